"""KIP-890 part 1, the partition leader's defence against hanging transactions: before a
transactional batch is appended to a partition where its producer has no transaction going on,
the leader asks the transaction coordinator whether the partition was added to that producer's
ongoing transaction at that epoch (AddPartitionsToTxn v4+ with `verify_only`, Kafka's
AddPartitionsToTxnManager). A partition never added (a late batch of a finished transaction, a
client skipping AddPartitionsToTxn) is refused instead of opening a transaction no marker will
ever close, which would hold the last stable offset, and every read_committed consumer, forever.

How the question travels (docs/transactions.md, "Verification"): in process when this broker
coordinates the transactional id; otherwise over the control plane as markers do (the
controller relays it to the coordinator's control endpoint `/v1/transactions/verify`).

One round trip per partition per transaction: once a verified batch is enqueued the partition
itself knows the transaction is going on there (its producer state), and the batches that
arrive while a verification is in flight wait for that same answer, then enqueue in arrival
order (so a producer's pipelined batches keep their sequence order)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from tidalmq_controller import ControllerClient
from tidalmq_core.metadata import NO_LEADER, TXN_STATE_TOPIC, ClusterMetadata
from tidalmq_core.model import TopicPartition

from tidalmq_broker.metrics import TXN_PARTITION_CHECKS
from tidalmq_broker.transactions.coordinator import TransactionCoordinator
from tidalmq_broker.transactions.state import TxnError

log = logging.getLogger(__name__)

MAX_PARTITIONS_PER_CALL = 10_000  # a control call asking about more is refused (bounded input)

# Kafka answers these as NOT_ENOUGH_REPLICAS to the producer, which retries the batch
# (ReplicaManager: "Unable to verify the partition has been added to the transaction").
_RETRIABLE = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.concurrent_transactions,
        ErrorCode.request_timed_out,
        ErrorCode.network_exception,
    }
)
FIRST_PRODUCE_VERSION_WITH_ABORTABLE = 11  # KIP-890: TRANSACTION_ABORTABLE from Produce v11


def produce_error(code: int, produce_version: int) -> tuple[int, str | None]:
    """The Produce answer to a failed verification, as Kafka gives it: PRODUCER_FENCED as
    INVALID_PRODUCER_EPOCH; TRANSACTION_ABORTABLE as INVALID_TXN_STATE to versions before 11;
    coordinator trouble as the retriable NOT_ENOUGH_REPLICAS; anything else as it came."""
    if code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch, None
    if code == ErrorCode.transaction_abortable:
        if produce_version < FIRST_PRODUCE_VERSION_WITH_ABORTABLE:
            return ErrorCode.invalid_txn_state, "the partition was not added to the transaction"
        return code, "the partition was not added to the transaction"
    if code in _RETRIABLE:
        name = ErrorCode(code).name.upper()
        return (
            ErrorCode.not_enough_replicas,
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {name}",
        )
    return code, None


FIRST_TXN_OFFSET_COMMIT_VERSION_WITH_ABORTABLE = 4  # KIP-890


def txn_offset_commit_error(code: int, version: int) -> int:
    """The TxnOffsetCommit answer to a failed verification of the group's `__consumer_offsets`
    partition, as Kafka 4.x's group coordinator gives it (AddPartitionsToTxnManager, then
    CoordinatorOperationExceptionHelper): PRODUCER_FENCED as INVALID_PRODUCER_EPOCH;
    TRANSACTION_ABORTABLE (AddOffsetsToTxn never added the group) as INVALID_TXN_STATE to
    versions before 4; an unreachable coordinator (NETWORK_EXCEPTION) as the retriable
    COORDINATOR_LOAD_IN_PROGRESS, NOT_ENOUGH_REPLICAS and REQUEST_TIMED_OUT as
    COORDINATOR_NOT_AVAILABLE; the rest (NOT_COORDINATOR, CONCURRENT_TRANSACTIONS, ...) as
    it came."""
    if code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    if code == ErrorCode.transaction_abortable:
        if version < FIRST_TXN_OFFSET_COMMIT_VERSION_WITH_ABORTABLE:
            return ErrorCode.invalid_txn_state
        return code
    if code == ErrorCode.network_exception:
        return ErrorCode.coordinator_load_in_progress
    if code in (ErrorCode.not_enough_replicas, ErrorCode.request_timed_out):
        return ErrorCode.coordinator_not_available
    return code


def verify_here(
    coordinator: TransactionCoordinator,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: set[tuple[str, int]],
) -> dict[tuple[str, int], int]:
    """The coordinator's verify-only answer (AddPartitionsToTxn v4 with verify_only), asked of
    the coordinator in this process."""
    try:
        shard = coordinator.shard(transactional_id)
        answer = shard.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)
    except TxnError as exc:
        return dict.fromkeys(partitions, int(exc.code))
    return {tp: int(code) for tp, code in answer.items()}


async def add_here(
    coordinator: TransactionCoordinator,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: set[tuple[str, int]],
) -> dict[tuple[str, int], int]:
    """Transaction version 2's implicit add (AddPartitionsToTxn v5 with verify_only false,
    broker to broker): the partitions join the producer's transaction, which they start if
    none is open, answered once the coordinator's record is durable."""
    try:
        shard = coordinator.shard(transactional_id)
        await shard.add_partitions(
            transactional_id, producer_id, producer_epoch, partitions, tv2=True
        )
    except TxnError as exc:
        return dict.fromkeys(partitions, int(exc.code))
    return dict.fromkeys(partitions, int(ErrorCode.none))


