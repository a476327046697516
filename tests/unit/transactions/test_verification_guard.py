"""KIP-890's verification guard and TxnOffsetCommit's verification, on real partition logs
against a real transaction coordinator shard: a transactional write whose coordinator answer
predates the marker of its own transaction is refused (Produce and TxnOffsetCommit alike)
instead of opening a transaction no marker closes; the group coordinator refuses offsets of a
producer that never added the group (AddOffsetsToTxn) or whose epoch is stale, with Kafka's
codes per version."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.errors import KafkaError
from tidalmq_broker.apis.produce import _append
from tidalmq_broker.apis.transactions import _verify_offsets
from tidalmq_broker.groups.coordinator import CommittedOffset, GroupSettings, GroupShard
from tidalmq_broker.protocol.records import TRANSACTIONAL_FLAG, build_batch
from tidalmq_broker.storage.api import (
    UNVERIFIED,
    InvalidProducerEpoch,
    InvalidTxnState,
    PartitionConfig,
    PartitionLog,
)
from tidalmq_broker.storage.engine import ObjectStreamEngine
from tidalmq_broker.storage.objectstore import LocalDirObjectStore
from tidalmq_broker.transactions.coordinator import TxnSettings, TxnShard
from tidalmq_broker.transactions.state import TV2, TxnState
from tidalmq_broker.transactions.verification import TxnVerifier, txn_offset_commit_error
from tidalmq_core.metadata import (
    OFFSETS_TOPIC,
    TRANSACTION_VERSION,
    TXN_STATE_TOPIC,
    ClusterMetadata,
    PartitionState,
    TopicInfo,
)
from tidalmq_core.model import TopicPartition

from tests.unit.transactions.test_apis import MemoryLog, no_markers
from tests.unit.transactions.test_coordinator import CONFIG

ORDERS = TopicPartition("orders", 0)
PAYMENTS = TopicPartition("payments", 0)
OFFSETS = TopicPartition(OFFSETS_TOPIC, 0)


class Cluster:
    """One broker's real partition logs (`orders-0`, `__consumer_offsets-0`), a real
    coordinator shard for transactional id "t" and the verifier asking it in process.
    `before_answer` runs while a question is out (what may land meanwhile)."""

    def __init__(self, root: Path) -> None:
        self.engine = ObjectStreamEngine(LocalDirObjectStore(root), 0, CONFIG)
        self.before_answer: Callable[[], Awaitable[None]] | None = None
        self.questions = 0

    async def start(self) -> None:
        await self.engine.start()
        self.orders = await self.engine.open_partition(ORDERS, "orders", 1, PartitionConfig())
        self.offsets = await self.engine.open_partition(OFFSETS, "offsets", 1, PartitionConfig())
        self.offsets_like = await self.engine.open_partition(
            PAYMENTS, "payments", 1, PartitionConfig()
        )
        pids = iter(range(9000, 9100))

        async def allocate() -> int:
            return next(pids)

        self.txn = TxnShard(
            0,
            MemoryLog(),
            TxnSettings(max_timeout_ms=60_000),
            no_markers,  # type: ignore[arg-type]
            allocate,
        )
        await self.txn.load()
        coordinator = SimpleNamespace(partition_for=lambda tid: 0, shard=lambda tid: self.txn)
        meta = ClusterMetadata("c", version=1)
        meta.topics = {
            TXN_STATE_TOPIC: TopicInfo(
                TXN_STATE_TOPIC, str(uuid.UUID(int=5)), [PartitionState(0, 0, [0])], internal=True
            )
        }
        host = SimpleNamespace(
            broker_id=0, metadata=meta, controller=None, transactions=coordinator
        )
        self.verifier = TxnVerifier(host)  # type: ignore[arg-type]
        self._coordinator_answer = self.verifier.ask
        self.groups = GroupShard(0, self.offsets, GroupSettings())
        await self.groups.load()
        self.pid, _ = await self.txn.init_producer_id("t", 60_000, None)

    async def ask(
        self, tp: TopicPartition, tid: str, producer_id: int, epoch: int, *, add: bool = False
    ) -> int:
        self.questions += 1
        code = await self._coordinator_answer(tp, tid, producer_id, epoch, add=add)
        if self.before_answer is not None:
            await self.before_answer()
        return code

    async def commit_offsets(self, epoch: int, version: int = 4) -> set[int]:
        async def verify(tp: TopicPartition, producer_id: int, producer_epoch: int) -> int:
            return txn_offset_commit_error(
                await self.ask(tp, "t", producer_id, producer_epoch), version
            )

        results = await self.groups.txn_commit(
            group_id="g",
            producer_id=self.pid,
            producer_epoch=epoch,
            generation=-1,
            member_id="",
            group_instance_id=None,
            offsets={("orders", 0): CommittedOffset(7, -1, None)},
            verify=verify,
        )
        return set(results.values())

    async def marker(self, plog: PartitionLog, commit: bool, epoch: int = 0) -> None:
        await plog.write_txn_marker(self.pid, epoch, commit=commit, coordinator_epoch=1)
        if plog is self.offsets:
            await self.groups.complete_txn(self.pid, commit)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path / "objects")
    await c.start()
    try:
        yield c
    finally:
        await c.engine.stop()


def batch(pid: int, epoch: int, seq: int) -> bytes:
    return build_batch(
        [(b"k", b"v")],
        timestamp_ms=1,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        attributes=TRANSACTIONAL_FLAG,
    )


async def test_a_guard_voided_by_a_marker_refuses_the_write_and_the_lso_moves_on(
    cluster: Cluster,
) -> None:
    plog, pid = cluster.orders, cluster.pid
    guard = plog.start_verification(pid)
    assert plog.start_verification(pid) is guard  # one verification under way per producer
    await plog.append(batch(pid, 0, 0), verification=guard)  # verified: the transaction opens
    await cluster.marker(plog, commit=True)
    assert plog.last_stable_offset == plog.high_watermark
    # the next transaction's batch verified before that marker landed: the guard is void
    late = plog.start_verification(pid)
    await cluster.marker(plog, commit=True)  # (a retried marker of the same transaction)
    hwm = plog.high_watermark
    with pytest.raises(InvalidTxnState):
        await plog.append(batch(pid, 0, 1), verification=late)
    # a batch that asked nothing because the transaction was going on, after it ended
    with pytest.raises(InvalidTxnState):
        await plog.append(batch(pid, 0, 1), verification=UNVERIFIED)
    assert plog.high_watermark == hwm and plog.last_stable_offset == hwm  # nothing hangs
    # a fresh verification is accepted, then batches of the open transaction need none
    await plog.append(batch(pid, 0, 1), verification=plog.start_verification(pid))
    await plog.append(batch(pid, 0, 2), verification=UNVERIFIED)
    assert plog.last_stable_offset == hwm  # held by the open transaction, as it must be
    # a refused verification gives its guard back; without verification nothing is checked
    refused = plog.start_verification(pid + 1)
    plog.end_verification(pid + 1, refused)
    assert plog.start_verification(pid + 1) is not refused
    # two requests hold one guard: the first giving it back leaves it valid for the other
    shared = plog.start_verification(pid + 2)
    assert plog.start_verification(pid + 2) is shared
    plog.end_verification(pid + 2, shared)
    await plog.append(batch(pid + 2, 0, 0), verification=shared)
    assert plog.in_transaction(pid + 2, 0)


async def test_a_produce_verified_before_the_marker_of_its_transaction_is_refused(
    cluster: Cluster,
) -> None:
    """The race the guard closes, through Produce's own path (apis/produce._append): the
    coordinator answers that orders-0 is in the transaction, then the commit marker lands
    before the batch is appended."""
    pid = cluster.pid
    await cluster.txn.add_partitions("t", pid, 0, {("orders", 0)})
    broker: Any = SimpleNamespace(
        txn_verifier=SimpleNamespace(pending=cluster.verifier.pending, gate=cluster.verifier.gate)
    )

    async def marker_lands() -> None:
        await cluster.marker(cluster.orders, commit=True)

    cluster.before_answer = marker_lands
    cluster.verifier.ask = cluster.ask  # type: ignore[method-assign]
    with pytest.raises(InvalidTxnState):
        await _append(broker, cluster.orders, batch(pid, 0, 0), -1, "t", 11)
    assert cluster.questions == 1
    assert cluster.orders.last_stable_offset == cluster.orders.high_watermark
    # without the race the same batch is verified and appended
    cluster.before_answer = None
    await _append(broker, cluster.orders, batch(pid, 0, 0), -1, "t", 11)
    assert cluster.orders.in_transaction(pid, 0) and cluster.questions == 2


async def test_txn_offset_commit_needs_add_offsets_and_the_current_epoch(
    cluster: Cluster,
) -> None:
    pid = cluster.pid
    hwm = cluster.offsets.high_watermark
    # AddOffsetsToTxn never added the group's partition: refused, nothing written or pending
    assert await cluster.commit_offsets(0, version=4) == {ErrorCode.transaction_abortable}
    assert await cluster.commit_offsets(0, version=3) == {ErrorCode.invalid_txn_state}
    assert cluster.offsets.high_watermark == hwm and not cluster.groups.pending
    await cluster.txn.add_partitions("t", pid, 0, {(OFFSETS_TOPIC, 0)})  # AddOffsetsToTxn
    assert await cluster.commit_offsets(0) == {ErrorCode.none}
    asked = cluster.questions
    assert await cluster.commit_offsets(0) == {ErrorCode.none}  # in the transaction: no question
    assert cluster.questions == asked
    assert cluster.groups.fetch_offsets("g", [("orders", 0)])[("orders", 0)].offset == -1
    # abort: the offsets vanish; a zombie of the old epoch is then fenced
    await cluster.txn.end_txn("t", pid, 0, False)
    await cluster.marker(cluster.offsets, commit=False)
    assert not cluster.groups.pending
    assert cluster.groups.fetch_offsets("g", [("orders", 0)])[("orders", 0)].offset == -1
    assert await cluster.txn.init_producer_id("t", 60_000, None) == (pid, 1)
    assert await cluster.commit_offsets(0) == {ErrorCode.invalid_producer_epoch}
    # the new epoch's transaction: committed offsets become visible at the commit marker only
    await cluster.txn.add_partitions("t", pid, 1, {(OFFSETS_TOPIC, 0)})
    assert await cluster.commit_offsets(1) == {ErrorCode.none}
    assert cluster.groups.fetch_offsets("g", [("orders", 0)])[("orders", 0)].offset == -1
    await cluster.marker(cluster.offsets, commit=True, epoch=1)
    assert cluster.groups.fetch_offsets("g", [("orders", 0)])[("orders", 0)].offset == 7


async def test_txn_offsets_verified_before_the_marker_of_their_transaction_are_refused(
    cluster: Cluster,
) -> None:
    pid = cluster.pid
    await cluster.txn.add_partitions("t", pid, 0, {(OFFSETS_TOPIC, 0)})

    async def marker_lands() -> None:
        await cluster.marker(cluster.offsets, commit=True)

    cluster.before_answer = marker_lands
    assert await cluster.commit_offsets(0) == {ErrorCode.invalid_txn_state}
    assert not cluster.groups.pending  # nothing waits for a marker that already came
    assert cluster.offsets.last_stable_offset == cluster.offsets.high_watermark
    assert not cluster.offsets.in_transaction(pid, 0)


async def test_the_unreachable_coordinator_and_the_others_as_kafka_answers_them() -> None:
    await asyncio.sleep(0)
    mapped = {
        code: txn_offset_commit_error(code, 4)
        for code in (
            ErrorCode.none,
            ErrorCode.producer_fenced,
            ErrorCode.network_exception,
            ErrorCode.not_enough_replicas,
            ErrorCode.not_coordinator,
            ErrorCode.concurrent_transactions,
            ErrorCode.invalid_producer_id_mapping,
        )
    }
    assert mapped == {
        ErrorCode.none: ErrorCode.none,
        ErrorCode.producer_fenced: ErrorCode.invalid_producer_epoch,
        ErrorCode.network_exception: ErrorCode.coordinator_load_in_progress,
        ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator: ErrorCode.not_coordinator,
        ErrorCode.concurrent_transactions: ErrorCode.concurrent_transactions,
        ErrorCode.invalid_producer_id_mapping: ErrorCode.invalid_producer_id_mapping,
    }


def tv2_broker(cluster: Cluster, level: int) -> Any:
    """What Produce's path reads of a broker at `transaction.version` `level`."""
    meta = ClusterMetadata("c", version=1)
    meta.features[TRANSACTION_VERSION] = level
    return SimpleNamespace(
        metadata=meta, txn_verifier=cluster.verifier, txn_partitions=cluster.verifier
    )


