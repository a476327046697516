"""Offsets committed in a transaction (TxnOffsetCommit) stay pending in `__consumer_offsets` until
the transaction's marker: a commit marker makes them the group's offsets, an abort drops them,
and a coordinator that replays the partition (a move, a restart) reaches the same result from
the log alone. Real partition logs and real markers (`write_txn_marker`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.groups.coordinator import CommittedOffset, GroupSettings, GroupShard
from tidalmq_broker.groups.records import OffsetKey, TxnOffsetKey, decode_key
from tidalmq_broker.protocol.records import BatchHeader, iter_complete_headers, iter_records
from tidalmq_broker.storage.api import PartitionConfig, PartitionLog
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.log_cleaner import LogCleaner
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.storage.partition import Partition
from tidalmq_core.metadata import OFFSETS_TOPIC
from tidalmq_core.model import TopicPartition

from tests.unit.transactions.test_coordinator import CONFIG

TP = TopicPartition(OFFSETS_TOPIC, 0)
COMMITTED, ABORTED, OPEN = 9001, 9002, 9003
DAY = 86_400_000


class Offsets:
    def __init__(self, root: Path) -> None:
        self.engine = ObjectStreamEngine(LocalDirObjectStore(root), 0, CONFIG)
        self.epoch = 0
        self.plog: PartitionLog | None = None
        self.config = PartitionConfig()

    async def reload(self) -> GroupShard:
        if self.plog is not None:
            await self.engine.close_partition(TP)
        self.epoch += 1
        self.plog = await self.engine.open_partition(TP, "offsets", self.epoch, self.config)
        shard = GroupShard(0, self.plog, GroupSettings())
        await shard.load()
        return shard

    async def marker(self, shard: GroupShard, pid: int, commit: bool) -> None:
        """What WriteTxnMarkers does on this partition: the marker, then its listener."""
        assert self.plog is not None
        await self.plog.write_txn_marker(pid, 0, commit=commit, coordinator_epoch=1)
        await shard.complete_txn(pid, commit)


@pytest.fixture
async def offsets(tmp_path: Path) -> AsyncIterator[Offsets]:
    o = Offsets(tmp_path / "objects")
    await o.engine.start()
    try:
        yield o
    finally:
        await o.engine.stop()


def offset_of(shard: GroupShard, partition: int) -> int:
    return shard.fetch_offsets("g", [("orders", partition)])[("orders", partition)].offset


async def test_markers_settle_pending_offsets_live_and_on_replay(offsets: Offsets) -> None:
    shard = await offsets.reload()
    for pid, partition, offset in ((COMMITTED, 0, 10), (ABORTED, 1, 20), (OPEN, 2, 30)):
        results = await shard.txn_commit(
            group_id="g",
            producer_id=pid,
            producer_epoch=0,
            generation=-1,
            member_id="",
            group_instance_id=None,
            offsets={("orders", partition): CommittedOffset(offset, -1, None)},
        )
        assert set(results.values()) == {0}
    assert [offset_of(shard, p) for p in range(3)] == [-1, -1, -1]  # all pending
    assert shard.has_pending("g", "orders", 0)
    await offsets.marker(shard, COMMITTED, True)
    await offsets.marker(shard, ABORTED, False)
    assert [offset_of(shard, p) for p in range(3)] == [10, -1, -1]
    assert not shard.has_pending("g", "orders", 0) and shard.has_pending("g", "orders", 2)

    again = await offsets.reload()  # a new coordinator: the same, from the log
    assert [offset_of(again, p) for p in range(3)] == [10, -1, -1]
    assert again.has_pending("g", "orders", 2) and not again.has_pending("g", "orders", 1)
    await offsets.marker(again, OPEN, True)
    assert offset_of(again, 2) == 30
    assert offset_of(await offsets.reload(), 2) == 30


async def test_a_deleted_groups_transactional_offset_stays_deleted_after_compaction(
    offsets: Offsets,
) -> None:
    # __consumer_offsets as it will be once compacted (docs/compaction.md step 7)
    offsets.config = PartitionConfig(
        cleanup_policy=frozenset({"compact"}), retention_ms=1000, segment_bytes=1024
    )
    shard = await offsets.reload()

    async def txn_commit(shard: GroupShard, group: str, offset: int) -> None:
        await shard.txn_commit(
            group_id=group,
            producer_id=COMMITTED,
            producer_epoch=0,
            generation=-1,
            member_id="",
            group_instance_id=None,
            offsets={("orders", 0): CommittedOffset(offset, -1, None)},
        )
        await offsets.marker(shard, COMMITTED, True)

    await txn_commit(shard, "g", 10)
    assert offset_of(shard, 0) == 10
    assert await shard.delete_group("g") == 0
    assert offset_of(shard, 0) == -1
    plog = offsets.plog
    assert isinstance(plog, Partition)
    await offsets.engine.compact_partition(plog, force=True)
    now = int(time.time() * 1000)
    # the first pass keeps the tombstones and sets their horizon; one past it drops them
    await LogCleaner(offsets.engine).clean(plog, now_ms=now + 3 * DAY)
    later = await LogCleaner(offsets.engine).clean(plog, now_ms=now + 5 * DAY)
    # the group's, its offset's and the settled transactional offset's
    assert later.stats.tombstones_expired == 3
    again = await offsets.reload()
    # the same producer's next transaction, for another group on this partition
    await txn_commit(again, "h", 99)
    assert offset_of(again, 0) == -1, "the deleted group's offset came back"
    assert not again.has_pending("g", "orders", 0)


async def records_of(plog: PartitionLog) -> list[tuple[BatchHeader, bytes | None, bytes | None]]:
    """Every record of the log with its batch's header (markers included)."""
    result = await plog.read(plog.log_start_offset, 1 << 20)
    return [
        (header, key, value)
        for header in iter_complete_headers(result.records)
        for _, key, value in iter_records(result.records, header)
    ]


