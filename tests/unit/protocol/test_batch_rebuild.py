"""The log cleaner's batch rebuild: records dropped from a client's batch, the rest re-encoded
with the same codec, offsets, producer fields and sequences; decoded back by kafka-python's own
record codec (a real client's decoder), for every codec."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from tidalmq_broker.protocol import records as rb
from tidalmq_broker.protocol.compression import compress, decompress

T0 = 1_700_000_000_000


def producer_batch(
    records: list[tuple[bytes | None, bytes | None]],
    *,
    compression: int = 0,
    base_offset: int = 0,
    transactional: bool = False,
) -> bytes:
    """A batch of an idempotent producer (id 77, epoch 3, base sequence 40) with one header per
    record, as kafka-python's producer encodes it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=transactional,
        producer_id=77,
        producer_epoch=3,
        base_sequence=40,
        batch_size=1 << 20,
    )
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=T0 + 10 * i, key=key, value=value, headers=[("h", b"%d" % i)])
    data = bytearray(builder.build())
    rb.patch_base_offset(data, rb.read_header(data), base_offset)
    return bytes(data)


def decoded(data: bytes) -> tuple[DefaultRecordBatch, list[tuple[int, int, object, object]]]:
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    rows = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
    return batch, rows


RECORDS = [(b"a", b"1" * 50), (b"b", b"2" * 50), (b"a", None), (None, b"keyless"), (b"c", b"")]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_rebuild_keeps_offsets_sequences_and_codec(codec: int) -> None:
    data = producer_batch(RECORDS, compression=codec, base_offset=1000)
    header = rb.read_header(data)
    slices = list(rb.iter_record_slices(data, header))
    assert [(s.offset, s.key, s.has_value) for s in slices] == [
        (1000, b"a", True),
        (1001, b"b", True),
        (1002, b"a", False),
        (1003, None, True),
        (1004, b"c", True),
    ]
    assert [s.timestamp for s in slices] == [T0 + 10 * i for i in range(5)]

    kept = [slices[1], slices[2]]  # drop the first, the keyless one and the last
    out = rb.rebuild_batch(header, kept)
    batch, rows = decoded(out)
    assert rows == [
        (1001, T0 + 10, b"b", b"2" * 50, [("h", b"1")]),
        (1002, T0 + 20, b"a", None, [("h", b"2")]),
    ]
    assert batch.base_offset == 1000 and batch.last_offset_delta == 4  # offsets stay
    assert batch.producer_id == 77 and batch.producer_epoch == 3 and batch.base_sequence == 40
    assert batch.compression_type == codec and batch.records_count == 2
    assert batch.max_timestamp == T0 + 20  # of the records kept
    rebuilt = rb.read_header(out)
    assert rebuilt.last_sequence == header.last_sequence and rebuilt.delete_horizon_ms is None


def test_delete_horizon_becomes_the_base_timestamp_and_timestamps_stay() -> None:
    data = producer_batch(RECORDS, transactional=True)
    header = rb.read_header(data)
    kept = list(rb.iter_record_slices(data, header))[:3]
    horizon = T0 + 86_400_000
    out = rb.rebuild_batch(header, kept, delete_horizon_ms=horizon)
    rebuilt = rb.read_header(out)
    assert rebuilt.delete_horizon_ms == horizon and rebuilt.base_timestamp == horizon
    assert rebuilt.is_transactional and rebuilt.attributes & rb.DELETE_HORIZON_FLAG
    # the deltas are negative now; the records' own timestamps did not move
    assert [s.timestamp for s in rb.iter_record_slices(out, rebuilt)] == [T0, T0 + 10, T0 + 20]
    # a second rebuild of a batch that already has a horizon keeps it
    again = rb.rebuild_batch(rebuilt, list(rb.iter_record_slices(out, rebuilt))[1:])
    assert rb.read_header(again).delete_horizon_ms == horizon
    assert rb.crc_matches(again, rb.read_header(again))


