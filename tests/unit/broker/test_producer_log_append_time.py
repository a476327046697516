"""A batch its producer marked LogAppendTime (attribute bit 3), as Kafka 4.3's LogValidator
treats it: each record has the batch's max timestamp; a CreateTime topic checks that timestamp
against its bounds and appends the batch as CreateTime (the bit cleared, the max timestamp
kept), a LogAppendTime topic, or a batch without a max timestamp, refuses every record
(apis/produce.py record_refusal, storage/batch_bytes.py set_create_time).
tests/integration/broker/test_log_append_time.py checks it with a real client."""

from __future__ import annotations

import crc32c
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.produce import INVALID_TIMESTAMP, record_refusal
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.batch_bytes import set_create_time, set_log_append_time

NOW = 1_800_000_000_000
HOUR = 3_600_000
LONG_MAX = 2**63 - 1
DEFAULT_BOUNDS = (LONG_MAX, HOUR)  # Kafka's: any age, at most an hour ahead
MISDATED = "Producer should not set timestamp type to LogAppendTime."


def _marked(keyed: list[tuple[bytes | None, bytes | None]], base_ms: int, max_ms: int) -> bytearray:
    """A producer's batch of these records at `base_ms`, marked LogAppendTime with `max_ms`."""
    buf = bytearray(records.build_batch(keyed, timestamp_ms=base_ms))
    set_log_append_time(buf, records.read_header(buf), max_ms)
    return buf


def _crc_ok(buf: bytearray) -> bool:
    h = records.read_header(buf)
    return h.crc == crc32c.crc32c(bytes(buf[21 : h.size]))


def test_a_marked_batch_on_a_log_append_time_topic_is_refused_record_by_record() -> None:
    data = bytes(_marked([(b"k", b"value"), (None, None)], NOW - HOUR, NOW - 5))
    refused = record_refusal("t", 0, data, False, None, NOW, log_append_time=True)
    assert refused is not None
    code, message, errors = refused
    assert (code, message) == (ErrorCode.invalid_timestamp, INVALID_TIMESTAMP)
    # Kafka names each record as its DefaultRecord prints itself, with the batch's max timestamp
    assert errors == [
        (
            0,
            f"Invalid timestamp type in message DefaultRecord(offset=0, timestamp={NOW - 5}, "
            f"key=1 bytes, value=5 bytes). {MISDATED}",
        ),
        (
            1,
            f"Invalid timestamp type in message DefaultRecord(offset=1, timestamp={NOW - 5}, "
            f"key=0 bytes, value=0 bytes). {MISDATED}",
        ),
    ]


def test_an_unmarked_batch_on_a_log_append_time_topic_is_taken() -> None:
    data = records.build_batch([(None, b"v")], timestamp_ms=0)
    assert record_refusal("t", 0, data, False, None, NOW, log_append_time=True) is None


def test_a_marked_batch_on_a_create_time_topic_is_checked_at_its_max_timestamp() -> None:
    # the records' own timestamps are a day old, the max timestamp is now: taken, as on Kafka
    fresh = bytes(_marked([(None, b"v")], NOW - 24 * HOUR, NOW))
    assert record_refusal("t", 0, fresh, False, (HOUR, HOUR), NOW) is None
    # the max timestamp two hours ahead: refused, as any record two hours ahead
    ahead = bytes(_marked([(None, b"v"), (None, b"w")], NOW, NOW + 2 * HOUR))
    refused = record_refusal("t", 0, ahead, False, DEFAULT_BOUNDS, NOW)
    assert refused is not None
    assert refused[0] == ErrorCode.invalid_timestamp
    assert [index for index, _ in refused[2]] == [0, 1]
    assert refused[2][0][1].startswith(f"Timestamp {NOW + 2 * HOUR} of message with offset 0 ")
    # a compacted topic reads the records for their keys: the same timestamp is checked
    keyed = bytes(_marked([(b"k", b"v")], NOW - 24 * HOUR, NOW + 2 * HOUR))
    refused = record_refusal("t", 0, keyed, True, DEFAULT_BOUNDS, NOW)
    assert refused is not None and refused[0] == ErrorCode.invalid_timestamp


def test_a_marked_batch_without_a_max_timestamp_is_refused_on_a_create_time_topic() -> None:
    data = bytes(_marked([(b"k", b"v")], NOW, -1))
    refused = record_refusal("t", 0, data, False, DEFAULT_BOUNDS, NOW)
    assert refused is not None
    assert refused[0] == ErrorCode.invalid_timestamp
    assert refused[2] == [
        (
            0,
            "Invalid timestamp type in message DefaultRecord(offset=0, timestamp=-1, "
            f"key=1 bytes, value=1 bytes). {MISDATED}",
        )
    ]


def test_a_keyless_record_of_a_marked_batch_on_a_compacted_topic_is_a_key_error() -> None:
    # Kafka checks the key first: a record without one is an INVALID_RECORD error only
    data = bytes(_marked([(None, b"v")], NOW, NOW))
    refused = record_refusal("t", 0, data, True, None, NOW, log_append_time=True)
    assert refused is not None
    assert refused[0] == ErrorCode.invalid_record
    assert refused[2] == [
        (0, "Compacted topic cannot accept message without key in topic partition t-0")
    ]


def test_set_create_time_clears_the_bit_and_keeps_the_max_timestamp() -> None:
    buf = _marked([(b"k", b"v"), (b"l", b"w")], NOW - HOUR, NOW)
    set_create_time(buf, records.read_header(buf))
    h = records.read_header(buf)
    assert not h.attributes & records.TIMESTAMP_TYPE_MASK
    assert (h.base_timestamp, h.max_timestamp) == (NOW - HOUR, NOW)
    assert _crc_ok(buf)
    # the records have their own timestamps again
    assert [t for _, t in records.iter_record_timestamps(buf, h)] == [NOW - HOUR, NOW - HOUR]


def test_set_create_time_leaves_a_create_time_batch_as_it_is() -> None:
    data = records.build_batch([(b"k", b"v")], timestamp_ms=NOW, attributes=0)
    buf = bytearray(data)
    set_create_time(buf, records.read_header(buf))
    assert bytes(buf) == data


def test_value_size_is_the_records_value_length() -> None:
    data = records.build_batch([(b"key", b"12345"), (None, b""), (b"k", None)])
    h = records.read_header(data)
    sizes = [records.value_size(r) for r in records.iter_record_slices(data, h)]
    assert sizes == [5, 0, 0]
