"""ListOffsets by timestamp answers per record, as Kafka does: the first record whose timestamp
is at least the target, not the first offset of the batch that holds it. A real partition on a
local-directory store, batches encoded (and compressed) by kafka-python's producer code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import PartitionConfig, PartitionLog, StorageConfig, TimestampLookup
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.storage.timestamps import first_record_at, max_timestamp_record
from tidalmq_core.model import TopicPartition

from tests.support.client_batches import client_batch

T0 = 1_700_000_000_000
CONFIG = StorageConfig(flush_interval_ms=2, checkpoint_interval_s=3600)


@pytest.fixture
async def plog(tmp_path: Path) -> AsyncIterator[PartitionLog]:
    engine = ObjectStreamEngine(LocalDirObjectStore(tmp_path / "objects"), 0, CONFIG)
    await engine.start()
    try:
        yield await engine.open_partition(TopicPartition("t", 0), "id", 1, PartitionConfig())
    finally:
        await engine.stop()


async def _lookup(plog: PartitionLog, timestamp_ms: int) -> tuple[int, int] | None:
    found = await plog.offset_for_timestamp(timestamp_ms)
    return None if found is None else (found.offset, found.timestamp)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
async def test_the_first_record_at_or_after_the_target(plog: PartitionLog, codec: int) -> None:
    await plog.append(client_batch([T0 + 10 * i for i in range(5)], compression=codec))  # 0-4
    await plog.append(client_batch([T0 + 100 + i for i in range(3)], compression=codec))  # 5-7
    assert await _lookup(plog, T0) == (0, T0)
    assert await _lookup(plog, T0 + 25) == (3, T0 + 30)  # inside the first batch
    assert await _lookup(plog, T0 + 40) == (4, T0 + 40)
    assert await _lookup(plog, T0 + 41) == (5, T0 + 100)  # the next batch
    assert await _lookup(plog, T0 + 102) == (7, T0 + 102)
    assert await _lookup(plog, T0 + 103) is None
    # records below the log start are never answered
    await plog.delete_records_before(2)
    assert await _lookup(plog, T0) == (2, T0 + 20)


async def _max(plog: PartitionLog) -> tuple[int, int] | None:
    found = await plog.offset_of_max_timestamp()
    return None if found is None else (found.offset, found.timestamp)


@pytest.mark.parametrize("codec", [0, 4], ids=["none", "zstd"])
async def test_max_timestamp_is_the_first_record_holding_the_greatest_timestamp(
    plog: PartitionLog, codec: int
) -> None:
    """ListOffsets MAX_TIMESTAMP (-3): the record with the greatest timestamp, not the last
    record nor a batch's first offset; on a tie the earlier record, as Kafka answers."""
    assert await _max(plog) is None  # an empty log
    await plog.append(client_batch([T0, T0 + 500, T0 + 20], compression=codec))  # 0-2
    await plog.append(client_batch([T0 + 30, T0 + 40], compression=codec))  # 3-4
    assert await _max(plog) == (1, T0 + 500)  # inside the first batch, not the newest
    await plog.append(client_batch([T0 + 50, T0 + 500, T0 + 900, T0 + 900]))  # 5-8
    assert await _max(plog) == (7, T0 + 900)  # the first of two records with the maximum
    # records below the log start are never answered: the next greatest one is
    await plog.delete_records_before(8)
    assert await _max(plog) == (8, T0 + 900)
    await plog.delete_records_before(9)
    assert await _max(plog) is None


async def test_max_timestamp_over_several_flushes(plog: PartitionLog) -> None:
    """Batches in separate WAL objects (separate index entries): the entry with the greatest
    max timestamp is found whatever its place, and an earlier entry wins a tie."""
    stamps = [T0 + 7, T0 + 300, T0 + 3, T0 + 300, T0 + 100]
    for ts in stamps:
        await plog.append(client_batch([ts]))  # one flush each (acks wait for durability)
    assert await _max(plog) == (1, T0 + 300)


async def test_a_batch_whose_records_cannot_be_read_is_answered_with_the_batch() -> None:
    """Both lookups fall back to the batch itself (its first offset at or after the log start,
    its max timestamp) when its records are malformed, instead of failing the request."""
    data = bytearray(client_batch([T0, T0 + 5, T0 + 9], base_offset=10))
    header = records.read_header(data, 0)
    data[records.HEADER_SIZE : header.size] = b"\xff" * (header.size - records.HEADER_SIZE)
    with pytest.raises(records.InvalidRecordBatch):
        list(records.iter_record_timestamps(data, header))
    where = TopicPartition("t", 0)
    assert first_record_at(data, T0 + 1, 11, where) == TimestampLookup(11, T0 + 9)
    entry = IndexEntry(10, 12, "wal/x", 0, len(data), header.max_timestamp)

    async def read(_: IndexEntry) -> bytes:
        return bytes(data)

    assert await max_timestamp_record([entry], 10, read, where) == TimestampLookup(10, T0 + 9)
