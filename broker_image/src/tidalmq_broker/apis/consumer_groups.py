"""The consumer group protocol's APIs (KIP-848): ConsumerGroupHeartbeat and
ConsumerGroupDescribe, as Kafka 4.x clients with `group.protocol=consumer` use them.

Authorized as Kafka does: ConsumerGroupHeartbeat READ on the group (GROUP_AUTHORIZATION_FAILED)
and DESCRIBE on every subscribed topic (TOPIC_AUTHORIZATION_FAILED); ConsumerGroupDescribe
DESCRIBE on the group. The coordinator's side is groups/consumer_groups.py
(docs/consumer-group-protocol.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import AclOperation, ResourceType
from tidalmq_core.metadata import TopicInfo as MetadataTopic

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.groups.assignors import Assignment
from tidalmq_broker.groups.consumer_groups import Heartbeat, TopicInfo
from tidalmq_broker.groups.coordinator import CoordinatorError
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

_GROUP = ResourceType.GROUP


class MetadataTopics:
    """The broker's topics as a heartbeat looks them up (groups/consumer_groups.py `Topics`): by
    name, one subscribed topic at a time, read from the metadata as it is now, so a topic
    created or given partitions since the last heartbeat is seen. Never the whole table: a
    heartbeat costs O(the group's subscriptions) whatever the number of topics."""

    __slots__ = ("_topics",)

    def __init__(self, topics: Mapping[str, MetadataTopic]) -> None:
        self._topics = topics

    def get(self, name: str, /) -> TopicInfo | None:
        topic = self._topics.get(name)
        if topic is None or not topic.topic_id:
            return None
        return TopicInfo(str(uuid.UUID(topic.topic_id)), len(topic.partitions))


def _owned(topic_partitions: Any) -> Assignment | None:
    if topic_partitions is None:
        return None
    owned: dict[str, frozenset[int]] = {}
    for tp in topic_partitions:
        if tp.topic_id is None:
            continue
        key = str(tp.topic_id)
        owned[key] = owned.get(key, frozenset()) | frozenset(int(p) for p in tp.partitions)
    return owned


def _heartbeat_error(code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "error_code": code,
        "error_message": message,
        "member_id": None,
        "member_epoch": -1,
        "heartbeat_interval": 0,
        "assignment": None,
    }


@api(68, "ConsumerGroupHeartbeat", 0, 1)
async def handle_consumer_group_heartbeat(
    broker: Broker, request: Request, conn: Connection
) -> Any:
    b = request.body
    if not broker.authorizer.allows(conn, AclOperation.READ, _GROUP, b.group_id):
        return _heartbeat_error(ErrorCode.group_authorization_failed, None)
    names = tuple(b.subscribed_topic_names) if b.subscribed_topic_names is not None else None
    denied = sorted(
        n
        for n in set(names or ())
        if not broker.authorizer.allows(conn, AclOperation.DESCRIBE, ResourceType.TOPIC, n)
    )
    if denied:
        return _heartbeat_error(
            ErrorCode.topic_authorization_failed, f"Unauthorized topics: {', '.join(denied)}"
        )
    if request.api_version == 0 and b.member_epoch != 0 and not b.member_id:
        return _heartbeat_error(ErrorCode.unknown_member_id, "MemberId can't be empty.")
    try:
        shard = broker.groups.shard(b.group_id)
    except CoordinatorError as exc:
        return _heartbeat_error(exc.code, None)
    rebalance_ms = int(b.rebalance_timeout.total_seconds() * 1000)
    result = await shard.consumer_heartbeat(
        Heartbeat(
            group_id=b.group_id,
            member_id=b.member_id,
            member_epoch=b.member_epoch,
            instance_id=b.instance_id,
            rack_id=b.rack_id,
            rebalance_timeout_ms=rebalance_ms,
            subscribed_topic_names=names,
            subscribed_topic_regex=getattr(b, "subscribed_topic_regex", None),
            server_assignor=b.server_assignor,
            owned=_owned(b.topic_partitions),
            client_id=conn.client_id or "",
            client_host="/" + conn.peer.rsplit(":", 1)[0],
        ),
        MetadataTopics(broker.metadata.topics),
    )
    if result.error != ErrorCode.none:
        return _heartbeat_error(ErrorCode(result.error), result.message)
    assignment = None
    if result.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": uuid.UUID(t), "partitions": sorted(ps)}
                for t, ps in sorted(result.assignment.items())
            ]
        }
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "member_id": result.member_id,
        "member_epoch": result.member_epoch,
        "heartbeat_interval": result.heartbeat_interval_ms,
        "assignment": assignment,
    }


def _described_assignment(broker: Broker, assignment: Assignment) -> dict[str, Any]:
    out = []
    for topic_id, partitions in sorted(assignment.items()):
        topic = broker.metadata.topic_by_id(topic_id)
        if topic is None:  # deleted since: Kafka leaves it out too
            continue
        out.append(
            {
                "topic_id": uuid.UUID(topic_id),
                "topic_name": topic.name,
                "partitions": sorted(partitions),
            }
        )
    return {"topic_partitions": out}


@api(69, "ConsumerGroupDescribe", 0, 1)
async def handle_consumer_group_describe(broker: Broker, request: Request, conn: Connection) -> Any:
    out = []
    for group_id in request.body.group_ids:
        entry: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "group_id": group_id,
            "group_state": "Dead",
            "group_epoch": -1,
            "assignment_epoch": -1,
            "assignor_name": "",
            "members": [],
            "authorized_operations": -(2**31),
        }
        out.append(entry)
        if not broker.authorizer.allows(conn, AclOperation.DESCRIBE, _GROUP, group_id):
            entry["error_code"] = ErrorCode.group_authorization_failed
            continue
        try:
            shard = broker.groups.shard(group_id)
        except CoordinatorError as exc:
            entry["error_code"] = exc.code
            continue
        group = shard.consumer_group(group_id)
        if group is None:
            # a classic group, or none (Kafka's messages): the admin client then asks
            # DescribeGroups
            entry["error_code"] = ErrorCode.group_id_not_found
            entry["error_message"] = (
                f"Group {group_id} is not a consumer group"
                if shard.describe(group_id) is not None
                else f"Group {group_id} not found."
            )
            continue
        entry.update(
            group_state=group.state().value,
            group_epoch=group.epoch,
            assignment_epoch=group.assignment_epoch,
            assignor_name=group.assignor,
            members=[
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id,
                    "rack_id": m.rack_id,
                    "member_epoch": m.epoch,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "subscribed_topic_names": list(m.subscribed_topic_names),
                    "subscribed_topic_regex": m.subscribed_topic_regex,
                    "assignment": _described_assignment(broker, m.assigned),
                    "target_assignment": _described_assignment(
                        broker, group.target.get(m.member_id, {})
                    ),
                    "member_type": 1,  # consumer protocol (v1)
                }
                for m in group.members.values()
            ],
        )
        if request.body.include_authorized_operations:
            entry["authorized_operations"] = broker.authorizer.authorized_operations(
                conn, _GROUP, group_id
            )
    return {"throttle_time": 0, "groups": out}
