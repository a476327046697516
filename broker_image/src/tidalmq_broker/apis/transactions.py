"""Transaction coordinator APIs (KIP-98): AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
TxnOffsetCommit (at the group coordinator), DescribeTransactions, ListTransactions. InitProducerId
and FindCoordinator (key type 1) are in producer_ids.py and groups.py; the coordinator itself is
transactions/coordinator.py, the partition side WriteTxnMarkers (txn_markers.py).

Authorized as Kafka does (KafkaApis): WRITE on the transactional id for AddPartitionsToTxn (up to
v3: from clients), AddOffsetsToTxn, EndTxn and TxnOffsetCommit
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddPartitionsToTxn also WRITE on each topic
(TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED), v4+ (broker to broker, KIP-890)
CLUSTER_ACTION on the cluster; AddOffsetsToTxn and TxnOffsetCommit READ on the group, and
TxnOffsetCommit READ on each topic; DescribeTransactions and ListTransactions DESCRIBE on each
transactional id (ids the client may not describe are left out of a list).

PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH to the versions from before KIP-588, as
Kafka does.
"""

from __future__ import annotations

import datetime
import re
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.metadata import OFFSETS_TOPIC, TRANSACTION_VERSION
from tidalmq_core.model import TopicPartition

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.groups.coordinator import CommittedOffset, CoordinatorError, Verify
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.transactions.state import TV2, TxnError, TxnMetadata, TxnState
from tidalmq_broker.transactions.verification import txn_offset_commit_error

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

_TXN = ResourceType.TRANSACTIONAL_ID
MAX_PATTERN_CHARS = 1024
TXN_OFFSET_COMMIT_IMPLICIT_ADD_FROM = (
    5  # KIP-890 part 2  # ListTransactions v2's regular expression
)


def _may(broker: Broker, conn: Connection, op: AclOperation, rt: ResourceType, name: str) -> bool:
    return broker.authorizer.allows(conn, op, rt, name)


def fenced_code(code: int, version: int, first_fenced_version: int) -> int:
    """KIP-588: PRODUCER_FENCED only to versions that know it, else INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.producer_fenced and version < first_fenced_version:
        return ErrorCode.invalid_producer_epoch
    return code


def _code(exc: Exception) -> int:
    if isinstance(exc, TxnError | CoordinatorError):
        return exc.code
    return ErrorCode.coordinator_not_available


def _ms(value: Any) -> int:
    """A kio timedelta field (or a plain int) in milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


# ---------------------------------------------------------------------- AddPartitionsToTxn
@api(24, "AddPartitionsToTxn", 0, 5)
async def handle_add_partitions_to_txn(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    version = request.api_version
    if version >= 4:
        return await _add_partitions_batched(broker, body, conn)
    topics = {t.name: set(t.partitions) for t in body.v3_and_below_topics}
    codes = await _add_partitions(
        broker,
        conn,
        body.v3_and_below_transactional_id,
        body.v3_and_below_producer_id,
        body.v3_and_below_producer_epoch,
        topics,
        verify_only=False,
    )
    return {"throttle_time": 0, "results_by_topic_v3_and_below": _topic_results(codes, version)}


async def _add_partitions_batched(broker: Broker, body: Any, conn: Connection) -> Any:
    """v4+ (KIP-890): from a partition leader, several transactions, possibly verify-only."""
    if not _may(broker, conn, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "results_by_transaction": [],
        }
    results = []
    for t in body.transactions:
        topics = {x.name: set(x.partitions) for x in t.topics}
        codes = await _add_partitions(
            broker,
            conn,
            t.transactional_id,
            t.producer_id,
            t.producer_epoch,
            topics,
            verify_only=t.verify_only,
        )
        results.append(
            {"transactional_id": t.transactional_id, "topic_results": _topic_results(codes, 5)}
        )
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_transaction": results}


def _topic_results(codes: dict[tuple[str, int], int], version: int) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in codes.items():
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "partition_error_code": fenced_code(code, version, 2),
            }
        )
    return [{"name": name, "results_by_partition": parts} for name, parts in by_topic.items()]


