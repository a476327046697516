"""Metadata and DescribeCluster: answered from the controller's latest snapshot.

As in Kafka, each broker is described by its endpoint of the listener the client is connected to
(brokers without that listener are left out, and a partition they lead has no leader for this
client: LISTENER_NOT_FOUND from Metadata v6).
"""

from __future__ import annotations

import enum
import logging
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_controller import ControllerError, NewTopic
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.metadata import (
    INTERNAL_TOPICS,
    NO_LEADER,
    PLAINTEXT,
    TXN_STATE_TOPIC,
    ClusterMetadata,
    TopicInfo,
)
from tidalmq_core.static_mapping import is_physical_topic
from tidalmq_core.topics import InvalidTopic, validate_topic_name

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.protocol.metadata_response import (
    NO_OPERATIONS,
    encode_metadata_response,
    topic_head,
    topic_tail,
)
from tidalmq_broker.server.ratelog import REQUEST_ERRORS, describe

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

log = logging.getLogger(__name__)
_NULL_UUID = uuid.UUID(int=0)


def brokers_body(meta: ClusterMetadata, listener: str = PLAINTEXT) -> list[dict[str, Any]]:
    """The live brokers, each at its endpoint of `listener` (those without one left out)."""
    out = []
    for b in sorted(meta.brokers.values(), key=lambda b: b.broker_id):
        endpoint = b.endpoint(listener)
        if b.state == "dead" or endpoint is None:
            continue
        out.append(
            {
                "node_id": b.broker_id,
                "broker_id": b.broker_id,
                "host": endpoint.host,
                "port": endpoint.port,
                "rack": b.rack,
                "is_fenced": False,
            }
        )
    return out


def unreachable_brokers(meta: ClusterMetadata, listener: str) -> set[int]:
    """Brokers without an endpoint of `listener` (none, in the usual uniform cluster)."""
    return {b.broker_id for b in meta.brokers.values() if b.endpoint(listener) is None}


def topic_body(
    topic: TopicInfo, unreachable: set[int] | frozenset[int] = frozenset(), version: int = 13
) -> dict[str, Any]:
    partitions = []
    for index, part in enumerate(topic.partitions):
        leader = part.leader
        code = ErrorCode.none if leader != NO_LEADER else ErrorCode.leader_not_available
        if leader in unreachable:
            code = ErrorCode.listener_not_found if version >= 6 else ErrorCode.leader_not_available
            leader = NO_LEADER
        partitions.append(
            {
                "error_code": code,
                "partition_index": index,
                "leader_id": leader,
                "leader_epoch": part.leader_epoch,
                "replica_nodes": list(part.replicas),
                "isr_nodes": [leader] if leader != NO_LEADER else [],
                "offline_replicas": [],
            }
        )
    return {
        "error_code": ErrorCode.none,
        "name": topic.name,
        "topic_id": uuid.UUID(topic.topic_id),
        "is_internal": topic.internal,
        "partitions": partitions,
    }


class AutoCreation(enum.Enum):
    """What a Metadata request naming a missing topic does when it may create it."""

    TOPIC = "topic"  # the controller creates it: num.partitions, the topic config defaults
    TRANSACTION_STATE = "transaction state"  # the transaction coordinator has it created
    NONE = "none"  # not created: an invalid name, or another internal topic's


def auto_creation(name: str) -> AutoCreation:
    """How auto.create.topics.enable treats a missing topic `name`, as Kafka's
    AutoTopicCreationManager: invalid names are not created (INVALID_TOPIC_EXCEPTION);
    `__transaction_state` is created with its own partition count and configs, as the
    transaction coordinator does on its first request. TidalMQ's other internal topics
    (`__consumer_offsets`, made with the cluster; the static topics' physical ones, made by
    their mapping) are never made by a client's Metadata request: UNKNOWN_TOPIC_OR_PARTITION."""
    try:
        validate_topic_name(name)
    except InvalidTopic:
        return AutoCreation.NONE
    if name == TXN_STATE_TOPIC:
        return AutoCreation.TRANSACTION_STATE
    if name in INTERNAL_TOPICS or is_physical_topic(name):
        return AutoCreation.NONE
    return AutoCreation.TOPIC


