"""[M1] A broker's periodic upkeep costs O(what changed), not O(open partitions).

The garbage sweep lists the store (every checkpoint key) but reads only the checkpoints written
since the last sweep (storage/garbage.py's CheckpointRefsCache): at 50,000 partitions that was
50,000 GETs per broker every garbage_sweep_interval_s.

The work is counted, not timed: every Python and C function call the passes make (sys.setprofile)
on a real engine (and a real PartitionManager) with 1,000 and with 50,000 open partitions, of
which the same 5 were written. Walking every open partition each interval (what the passes did
before storage/upkeep.py) makes at least one call per open partition, so 49,000 more calls at
50,000; here both counts are the same to within a little.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from tidalmq_broker.partitions import PartitionManager
from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import PartitionConfig, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.storage.retention import oldest_segment_expiry_ms
from tidalmq_broker.storage.upkeep import (
    CHECKPOINTS,
    COMPACTION,
    RETENTION,
    UpkeepSchedule,
)
from tidalmq_core.deadlines import DeadlineQueue
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition

from tests.support.partition_managers import partition_manager

HOUR = 3600.0
# the engine's own loops stay asleep: the test runs each pass itself
CONFIG = StorageConfig(
    checkpoint_interval_s=HOUR,
    compaction_interval_s=HOUR,
    retention_check_interval_s=HOUR,
    garbage_sweep_interval_s=HOUR,
    identity_check_interval_ms=HOUR * 1000,
    store_probe_interval_ms=0,
)
WRITTEN = 5
SIZES = (1_000, 50_000)


async def count_calls(work: Callable[[], Awaitable[Any]]) -> int:
    """Function calls made on this thread while `work` runs (the event loop's included)."""
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        await work()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


def one_topic(name: str, partitions: int, broker: int) -> ClusterMetadata:
    parts = [PartitionState(leader=broker, leader_epoch=0, replicas=[broker])] * partitions
    topic = TopicInfo(name=name, topic_id="t-" + name, partitions=parts)
    return ClusterMetadata(cluster_id="c", version=1, topics={name: topic})


@asynccontextmanager
async def written_engine(
    tmp_path: Path, partitions: int
) -> AsyncIterator[tuple[ObjectStreamEngine, PartitionManager]]:
    """An engine with `partitions` open through a PartitionManager (as a broker opens them),
    WRITTEN of them written, and the upkeep passes run once since."""
    async with partition_manager(tmp_path / f"objects-{partitions}", CONFIG) as (engine, manager):
        manager.apply(one_topic("orders", partitions, 0))
        assert await manager.wait_settled(600)
        assert len(engine.partitions()) == partitions
        for i in range(WRITTEN):
            log = engine.get(TopicPartition("orders", i * (partitions // WRITTEN)))
            assert log is not None
            await log.append(records.build_batch([(b"k", b"v")]))
        await engine.checkpoint_all()
        await engine.compact_all()
        await engine.apply_retention_all()
        manager.take_changed()
        yield engine, manager


async def upkeep_work(engine: ObjectStreamEngine, manager: PartitionManager) -> dict[str, int]:
    """Calls made by each periodic path of a broker after the same 5 partitions were written
    again."""
    for i, tp in enumerate(sorted(engine.partitions())[:WRITTEN]):
        log = engine.get(tp)
        assert log is not None
        await log.append(records.build_batch([(b"k", b"again %d" % i)]))

    async def heartbeat_news() -> None:  # what Broker._prepare_beat asks of the partitions
        changed = manager.take_changed()
        assert changed is not None and len(changed) == WRITTEN
        manager.open_changes()
        manager.open_high_watermarks(changed)
        manager.high_watermarks(lambda topic: True, changed)

    async def settled() -> None:  # the readiness probe's question
        assert manager.is_settled()

    return {
        "heartbeat": await count_calls(heartbeat_news),
        "readiness": await count_calls(settled),
        "checkpoints": await count_calls(engine.checkpoint_all),
        "compaction": await count_calls(engine.compact_all),
        "retention": await count_calls(engine.apply_retention_all),
    }


async def test_upkeep_work_does_not_grow_with_open_partitions(tmp_path: Path) -> None:
    work: dict[int, dict[str, int]] = {}
    for n in SIZES:
        async with written_engine(tmp_path, n) as (engine, manager):
            await engine.collect_garbage()  # the first sweep reads every checkpoint there is
            assert engine.swept_checkpoints.loaded == WRITTEN  # (only written ones have one)
            work[n] = await upkeep_work(engine, manager)
            assert engine.upkeep.pending(CHECKPOINTS) == 0  # committed, nothing left
            await engine.collect_garbage()  # the next ones: the checkpoints written since
            await engine.collect_garbage()
            assert engine.swept_checkpoints.loaded == 2 * WRITTEN
            assert not any(engine.get(tp).dirty for tp in engine.partitions())  # type: ignore[union-attr]
    small, large = work[SIZES[0]], work[SIZES[1]]
    for path, calls in small.items():
        # at least one call per open partition would be 49,000 more: allow a few hundred
        assert large[path] <= calls + 500, (path, small, large)


async def test_written_partitions_are_checkpointed_compacted_and_expired(tmp_path: Path) -> None:
    """The passes still do their work on the partitions that need it: a written partition is
    checkpointed by the next pass, compacted once its oldest WAL range has waited
    compaction_idle_s (a deadline, not a walk), and its segment dropped once retention.ms
    passed (another deadline)."""
    config = dataclasses.replace(CONFIG, compaction_idle_s=0.2)
    engine = ObjectStreamEngine(LocalDirObjectStore(tmp_path / "objects"), 0, config)
    await engine.start()
    try:
        short = PartitionConfig(retention_ms=1500)
        logs = [
            await engine.open_partition(TopicPartition("t", i), "id", 0, short) for i in range(20)
        ]
        now_ms = int(time.time() * 1000)
        await logs[3].append(records.build_batch([(b"k", b"v")], timestamp_ms=now_ms))
        assert logs[3].dirty
        await engine.checkpoint_all()
        assert not logs[3].dirty
        await engine.compact_all()  # too young to compact: a deadline is set
        assert logs[3].index.wal_ranges() == 1
        assert engine.upkeep.pending(COMPACTION) == 1
        await asyncio.sleep(0.25)
        await engine.compact_all()
        assert logs[3].index.wal_ranges() == 0 and len(logs[3].index) == 1
        await engine.apply_retention_all()  # the new segment: expires 1.5 s after its batch
        assert logs[3].log_start_offset == 0
        assert engine.upkeep.pending(RETENTION) == 1
        await asyncio.sleep(1.5)
        await engine.apply_retention_all()
        assert logs[3].log_start_offset == 1 and len(logs[3].index) == 0
        await engine.apply_retention_all()  # its change (the new log start) is looked at once
        assert engine.upkeep.pending(RETENTION) == 0  # nothing left to expire: no deadline
        assert engine.upkeep.taken[RETENTION] == 3  # the other 19 were never looked at
    finally:
        await engine.stop()


def test_deadline_queue_pops_due_keys_in_order_and_once() -> None:
    q: DeadlineQueue[str] = DeadlineQueue()
    q.schedule("a", 5)
    q.schedule("b", 1)
    q.schedule("c", 3)
    q.schedule("a", 2)  # replaces 5
    q.cancel("c")
    assert q.pop_due(0) == []
    assert q.pop_due(4) == ["b", "a"]
    assert q.pop_due(10) == [] and len(q) == 0
    for i in range(1000):  # rescheduling does not grow the heap without bound
        q.schedule("x", i)
    assert len(q._heap) <= 2 * len(q) + 65


def test_deadline_queue_s_earliest_skips_replaced_and_cancelled_deadlines() -> None:
    q: DeadlineQueue[str] = DeadlineQueue()
    assert q.earliest() is None
    q.schedule("a", 1)
    q.schedule("b", 3)
    q.schedule("a", 4)  # the 1 is replaced
    assert q.earliest() == 3
    q.cancel("b")
    assert q.earliest() == 4
    q.pop_due(10)
    assert q.earliest() is None


def test_schedule_takes_changed_and_due_once() -> None:
    s: UpkeepSchedule[str] = UpkeepSchedule()
    s.changed("p")
    s.due_at(COMPACTION, "q", 10.0)
    assert sorted(s.take(COMPACTION, 5.0)) == ["p"]
    assert sorted(s.take(COMPACTION, 10.0)) == ["q"]
    assert s.take(COMPACTION, 99.0) == []
    assert s.take(CHECKPOINTS, 0.0) == ["p"]
    s.changed("gone")
    s.due_at(RETENTION, "gone", 1.0)
    s.forget("gone")
    assert s.take(RETENTION, 2.0) == ["p"]  # changed before; "gone" is not looked at


@pytest.mark.parametrize(
    ("retention_ms", "expected"), [(-1, None), (100, 1000 + 100 + 1), (0, 1000 + 1)]
)
def test_oldest_segment_expiry(retention_ms: int, expected: int | None) -> None:
    entries = [
        IndexEntry(0, 9, "partitions/seg-a", 0, 10, 900),
        IndexEntry(10, 19, "partitions/seg-a", 10, 10, 1000),
        IndexEntry(20, 29, "partitions/seg-b", 0, 10, 5000),
        IndexEntry(30, 39, "wal/0/x/1", 0, 10, 6000),
    ]
    assert oldest_segment_expiry_ms(entries, retention_ms) == expected
    assert oldest_segment_expiry_ms(entries[3:], 100) is None  # WAL ranges do not expire
