"""AlterPartitionReassignments and ListPartitionReassignments, forwarded to the controller, so
`kafka-reassign-partitions` and Kafka AdminClients drive TidalMQ moves unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import InvalidPlan, NoReassignmentInProgress, PlanEntry

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection


def _code(exc: Exception) -> ErrorCode:
    if isinstance(exc, NoReassignmentInProgress):
        return ErrorCode.no_reassignment_in_progress
    if isinstance(exc, InvalidPlan):
        message = str(exc)
        if "unknown topic" in message or "unknown partition" in message:
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.invalid_replica_assignment
    return error_code(exc)


@api(45, "AlterPartitionReassignments", 0, 1)
async def handle_alter_reassignments(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    if not broker.authorizer.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        denied = ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
        return {
            "throttle_time": 0,
            "error_code": denied[0],
            "error_message": denied[1],
            "responses": [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": p.partition_index,
                            "error_code": denied[0],
                            "error_message": denied[1],
                        }
                        for p in t.partitions
                    ],
                }
                for t in body.topics
            ],
        }
    # v1 (KIP-860): a client may forbid changing the replication factor; it is always 1 here
    rf_fixed = not getattr(body, "allow_replication_factor_change", True)
    entries: list[PlanEntry] = []
    early: dict[TopicPartition, tuple[ErrorCode, str | None]] = {}
    for t in body.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            if p.replicas is None:
                entries.append(PlanEntry(tp, None))
            elif len(p.replicas) != 1:
                early[tp] = (
                    ErrorCode.invalid_replication_factor
                    if rf_fixed
                    else ErrorCode.invalid_replica_assignment,
                    f"replicas {list(p.replicas)} must name exactly one broker: TidalMQ keeps "
                    "one replica per partition, its data lives in object storage",
                )
            else:
                entries.append(PlanEntry(tp, int(p.replicas[0])))
    results = await broker.controller.alter_reassignments(entries) if entries else {}
    responses = []
    for t in body.topics:
        parts = []
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            if tp in early:
                code, message = early[tp]
            else:
                err = results.get(tp)
                code, message = (
                    (ErrorCode.none, None) if err is None else (_code(err), error_message(err))
                )
            parts.append(
                {"partition_index": p.partition_index, "error_code": code, "error_message": message}
            )
        responses.append({"name": t.name, "partitions": parts})
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "responses": responses,
    }


@api(46, "ListPartitionReassignments", 0, 0)
async def handle_list_reassignments(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    if not broker.authorizer.allows(
        conn, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME
    ):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": "Cluster authorization failed.",
            "topics": [],
        }
    wanted = None
    if body.topics is not None:
        wanted = [TopicPartition(t.name, i) for t in body.topics for i in t.partition_indexes]
    rows = await broker.controller.list_reassignments(wanted)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, replicas, adding, removing in rows:
        by_topic.setdefault(tp.topic, []).append(
            {
                "partition_index": tp.partition,
                "replicas": replicas,
                "adding_replicas": adding,
                "removing_replicas": removing,
            }
        )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
    }
