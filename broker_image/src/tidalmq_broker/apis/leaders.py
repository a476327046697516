"""ElectLeaders (kafka-leader-election).

A TidalMQ partition has exactly one replica, its data in object storage, and the controller
elects that replica whenever the partition is not moving: the preferred leader is always the
leader already. So every election is ELECTION_NOT_NEEDED, except for a partition in the middle of
a move (no leader yet), which the controller finishes on its own: that one is
PREFERRED_LEADER_NOT_AVAILABLE (preferred) or ELIGIBLE_LEADERS_NOT_AVAILABLE (unclean).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.metadata import NO_LEADER

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

PREFERRED = 0


@api(43, "ElectLeaders", 0, 2)
async def handle_elect_leaders(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    meta = broker.metadata
    election_type = getattr(body, "election_type", PREFERRED)
    if not broker.authorizer.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        # as Kafka: ALTER on the cluster, refused for the request and each partition named
        denied = [
            {
                "topic": t.topic,
                "partition_result": [
                    {
                        "partition_id": i,
                        "error_code": ErrorCode.cluster_authorization_failed,
                        "error_message": "Cluster authorization failed.",
                    }
                    for i in t.partitions
                ],
            }
            for t in body.topic_partitions or ()
        ]
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "replica_election_results": denied,
        }
    if body.topic_partitions is None:  # every partition (of the topics Metadata lists)
        wanted = [
            (name, list(range(len(topic.partitions))))
            for name, topic in sorted(meta.topics.items())
            if not topic.internal
        ]
    else:
        wanted = [(t.topic, list(t.partitions)) for t in body.topic_partitions]
    results = []
    for name, indexes in wanted:
        topic = meta.topics.get(name)
        parts = []
        for index in indexes:
            if topic is None or not 0 <= index < len(topic.partitions):
                code = ErrorCode.unknown_topic_or_partition
                message = f"{name}-{index} does not exist"
            elif topic.partitions[index].leader == NO_LEADER:
                code = (
                    ErrorCode.preferred_leader_not_available
                    if election_type == PREFERRED
                    else ErrorCode.eligible_leaders_not_available
                )
                message = f"{name}-{index} is moving; the controller elects its new broker"
            else:
                code = ErrorCode.election_not_needed
                message = "the partition's only replica is its leader"
            parts.append({"partition_id": index, "error_code": code, "error_message": message})
        results.append({"topic": name, "partition_result": parts})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "replica_election_results": results}