async def test_tv2_produce_adds_the_partition_and_a_late_batch_of_the_old_epoch_is_fenced(
    cluster: Cluster,
) -> None:
    """Transaction version 2 through Produce's own path: v12 at level 2 adds the partition
    (no AddPartitionsToTxn); EndTxn v5 bumps the epoch and the marker carries it; a batch of
    the finished transaction's epoch arriving late is refused, by the partition that had the
    marker and by the coordinator for one that did not."""
    pid = cluster.pid
    broker = tv2_broker(cluster, 2)
    await _append(broker, cluster.orders, batch(pid, 0, 0), -1, "t", 12)
    assert cluster.orders.in_transaction(pid, 0)
    assert cluster.txn.txns["t"].partitions == {("orders", 0)}
    assert cluster.txn.txns["t"].txn_version == TV2
    assert await cluster.txn.end_txn("t", pid, 0, True, tv2=True) == (pid, 1)
    await cluster.marker(cluster.orders, commit=True, epoch=1)  # the marker at the new epoch
    assert cluster.orders.last_stable_offset == cluster.orders.high_watermark
    hwm = cluster.orders.high_watermark
    # a zombie's batch of the old epoch: the coordinator fences it (the add at epoch 0) on
    # the partition that had the marker and on one the marker never reached
    for plog in (cluster.orders, cluster.offsets_like):
        with pytest.raises(KafkaError) as refused:
            await _append(broker, plog, batch(pid, 0, 1), -1, "t", 12)
        assert refused.value.code == ErrorCode.invalid_producer_epoch
    # and the partition itself, past the marker at the bumped epoch, by the epoch alone
    with pytest.raises(InvalidProducerEpoch):
        await cluster.orders.append(batch(pid, 0, 1))
    assert cluster.orders.high_watermark == hwm
    # the next transaction at the new epoch starts at sequence 0 and is added again
    await _append(broker, cluster.orders, batch(pid, 1, 0), -1, "t", 12)
    assert cluster.txn.txns["t"].state is TxnState.ONGOING


