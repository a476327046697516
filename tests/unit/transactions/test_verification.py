"""KIP-890's partition-side verification (transactions/verification.py) against a real
coordinator shard: the answers a producer gets by Produce version, one question per partition
and transaction however many batches wait on it, their arrival order kept, and the same
answers when the coordinator is on another broker (the relayed control call's document)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode
from tidalmq_broker.transactions.coordinator import TxnSettings, TxnShard
from tidalmq_broker.transactions.state import TxnState
from tidalmq_broker.transactions.verification import (
    TxnVerifier,
    answer_control_call,
    produce_error,
)
from tidalmq_core.metadata import TXN_STATE_TOPIC, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition

from tests.unit.transactions.test_apis import MemoryLog, no_markers

TP = TopicPartition("orders", 0)
OTHER = TopicPartition("orders", 1)


class CountingControl:
    """The controller's relay as the coordinator's broker answers it (answer_control_call on
    the document the leader sends), counting the questions."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self.calls = 0

    async def forward_txn_verification(self, broker_id: int, doc: dict[str, Any]) -> Any:
        self.calls += 1
        await asyncio.sleep(0.01)  # an answer takes a round trip: batches queue meanwhile
        return await answer_control_call(self.coordinator, doc)


async def setup(coordinator_broker: int) -> tuple[TxnVerifier, TxnShard, CountingControl, int]:
    pids = iter(range(9000, 9100))

    async def allocate() -> int:
        return next(pids)

    shard = TxnShard(
        0,
        MemoryLog(),
        TxnSettings(max_timeout_ms=60_000),
        no_markers,  # type: ignore[arg-type]
        allocate,
    )
    await shard.load()
    coordinator = SimpleNamespace(partition_for=lambda tid: 0, shard=lambda tid: shard)
    control = CountingControl(coordinator)
    meta = ClusterMetadata("c", version=1)
    meta.topics = {
        TXN_STATE_TOPIC: TopicInfo(
            TXN_STATE_TOPIC,
            str(uuid.UUID(int=5)),
            [PartitionState(coordinator_broker, 0, [0])],
            internal=True,
        )
    }
    host = SimpleNamespace(broker_id=0, metadata=meta, controller=control, transactions=coordinator)
    pid, _epoch = await shard.init_producer_id("t", 60_000, None)
    return TxnVerifier(host), shard, control, pid  # type: ignore[arg-type]


def test_produce_answers_by_version_as_kafka() -> None:
    assert produce_error(ErrorCode.transaction_abortable, 10)[0] == ErrorCode.invalid_txn_state
    assert produce_error(ErrorCode.transaction_abortable, 11)[0] == ErrorCode.transaction_abortable
    assert produce_error(ErrorCode.producer_fenced, 11)[0] == ErrorCode.invalid_producer_epoch
    retriable, message = produce_error(ErrorCode.not_coordinator, 9)
    assert retriable == ErrorCode.not_enough_replicas and "NOT_COORDINATOR" in (message or "")
    assert produce_error(ErrorCode.invalid_producer_id_mapping, 9)[0] == (
        ErrorCode.invalid_producer_id_mapping
    )


async def run_batches(verifier: TxnVerifier, pid: int, tp: TopicPartition, n: int) -> list[Any]:
    enqueued: list[tuple[int, int]] = []

    def batch(i: int) -> Any:
        def enqueue(code: int) -> Any:
            enqueued.append((i, code))
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            done.set_result(i)
            return done

        return enqueue

    await asyncio.gather(*(verifier.gate(tp, "t", pid, 0, batch(i)) for i in range(n)))
    return enqueued


async def test_one_question_per_partition_and_batches_keep_their_order() -> None:
    for coordinator_broker in (0, 1):  # in process, then relayed to another broker
        verifier, shard, control, pid = await setup(coordinator_broker)
        # never added: every waiting batch gets the refusal, after one question
        refused = await run_batches(verifier, pid, TP, 5)
        assert refused == [(i, ErrorCode.transaction_abortable) for i in range(5)]
        await shard.add_partitions("t", pid, 0, {("orders", 0)})
        accepted = await run_batches(verifier, pid, TP, 5)
        assert accepted == [(i, ErrorCode.none) for i in range(5)]
        assert not verifier.pending(TP, pid)
        assert await run_batches(verifier, pid, OTHER, 1) == [(0, ErrorCode.transaction_abortable)]
        assert control.calls == (3 if coordinator_broker == 1 else 0)


async def _value(code: int) -> int:
    return code


async def test_a_late_batch_after_the_end_an_older_epoch_and_another_producer_are_refused() -> None:
    verifier, shard, _control, pid = await setup(1)
    await shard.add_partitions("t", pid, 0, {("orders", 0)})
    assert await verifier.gate(TP, "t", pid, 0, _value) == ErrorCode.none
    await shard.end_txn("t", pid, 0, True)
    for _ in range(200):  # the markers (acknowledged at once here), then CompleteCommit
        meta = shard.describe("t")
        if meta is not None and meta.state is TxnState.COMPLETE_COMMIT:
            break
        await asyncio.sleep(0.01)
    # a batch of the finished transaction arriving late would open a transaction no marker
    # closes: refused
    assert await verifier.gate(TP, "t", pid, 0, _value) == ErrorCode.transaction_abortable
    assert await shard.init_producer_id("t", 60_000, None) == (pid, 1)
    assert await verifier.gate(TP, "t", pid, 0, _value) == ErrorCode.producer_fenced
    assert await verifier.gate(TP, "t", pid + 1, 1, _value) == (
        ErrorCode.invalid_producer_id_mapping
    )


async def test_a_tv2_add_joins_the_transaction_in_process_and_over_the_relay() -> None:
    """Transaction version 2's implicit add (Produce v12, TxnOffsetCommit v5): the same gate
    asks the coordinator to add the partition, in process or relayed to its broker (the
    document carries `add`); a stale epoch is fenced by the add."""
    for coordinator_broker in (0, 1):
        verifier, shard, control, pid = await setup(coordinator_broker)
        assert await verifier.gate(TP, "t", pid, 0, _value, add=True) == ErrorCode.none
        assert await verifier.gate(OTHER, "t", pid, 0, _value, add=True) == ErrorCode.none
        meta = shard.describe("t")
        assert meta is not None and meta.state is TxnState.ONGOING
        assert meta.partitions == {("orders", 0), ("orders", 1)} and meta.txn_version == 2
        assert await shard.end_txn("t", pid, 0, True, tv2=True) == (pid, 1)
        for _ in range(200):
            if shard.txns["t"].state is TxnState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0.01)
        assert await verifier.gate(TP, "t", pid, 0, _value, add=True) == ErrorCode.producer_fenced
        assert control.calls == (3 if coordinator_broker == 1 else 0)