async def test_transactional_offsets_are_transactional_batches_of_their_producer(
    offsets: Offsets,
) -> None:
    shard = await offsets.reload()
    plog = offsets.plog
    assert plog is not None

    async def commit(group: str, epoch: int) -> set[int]:
        results = await shard.txn_commit(
            group_id=group,
            producer_id=COMMITTED,
            producer_epoch=epoch,
            generation=-1,
            member_id="",
            group_instance_id=None,
            offsets={("orders", 0): CommittedOffset(7, -1, None)},
        )
        return set(results.values())

    # two commits of one producer at once take consecutive sequences
    assert await asyncio.gather(commit("g", 0), commit("h", 0)) == [{0}, {0}]
    data = [(h, k) for h, k, _ in await records_of(plog)]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h, _ in data] == [
        (COMMITTED, 0, 0),
        (COMMITTED, 0, 1),
    ]
    assert all(h.is_transactional and not h.is_control for h, _ in data)
    assert plog.last_stable_offset == 0  # the open transaction holds it, as for any data
    await offsets.marker(shard, COMMITTED, True)
    assert plog.last_stable_offset == plog.high_watermark
    assert offset_of(shard, 0) == 7
    # the settled offsets written as plain records: the offset and a tombstone for the pending
    after = await records_of(plog)
    plain = [(decode_key(k), v) for h, k, v in after if not h.is_control and not h.has_producer_id]
    assert {k for k, v in plain if v is None} == {
        TxnOffsetKey(COMMITTED, g, "orders", 0) for g in ("g", "h")
    }
    assert {k for k, v in plain if v is not None} == {OffsetKey(g, "orders", 0) for g in ("g", "h")}
    # a producer fenced by a newer epoch (its marker was written with the bumped epoch)
    await plog.write_txn_marker(COMMITTED, 1, commit=False, coordinator_epoch=1)
    assert await commit("g", 0) == {ErrorCode.invalid_producer_epoch}  # as Kafka 4.x
    assert await commit("g", 1) == {0}  # the new epoch starts its sequence again


async def test_a_coordinator_stopped_between_a_marker_and_its_records_writes_them_on_load(
    offsets: Offsets,
) -> None:
    offsets.config = PartitionConfig(
        cleanup_policy=frozenset({"compact"}), retention_ms=1000, segment_bytes=1024
    )
    shard = await offsets.reload()
    await shard.txn_commit(
        group_id="g",
        producer_id=COMMITTED,
        producer_epoch=0,
        generation=-1,
        member_id="",
        group_instance_id=None,
        offsets={("orders", 0): CommittedOffset(10, -1, None)},
    )
    plog = offsets.plog
    assert isinstance(plog, Partition)
    # the marker is written, and the coordinator goes before its listener runs
    await plog.write_txn_marker(COMMITTED, 0, commit=True, coordinator_epoch=1)
    again = await offsets.reload()
    assert offset_of(again, 0) == 10 and not again.has_pending("g", "orders", 0)
    assert await again.delete_group("g") == 0
    plog = offsets.plog
    assert isinstance(plog, Partition)
    await offsets.engine.compact_partition(plog, force=True)
    now = int(time.time() * 1000)
    await LogCleaner(offsets.engine).clean(plog, now_ms=now + 3 * DAY)
    await LogCleaner(offsets.engine).clean(plog, now_ms=now + 5 * DAY)
    assert offset_of(await offsets.reload(), 0) == -1, "the deleted group's offset came back"


async def test_a_marker_landing_during_a_snapshot_that_trims_it_still_settles_on_reload(
    offsets: Offsets,
) -> None:
    """The snapshot holds the offsets as pending, the marker lands before the snapshot's
    first record (so the trim removes it), and the coordinator goes before the listener's
    records: the reload must still see the committed offset and the aborted one gone."""
    shard = await offsets.reload()
    for pid, partition, offset in ((COMMITTED, 0, 10), (ABORTED, 1, 20), (OPEN, 2, 30)):
        await shard.txn_commit(
            group_id="g",
            producer_id=pid,
            producer_epoch=0,
            generation=-1,
            member_id="",
            group_instance_id=None,
            offsets={("orders", partition): CommittedOffset(offset, -1, None)},
        )
    plog = offsets.plog
    assert plog is not None
    async with shard._snapshot_lock:  # a snapshot is being written
        live = list(shard._durable.items())
        settling = []
        for pid, commit in ((COMMITTED, True), (ABORTED, False)):
            await plog.write_txn_marker(pid, 0, commit=commit, coordinator_epoch=1)
            # the listener settles in memory, then waits for the snapshot to write its records
            settling.append(asyncio.create_task(shard.complete_txn(pid, commit)))
        await asyncio.sleep(0.01)
        await shard._write_snapshot(live)
        for task in settling:  # the coordinator stops before the listener's records
            task.cancel()
    assert plog.log_start_offset > 0  # the markers were trimmed with the rest
    again = await offsets.reload()
    assert [offset_of(again, p) for p in range(3)] == [10, -1, -1]
    assert not again.has_pending("g", "orders", 0) and not again.has_pending("g", "orders", 1)
    assert again.has_pending("g", "orders", 2)  # the open transaction's offset waits still
