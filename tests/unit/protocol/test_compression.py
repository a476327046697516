"""Record timestamps of client batches, compressed by a real client's encoder with every codec."""

from __future__ import annotations

import pytest
import snappy
from tidalmq_broker.protocol import records as rb
from tidalmq_broker.protocol.compression import decompress

from tests.support.client_batches import client_batch

T0 = 1_700_000_000_000


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_record_timestamps_of_every_codec(codec: int) -> None:
    stamps = [T0, T0 + 5, T0 + 5, T0 + 9, T0 + 20]
    data = b"\0" * 7 + client_batch(stamps, compression=codec, base_offset=100)
    h = rb.read_header(data, 7)  # a batch inside a larger buffer (a WAL object's range)
    assert h.compression == codec
    assert list(rb.iter_record_timestamps(data, h)) == [
        (100 + i, ts) for i, ts in enumerate(stamps)
    ]


def test_snappy_raw_and_xerial_framed() -> None:
    raw = b"records " * 1000
    xerial = bytearray(b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") + (1).to_bytes(4, "big"))
    for part in (raw[:3000], raw[3000:]):  # the Java client's framing: several blocks
        block = snappy.compress(part)
        xerial += len(block).to_bytes(4, "big") + block
    assert decompress(2, bytes(xerial)) == raw
    assert decompress(2, snappy.compress(raw)) == raw  # librdkafka's


def test_log_append_time_batches_report_the_broker_time() -> None:
    data = bytearray(client_batch([T0, T0 + 1, T0 + 2]))
    h = rb.read_header(data)
    attributes = h.attributes | rb.TIMESTAMP_TYPE_MASK
    data[21:23] = attributes.to_bytes(2, "big")
    data[35:43] = (T0 + 99).to_bytes(8, "big")
    h = rb.read_header(data)
    assert list(rb.iter_record_timestamps(data, h)) == [(0, T0 + 99), (1, T0 + 99), (2, T0 + 99)]


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_corrupt_compressed_records_are_an_invalid_batch(codec: int) -> None:
    good = client_batch([T0, T0 + 1], compression=codec)
    data = bytearray(good[: rb.HEADER_SIZE] + b"\x00garbage" * 4)
    data[8:12] = (len(data) - rb.LOG_OVERHEAD).to_bytes(4, "big")
    h = rb.read_header(data)
    with pytest.raises(rb.InvalidRecordBatch):
        list(rb.iter_record_timestamps(data, h))
