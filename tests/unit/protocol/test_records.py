"""RecordBatch v2 header parsing and patching, cross-checked with kafka-python's own codec."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from tidalmq_broker.protocol import records as rb


def client_batch(n: int, *, compression: int = 0, producer_id: int = -1, seq: int = -1) -> bytes:
    """A batch encoded by kafka-python, as a real producer would send it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i in range(n):
        builder.append(
            i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * 100, headers=[]
        )
    return bytes(builder.build())


def test_header_fields_of_a_client_batch() -> None:
    data = client_batch(5, producer_id=42, seq=7)
    (h,) = list(rb.iter_headers(data, verify_crc=True))
    assert h.size == len(data)
    assert h.record_count == 5
    assert h.last_offset_delta == 4
    assert h.producer_id == 42 and h.base_sequence == 7 and h.last_sequence == 11
    assert h.base_timestamp == 1_700_000_000_000 and h.max_timestamp == 1_700_000_000_004
    assert h.compression == 0 and not h.is_transactional and not h.is_control


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_compressed_batches_validate_without_decompression(codec: int) -> None:
    data = client_batch(50, compression=codec)
    (h,) = list(rb.iter_headers(data, verify_crc=True))
    assert h.compression == codec and h.record_count == 50


def test_patching_base_offset_keeps_crc_and_records() -> None:
    data = bytearray(client_batch(3))
    (h,) = list(rb.iter_headers(data))
    rb.patch_base_offset(data, h, 1000)
    rb.patch_leader_epoch(data, h, 9)
    (h2,) = list(rb.iter_headers(data, verify_crc=True))
    assert h2.base_offset == 1000 and h2.last_offset == 1002 and h2.partition_leader_epoch == 9
    batch = DefaultRecordBatch(bytes(data))
    assert [r.offset for r in batch] == [1000, 1001, 1002]


def test_crc_mismatch_is_detected() -> None:
    data = bytearray(client_batch(2))
    data[-1] ^= 0xFF
    with pytest.raises(rb.InvalidRecordBatch, match="CRC"):
        list(rb.iter_headers(data, verify_crc=True))


@pytest.mark.parametrize(
    "mangle, message",
    [
        (lambda d: d[:30], "truncated"),
        (lambda d: d + b"\0" * 5, "truncated"),
        (lambda d: d[:8] + (10**6).to_bytes(4, "big") + d[12:], "declares"),
        (lambda d: d[:8] + (3).to_bytes(4, "big") + d[12:], "shorter than its header"),
        (lambda d: d[:16] + b"\x01" + d[17:], "magic"),
    ],
)
def test_malformed_batches_are_rejected(mangle, message: str) -> None:
    with pytest.raises(rb.InvalidRecordBatch, match=message):
        list(rb.iter_headers(mangle(client_batch(2))))


def test_several_batches_and_trailing_partial_batch() -> None:
    a, b = client_batch(2), client_batch(3)
    assert [h.record_count for h in rb.iter_headers(a + b)] == [2, 3]
    assert [h.record_count for h in rb.iter_complete_headers(a + b[:20])] == [2]


def test_internal_batches_are_readable_by_a_kafka_client() -> None:
    data = rb.build_batch([(b"key", b"value"), (b"k2", None)], base_offset=5, timestamp_ms=123)
    (h,) = list(rb.iter_headers(data, verify_crc=True))
    assert list(rb.iter_records(data, h)) == [(5, b"key", b"value"), (6, b"k2", None)]
    parsed = [(r.offset, r.key, r.value, r.timestamp) for r in DefaultRecordBatch(data)]
    assert parsed == [(5, b"key", b"value", 123), (6, b"k2", None, 123)]