def request_doc(
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    tps: list[TopicPartition],
    *,
    add: bool = False,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "transactional_id": transactional_id,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in tps],
    }
    if add:  # absent for a verification: the document as before transaction version 2
        doc["add"] = True
    return doc


async def answer_control_call(coordinator: TransactionCoordinator, doc: Any) -> dict[str, Any]:
    """The coordinator's side of a relayed verification, or (`add`) of a TV2 implicit add
    (ValueError when malformed)."""
    parts = doc.get("partitions") if isinstance(doc, dict) else None
    if (
        not isinstance(parts, list)
        or len(parts) > MAX_PARTITIONS_PER_CALL
        or not isinstance(doc.get("transactional_id"), str)
    ):
        raise ValueError(f"verify: expected at most {MAX_PARTITIONS_PER_CALL} partitions")
    try:
        wanted = {(str(p["topic"]), int(p["partition"])) for p in parts}
        pid, epoch = int(doc["producer_id"]), int(doc["producer_epoch"])
    except (TypeError, KeyError) as exc:
        raise ValueError(f"verify: malformed request: {exc}") from exc
    if doc.get("add") is True:
        codes = await add_here(coordinator, doc["transactional_id"], pid, epoch, wanted)
    else:
        codes = verify_here(coordinator, doc["transactional_id"], pid, epoch, wanted)
    return {
        "results": [{"topic": t, "partition": p, "error_code": c} for (t, p), c in codes.items()]
    }


class VerifierHost(Protocol):
    """What verification uses of its broker (the Broker is one)."""

    broker_id: int
    metadata: ClusterMetadata
    controller: ControllerClient
    transactions: TransactionCoordinator


@dataclass(slots=True)
class _Queue:
    """The batches of one producer on one partition waiting on verification, in arrival
    order, and the coordinator's answers they wait for (by producer epoch)."""

    answers: dict[int, asyncio.Future[int]] = field(default_factory=dict)
    waiting: int = 0
    tail: asyncio.Future[None] | None = None  # done once the last waiter has enqueued


class TxnVerifier:
    """The partition leaders' side: `gate` a transactional batch behind the coordinator's
    answer for its partition."""

    def __init__(self, host: VerifierHost) -> None:
        self._host = host
        self._queues: dict[tuple[TopicPartition, int], _Queue] = {}

    def pending(self, tp: TopicPartition, producer_id: int) -> bool:
        """Whether batches of this producer wait on a verification for this partition (a
        later batch then waits behind them, whatever its own state)."""
        return (tp, producer_id) in self._queues

    async def gate(
        self,
        tp: TopicPartition,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        enqueue: Callable[[int], Awaitable[Any]],
        *,
        add: bool = False,
    ) -> Any:
        """Verify (or join the verification in flight for the same partition, producer and
        epoch), then call `enqueue(code)` in arrival order among the batches that waited:
        code NONE means verified, anything else is the coordinator's refusal. `enqueue` must
        enqueue its append before it returns (what it returns is awaited after). `add`: ask
        the coordinator to add the partition (transaction version 2) rather than only check;
        batches joining a question in flight share its kind."""
        key = (tp, producer_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = _Queue()
        answer = queue.answers.get(producer_epoch)
        if answer is None:
            answer = queue.answers[producer_epoch] = asyncio.ensure_future(
                self.ask(tp, transactional_id, producer_id, producer_epoch, add=add)
            )
        previous = queue.tail
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.tail = mine
        queue.waiting += 1
        try:
            code = await asyncio.shield(answer)
            if previous is not None:
                await previous
            appended = enqueue(code)  # enqueued before the next waiter resumes: order kept
        finally:
            if not mine.done():
                mine.set_result(None)
            queue.waiting -= 1
            if queue.waiting == 0 and self._queues.get(key) is queue:
                del self._queues[key]
        return await appended

    async def ask(
        self,
        tp: TopicPartition,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        *,
        add: bool = False,
    ) -> int:
        """The coordinator's verify-only answer for one partition (NONE: it is in the
        producer's ongoing transaction at that epoch), or with `add` its answer to adding it
        (NONE: added, durably); NETWORK_EXCEPTION when unreachable."""
        host = self._host
        TXN_PARTITION_CHECKS.labels(str(host.broker_id), "add" if add else "verify").inc()
        wanted = {(tp.topic, tp.partition)}
        try:
            state_partition = host.transactions.partition_for(transactional_id)
        except TxnError as exc:
            return int(exc.code)
        topic = host.metadata.topics.get(TXN_STATE_TOPIC)
        if topic is None or not 0 <= state_partition < len(topic.partitions):
            return ErrorCode.coordinator_not_available
        leader = topic.partitions[state_partition].leader
        if leader == NO_LEADER:
            return ErrorCode.coordinator_not_available
        if leader == host.broker_id:
            if add:
                codes = await add_here(
                    host.transactions, transactional_id, producer_id, producer_epoch, wanted
                )
            else:
                codes = verify_here(
                    host.transactions, transactional_id, producer_id, producer_epoch, wanted
                )
            return codes[(tp.topic, tp.partition)]
        doc = request_doc(transactional_id, producer_id, producer_epoch, [tp], add=add)
        try:
            answer = await host.controller.forward_txn_verification(leader, doc)
            for r in answer["results"]:
                if (r["topic"], int(r["partition"])) == (tp.topic, tp.partition):
                    return int(r["error_code"])
        except Exception as exc:
            log.info("verifying %s with broker %d failed: %s", tp, leader, exc)
            return ErrorCode.network_exception
        return ErrorCode.coordinator_not_available
