"""CreateTopics, DeleteTopics and CreatePartitions, all decided by the controller.

Authorized as Kafka's controller does (ControllerApis): CreateTopics needs CREATE on the cluster
or on each topic ("Authorization failed."), and returns a created topic's configs only to a
client that may DESCRIBE_CONFIGS it (TOPIC_AUTHORIZATION_FAILED as its config error otherwise);
DeleteTopics needs DELETE on the cluster or on each topic (a topic the client may not DESCRIBE
is refused before anything says whether it exists); CreatePartitions ALTER on each topic. The
controller refuses to delete, grow or reconfigure an internal topic, whatever the ACLs
(INVALID_TOPIC_EXCEPTION).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from tidalmq_controller import NewTopic
from tidalmq_core.acls import CLUSTER_NAME, AclOperation, ResourceType

from tidalmq_broker.apis.errors import error_code, error_message
from tidalmq_broker.apis.kafka_registry import api
from tidalmq_broker.protocol.codec import Request

if TYPE_CHECKING:
    from tidalmq_broker.broker import Broker
    from tidalmq_broker.server.connection import Connection


def _config_entries(configs: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"name": k, "value": v, "read_only": False, "config_source": 5, "is_sensitive": False}
        for k, v in sorted(configs.items())
    ]


@api(19, "CreateTopics", 0, 7)
async def handle_create_topics(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    early: dict[str, tuple[ErrorCode, str]] = {}
    wanted: list[NewTopic] = []
    authorizer = broker.authorizer
    every = authorizer.allows(conn, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
    for t in body.topics:
        if not every and not authorizer.allows(
            conn, AclOperation.CREATE, ResourceType.TOPIC, t.name
        ):
            early[t.name] = (ErrorCode.topic_authorization_failed, "Authorization failed.")
            continue
        if t.assignments:
            owners, problem = _placement(t)
            if problem is not None:
                early[t.name] = problem
            else:
                configs = {c.name: c.value for c in t.configs}
                wanted.append(NewTopic(t.name, len(owners), configs, assignment=owners))
            continue
        if t.replication_factor not in (-1, 1):
            early[t.name] = (
                ErrorCode.invalid_replication_factor,
                "TidalMQ keeps one durable copy in object storage: replication factor must be "
                f"1 or -1 (default), got {t.replication_factor}",
            )
            continue
        partitions = (
            t.num_partitions if t.num_partitions != -1 else broker.settings.default_partitions
        )
        wanted.append(NewTopic(t.name, partitions, {c.name: c.value for c in t.configs}))
    results = {}
    if wanted:
        # like Kafka, answer within the request's timeout; unlike Kafka, also wait (within it)
        # until the partitions serve, so a producer right after CreateTopics just works
        wait_s = (
            min(max(body.timeout.total_seconds(), 0.0), 10.0) if request.api_version >= 1 else 0.0
        )
        created = await broker.controller.create_topics(
            wanted, validate_only=body.validate_only, wait_s=wait_s
        )
        for r in created:
            results[r.name] = r
    topics = []
    for t in body.topics:
        if t.name in early:
            code, msg = early[t.name]
            topics.append(
                {
                    "name": t.name,
                    "topic_id": uuid.UUID(int=0),
                    "error_code": code,
                    "error_message": msg,
                    "configs": None,
                }
            )
            continue
        r = results[t.name]
        if r.error is not None:
            topics.append(
                {
                    "name": t.name,
                    "topic_id": uuid.UUID(int=0),
                    "error_code": error_code(r.error),
                    "error_message": error_message(r.error),
                    "configs": None,
                }
            )
        elif not authorizer.allows(conn, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, t.name):
            topics.append(
                {
                    "name": t.name,
                    "topic_id": uuid.UUID(r.topic_id) if r.topic_id else uuid.UUID(int=0),
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "num_partitions": -1,
                    "replication_factor": -1,
                    "configs": [],
                    "topic_config_error_code": ErrorCode.topic_authorization_failed,
                }
            )
        else:
            topics.append(
                {
                    "name": t.name,
                    "topic_id": uuid.UUID(r.topic_id) if r.topic_id else uuid.UUID(int=0),
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "num_partitions": r.num_partitions,
                    "replication_factor": 1,
                    "configs": _config_entries(r.configs),
                }
            )
    return {"throttle_time": 0, "topics": topics}


def _single_replicas(lists: list[list[int]]) -> str | None:
    for replicas in lists:
        if len(replicas) != 1:
            return (
                f"replicas {replicas} must name exactly one broker: TidalMQ keeps one replica "
                "per partition, its data lives in object storage"
            )
    return None


def _placement(t: Any) -> tuple[list[int], tuple[ErrorCode, str] | None]:
    """The broker of each partition from CreateTopics' replica assignment, or the error."""
    if t.num_partitions != -1 or t.replication_factor != -1:
        return [], (
            ErrorCode.invalid_request,
            "Both numPartitions or replicationFactor and "
            "replicasAssignments were set. Both cannot be used at the same time.",
        )
    by_index = {a.partition_index: list(a.broker_ids) for a in t.assignments}
    if sorted(by_index) != list(range(len(t.assignments))):
        return [], (
            ErrorCode.invalid_replica_assignment,
            "partitions in the replica assignment must be numbered 0..n-1",
        )
    lists = [by_index[i] for i in range(len(by_index))]
    problem = _single_replicas(lists)
    if problem is not None:
        return [], (ErrorCode.invalid_replica_assignment, problem)
    return [r[0] for r in lists], None