async def test_produce_v12_at_level_1_is_only_verified(cluster: Cluster) -> None:
    pid = cluster.pid
    with pytest.raises(KafkaError) as refused:  # never added: not in the transaction
        await _append(tv2_broker(cluster, 1), cluster.orders, batch(pid, 0, 0), -1, "t", 12)
    assert refused.value.code == ErrorCode.transaction_abortable
    assert cluster.txn.txns["t"].state is TxnState.EMPTY


async def test_tv2_txn_offset_commit_adds_the_group_partition(cluster: Cluster) -> None:
    """TxnOffsetCommit v5 at level 2 (no AddOffsetsToTxn): the group's partition joins."""
    pid = cluster.pid
    verify = _verify_offsets(tv2_broker(cluster, 2), "t", 5)
    assert verify is not None
    results = await cluster.groups.txn_commit(
        group_id="g",
        producer_id=pid,
        producer_epoch=0,
        generation=-1,
        member_id="",
        group_instance_id=None,
        offsets={("orders", 0): CommittedOffset(7, -1, None)},
        verify=verify,
    )
    assert set(results.values()) == {ErrorCode.none}
    assert cluster.txn.txns["t"].partitions == {(OFFSETS_TOPIC, 0)}
    # at level 1 the same version is only verified (AddOffsetsToTxn must have added it)
    level1 = _verify_offsets(tv2_broker(cluster, 1), "t", 5)
    assert level1 is not None
    assert await level1(TopicPartition("other", 0), pid, 0) == ErrorCode.transaction_abortable


