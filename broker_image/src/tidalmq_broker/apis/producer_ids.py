"""Idempotent producers: InitProducerId hands out cluster-unique ids, DescribeProducers shows the
producer state each partition keeps.

InitProducerId with a transactional id goes to the transaction coordinator of that id
(transactions/coordinator.py): a new producer id from the controller's blocks, or the same id
with its epoch bumped (fencing older epochs), after aborting an unfinished transaction of the
previous incarnation (CONCURRENT_TRANSACTIONS until that abort completes; clients retry).

Authorized as Kafka does: InitProducerId for a transactional id needs WRITE on it
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), an idempotent producer IDEMPOTENT_WRITE on the cluster
or WRITE on at least one topic (CLUSTER_AUTHORIZATION_FAILED); DescribeProducers READ on each
topic (its producers' ids and sequences are what a forger needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.model import TopicPartition

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.apis.transactions import fenced_code
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.transactions.state import TxnError

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection


@api(22, "InitProducerId", 0, 5)
async def handle_init_producer_id(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    authorizer = broker.authorizer
    if body.transactional_id is not None and not authorizer.allows(
        conn, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id
    ):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.transactional_id_authorization_failed,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    if (
        body.transactional_id is None
        and not authorizer.allows(
            conn, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME
        )
        and not authorizer.allows_by_resource_type(conn, AclOperation.WRITE, ResourceType.TOPIC)
    ):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    if body.transactional_id is not None:
        return await _init_transactional(broker, request)
    current_id = getattr(body, "producer_id", -1)
    current_epoch = getattr(body, "producer_epoch", -1)
    if current_id >= 0 and 0 <= current_epoch < 32766:
        # KIP-360: a producer bumps its epoch to recover from a sequence error; the partitions
        # see the new epoch and expect sequences from 0 again
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "producer_id": current_id,
            "producer_epoch": current_epoch + 1,
        }
    try:
        producer_id = await broker.controller.allocate_producer_id()
    except Exception as exc:
        return {
            "throttle_time": 0,
            "error_code": error_code(exc),
            "producer_id": -1,
            "producer_epoch": -1,
        }
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "producer_id": producer_id,
        "producer_epoch": 0,
    }


async def _init_transactional(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    tid = body.transactional_id
    timeout = body.transaction_timeout
    timeout_ms = (
        int(timeout.total_seconds() * 1000) if hasattr(timeout, "total_seconds") else timeout
    )
    expected = (getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
    out: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "producer_id": -1,
        "producer_epoch": -1,
    }
    try:
        shard = broker.transactions.shard(tid)
        out["producer_id"], out["producer_epoch"] = await shard.init_producer_id(
            tid, int(timeout_ms), expected if expected[0] >= 0 else None
        )
    except TxnError as exc:
        out["error_code"] = fenced_code(exc.code, request.api_version, 4)
    except Exception as exc:  # the controller's producer ids
        out["error_code"] = error_code(exc)
    return out


@api(61, "DescribeProducers", 0, 0)
async def handle_describe_producers(broker: Broker, request: Request, conn: Connection) -> Any:
    """The active idempotent producers of each partition this broker leads (Kafka clients send
    the request for a partition to its leader)."""
    topics = []
    for topic in request.body.topics:
        partitions = []
        readable = broker.authorizer.allows(conn, AclOperation.READ, ResourceType.TOPIC, topic.name)
        for index in topic.partition_indexes:
            out: dict[str, Any] = {
                "partition_index": index,
                "error_code": ErrorCode.none,
                "error_message": None,
                "active_producers": [],
            }
            if not readable:
                out["error_code"] = ErrorCode.topic_authorization_failed
                out["error_message"] = "Topic authorization failed."
                partitions.append(out)
                continue
            try:
                plog = broker.partitions.get_log(TopicPartition(topic.name, index))
            except Exception as exc:
                out["error_code"], out["error_message"] = error_code(exc), error_message(exc)
            else:
                out["active_producers"] = [
                    {
                        "producer_id": p.producer_id,
                        "producer_epoch": p.epoch,
                        "last_sequence": p.last_sequence,
                        "last_timestamp": p.last_timestamp_ms,
                        "coordinator_epoch": p.coordinator_epoch,
                        "current_txn_start_offset": p.current_txn_start_offset,
                    }
                    for p in plog.active_producers()
                ]
            partitions.append(out)
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}
