"""The transaction coordinator's shard over a real partition log (local-directory store): what
it logs survives a reload (as a new coordinator replays the partition), markers are retried
until every partition acknowledged, a Prepare* found at load is finished, timeouts abort with a
bumped epoch. A fake clock and a fake marker channel."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.records import build_batch
from tidalmq_broker.storage.api import PartitionConfig, PartitionLog, StorageConfig
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.transactions.coordinator import Marker, TxnSettings, TxnShard
from tidalmq_broker.transactions.records import encode_key, encode_value
from tidalmq_broker.transactions.state import MAX_EPOCH, TxnError, TxnState, new_producer
from tidalmq_core.metadata import TXN_STATE_TOPIC
from tidalmq_core.model import TopicPartition

TP = TopicPartition(TXN_STATE_TOPIC, 0)
CONFIG = StorageConfig(
    flush_interval_ms=2,
    checkpoint_interval_s=3600,
    compaction_interval_s=3600,
    retention_check_interval_s=3600,
    garbage_sweep_interval_s=3600,
)
SETTINGS = TxnSettings(
    max_timeout_ms=60_000,
    timeout_check_interval_s=3600,
    marker_backoff_s=0.001,
    marker_backoff_max_s=0.002,
)
A, B = TopicPartition("orders", 0), TopicPartition("payments", 1)


class Markers:
    """Records every marker sent; `refuse` answers NOT_LEADER a number of times per partition,
    `gate` holds sends until set."""

    def __init__(self) -> None:
        self.sent: list[Marker] = []
        self.refuse: dict[TopicPartition, int] = {}
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, markers: list[Marker]) -> dict[TopicPartition, int]:
        await self.gate.wait()
        out: dict[TopicPartition, int] = {}
        for m in markers:
            if self.refuse.get(m.tp, 0) > 0:
                self.refuse[m.tp] -= 1
                out[m.tp] = ErrorCode.not_leader_or_follower
            else:
                self.sent.append(m)
                out[m.tp] = ErrorCode.none
        return out


class Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.engine = ObjectStreamEngine(LocalDirObjectStore(root), 0, CONFIG)
        self.epoch = 0
        self.now = 1_000_000
        self.next_pid = 1000
        self.markers = Markers()
        self.shard: TxnShard | None = None

    async def allocate(self) -> int:
        self.next_pid += 1
        return self.next_pid

    async def open(self) -> TxnShard:
        """(Re)open the partition at a new epoch and replay it into a new shard."""
        if self.shard is not None:
            self.shard.close()
            await self.engine.close_partition(TP)
        self.epoch += 1
        plog: PartitionLog = await self.engine.open_partition(
            TP, "txn-state", self.epoch, PartitionConfig()
        )
        self.shard = TxnShard(0, plog, SETTINGS, self.markers, self.allocate, lambda: self.now)
        await self.shard.load()
        return self.shard


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path / "objects")
    await harness.engine.start()
    try:
        yield harness
    finally:
        if harness.shard is not None:
            harness.shard.close()
        await harness.engine.stop()


async def settled(shard: TxnShard, tid: str) -> TxnState:
    for _ in range(500):
        state = shard.txns[tid].state
        if not state.preparing:
            return state
        await asyncio.sleep(0.01)
    raise AssertionError(f"{tid} stayed {state}")


async def test_commit_writes_markers_until_acknowledged_and_survives_reload(h: Harness) -> None:
    shard = await h.open()
    assert await shard.init_producer_id("t1", 30_000, None) == (1001, 0)
    assert await shard.init_producer_id("t1", 30_000, None) == (1001, 1)  # same id, new epoch
    await shard.add_partitions("t1", 1001, 1, {("orders", 0), ("payments", 1)})
    h.markers.refuse[B] = 3  # the leader of payments-1 moves: retried until written
    await shard.end_txn("t1", 1001, 1, True)
    assert await settled(shard, "t1") is TxnState.COMPLETE_COMMIT
    assert sorted(
        (m.tp, m.commit, m.producer_epoch, m.coordinator_epoch) for m in h.markers.sent
    ) == [(A, True, 1, 1), (B, True, 1, 1)]
    await shard.end_txn("t1", 1001, 1, True)  # a retried EndTxn: answered, nothing sent
    assert len(h.markers.sent) == 2
    again = await h.open()
    meta = again.txns["t1"]
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (
        TxnState.COMPLETE_COMMIT,
        1001,
        1,
    )
    with pytest.raises(TxnError) as fenced:
        await again.add_partitions("t1", 1001, 0, {("orders", 0)})
    assert fenced.value.code == ErrorCode.producer_fenced


async def test_a_prepared_transaction_is_finished_by_the_next_coordinator(h: Harness) -> None:
    shard = await h.open()
    pid, epoch = await shard.init_producer_id("t2", 30_000, None)
    await shard.add_partitions("t2", pid, epoch, {("orders", 0)})
    h.markers.gate.clear()  # the coordinator's partition moves before any marker is written
    await shard.end_txn("t2", pid, epoch, False)
    assert shard.txns["t2"].state is TxnState.PREPARE_ABORT
    h.markers.gate.set()
    h.markers.refuse[A] = 10**6  # the old coordinator gets nowhere ...
    new = await h.open()
    h.markers.refuse.clear()
    assert await settled(new, "t2") is TxnState.COMPLETE_ABORT  # ... the new one finishes
    assert [(m.tp, m.commit, m.coordinator_epoch) for m in h.markers.sent] == [(A, False, 2)]


async def test_a_timed_out_transaction_is_aborted_with_a_bumped_epoch(h: Harness) -> None:
    shard = await h.open()
    pid, epoch = await shard.init_producer_id("t3", 10_000, None)
    await shard.add_partitions("t3", pid, epoch, {("orders", 0)})
    h.now += 10_000
    assert await shard.abort_expired() == []
    h.now += 1
    assert await shard.abort_expired() == ["t3"]
    assert await settled(shard, "t3") is TxnState.COMPLETE_ABORT
    assert [(m.commit, m.producer_epoch) for m in h.markers.sent] == [(False, epoch + 1)]
    with pytest.raises(TxnError) as fenced:  # the zombie is fenced
        await shard.end_txn("t3", pid, epoch, True)
    assert fenced.value.code == ErrorCode.producer_fenced
    # KIP-360: the producer recovers with its old (id, epoch)
    assert await shard.init_producer_id("t3", 10_000, (pid, epoch)) == (pid, epoch + 2)


async def test_a_new_incarnation_aborts_the_open_transaction_first(h: Harness) -> None:
    shard = await h.open()
    pid, epoch = await shard.init_producer_id("t4", 30_000, None)
    await shard.add_partitions("t4", pid, epoch, {("orders", 0)})
    with pytest.raises(TxnError) as busy:
        await shard.init_producer_id("t4", 30_000, None)
    assert busy.value.code == ErrorCode.concurrent_transactions
    assert await settled(shard, "t4") is TxnState.COMPLETE_ABORT
    assert await shard.init_producer_id("t4", 30_000, None) == (pid, epoch + 2)
    with pytest.raises(TxnError) as too_long:
        await shard.init_producer_id("t4", 60_001, None)
    assert too_long.value.code == ErrorCode.invalid_transaction_timeout


async def test_snapshots_trim_the_log_and_replay_gives_the_same_state(h: Harness) -> None:
    shard = await h.open()
    shard._settings = dataclasses.replace(SETTINGS, snapshot_after_records=5)
    for i in range(4):
        await shard.init_producer_id(f"s{i}", 30_000, None)
    pid, epoch = await shard.init_producer_id("s0", 30_000, None)  # 5th record: a snapshot
    assert shard._snapshotting is not None
    await shard._snapshotting
    await shard.add_partitions("s0", pid, epoch, {("orders", 0)})  # after the snapshot
    plog = shard._log
    assert plog.log_start_offset == 5  # the 5 records before the snapshot are gone
    before = dict(shard.txns)
    again = await h.open()
    assert again.txns == before
    assert again.txns["s0"].state is TxnState.ONGOING and again.txns["s0"].producer_epoch == 1


async def test_idle_transactional_ids_expire_with_a_tombstone_that_replay_honours(
    h: Harness,
) -> None:
    shard = await h.open()
    shard._settings = dataclasses.replace(SETTINGS, id_expiration_ms=60_000)
    idle_pid, _ = await shard.init_producer_id("idle", 30_000, None)
    await shard.init_producer_id("busy", 30_000, None)
    h.now += 30_000
    await shard.init_producer_id("recent", 30_000, None)  # changed later: not yet
    pid, epoch = await shard.init_producer_id("busy", 30_000, None)
    await shard.add_partitions("busy", pid, epoch, {("orders", 0)})  # a transaction open
    h.now += 30_000
    assert await shard.expire_ids(chunk=1) == ["idle"]
    assert set(shard.txns) == {"busy", "recent"}
    h.now += 10**9  # "busy" is past its transaction timeout too: aborted, not forgotten
    assert await shard.expire_ids() == ["recent"]
    assert set(shard.txns) == {"busy"}
    again = await h.open()  # a new coordinator replays the log: the tombstones hold
    assert set(again.txns) == {"busy"}
    # an expired id starts again with a new producer id
    new_pid, new_epoch = await again.init_producer_id("idle", 30_000, None)
    assert new_pid != idle_pid and new_epoch == 0


async def test_a_compacted_log_is_not_snapshotted(h: Harness) -> None:
    """The log cleaner keeps a compacted transaction state log short (docs/compaction.md step
    7): no snapshot rewrites it or trims it."""
    shard = await h.open()
    shard._settings = dataclasses.replace(SETTINGS, snapshot_after_records=2)
    plog = shard._log
    plog.config = PartitionConfig(cleanup_policy=frozenset({"compact"}))  # type: ignore[misc]
    for i in range(6):
        await shard.init_producer_id(f"s{i}", 30_000, None)
    assert shard._snapshotting is None
    assert plog.log_start_offset == 0 and plog.high_watermark == 6


IDLE_IDS = (1_000, 10_000)


def count_lines(work: Callable[[], None]) -> int:
    """Python lines executed by `work` (sys.settrace; comprehension iterations included)."""
    lines = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    sys.settrace(lambda frame, event, arg: local)
    try:
        work()
    finally:
        sys.settrace(None)
    return lines


def check_timeouts(shard: TxnShard) -> list[str]:
    """abort_expired with nothing due: it finishes without waiting (no write), run inline."""
    coro = shard.abort_expired()
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    aborted: list[str] = done.value.value
    return aborted


async def test_the_timeout_check_looks_at_the_due_transactions_only(tmp_path: Path) -> None:
    """[M1] A shard with 1,000 and with 10,000 transactional ids (replayed from its log), two
    of them in a transaction: the timeout check costs the same (a walk over every id each
    interval, what it did before, is a line per id), and still aborts each when it is due."""
    work: dict[int, int] = {}
    for n in IDLE_IDS:
        h = Harness(tmp_path / f"ids-{n}")
        await h.engine.start()
        try:
            plog = await h.engine.open_partition(TP, "txn-state", 1, PartitionConfig())
            for first in range(0, n, 5_000):
                metas = [
                    new_producer(f"idle-{i}", i, 60_000, h.now)
                    for i in range(first, min(n, first + 5_000))
                ]
                await plog.append(
                    build_batch([(encode_key(m.transactional_id), encode_value(m)) for m in metas])
                )
            await h.engine.close_partition(TP)
            h.epoch = 1
            shard = await h.open()
            assert len(shard.txns) == n
            for tid, timeout in (("soon", 5_000), ("later", 50_000)):
                pid, epoch = await shard.init_producer_id(tid, timeout, None)
                await shard.add_partitions(tid, pid, epoch, {("orders", 0)})
            h.now += 5_000
            work[n] = count_lines(lambda shard=shard: check_timeouts(shard))
            h.now += 1
            assert await shard.abort_expired() == ["soon"]
            assert await settled(shard, "soon") is TxnState.COMPLETE_ABORT
            h.now += 100_000
            assert await shard.abort_expired() == ["later"]
            assert await settled(shard, "later") is TxnState.COMPLETE_ABORT
        finally:
            if h.shard is not None:
                h.shard.close()
            await h.engine.stop()
    small, large = work[IDLE_IDS[0]], work[IDLE_IDS[1]]
    assert large <= small + 20, (small, large)


async def test_tv2_ends_bump_the_epoch_and_an_overflow_survives_a_new_coordinator(
    h: Harness,
) -> None:
    """Transaction version 2 at the shard: EndTxn v5 answers the bumped epoch and the markers
    carry it; at an exhausted epoch a new producer id is allocated, the markers go out with the
    old id at the last epoch, and a coordinator that replays Prepare* completes to the new id."""
    shard = await h.open()
    pid, epoch = await shard.init_producer_id("t9", 30_000, None)
    await shard.add_partitions("t9", pid, epoch, {("orders", 0)}, tv2=True)
    assert await shard.end_txn("t9", pid, epoch, True, tv2=True) == (pid, epoch + 1)
    assert await settled(shard, "t9") is TxnState.COMPLETE_COMMIT
    assert [(m.producer_id, m.producer_epoch) for m in h.markers.sent] == [(pid, epoch + 1)]
    assert await shard.end_txn("t9", pid, epoch, True, tv2=True) == (pid, epoch + 1)  # retry
    # the epoch runs out: pretend many transactions went by
    await shard._write(dataclasses.replace(shard.txns["t9"], producer_epoch=MAX_EPOCH - 1))
    await shard.add_partitions("t9", pid, MAX_EPOCH - 1, {("orders", 0)}, tv2=True)
    h.markers.gate.clear()  # the coordinator moves before the markers are written
    new_pid, new_epoch = await shard.end_txn("t9", pid, MAX_EPOCH - 1, False, tv2=True)
    assert new_pid == h.next_pid and new_pid != pid and new_epoch == 0
    h.markers.gate.set()
    h.markers.refuse[A] = 10**6  # the old coordinator gets nowhere ...
    again = await h.open()
    h.markers.refuse.clear()
    assert await settled(again, "t9") is TxnState.COMPLETE_ABORT  # ... the new one finishes
    assert (h.markers.sent[-1].producer_id, h.markers.sent[-1].producer_epoch) == (pid, MAX_EPOCH)
    meta = again.txns["t9"]
    assert (meta.producer_id, meta.producer_epoch, meta.previous_producer_id) == (new_pid, 0, pid)
    # the client's retry with the old id at the exhausted epoch is answered with the new one
    assert await again.end_txn("t9", pid, MAX_EPOCH - 1, False, tv2=True) == (new_pid, 0)