def test_empty_batch_keeps_last_offset_and_producer_state() -> None:
    data = producer_batch(RECORDS, compression=3, base_offset=500, transactional=True)
    header = rb.read_header(data)
    out = rb.empty_batch(header)
    assert len(out) == rb.HEADER_SIZE
    batch, rows = decoded(out)
    assert rows == []
    assert batch.records_count == 0 and batch.compression_type == 0
    empty = rb.read_header(out)
    assert (empty.base_offset, empty.last_offset) == (500, 504)
    assert empty.last_sequence == header.last_sequence and empty.is_transactional
    assert empty.base_timestamp == empty.max_timestamp == header.max_timestamp


def test_control_type_of_markers_and_of_an_emptied_marker() -> None:
    for kind in (rb.CONTROL_ABORT, rb.CONTROL_COMMIT):
        key = (0).to_bytes(2, "big") + kind.to_bytes(2, "big")
        marker = rb.build_batch(
            [(key, b"\0\0\0\0\0\x05")],
            producer_id=9,
            producer_epoch=1,
            attributes=rb.CONTROL_FLAG | rb.TRANSACTIONAL_FLAG,
        )
        header = rb.read_header(marker)
        assert rb.control_type(marker, header) == kind
        emptied = rb.empty_batch(header)
        assert rb.control_type(emptied, rb.read_header(emptied)) is None


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_compress_round_trips(codec: int) -> None:
    data = b"".join(b"record %d " % i for i in range(20_000))  # several snappy/lz4 blocks
    assert decompress(codec, compress(codec, data)) == data


def test_truncated_or_lying_records_are_refused() -> None:
    data = bytearray(producer_batch(RECORDS))
    header = rb.read_header(data)
    lying = bytearray(data)
    lying[rb.HEADER_SIZE] = 0x7E  # first record's length varint: 63 bytes, more than it has
    with pytest.raises(rb.InvalidRecordBatch):
        list(rb.iter_record_slices(lying, header))
    short_count = bytearray(data)
    short_count[57:61] = (4).to_bytes(4, "big")  # one record left over as stray bytes
    with pytest.raises(rb.InvalidRecordBatch, match="stray"):
        list(rb.iter_record_slices(short_count, rb.read_header(short_count)))


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_record_keys_are_those_of_the_whole_records(codec: int) -> None:
    data = producer_batch(RECORDS * 30, compression=codec, base_offset=500)
    header = rb.read_header(data)
    whole = [(s.offset, s.key) for s in rb.iter_record_slices(data, header)]
    assert list(rb.iter_record_keys(data, header)) == whole
    assert whole[:4] == [(500, b"a"), (501, b"b"), (502, b"a"), (503, None)]


def test_record_keys_refuse_what_the_whole_records_refuse() -> None:
    data = bytearray(producer_batch(RECORDS))
    header = rb.read_header(data)
    lying = bytearray(data)
    lying[rb.HEADER_SIZE] = 0x7E  # first record's length varint: 63 bytes, more than it has
    with pytest.raises(rb.InvalidRecordBatch):
        list(rb.iter_record_keys(lying, header))
    long_key = bytearray(producer_batch([(b"a", b"1")]))  # a record of less than 64 bytes
    assert long_key[rb.HEADER_SIZE + 4] == 2  # its length, attributes, two deltas, key length
    long_key[rb.HEADER_SIZE + 4] = 0x7E  # a key of 63 bytes
    with pytest.raises(rb.InvalidRecordBatch, match="key past"):
        list(rb.iter_record_keys(long_key, rb.read_header(long_key)))
    short_count = bytearray(data)
    short_count[57:61] = (4).to_bytes(4, "big")
    with pytest.raises(rb.InvalidRecordBatch, match="stray"):
        list(rb.iter_record_keys(short_count, rb.read_header(short_count)))
    truncated = bytes(data[: header.size - 5])
    with pytest.raises(rb.InvalidRecordBatch):
        list(rb.iter_record_keys(truncated, rb.read_header(truncated)))
