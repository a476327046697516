"""What the handlers answer a client that may not see or touch a resource, in-process: the
shapes of Kafka's answers (no id for a topic named but not described, no name for one given by
id, topics left out of every-topic answers, refused deletions that do not say whether a topic
exists), the authorized-operations bit fields, and the internal topics no client changes."""

from __future__ import annotations

import dataclasses
import uuid
from types import SimpleNamespace
from typing import Any

import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
from tidalmq_broker.handover import Handovers
from tidalmq_broker.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response_parts,
)
from tidalmq_broker.protocol.fastpath import EncodedBody
from tidalmq_broker.protocol.metadata_response import TopicEncodings
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_broker.storage.api import ActiveProducer
from tidalmq_controller import TopicResult, UnknownTopic
from tidalmq_core.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType
from tidalmq_core.metadata import (
    OFFSETS_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicInfo,
)

SEEN, HIDDEN = "seen", "hidden"
SEEN_ID, HIDDEN_ID = uuid.UUID(int=1), uuid.UUID(int=2)


def allow(name: str, op: AclOperation, rt: ResourceType = ResourceType.TOPIC) -> AclBinding:
    return AclBinding(rt, name, PatternType.LITERAL, "User:bob", "*", op, PermissionType.ALLOW)


class Controller:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete_topics(self, names: list[str]) -> list[TopicResult]:
        self.deleted += names
        return [TopicResult(n, UnknownTopic(f"topic {n!r} does not exist")) for n in names]

    async def allocate_producer_id(self) -> int:
        return 7


def broker(*bindings: AclBinding) -> Any:
    meta = ClusterMetadata("c", version=3)
    meta.brokers = {0: BrokerInfo(0, "b0", 9092)}
    meta.topics = {
        SEEN: TopicInfo(SEEN, str(SEEN_ID), [PartitionState(0, 0, [0])]),
        HIDDEN: TopicInfo(HIDDEN, str(HIDDEN_ID), [PartitionState(0, 0, [0])]),
        OFFSETS_TOPIC: TopicInfo(
            OFFSETS_TOPIC, str(uuid.UUID(int=3)), [PartitionState(0, 0, [0])], internal=True
        ),
    }
    authorizer = Authorizer(enabled=True)
    authorizer.load(list(bindings))
    return SimpleNamespace(
        metadata=meta,
        authorizer=authorizer,
        controller=Controller(),
        settings=SimpleNamespace(auto_create_topics=False, produce_handover_wait_ms=1000.0),
        controller_id_for_clients=lambda: 0,
        partitions=SimpleNamespace(get_log=lambda tp: None),
        metadata_encodings=TopicEncodings(),
        handovers=Handovers(0),
    )


BOB = SimpleNamespace(
    principal="User:bob", host="10.0.0.1", listener="PLAINTEXT", client_id="t", peer="10.0.0.1:5000"
)


async def call(b: Any, api_key: int, version: int, body: dict[str, Any]) -> Any:
    """The handler's answer; one already in wire format (Metadata) decoded back to dicts."""
    frame = encode_request(api_key, version, 1, body)[4:]
    request = decode_request(frame, supported_versions())
    answer = await REGISTRY[api_key].handler(b, request, BOB)  # type: ignore[arg-type]
    if not isinstance(answer, EncodedBody):
        return answer
    raw = b"".join(bytes(p) for p in encode_response_parts(api_key, version, 1, answer))
    return dataclasses.asdict(decode_response(api_key, version, raw[4:])[1])