@api(20, "DeleteTopics", 0, 6)
async def handle_delete_topics(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    meta = broker.metadata
    if request.api_version >= 6:
        names: list[str | None] = []
        for t in body.topics:
            if t.name is not None:
                names.append(t.name)
            else:
                found = meta.topic_by_id(str(t.topic_id))
                names.append(found.name if found else None)
        ids = [t.topic_id for t in body.topics]
    else:
        names = list(body.topic_names)
        ids = [None] * len(names)
    # A topic named twice (by name or id) is refused as Kafka does, not deleted: the controller
    # would delete it twice over (KeyError in its commit, the connection closed).
    counts = Counter(n for n in names if n is not None)
    authorizer = broker.authorizer
    every = authorizer.allows(conn, AclOperation.DELETE, ResourceType.CLUSTER, CLUSTER_NAME)
    refused: dict[str, bool] = {}  # name -> whether the client may know it (DESCRIBE)
    for counted in counts:
        if not every and not authorizer.allows(
            conn, AclOperation.DELETE, ResourceType.TOPIC, counted
        ):
            refused[counted] = authorizer.allows(
                conn, AclOperation.DESCRIBE, ResourceType.TOPIC, counted
            )
    for name, tid in zip(names, ids, strict=True):
        # by name: a topic the client may describe is known to be missing, as in Kafka
        if name in refused and tid is None and refused[name] and name not in meta.topics:
            del refused[name]
    known = [n for n in counts if counts[n] == 1 and n not in refused]
    results = {r.name: r for r in await broker.controller.delete_topics(known)} if known else {}
    responses = []
    for name, tid in zip(names, ids, strict=True):
        if name is None:
            responses.append(
                {
                    "name": None,
                    "topic_id": tid,
                    "error_code": ErrorCode.unknown_topic_id,
                    "error_message": "unknown topic id",
                }
            )
            continue
        if name in refused and counts[name] == 1:
            described = refused[name] or tid is None  # by id: no name for a topic not described
            responses.append(
                {
                    "name": name if described else None,
                    "topic_id": tid or uuid.UUID(int=0),
                    "error_code": ErrorCode.topic_authorization_failed,
                    "error_message": None,
                }
            )
            continue
        if counts[name] > 1:
            duplicate = {
                "name": name,
                "topic_id": tid or uuid.UUID(int=0),
                "error_code": ErrorCode.invalid_request,
                "error_message": "Duplicate topic name.",
            }
            responses.append(duplicate)
            continue
        r = results[name]
        responses.append(
            {
                "name": name,
                "topic_id": uuid.UUID(r.topic_id) if r.topic_id else uuid.UUID(int=0),
                "error_code": error_code(r.error) if r.error else ErrorCode.none,
                "error_message": error_message(r.error) if r.error else None,
            }
        )
    return {"throttle_time": 0, "responses": responses}


@api(37, "CreatePartitions", 0, 3)
async def handle_create_partitions(broker: Broker, request: Request, conn: Connection) -> Any:
    body = request.body
    results = []
    for t in body.topics:
        if not broker.authorizer.allows(conn, AclOperation.ALTER, ResourceType.TOPIC, t.name):
            results.append(
                {
                    "name": t.name,
                    "error_code": ErrorCode.topic_authorization_failed,
                    "error_message": None,
                }
            )
            continue
        owners = None
        if t.assignments:
            lists = [list(a.broker_ids) for a in t.assignments]
            problem = _single_replicas(lists)
            if problem is not None:
                results.append(
                    {
                        "name": t.name,
                        "error_code": ErrorCode.invalid_replica_assignment,
                        "error_message": problem,
                    }
                )
                continue
            owners = [r[0] for r in lists]
        r = await broker.controller.create_partitions(
            t.name, t.count, validate_only=body.validate_only, assignment=owners
        )
        results.append(
            {
                "name": t.name,
                "error_code": error_code(r.error) if r.error else ErrorCode.none,
                "error_message": error_message(r.error) if r.error else None,
            }
        )
    return {"throttle_time": 0, "results": results}