async def _add_partitions(
    broker: Broker,
    conn: Connection,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: dict[str, set[int]],
    *,
    verify_only: bool,
) -> dict[tuple[str, int], int]:
    wanted = {(t, p) for t, parts in topics.items() for p in parts}
    if not _may(broker, conn, AclOperation.WRITE, _TXN, transactional_id):
        return dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
    refused: dict[tuple[str, int], int] = {}
    for topic, parts in topics.items():
        info = broker.metadata.topics.get(topic)
        if not _may(broker, conn, AclOperation.WRITE, ResourceType.TOPIC, topic):
            code = ErrorCode.topic_authorization_failed
        elif (
            info is None or not info.listed or any(not 0 <= p < len(info.partitions) for p in parts)
        ):
            code = ErrorCode.unknown_topic_or_partition
        else:
            continue
        refused.update(dict.fromkeys(((topic, p) for p in parts), code))
    if refused:  # as Kafka: nothing is added, the rest OPERATION_NOT_ATTEMPTED
        return {tp: refused.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
    try:
        shard = broker.transactions.shard(transactional_id)
        if verify_only:
            return dict(
                shard.verify_partitions(transactional_id, producer_id, producer_epoch, wanted)
            )
        await shard.add_partitions(transactional_id, producer_id, producer_epoch, wanted)
    except (TxnError, CoordinatorError) as exc:
        return dict.fromkeys(wanted, exc.code)
    return dict.fromkeys(wanted, ErrorCode.none)


# ---------------------------------------------------------------------- AddOffsetsToTxn
@api(25, "AddOffsetsToTxn", 0, 4)
async def handle_add_offsets_to_txn(broker: Broker, request: Request, conn: Connection) -> Any:
    """The group's `__consumer_offsets` partition joins the transaction: its marker settles
    the offsets TxnOffsetCommit stores pending there."""
    b = request.body
    code: int
    if not _may(broker, conn, AclOperation.WRITE, _TXN, b.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif not _may(broker, conn, AclOperation.READ, ResourceType.GROUP, b.group_id):
        code = ErrorCode.group_authorization_failed
    else:
        try:
            partition = (OFFSETS_TOPIC, broker.groups.partition_for(b.group_id))
            shard = broker.transactions.shard(b.transactional_id)
            await shard.add_partitions(
                b.transactional_id, b.producer_id, b.producer_epoch, {partition}
            )
            code = ErrorCode.none
        except (TxnError, CoordinatorError) as exc:
            code = fenced_code(exc.code, request.api_version, 2)
    return {"throttle_time": 0, "error_code": code}


# ---------------------------------------------------------------------- EndTxn
@api(26, "EndTxn", 0, 5)
async def handle_end_txn(broker: Broker, request: Request, conn: Connection) -> Any:
    """EndTxn. v5 answers the producer id and epoch of the producer's next transaction: at
    transaction.version 2 the coordinator bumps the epoch per transaction (KIP-890 part 2,
    docs/transactions-v2.md); at level 1 they are the request's, unchanged."""
    b = request.body
    out: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none}
    if request.api_version >= 5:  # as the request's unless answered below
        out.update(producer_id=b.producer_id, producer_epoch=b.producer_epoch)
    if not _may(broker, conn, AclOperation.WRITE, _TXN, b.transactional_id):
        out["error_code"] = ErrorCode.transactional_id_authorization_failed
        return out
    tv2 = request.api_version >= 5 and broker.metadata.feature_level(TRANSACTION_VERSION) >= TV2
    try:
        shard = broker.transactions.shard(b.transactional_id)
        pid, epoch = await shard.end_txn(
            b.transactional_id, b.producer_id, b.producer_epoch, b.committed, tv2=tv2
        )
        if request.api_version >= 5:
            out.update(producer_id=pid, producer_epoch=epoch)
    except TxnError as exc:
        out["error_code"] = fenced_code(exc.code, request.api_version, 2)
        if tv2:  # Kafka answers no producer with an error
            out.update(producer_id=-1, producer_epoch=-1)
    return out


# ---------------------------------------------------------------------- TxnOffsetCommit
@api(28, "TxnOffsetCommit", 0, 5)
async def handle_txn_offset_commit(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    version = request.api_version
    wanted = [(t.name, p) for t in b.topics for p in t.partitions]

    def answer(codes: dict[tuple[str, Any], int]) -> dict[str, Any]:  # (topic, its partition)
        topics: dict[str, list[dict[str, Any]]] = {}
        for (name, p), code in codes.items():
            topics.setdefault(name, []).append(
                {"partition_index": p.partition_index, "error_code": fenced_code(code, version, 3)}
            )
        return {
            "throttle_time": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
        }

    if not _may(broker, conn, AclOperation.WRITE, _TXN, b.transactional_id):
        return answer(dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed))
    if not _may(broker, conn, AclOperation.READ, ResourceType.GROUP, b.group_id):
        return answer(dict.fromkeys(wanted, ErrorCode.group_authorization_failed))
    codes: dict[tuple[str, Any], int] = {}
    offsets: dict[tuple[str, int], CommittedOffset] = {}
    for name, p in wanted:
        if not _may(broker, conn, AclOperation.READ, ResourceType.TOPIC, name):
            codes[(name, p)] = ErrorCode.topic_authorization_failed
        elif name not in broker.metadata.topics:
            codes[(name, p)] = ErrorCode.unknown_topic_or_partition
        else:
            offsets[(name, p.partition_index)] = CommittedOffset(
                p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata
            )
    if offsets:
        try:
            shard = broker.groups.shard(b.group_id)
            results = await shard.txn_commit(
                group_id=b.group_id,
                producer_id=b.producer_id,
                producer_epoch=b.producer_epoch,
                generation=getattr(b, "generation_id", -1),
                member_id=getattr(b, "member_id", ""),
                group_instance_id=getattr(b, "group_instance_id", None),
                offsets=offsets,
                verify=_verify_offsets(broker, b.transactional_id, version),
            )
        except CoordinatorError as exc:
            results = dict.fromkeys(offsets, exc.code)
        for name, p in wanted:
            if (name, p) not in codes:
                codes[(name, p)] = results.get((name, p.partition_index), ErrorCode.none)
    return answer({(name, p): codes[(name, p)] for name, p in wanted})


def _verify_offsets(broker: Broker, transactional_id: str, version: int) -> Verify | None:
    """KIP-890 for TxnOffsetCommit: the group coordinator asks the transaction coordinator
    whether the group's `__consumer_offsets` partition is in the producer's transaction (None
    when `transaction.partition.verification.enable` is off). With transaction version 2
    (TxnOffsetCommit v5 at `transaction.version` 2, no AddOffsetsToTxn) it asks it to add the
    partition instead, whatever the verification setting."""
    add = version >= TXN_OFFSET_COMMIT_IMPLICIT_ADD_FROM and (
        broker.metadata.feature_level(TRANSACTION_VERSION) >= TV2
    )
    verifier = broker.txn_partitions if add else broker.txn_verifier
    if verifier is None:
        return None

    async def verify(tp: TopicPartition, producer_id: int, producer_epoch: int) -> int:
        code = await verifier.ask(tp, transactional_id, producer_id, producer_epoch, add=add)
        return txn_offset_commit_error(code, version)

    return verify


# ---------------------------------------------------------------------- describe / list
def _describe(broker: Broker, conn: Connection, transactional_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "error_code": ErrorCode.none,
        "transactional_id": transactional_id,
        "transaction_state": "",
        "transaction_timeout": 0,
        "transaction_start_time": 0,
        "producer_id": -1,
        "producer_epoch": -1,
        "topics": [],
    }  # fmt: skip  (an error's fields are the schema's defaults, as Kafka answers)
    if not _may(broker, conn, AclOperation.DESCRIBE, _TXN, transactional_id):
        out["error_code"] = ErrorCode.transactional_id_authorization_failed
        return out
    try:
        meta = broker.transactions.shard(transactional_id).describe(transactional_id)
    except TxnError as exc:
        out["error_code"] = exc.code
        return out
    if meta is None:
        out["error_code"] = ErrorCode.transactional_id_not_found
        return out
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.partitions):
        if _may(broker, conn, AclOperation.DESCRIBE, ResourceType.TOPIC, topic):
            topics.setdefault(topic, []).append(partition)
    out.update(
        transaction_state=meta.state.value,
        transaction_timeout=meta.timeout_ms,
        transaction_start_time=meta.start_ms,  # -1 with no transaction open, as Kafka
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        topics=[{"topic": t, "partitions": ps} for t, ps in topics.items()],
    )
    return out


