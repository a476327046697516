"""[M1] An opened partition nobody writes to leaves few objects for the garbage collector.

A topic creation opens thousands of partitions on each broker at once, and every container their
storage state keeps is an object the cyclic garbage collector tracks: on 2026-11-27 a partition
opened on the storage engine and never used left 16 of them (7 lists, two ProducerStateTables,
the OffsetIndex, AbortedTxns and PartitionCache, a set, the instance's dict, the Partition, the
key of `_opened_once`), so a 2,000-partition share of a creation made a young collection
(threshold 50,000) on every broker, 18-26 ms each on glibc's malloc (docs/control-plane.md).
Since, the empty lists are one shared read-only list until first written to (storage/empty.py),
so is the partition cache (TailCache.empty), the per-partition classes have __slots__, and such a
partition leaves 5: the Partition, its two ProducerStateTables, the OffsetIndex and AbortedTxns.
The bound below fails the test if anyone gives an unused partition its own containers again.

Counted, not timed: the tracked objects alive after the opens that were not before them
(gc.get_objects, with the collector off and the earlier objects held so no id is reused), on a
real engine over a local directory, the TopicPartitions made beforehand.
"""

from __future__ import annotations

import gc
from collections import Counter
from pathlib import Path

import pytest
from tidalmq_broker.storage.aborted_txns import AbortedTxns
from tidalmq_broker.storage.api import PartitionConfig, StorageConfig
from tidalmq_broker.storage.cache import TailCache
from tidalmq_broker.storage.empty import EMPTY_LIST
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.index import IndexEntry, OffsetIndex
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_core.model import TopicPartition

HOUR = 3600.0
CONFIG = StorageConfig(
    checkpoint_interval_s=HOUR,
    compaction_interval_s=HOUR,
    retention_check_interval_s=HOUR,
    garbage_sweep_interval_s=HOUR,
    identity_check_interval_ms=HOUR * 1000,
    store_probe_interval_ms=0,
)
OPENED = 1_000
# tracked objects an opened, unused partition may leave (5.004 measured on 2026-11-28, the
# fraction the engine's own; 16.004 before): one more container each fails
BOUND = 5


async def test_an_unused_partition_leaves_few_tracked_objects(tmp_path: Path) -> None:
    engine = ObjectStreamEngine(LocalDirObjectStore(tmp_path / "objects"), 0, CONFIG)
    await engine.start()
    config = PartitionConfig()
    for i in range(10):  # the engine's own first-use state (locks, metrics children, ...)
        await engine.open_partition(TopicPartition("warm", i), "warm-id", 0, config)
    tps = [TopicPartition("created", i) for i in range(OPENED)]
    gc.collect()
    gc.disable()
    try:
        before = gc.get_objects()  # held: no object made below can reuse one's id
        known = {id(o) for o in before}
        for tp in tps:
            await engine.open_partition(tp, "created-id", 0, config)
        new = [o for o in gc.get_objects() if id(o) not in known]
    finally:
        gc.enable()
    by_type = Counter(type(o).__name__ for o in new)
    del before, new
    per_partition = sum(by_type.values()) / OPENED
    breakdown = ", ".join(f"{name} {n / OPENED:g}" for name, n in by_type.most_common())
    assert per_partition < BOUND + 0.5, (
        f"{per_partition:g} tracked objects a partition: {breakdown}"
    )
    assert len(engine.partitions()) == OPENED + 10
    await engine.stop()


def test_the_shared_empty_list_refuses_changes_and_its_users_make_their_own() -> None:
    with pytest.raises(TypeError):
        EMPTY_LIST.append(1)
    with pytest.raises(TypeError):
        EMPTY_LIST.extend([1])
    with pytest.raises(TypeError):
        del EMPTY_LIST[:0]
    index, aborted, cache = OffsetIndex(), AbortedTxns(), TailCache(1 << 20).partition()
    assert aborted.drop_before(10) == 0 and index.drop_before(10) == []
    index.append(IndexEntry(0, 4, "wal/1", 0, 10, 7))
    index.append(IndexEntry(5, 9, "wal/1", 10, 10, 3))
    assert index.find(6) == 1 and index.find_timestamp(5) == 0 and index.size_bytes == 20
    aborted.add(1, 0, 5)
    aborted.add(2, 1, 3)  # out of marker order: inserted before
    assert aborted.overlapping(0, 9) == [(1, 0), (2, 1)]
    cache.add(0, 4, memoryview(b"abc"))
    cache.clear()
    cache.add(5, 9, memoryview(b"defg"))
    assert cache.lookup(5, 100) == [memoryview(b"defg")] and cache.start_offset == 5
    assert EMPTY_LIST == [] and OffsetIndex().entries == [] and len(AbortedTxns()) == 0


def test_the_shared_partition_cache_finds_nothing_and_takes_no_chunks() -> None:
    tail = TailCache(1 << 20)
    empty = tail.empty
    assert empty.shared and not tail.partition().shared
    with pytest.raises(TypeError):
        empty.add(0, 4, memoryview(b"abc"))
    empty.clear()
    empty.drop_before(10)
    assert empty.lookup(0, 100) is None and empty.exact(0, 4) is None
    assert empty.bytes == 0 and empty.start_offset is None and tail.bytes == 0
