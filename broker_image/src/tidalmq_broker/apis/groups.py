"""Consumer group APIs: FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, offsets, admin.

Authorized as Kafka does (KafkaApis): FindCoordinator DESCRIBE on the group (or transactional
id), CLUSTER_ACTION on the cluster for a share-group key (v6); JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetCommit READ on the group
(GROUP_AUTHORIZATION_FAILED), OffsetCommit also READ on each topic; OffsetFetch and
DescribeGroups DESCRIBE on the group, OffsetFetch also DESCRIBE on each topic (a topic refused
is left out when every offset is asked for, TOPIC_AUTHORIZATION_FAILED when named); ListGroups
every group with DESCRIBE on the cluster, else the groups the client may DESCRIBE; DeleteGroups
DELETE on each group; OffsetDelete DELETE on the group and READ on each topic.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType
from tidalmq_core.metadata import NO_LEADER, OFFSETS_TOPIC, TXN_STATE_TOPIC

from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.groups.consumer_group import CONSUMER_PROTOCOL
from tidalmq_broker.groups.coordinator import CommittedOffset, CoordinatorError, GroupShard
from tidalmq_broker.groups.group import GroupState
from tidalmq_broker.protocol.codec import Request
from tidalmq_broker.transactions.state import TxnError

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection

GROUP_KEY = 0
CLASSIC_GROUP_TYPE = "classic"
TRANSACTION_KEY = 1
SHARE_KEY = 2  # FindCoordinator v6 (KIP-932): the share coordinator, asked by brokers
_GROUP = ResourceType.GROUP
_TOPIC = ResourceType.TOPIC
GROUP_DENIED = "Group authorization failed."
TXN_DENIED = "Transactional Id authorization failed."
CLUSTER_DENIED = "Cluster authorization failed."
SHARE_UNSUPPORTED = "TidalMQ has no share groups (KIP-932): no share coordinator"


def _may(broker: Broker, conn: Connection, op: AclOperation, rt: ResourceType, name: str) -> bool:
    return broker.authorizer.allows(conn, op, rt, name)


def _found(
    broker: Broker, conn: Connection, key: str, key_type: int, version: int
) -> dict[str, Any]:
    """FindCoordinator for one key: DESCRIBE on the group (or transactional id) first."""
    if key_type == GROUP_KEY and not _may(broker, conn, AclOperation.DESCRIBE, _GROUP, key):
        code, message = ErrorCode.group_authorization_failed, GROUP_DENIED
    elif key_type == TRANSACTION_KEY and not _may(
        broker, conn, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key
    ):
        code, message = ErrorCode.transactional_id_authorization_failed, TXN_DENIED
    elif key_type == SHARE_KEY:
        # as Kafka: INVALID_REQUEST below v6; at v6 CLUSTER_ACTION on the cluster first (share
        # coordinators are found by brokers), then INVALID_REQUEST where no share coordinator
        # runs (Kafka without share groups); TidalMQ has no share groups (KIP-932)
        if version >= 6 and not _may(
            broker, conn, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME
        ):
            code, message = ErrorCode.cluster_authorization_failed, CLUSTER_DENIED
        else:
            code = ErrorCode.invalid_request
            message = (
                SHARE_UNSUPPORTED if version >= 6 else "share-group keys need FindCoordinator v6"
            )
    else:
        return _find(broker, key, key_type, conn.listener)
    return {
        "key": key,
        "node_id": -1,
        "host": "",
        "port": -1,
        "error_code": code,
        "error_message": message,
    }


def _find(broker: Broker, key: str, key_type: int, listener: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "key": key,
        "node_id": -1,
        "host": "",
        "port": -1,
        "error_code": ErrorCode.none,
        "error_message": None,
    }
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        out["error_code"] = ErrorCode.invalid_request
        out["error_message"] = f"TidalMQ has no coordinators of key type {key_type}"
        return out
    what = "group" if key_type == GROUP_KEY else "transaction"
    if not key:
        out["error_code"] = ErrorCode.invalid_request
        out["error_message"] = f"{what} id is empty"
        return out
    meta = broker.metadata
    topic = meta.topics.get(OFFSETS_TOPIC if key_type == GROUP_KEY else TXN_STATE_TOPIC)
    try:
        if key_type == GROUP_KEY:
            partition = broker.groups.partition_for(key)
        else:
            if topic is None:  # created on first use, as Kafka does
                broker.transactions.ensure_state_topic()
            partition = broker.transactions.partition_for(key)
    except (CoordinatorError, TxnError):
        partition = -1
    leader = topic.partitions[partition].leader if topic and partition >= 0 else NO_LEADER
    node = meta.brokers.get(leader)
    if node is None or node.state == "dead":
        out["error_code"] = ErrorCode.coordinator_not_available
        out["error_message"] = f"the {what}'s coordinator is moving; retry"
        return out
    endpoint = node.endpoint(listener)  # as Kafka: the coordinator on the client's listener
    if endpoint is None:
        out["error_code"] = ErrorCode.coordinator_not_available
        out["error_message"] = f"the {what}'s coordinator has no listener {listener}"
        return out
    out.update(node_id=node.broker_id, host=endpoint.host, port=endpoint.port)
    return out


# v4 batches keys; v5 only allows TRANSACTION_ABORTABLE in answers (KIP-890); v6 adds the share-group key type (answered INVALID_REQUEST, as Kafka without a
# share coordinator)
@api(10, "FindCoordinator", 0, 6)
async def handle_find_coordinator(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    version = request.api_version
    key_type = getattr(body, "key_type", GROUP_KEY)
    if version >= 4:
        return {
            "throttle_time": 0,
            "coordinators": [
                _found(broker, conn, k, key_type, version) for k in body.coordinator_keys
            ],
        }
    found = _found(broker, conn, body.key, key_type, version)
    return {"throttle_time": 0, **found}


def _shard(broker: Broker, group_id: str) -> GroupShard:
    return broker.groups.shard(group_id)


@api(11, "JoinGroup", 0, 9)
async def handle_join_group(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    if not _may(broker, conn, AclOperation.READ, _GROUP, b.group_id):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.group_authorization_failed,
            "generation_id": -1,
            "protocol_name": None,
            "leader": "",
            "member_id": "",
            "members": [],
        }
    try:
        shard = _shard(broker, b.group_id)
    except CoordinatorError as exc:
        return {
            "throttle_time": 0,
            "error_code": exc.code,
            "generation_id": -1,
            "protocol_name": None,
            "leader": "",
            "member_id": b.member_id,
            "members": [],
        }
    session_ms = int(b.session_timeout.total_seconds() * 1000)
    rebalance = getattr(b, "rebalance_timeout", None)
    rebalance_ms = int(rebalance.total_seconds() * 1000) if rebalance is not None else session_ms
    result = await shard.join(
        group_id=b.group_id,
        member_id=b.member_id,
        group_instance_id=getattr(b, "group_instance_id", None),
        client_id=conn.client_id or "",
        client_host="/" + conn.peer.rsplit(":", 1)[0],
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type=b.protocol_type,
        protocols=[(p.name, p.metadata) for p in b.protocols],
        require_known_member_id=request.api_version >= 4,
    )
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name
        if request.api_version >= 7
        else (result.protocol_name or ""),
        "leader": result.leader,
        "skip_assignment": False,
        "member_id": result.member_id,
        "members": result.members,
    }


@api(14, "SyncGroup", 0, 5)
async def handle_sync_group(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    if not _may(broker, conn, AclOperation.READ, _GROUP, b.group_id):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.group_authorization_failed,
            "assignment": b"",
        }
    try:
        shard = _shard(broker, b.group_id)
    except CoordinatorError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "assignment": b""}
    code, assignment, ptype, pname = await shard.sync(
        group_id=b.group_id,
        generation=b.generation_id,
        member_id=b.member_id,
        protocol_type=getattr(b, "protocol_type", None),
        protocol_name=getattr(b, "protocol_name", None),
        assignments={a.member_id: a.assignment for a in b.assignments},
    )
    return {
        "throttle_time": 0,
        "error_code": code,
        "protocol_type": ptype,
        "protocol_name": pname,
        "assignment": assignment,
    }


@api(12, "Heartbeat", 0, 4)
async def handle_heartbeat(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    if not _may(broker, conn, AclOperation.READ, _GROUP, b.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
    try:
        code = _shard(broker, b.group_id).heartbeat(b.group_id, b.generation_id, b.member_id)
    except CoordinatorError as exc:
        code = exc.code
    return {"throttle_time": 0, "error_code": code}


@api(13, "LeaveGroup", 0, 5)
async def handle_leave_group(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    if not _may(broker, conn, AclOperation.READ, _GROUP, b.group_id):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.group_authorization_failed,
            "members": [],
        }
    if request.api_version >= 3:
        members = [(m.member_id, m.group_instance_id) for m in b.members]
    else:
        members = [(b.member_id, None)]
    try:
        codes = _shard(broker, b.group_id).leave(b.group_id, members)
    except CoordinatorError as exc:
        return {"throttle_time": 0, "error_code": exc.code, "members": []}
    top = ErrorCode.none if request.api_version >= 3 else ErrorCode(codes[0])
    return {
        "throttle_time": 0,
        "error_code": top,
        "members": [
            {"member_id": mid, "group_instance_id": iid, "error_code": code}
            for (mid, iid), code in zip(members, codes, strict=True)
        ],
    }


# v9: the same fields, sent by members of consumer groups (KIP-848) with their member epoch
@api(8, "OffsetCommit", 2, 9)
async def handle_offset_commit(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    offsets: dict[tuple[str, int], CommittedOffset] = {}
    unknown: set[tuple[str, int]] = set()
    refused: dict[tuple[str, int], ErrorCode] = {}
    meta = broker.metadata
    group_ok = _may(broker, conn, AclOperation.READ, _GROUP, b.group_id)
    for t in b.topics:
        topic = meta.topics.get(t.name)
        topic_ok = group_ok and _may(broker, conn, AclOperation.READ, _TOPIC, t.name)
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if not topic_ok:
                refused[key] = (
                    ErrorCode.topic_authorization_failed
                    if group_ok
                    else ErrorCode.group_authorization_failed
                )
                continue
            if topic is None or p.partition_index >= len(topic.partitions):
                unknown.add(key)
                continue
            offsets[key] = CommittedOffset(
                p.committed_offset, getattr(p, "committed_leader_epoch", -1), p.committed_metadata
            )
    try:
        codes = (
            await _shard(broker, b.group_id).commit(
                group_id=b.group_id,
                generation=b.generation_id_or_member_epoch,
                member_id=b.member_id,
                offsets=offsets,
                topic_ids={
                    t.name: str(uuid.UUID(meta.topics[t.name].topic_id))
                    for t in b.topics
                    if t.name in meta.topics and meta.topics[t.name].topic_id
                },
            )
            if offsets
            else {}
        )
    except CoordinatorError as exc:
        codes = dict.fromkeys(offsets, exc.code)
    for key in unknown:
        codes[key] = ErrorCode.unknown_topic_or_partition
    codes.update(refused)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for t in b.topics:
        for p in t.partitions:
            by_topic.setdefault(t.name, []).append(
                {
                    "partition_index": p.partition_index,
                    "error_code": codes[(t.name, p.partition_index)],
                }
            )
    return {
        "throttle_time": 0,
        "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
    }


def _fetch_group_offsets(
    broker: Broker,
    conn: Connection,
    group_id: str,
    topics: Any,
    version: int,
    require_stable: bool = False,
    member: tuple[str | None, int] = (None, -1),
) -> dict[str, Any]:
    """`require_stable` (v7+, KIP-447): a partition with an offset pending in an open
    transaction answers UNSTABLE_OFFSET_COMMIT (the client retries) instead of the older one."""
    if not _may(broker, conn, AclOperation.DESCRIBE, _GROUP, group_id):
        # v1 has no error of its own: each partition named carries it
        denied = (
            [
                {
                    "name": t.name,
                    "partitions": [
                        _offset_error(i, ErrorCode.group_authorization_failed)
                        for i in t.partition_indexes
                    ],
                }
                for t in topics or ()
            ]
            if version < 2
            else []
        )
        return {
            "group_id": group_id,
            "topics": denied,
            "error_code": ErrorCode.group_authorization_failed,
        }
    try:
        shard = _shard(broker, group_id)
    except CoordinatorError as exc:
        return {"group_id": group_id, "topics": [], "error_code": exc.code}
    code = shard.validate_offset_fetch(group_id, *member)
    if code != ErrorCode.none:
        return {"group_id": group_id, "topics": [], "error_code": code}
    wanted = None
    refused: list[Any] = []
    if topics is not None:
        allowed = []
        for t in topics:
            if _may(broker, conn, AclOperation.DESCRIBE, _TOPIC, t.name):
                allowed.append(t)
            else:
                refused.append(t)
        wanted = [(t.name, p) for t in allowed for p in t.partition_indexes]
    found = shard.fetch_offsets(group_id, wanted)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for t in refused:
        by_topic[t.name] = [
            _offset_error(i, ErrorCode.topic_authorization_failed) for i in t.partition_indexes
        ]
    for (topic, partition), c in found.items():
        if wanted is None and not _may(broker, conn, AclOperation.DESCRIBE, _TOPIC, topic):
            continue  # every offset asked for: topics the client may not see are left out
        if require_stable and shard.has_pending(group_id, topic, partition):
            by_topic.setdefault(topic, []).append(
                _offset_error(partition, ErrorCode.unstable_offset_commit)
            )
            continue
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": c.offset,
                "committed_leader_epoch": c.leader_epoch,
                "metadata": c.metadata,
                "error_code": ErrorCode.none,
            }
        )
    return {
        "group_id": group_id,
        "error_code": ErrorCode.none,
        "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
    }


def _offset_error(index: int, code: ErrorCode) -> dict[str, Any]:
    return {
        "partition_index": index,
        "committed_offset": -1,
        "committed_leader_epoch": -1,
        "metadata": "",
        "error_code": code,
    }


# v9: a consumer group's member names itself and its epoch (KIP-848)
@api(9, "OffsetFetch", 1, 9)
async def handle_offset_fetch(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    version = request.api_version
    stable = bool(getattr(b, "require_stable", False))
    if version >= 8:
        return {
            "throttle_time": 0,
            "groups": [
                _fetch_group_offsets(
                    broker,
                    conn,
                    g.group_id,
                    g.topics,
                    version,
                    stable,
                    member=(getattr(g, "member_id", None), getattr(g, "member_epoch", -1)),
                )
                for g in b.groups
            ],
        }
    one = _fetch_group_offsets(broker, conn, b.group_id, b.topics, version, stable)
    return {"throttle_time": 0, "topics": one["topics"], "error_code": one["error_code"]}


@api(16, "ListGroups", 0, 5)
async def handle_list_groups(broker: Broker, request: Request, conn: Connection) -> Any:
    """Classic groups (JoinGroup/SyncGroup) and consumer groups (KIP-848, type `consumer`);
    filters match case-insensitively, as in Kafka, so `kafka-groups --list --group-type
    classic` and the like work."""
    states = {s.lower() for s in getattr(request.body, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(request.body, "types_filter", ()) or ()}
    listed: list[tuple[str, str, str, str]] = []  # id, protocol type, state, group type
    for shard in broker.groups.shards():
        if not types or CLASSIC_GROUP_TYPE in types:
            listed += [
                (g.group_id, g.protocol_type or "", g.state.value, CLASSIC_GROUP_TYPE)
                for g in shard.list_groups()
            ]
        if not types or CONSUMER_PROTOCOL in types:
            listed += [
                (g.group_id, CONSUMER_PROTOCOL, g.state().value, CONSUMER_PROTOCOL)
                for g in shard.consumer.groups.values()
            ]
    groups = []
    every = _may(broker, conn, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
    for group_id, protocol_type, state, group_type in listed:
        if states and state.lower() not in states:
            continue
        if not every and not _may(broker, conn, AclOperation.DESCRIBE, _GROUP, group_id):
            continue
        groups.append(
            {
                "group_id": group_id,
                "protocol_type": protocol_type,
                "group_state": state,
                "group_type": group_type,
            }
        )
    return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}


@api(15, "DescribeGroups", 0, 6)
async def handle_describe_groups(broker: Broker, request: Request, conn: Connection) -> Any:
    out = []
    operations = request.api_version >= 3 and request.body.include_authorized_operations
    for group_id in request.body.groups:
        entry: dict[str, Any] = {
            "group_id": group_id,
            "group_state": GroupState.DEAD.value,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "error_code": ErrorCode.none,
        }
        if not _may(broker, conn, AclOperation.DESCRIBE, _GROUP, group_id):
            entry.update(group_state="", error_code=ErrorCode.group_authorization_failed)
            out.append(entry)
            continue
        try:
            group = _shard(broker, group_id).describe(group_id)
        except CoordinatorError as exc:
            entry["error_code"] = exc.code
            out.append(entry)
            continue
        if group is not None:
            stable = group.state is GroupState.STABLE
            entry.update(
                group_state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_data=(group.protocol_name or "")
                if stable or group.state is GroupState.COMPLETING_REBALANCE
                else "",
                members=group.described_members(),
            )
        elif request.api_version >= 6:  # KIP-1043: a group that does not exist is an error
            entry["error_code"] = ErrorCode.group_id_not_found
            entry["error_message"] = (
                f"Group {group_id} is not a classic group."
                if _shard(broker, group_id).consumer_group(group_id) is not None
                else f"Group {group_id} not found."
            )
        if operations and entry["error_code"] == ErrorCode.none:
            entry["authorized_operations"] = broker.authorizer.authorized_operations(
                conn, _GROUP, group_id
            )
        out.append(entry)
    return {"throttle_time": 0, "groups": out}


@api(42, "DeleteGroups", 0, 2)
async def handle_delete_groups(broker: Broker, request: Request, conn: Connection) -> Any:
    results = []
    for group_id in request.body.groups_names:
        if not _may(broker, conn, AclOperation.DELETE, _GROUP, group_id):
            results.append(
                {"group_id": group_id, "error_code": ErrorCode.group_authorization_failed}
            )
            continue
        try:
            code = await _shard(broker, group_id).delete_group(group_id)
        except CoordinatorError as exc:
            code = exc.code
        results.append({"group_id": group_id, "error_code": code})
    return {"throttle_time": 0, "results": results}


@api(47, "OffsetDelete", 0, 0)
async def handle_offset_delete(broker: Broker, request: Request, conn: Connection) -> Any:
    b = request.body
    if not _may(broker, conn, AclOperation.DELETE, _GROUP, b.group_id):
        return {
            "error_code": ErrorCode.group_authorization_failed,
            "throttle_time": 0,
            "topics": [],
        }
    wanted = []
    refused: dict[tuple[str, int], ErrorCode] = {}
    for t in b.topics:
        readable = _may(broker, conn, AclOperation.READ, _TOPIC, t.name)
        for p in t.partitions:
            if readable:
                wanted.append((t.name, p.partition_index))
            else:
                refused[(t.name, p.partition_index)] = ErrorCode.topic_authorization_failed
    try:
        top, per = await _shard(broker, b.group_id).delete_offsets(b.group_id, wanted)
    except CoordinatorError as exc:
        top, per = exc.code, {}
    per = {**per, **refused}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in per.items():
        by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return {
        "error_code": top,
        "throttle_time": 0,
        "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
    }
