"""Record batches as a real client encodes them (kafka-python's producer code), for tests that
must look inside batches the broker stores untouched."""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatchBuilder
from tidalmq_broker.protocol import records as rb


def client_batch(timestamps: list[int], *, compression: int = 0, base_offset: int = 0) -> bytes:
    """One record per timestamp, compressed with Kafka codec `compression` (0-4)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, ts in enumerate(timestamps):
        builder.append(i, timestamp=ts, key=b"k%d" % i, value=b"v" * 300, headers=[])
    data = bytearray(builder.build())
    rb.patch_base_offset(data, rb.read_header(data), base_offset)
    return bytes(data)