async def test_a_downgrade_to_level_1_mid_transaction_aborts_it_and_loses_nothing(
    cluster: Cluster,
) -> None:
    """`kafka-features downgrade --feature transaction.version=1` while a TV2 transaction is
    open (docs/transactions-v2.md, "What downgrade does"): the partitions it added keep taking
    its batches (verified), a partition new to it is refused as abortable (only verified at
    level 1, and never added), and its EndTxn v5 ends it without a bump; the client goes on at
    its epoch and nothing of the transaction is left open."""
    pid = cluster.pid
    await _append(tv2_broker(cluster, 2), cluster.orders, batch(pid, 0, 0), -1, "t", 12)
    level1 = tv2_broker(cluster, 1)
    await _append(level1, cluster.orders, batch(pid, 0, 1), -1, "t", 12)
    with pytest.raises(KafkaError) as refused:
        await _append(level1, cluster.offsets_like, batch(pid, 0, 0), -1, "t", 12)
    assert refused.value.code == ErrorCode.transaction_abortable
    assert cluster.txn.txns["t"].partitions == {("orders", 0)}
    assert await cluster.txn.end_txn("t", pid, 0, False, tv2=False) == (pid, 0)
    await cluster.marker(cluster.orders, commit=False, epoch=0)
    assert cluster.orders.last_stable_offset == cluster.orders.high_watermark