async def test_metadata_hides_what_the_client_may_not_describe() -> None:
    b = broker(allow(SEEN, AclOperation.READ))  # READ implies DESCRIBE
    every = await call(
        b,
        3,
        12,
        {
            "topics": None,
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": True,
        },
    )
    assert [t["name"] for t in every["topics"]] == [SEEN]  # not hidden, not the offsets topic
    assert every["topics"][0]["topic_authorized_operations"] == (
        1 << AclOperation.READ | 1 << AclOperation.DESCRIBE
    )
    named = await call(
        b,
        3,
        12,
        {
            "topics": [
                {"name": HIDDEN, "topic_id": None},
                {"name": "missing", "topic_id": None},
                {"name": None, "topic_id": HIDDEN_ID},
            ],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    by_name, missing, by_id = named["topics"]
    # refused whether or not it exists; a name keeps no id, an id gets no name
    # (kio reads the zero id as None)
    assert (by_name["error_code"], by_name["name"], by_name["topic_id"]) == (
        ErrorCode.topic_authorization_failed,
        HIDDEN,
        None,
    )
    assert missing["error_code"] == ErrorCode.topic_authorization_failed
    assert (by_id["error_code"], by_id["name"], by_id["topic_id"]) == (
        ErrorCode.topic_authorization_failed,
        None,
        HIDDEN_ID,
    )


async def test_metadata_cluster_operations_only_when_asked() -> None:
    b = broker(allow("kafka-cluster", AclOperation.ALTER, ResourceType.CLUSTER))
    asked = {
        "topics": None,
        "allow_auto_topic_creation": False,
        "include_cluster_authorized_operations": True,
        "include_topic_authorized_operations": False,
    }
    answer = await call(b, 3, 10, asked)
    assert answer["cluster_authorized_operations"] == (
        1 << AclOperation.ALTER | 1 << AclOperation.DESCRIBE
    )
    answer = await call(b, 3, 10, {**asked, "include_cluster_authorized_operations": False})
    assert answer["cluster_authorized_operations"] == -2147483648
    b.authorizer.load([])
    assert (await call(b, 3, 10, asked))["cluster_authorized_operations"] == 0  # no DESCRIBE


async def test_describe_topic_partitions_and_cluster_operations() -> None:
    b = broker(allow(SEEN, AclOperation.DESCRIBE))
    every = await call(b, 75, 0, {"topics": [], "response_partition_limit": 100, "cursor": None})
    assert [t["name"] for t in every["topics"]] == [SEEN]
    named = await call(
        b,
        75,
        0,
        {
            "topics": [{"name": HIDDEN}, {"name": SEEN}],
            "response_partition_limit": 100,
            "cursor": None,
        },
    )
    assert [(t["name"], t["error_code"]) for t in named["topics"]] == [
        (SEEN, ErrorCode.none),
        (HIDDEN, ErrorCode.topic_authorization_failed),
    ]
    cluster = await call(b, 60, 1, {"include_cluster_authorized_operations": True})
    assert cluster["cluster_authorized_operations"] == 0  # no DESCRIBE on the cluster
    b.authorizer.load([allow("kafka-cluster", AclOperation.ALTER, ResourceType.CLUSTER)])
    cluster = await call(b, 60, 1, {"include_cluster_authorized_operations": True})
    assert cluster["cluster_authorized_operations"] == (
        1 << AclOperation.ALTER | 1 << AclOperation.DESCRIBE
    )


async def test_delete_topics_says_missing_only_to_who_may_describe() -> None:
    b = broker(allow("gone", AclOperation.DESCRIBE), allow(SEEN, AclOperation.READ))
    answer = await call(
        b,
        20,
        6,
        {
            "topics": [
                {"name": HIDDEN, "topic_id": None},
                {"name": "gone", "topic_id": None},
                {"name": "unknown", "topic_id": None},
            ],
            "timeout": 1000,
        },
    )
    got = [(r["name"], r["error_code"]) for r in answer["responses"]]
    assert got == [
        (HIDDEN, ErrorCode.topic_authorization_failed),
        ("gone", ErrorCode.unknown_topic_or_partition),  # may describe it: told it is missing
        ("unknown", ErrorCode.topic_authorization_failed),  # may not: refused, nothing said
    ]
    # by id (a request of its own: the same topic by name and by id is a duplicate)
    by_id = await call(
        b,
        20,
        6,
        {
            "topics": [{"name": None, "topic_id": HIDDEN_ID}, {"name": None, "topic_id": SEEN_ID}],
            "timeout": 1000,
        },
    )
    got = [(r["name"], r["topic_id"], r["error_code"]) for r in by_id["responses"]]
    assert got == [
        (None, HIDDEN_ID, ErrorCode.topic_authorization_failed),  # not described: no name
        (SEEN, SEEN_ID, ErrorCode.topic_authorization_failed),  # described: named
    ]
    assert b.controller.deleted == ["gone"]  # nothing refused reached the controller


async def test_group_and_offset_apis_refuse_with_group_errors() -> None:
    b = broker(allow(SEEN, AclOperation.READ))
    v8 = await call(
        b, 9, 8, {"groups": [{"group_id": "g", "topics": None}], "require_stable": False}
    )
    assert v8["groups"][0]["error_code"] == ErrorCode.group_authorization_failed
    v1 = await call(
        b, 9, 1, {"group_id": "g", "topics": [{"name": SEEN, "partition_indexes": [0, 1]}]}
    )
    assert [p["error_code"] for p in v1["topics"][0]["partitions"]] == [
        ErrorCode.group_authorization_failed
    ] * 2
    found = await call(b, 10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
    assert found["coordinators"][0]["error_code"] == ErrorCode.group_authorization_failed
    txn = await call(b, 10, 4, {"key_type": 1, "coordinator_keys": ["tx"]})
    assert txn["coordinators"][0]["error_code"] == (ErrorCode.transactional_id_authorization_failed)


async def test_producers_need_write_and_no_one_appends_to_the_offsets_topic() -> None:
    idle = {
        "transactional_id": None,
        "transaction_timeout": 1000,
        "producer_id": -1,
        "producer_epoch": -1,
    }
    init = await call(broker(allow(SEEN, AclOperation.READ)), 22, 4, idle)
    assert init["error_code"] == ErrorCode.cluster_authorization_failed  # WRITE on no topic
    # WRITE on any topic (here ALL on the offsets topic) is enough for an idempotent producer
    b = broker(allow(SEEN, AclOperation.READ), allow(OFFSETS_TOPIC, AclOperation.ALL))
    init = await call(b, 22, 4, idle)
    assert (init["error_code"], init["producer_id"]) == (ErrorCode.none, 7)
    txn = await call(b, 22, 4, {**idle, "transactional_id": "tx"})
    assert txn["error_code"] == ErrorCode.transactional_id_authorization_failed
    frame = encode_request(
        0,
        9,
        1,
        {
            "transactional_id": None,
            "acks": 1,
            "timeout": 1000,
            "topic_data": [
                {"name": SEEN, "partition_data": [{"index": 0, "records": b"x"}]},
                {"name": OFFSETS_TOPIC, "partition_data": [{"index": 0, "records": b"x"}]},
            ],
        },
    )[4:]
    produced = await REGISTRY[0].handler(b, decode_request(frame, supported_versions()), BOB)  # type: ignore[arg-type]
    parts = encode_response_parts(0, 9, 1, produced)
    raw = b"".join(bytes(p) for p in parts) if isinstance(parts, list) else parts
    _, body = decode_response(0, 9, raw[4:])
    codes = {t.name: t.partition_responses[0].error_code for t in body.responses}
    assert codes == {
        SEEN: ErrorCode.topic_authorization_failed,
        OFFSETS_TOPIC: ErrorCode.invalid_topic_exception,
    }


async def test_describe_producers_only_to_who_may_read_the_topic() -> None:
    b = broker(allow(SEEN, AclOperation.DESCRIBE))  # DESCRIBE is not enough
    active = [ActiveProducer(42, 3, 9, 1, coordinator_epoch=2, current_txn_start_offset=5)]
    b.partitions = SimpleNamespace(
        get_log=lambda tp: SimpleNamespace(active_producers=lambda: active)
    )
    body = {"topics": [{"name": SEEN, "partition_indexes": [0]}]}
    refused = await call(b, 61, 0, body)
    part = refused["topics"][0]["partitions"][0]
    assert (part["error_code"], part["active_producers"]) == (
        ErrorCode.topic_authorization_failed,
        [],
    )
    b.authorizer.load([allow(SEEN, AclOperation.READ)])
    shown = await call(b, 61, 0, body)
    part = shown["topics"][0]["partitions"][0]
    assert part["error_code"] == ErrorCode.none
    assert [p["producer_id"] for p in part["active_producers"]] == [42]
    assert part["active_producers"][0]["coordinator_epoch"] == 2
    assert part["active_producers"][0]["current_txn_start_offset"] == 5


async def test_write_txn_markers_needs_cluster_action() -> None:
    written: list[tuple[int, int, bool, int]] = []

    async def write_txn_marker(
        pid: int, epoch: int, *, commit: bool, coordinator_epoch: int
    ) -> None:
        written.append((pid, epoch, commit, coordinator_epoch))

    b = broker(allow(SEEN, AclOperation.ALL))  # all of a topic is nothing of the cluster
    b.partitions = SimpleNamespace(
        get_log=lambda tp: SimpleNamespace(write_txn_marker=write_txn_marker)
    )
    b.txn_marker_listeners = []
    body = {
        "markers": [
            {
                "producer_id": 9,
                "producer_epoch": 1,
                "transaction_result": True,
                "topics": [{"name": SEEN, "partition_indexes": [0]}],
                "coordinator_epoch": 4,
            }
        ]
    }
    refused = await call(b, 27, 1, body)
    codes = [p["error_code"] for p in refused["markers"][0]["topics"][0]["partitions"]]
    assert codes == [ErrorCode.cluster_authorization_failed] and written == []
    b.authorizer.load([allow("kafka-cluster", AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)])
    done = await call(b, 27, 1, body)
    assert [p["error_code"] for p in done["markers"][0]["topics"][0]["partitions"]] == [0]
    assert written == [(9, 1, True, 4)]