@api(3, "Metadata", 0, 13)
async def handle_metadata(broker: Broker, request: Request, conn: Connection) -> Any:
    """As Kafka's handleTopicMetadataRequest: topics the client may not DESCRIBE are left out
    of an every-topic answer and answer TOPIC_AUTHORIZATION_FAILED when named (without their
    id; by id: without their name), whether or not they exist; auto-creation needs CREATE on
    the cluster or the topic."""
    body = request.body
    meta = broker.metadata
    authorizer = broker.authorizer
    version = request.api_version
    requested = body.topics
    every = requested is None or (version == 0 and not requested)
    # (name, the id it was named by): an unknown id is "\0<id>"
    wanted: list[tuple[str, uuid.UUID | None]] = []
    if every:
        wanted = [(t.name, None) for t in meta.topics.values() if t.listed]
    else:
        for t in requested:
            if t.name is None:
                # neither a name nor an id (kio reads the zero id as None): an unknown id, as
                # Kafka answers, where "\0None" made uuid.UUID raise and the connection close
                topic_id = t.topic_id or _NULL_UUID
                topic = meta.topic_by_id(str(topic_id))
                wanted.append((topic.name if topic else f"\0{topic_id}", topic_id))
            else:
                wanted.append((t.name, None))
    denied: dict[str, ErrorCode] = {}
    for name, _ in wanted:
        if not name.startswith("\0") and not authorizer.allows(
            conn, AclOperation.DESCRIBE, ResourceType.TOPIC, name
        ):
            denied[name] = ErrorCode.topic_authorization_failed
    if every:
        wanted = [w for w in wanted if w[0] not in denied]
    allow_create = version >= 4 and getattr(body, "allow_auto_topic_creation", True)
    if version < 4:
        allow_create = True
    allow_create = allow_create and broker.settings.auto_create_topics and not every
    missing = [
        n for n, _ in wanted if n not in meta.topics and not n.startswith("\0") and n not in denied
    ]
    creating: set[str] = set()  # answered LEADER_NOT_AVAILABLE until they are in the metadata
    if missing and allow_create:
        if not authorizer.allows(conn, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME):
            for name in missing:
                if not authorizer.allows(conn, AclOperation.CREATE, ResourceType.TOPIC, name):
                    denied[name] = ErrorCode.topic_authorization_failed
            missing = [n for n in missing if n not in denied]
        ordinary = []
        for name in missing:
            kind = auto_creation(name)
            if kind is AutoCreation.TOPIC:
                ordinary.append(name)
            elif kind is AutoCreation.TRANSACTION_STATE:
                broker.transactions.ensure_state_topic()  # in the background, as Kafka
            if kind is not AutoCreation.NONE:
                creating.add(name)
        if ordinary:
            try:
                await broker.controller.create_topics(
                    [NewTopic(n, broker.settings.default_partitions) for n in ordinary]
                )
            except ControllerError as exc:  # unreachable, or not the active controller
                # as Kafka, whose creation is asynchronous: LEADER_NOT_AVAILABLE, and the
                # client's next Metadata request tries again
                REQUEST_ERRORS.warning(
                    log, "auto-creating %d topic(s) failed: %s", len(ordinary), describe(exc)
                )
            meta = broker.metadata
    unreachable = frozenset(unreachable_brokers(meta, conn.listener))
    encodings = broker.metadata_encodings
    operations = version >= 8 and getattr(body, "include_topic_authorized_operations", False)
    topics: list[list[bytes]] = []
    for name, by_id in wanted:
        if name in denied:
            # no id for a name, no name for an id: nothing the client may not see
            tname, tid = (None, by_id) if by_id else (name, _NULL_UUID)
            topics.append(
                [
                    topic_head(version, denied[name].value, tname, tid.bytes, False, 0),
                    topic_tail(version),
                ]
            )
            continue
        topic = meta.topics.get(name)
        ops = NO_OPERATIONS
        if operations and (topic is not None or not name.startswith("\0")):
            ops = authorizer.authorized_operations(conn, ResourceType.TOPIC, name)
        if topic is not None:
            topics.append(encodings.topic(meta, topic, version, unreachable, ops))
            continue
        if name.startswith("\0"):
            code, tname, tid = ErrorCode.unknown_topic_id, None, uuid.UUID(name[1:])
        else:
            try:
                validate_topic_name(name)
                code = ErrorCode.unknown_topic_or_partition
                if name in creating:
                    code = ErrorCode.leader_not_available
            except InvalidTopic:
                code = ErrorCode.invalid_topic_exception
            tname, tid = name, _NULL_UUID
        topics.append(
            [topic_head(version, code.value, tname, tid.bytes, False, 0), topic_tail(version, ops)]
        )
    cluster_operations = NO_OPERATIONS
    if 8 <= version <= 10 and getattr(body, "include_cluster_authorized_operations", False):
        cluster_operations = _cluster_operations(broker, conn)
    brokers = [
        (b["node_id"], b["host"], b["port"], b["rack"]) for b in brokers_body(meta, conn.listener)
    ]
    return encode_metadata_response(
        version,
        brokers,
        meta.cluster_id,
        broker.controller_id_for_clients(),
        topics,
        cluster_authorized_operations=cluster_operations,
    )


