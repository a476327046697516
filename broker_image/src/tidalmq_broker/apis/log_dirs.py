"""DescribeLogDirs and AlterReplicaLogDirs.

A TidalMQ broker keeps no partition data on local disk: every partition it leads lives in the
object store. Each broker therefore reports exactly one "log directory", named after the object
store (``s3://bucket/prefix``, or the directory of a local store), holding the partitions it
leads with their stored sizes. `kafka-reassign-partitions` and `kafka-log-dirs` read this;
AlterReplicaLogDirs accepts that one directory (nothing to move) and refuses any other with
LOG_DIR_NOT_FOUND.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.model import TopicPartition

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.settings import log_dir_name

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

UNKNOWN_VOLUME_BYTES = -1  # Kafka's value when a volume's size is not known (object storage)


@api(35, "DescribeLogDirs", 1, 5)
async def handle_describe_log_dirs(broker: Broker, request: Request, conn: Connection) -> Any:
    if not broker.authorizer.allows(
        conn, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME
    ):  # as Kafka: DESCRIBE on the cluster
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "results": [],
        }
    wanted: dict[str, set[int]] | None = None
    if request.body.topics is not None:
        wanted = {}
        for t in request.body.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp in sorted(broker.partitions.leading()):
        if wanted is not None and tp.partition not in wanted.get(tp.topic, ()):
            continue
        try:
            size = broker.partitions.get_log(tp).stats().size_bytes
        except Exception:  # closed between leading() and here: not in this directory now
            continue
        by_topic.setdefault(tp.topic, []).append(
            {
                "partition_index": tp.partition,
                "partition_size": size,
                "offset_lag": 0,
                "is_future_key": False,
            }
        )
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "results": [
            {
                "error_code": ErrorCode.none,
                "log_dir": log_dir_name(broker.settings.storage_url),
                "topics": [{"name": n, "partitions": ps} for n, ps in sorted(by_topic.items())],
                "total_bytes": UNKNOWN_VOLUME_BYTES,
                "usable_bytes": UNKNOWN_VOLUME_BYTES,
                "is_cordoned": False,
            }
        ],
    }


@api(34, "AlterReplicaLogDirs", 1, 2)
async def handle_alter_replica_log_dirs(broker: Broker, request: Request, conn: Connection) -> Any:
    """Every replica a broker has is in its one directory, and a replica that arrives later
    lands there too, so moving to that directory is done already; other paths do not exist."""
    ours = log_dir_name(broker.settings.storage_url)
    results: dict[str, list[dict[str, Any]]] = {}
    allowed = broker.authorizer.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
    for d in request.body.dirs:
        code = ErrorCode.none if d.path == ours else ErrorCode.log_dir_not_found
        if not allowed:  # as Kafka: ALTER on the cluster, refused for each partition
            code = ErrorCode.cluster_authorization_failed
        for t in d.topics:
            for index in t.partitions:
                part_code = code
                if code == ErrorCode.none and not _exists(broker, TopicPartition(t.name, index)):
                    part_code = ErrorCode.unknown_topic_or_partition
                results.setdefault(t.name, []).append(
                    {"partition_index": index, "error_code": part_code}
                )
    return {
        "throttle_time": 0,
        "results": [{"topic_name": n, "partitions": ps} for n, ps in results.items()],
    }


def _exists(broker: Broker, tp: TopicPartition) -> bool:
    topic = broker.metadata.topics.get(tp.topic)
    return topic is not None and 0 <= tp.partition < len(topic.partitions)