@api(65, "DescribeTransactions", 0, 0)
async def handle_describe_transactions(broker: Broker, request: Request, conn: Connection) -> Any:
    return {
        "throttle_time": 0,
        "transaction_states": [
            _describe(broker, conn, tid) for tid in request.body.transactional_ids
        ],
    }


def list_filter(body: Any, now_ms: int) -> tuple[list[str], Any]:
    """(unknown state names, a predicate over TxnMetadata) from a ListTransactions request."""
    known = {s.value for s in TxnState}
    states = set(getattr(body, "state_filters", ()) or ())
    unknown = sorted(states - known)
    pids = set(getattr(body, "producer_id_filters", ()) or ())
    duration = int(getattr(body, "duration_filter", -1))
    raw_pattern = getattr(body, "transactional_id_pattern", None)
    pattern = re.compile(raw_pattern) if raw_pattern else None

    def keep(meta: TxnMetadata) -> bool:
        if states and meta.state.value not in states:
            return False
        if pids and meta.producer_id not in pids:
            return False
        if duration >= 0 and (meta.start_ms < 0 or now_ms - meta.start_ms < duration):
            return False  # only transactions open (or ending) for at least `duration` ms
        return pattern is None or pattern.fullmatch(meta.transactional_id) is not None

    return unknown, keep


@api(66, "ListTransactions", 0, 2)
async def handle_list_transactions(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    raw_pattern = getattr(body, "transactional_id_pattern", None)
    if raw_pattern is not None and len(raw_pattern) > MAX_PATTERN_CHARS:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.invalid_request,
            "unknown_state_filters": [],
            "transaction_states": [],
        }
    try:
        unknown, keep = list_filter(body, int(datetime.datetime.now().timestamp() * 1000))
    except re.error:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.invalid_regular_expression,
            "unknown_state_filters": [],
            "transaction_states": [],
        }
    states = [
        {
            "transactional_id": m.transactional_id,
            "producer_id": m.producer_id,
            "transaction_state": m.state.value,
        }
        for shard in broker.transactions.shards()
        for m in list(shard.txns.values())
        if keep(m) and _may(broker, conn, AclOperation.DESCRIBE, _TXN, m.transactional_id)
    ]
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "unknown_state_filters": unknown,
        "transaction_states": states,
    }
