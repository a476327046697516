"""Group shard snapshots (our compaction of `__consumer_offsets`) lose nothing: not a change that
was durable but not yet applied in memory when the snapshot started, not the stored generation of
a group that is rebalancing. Real partition logs on a local-directory store; each test reloads
the shard from a re-opened partition, as a new coordinator would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tidalmq_broker.groups.coordinator import CommittedOffset, GroupSettings, GroupShard
from tidalmq_broker.groups.group import GroupState
from tidalmq_broker.storage.api import AppendResult, PartitionConfig, PartitionLog, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_core.metadata import OFFSETS_TOPIC
from tidalmq_core.model import TopicPartition

TP = TopicPartition(OFFSETS_TOPIC, 0)
CONFIG = StorageConfig(
    flush_interval_ms=2,
    checkpoint_interval_s=3600,
    compaction_interval_s=3600,
    retention_check_interval_s=3600,
    garbage_sweep_interval_s=3600,
)


class HeldLog:
    """A real partition log whose next append, once durable, is held before it returns: the
    window in which the log has a record the shard has not applied in memory yet."""

    def __init__(self, inner: PartitionLog) -> None:
        self._inner = inner
        self.hold: asyncio.Event | None = None
        self.held = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, records: bytes, *, acks: int = -1, owned: bool = False) -> AppendResult:
        hold, self.hold = self.hold, None
        result = await self._inner.append(records, acks=acks, owned=owned)
        if hold is not None:
            self.held.set()
            await hold.wait()
        return result


class Offsets:
    """An engine over a local directory with `__consumer_offsets-0` open at some epoch."""

    def __init__(self, root: Path) -> None:
        self.engine = ObjectStreamEngine(LocalDirObjectStore(root), 0, CONFIG)
        self.epoch = 0

    async def open(self) -> PartitionLog:
        self.epoch += 1
        return await self.engine.open_partition(TP, "offsets-id", self.epoch, PartitionConfig())

    async def reload(self, settings: GroupSettings) -> GroupShard:
        """Close and re-open the partition, replay it into a new shard."""
        await self.engine.close_partition(TP)
        shard = GroupShard(0, await self.open(), settings)
        await shard.load()
        return shard


@pytest.fixture
async def offsets(tmp_path: Path) -> AsyncIterator[Offsets]:
    o = Offsets(tmp_path / "objects")
    await o.engine.start()
    try:
        yield o
    finally:
        await o.engine.stop()


async def _commit(shard: GroupShard, group: str, partition: int, offset: int) -> None:
    codes = await shard.commit(
        group_id=group,
        generation=-1,
        member_id="",
        offsets={("t", partition): CommittedOffset(offset, -1, "")},
    )
    assert codes == {("t", partition): 0}


async def _snapshotted(shard: GroupShard, plog: PartitionLog) -> None:
    """Wait for the snapshots the shard started, and check one trimmed the log."""
    await asyncio.gather(*shard._background)
    assert plog.log_start_offset > 0


async def test_a_durable_commit_not_yet_applied_survives_a_snapshot(offsets: Offsets) -> None:
    settings = GroupSettings(snapshot_after_records=2)
    plog = HeldLog(await offsets.open())
    shard = GroupShard(0, plog, settings)  # type: ignore[arg-type]
    await shard.load()
    await _commit(shard, "g", 0, 10)

    # commit 1 is durable but held before the shard applies it; meanwhile commit 2 reaches
    # the snapshot threshold and the snapshot starts
    plog.hold = release = asyncio.Event()
    held_commit = asyncio.create_task(_commit(shard, "g", 1, 11))
    await plog.held.wait()
    await _commit(shard, "g", 2, 12)
    await asyncio.sleep(0.2)  # the snapshot task runs as far as it can
    release.set()
    await held_commit
    await _snapshotted(shard, plog)
    shard.close()

    reloaded = await offsets.reload(settings)
    found = reloaded.fetch_offsets("g", [("t", 0), ("t", 1), ("t", 2)])
    assert {tp: c.offset for tp, c in found.items()} == {("t", 0): 10, ("t", 1): 11, ("t", 2): 12}
    reloaded.close()


async def test_commits_during_a_snapshot_wait_and_are_kept(offsets: Offsets) -> None:
    settings = GroupSettings(snapshot_after_records=5)
    plog = await offsets.open()
    shard = GroupShard(0, plog, settings)
    await shard.load()
    # many concurrent commits across the snapshot threshold, some of them while it writes
    await asyncio.gather(*(_commit(shard, f"g{i % 3}", i, 100 + i) for i in range(40)))
    await _snapshotted(shard, plog)
    await asyncio.gather(*(_commit(shard, "late", 0, 7) for _ in range(2)))
    shard.close()

    reloaded = await offsets.reload(settings)
    for i in range(40):
        assert reloaded.fetch_offsets(f"g{i % 3}", [("t", i)])[("t", i)].offset == 100 + i
    assert reloaded.fetch_offsets("late", [("t", 0)])[("t", 0)].offset == 7
    reloaded.close()


async def test_a_rebalancing_group_keeps_its_generation(offsets: Offsets) -> None:
    settings = GroupSettings(snapshot_after_records=3, initial_rebalance_delay_ms=0)
    plog = await offsets.open()
    shard = GroupShard(0, plog, settings)
    await shard.load()
    join = {
        "group_id": "g",
        "group_instance_id": None,
        "client_id": "c",
        "client_host": "h",
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 10_000,
        "protocol_type": "consumer",
        "protocols": [("range", b"")],
        "require_known_member_id": False,
    }
    first = await shard.join(member_id="", **join)
    assert first.generation == 1
    code, _, _, _ = await shard.sync(
        group_id="g",
        generation=1,
        member_id=first.member_id,
        protocol_type="consumer",
        protocol_name="range",
        assignments={first.member_id: b"all"},
    )
    assert code == 0
    # a second member joins: the group waits for the first to rejoin (PreparingRebalance)
    second = asyncio.create_task(shard.join(member_id="", **join))
    await asyncio.sleep(0.05)
    assert shard.groups["g"].state is GroupState.PREPARING_REBALANCE
    await _commit(shard, "other", 0, 1)
    await _commit(shard, "other", 1, 2)  # the third record since load: snapshot
    await _snapshotted(shard, plog)
    shard.close()
    await second

    reloaded = await offsets.reload(settings)
    group = reloaded.groups.get("g")
    assert group is not None, "the rebalancing group was dropped by the snapshot"
    assert group.generation == 1 and list(group.members) == [first.member_id]
    assert group.members[first.member_id].assignment == b"all"
    reloaded.close()


async def test_a_compacted_log_is_not_snapshotted(offsets: Offsets) -> None:
    """The log cleaner keeps a compacted `__consumer_offsets` short (docs/compaction.md step
    7): no snapshot rewrites its live keys or trims it."""
    settings = GroupSettings(snapshot_after_records=2)
    plog = await offsets.open()
    plog.config = PartitionConfig(cleanup_policy=frozenset({"compact"}))  # type: ignore[misc]
    shard = GroupShard(0, plog, settings)
    await shard.load()
    for i in range(6):
        await _commit(shard, "g", i, 100 + i)
    assert not shard._background
    assert plog.log_start_offset == 0 and plog.high_watermark == 6
    shard.close()