def _cluster_operations(broker: Broker, conn: Connection) -> int:
    """The cluster's authorized operations, as Kafka: none without DESCRIBE on the cluster."""
    authorizer = broker.authorizer
    if not authorizer.allows(conn, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return 0
    return authorizer.authorized_operations(conn, ResourceType.CLUSTER, CLUSTER_NAME)


@api(60, "DescribeCluster", 0, 2)
async def handle_describe_cluster(broker: Broker, request: Request, conn: Connection) -> Any:
    meta = broker.metadata
    endpoint_type = getattr(request.body, "endpoint_type", 1)
    if endpoint_type != 1:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.mismatched_endpoint_type,
            "error_message": "this listener serves brokers only (endpoint type 1)",
            "endpoint_type": endpoint_type,
            "cluster_id": meta.cluster_id,
            "brokers": [],
        }
    cluster_operations = -2147483648  # not asked for
    if request.body.include_cluster_authorized_operations:
        cluster_operations = _cluster_operations(broker, conn)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "error_message": None,
        "endpoint_type": 1,
        "cluster_id": meta.cluster_id,
        "controller_id": broker.controller_id_for_clients(),
        "brokers": brokers_body(meta, conn.listener),
        "cluster_authorized_operations": cluster_operations,
    }


# The most partitions one DescribeTopicPartitions response carries (Kafka's
# max.request.partition.size.limit default); clients page with the cursor.
MAX_RESPONSE_PARTITIONS = 2000


@api(75, "DescribeTopicPartitions", 0, 0)
async def handle_describe_topic_partitions(
    broker: Broker, request: Request, conn: Connection
) -> Any:
    """Kafka 4's topic description (AdminClient.describeTopics): the named topics, or every
    topic when none is named, sorted by name, at most `response_partition_limit` partitions per
    response and a cursor to the next one. As in Kafka, a topic the client may not DESCRIBE is
    left out of every-topic answers and answers TOPIC_AUTHORIZATION_FAILED when named; each
    topic carries the operations the client may do on it."""
    body = request.body
    meta = broker.metadata
    authorizer = broker.authorizer
    if body.topics:
        names = sorted({t.name for t in body.topics})
    else:
        names = sorted(t.name for t in meta.topics.values() if t.listed)
    cursor = body.cursor
    if cursor is not None and cursor.topic_name not in names:
        return {
            "throttle_time": 0,
            "topics": [_unknown_topic(n, ErrorCode.invalid_request) for n in names],
            "next_cursor": None,
        }
    if cursor is not None:
        names = names[names.index(cursor.topic_name) :]
    denied = [
        n
        for n in names
        if not authorizer.allows(conn, AclOperation.DESCRIBE, ResourceType.TOPIC, n)
    ]
    if denied:
        names = [n for n in names if n not in set(denied)]
        if not body.topics:
            denied = []  # every topic: those left out say nothing
    budget = min(max(body.response_partition_limit, 1), MAX_RESPONSE_PARTITIONS)
    topics: list[dict[str, Any]] = []
    next_cursor = None
    for name in names:
        topic = meta.topics.get(name)
        if topic is None:
            topics.append(_unknown_topic(name, ErrorCode.unknown_topic_or_partition))
            continue
        if budget == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        described = topic_body(topic, unreachable_brokers(meta, conn.listener))
        start = cursor.partition_index if cursor is not None and cursor.topic_name == name else 0
        partitions = described["partitions"][start:]
        if len(partitions) > budget:
            next_cursor = {"topic_name": name, "partition_index": start + budget}
            partitions = partitions[:budget]
        budget -= len(partitions)
        for p in partitions:
            p["eligible_leader_replicas"] = []  # no ELR: one replica, always in sync
            p["last_known_elr"] = []
        described["topic_authorized_operations"] = authorizer.authorized_operations(
            conn, ResourceType.TOPIC, name
        )
        described["partitions"] = partitions
        topics.append(described)
        if next_cursor is not None:
            break
    # named and refused: no id, whether or not they exist
    topics += [_unknown_topic(n, ErrorCode.topic_authorization_failed) for n in denied]
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}


def _unknown_topic(name: str, code: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": _NULL_UUID,
        "is_internal": False,
        "partitions": [],
    }
