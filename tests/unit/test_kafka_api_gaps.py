"""FindCoordinator up to v6, ListConfigResources and the static broker configs of
DescribeConfigs, in-process: each answer goes through kio's schema both ways (what a client
reads), and the README's list of APIs not offered is checked against Kafka 4.3.1's."""

from __future__ import annotations

import dataclasses
import re
import socket
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import tidalmq_broker.apis  # noqa: F401  (registers the handlers)
from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.api_versions import api_versions_body
from tidalmq_broker.apis.kafka_registry import REGISTRY, supported_versions
from tidalmq_broker.apis.metadata import AutoCreation, auto_creation
from tidalmq_broker.handover import Handovers
from tidalmq_broker.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidalmq_broker.protocol.metadata_response import TopicEncodings
from tidalmq_broker.security.authorizer import Authorizer
from tidalmq_broker.settings import BrokerSettings
from tidalmq_controller import HttpControllerClient
from tidalmq_core.acls import AclBinding, AclOperation, PatternType, PermissionType, ResourceType
from tidalmq_core.metadata import (
    OFFSETS_TOPIC,
    TXN_STATE_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    Endpoint,
    PartitionState,
    TopicInfo,
)

README = Path(__file__).resolve().parents[2] / "README.md"
CLUSTER = "kafka-cluster"
GROUP_KEY, TXN_KEY, SHARE_KEY = 0, 1, 2
TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 4, 5

# Apache Kafka 4.3.1's APIs on a broker listener (ApiKeys.apisForListener(BROKER) of
# kafka-clients-4.3.1.jar): key -> name
KAFKA_BROKER_APIS = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    17: "SaslHandshake",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
    21: "DeleteRecords",
    22: "InitProducerId",
    23: "OffsetForLeaderEpoch",
    24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn",
    26: "EndTxn",
    27: "WriteTxnMarkers",
    28: "TxnOffsetCommit",
    29: "DescribeAcls",
    30: "CreateAcls",
    31: "DeleteAcls",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    34: "AlterReplicaLogDirs",
    35: "DescribeLogDirs",
    36: "SaslAuthenticate",
    37: "CreatePartitions",
    38: "CreateDelegationToken",
    39: "RenewDelegationToken",
    40: "ExpireDelegationToken",
    41: "DescribeDelegationToken",
    42: "DeleteGroups",
    43: "ElectLeaders",
    44: "IncrementalAlterConfigs",
    45: "AlterPartitionReassignments",
    46: "ListPartitionReassignments",
    47: "OffsetDelete",
    48: "DescribeClientQuotas",
    49: "AlterClientQuotas",
    50: "DescribeUserScramCredentials",
    51: "AlterUserScramCredentials",
    55: "DescribeQuorum",
    57: "UpdateFeatures",
    60: "DescribeCluster",
    61: "DescribeProducers",
    64: "UnregisterBroker",
    65: "DescribeTransactions",
    66: "ListTransactions",
    68: "ConsumerGroupHeartbeat",
    69: "ConsumerGroupDescribe",
    71: "GetTelemetrySubscriptions",
    72: "PushTelemetry",
    74: "ListConfigResources",
    75: "DescribeTopicPartitions",
    76: "ShareGroupHeartbeat",
    77: "ShareGroupDescribe",
    78: "ShareFetch",
    79: "ShareAcknowledge",
    80: "AddRaftVoter",
    81: "RemoveRaftVoter",
    83: "InitializeShareGroupState",
    84: "ReadShareGroupState",
    85: "WriteShareGroupState",
    86: "DeleteShareGroupState",
    87: "ReadShareGroupStateSummary",
    88: "StreamsGroupHeartbeat",
    89: "StreamsGroupDescribe",
    90: "DescribeShareGroupOffsets",
    91: "AlterShareGroupOffsets",
    92: "DeleteShareGroupOffsets",
}


def allow(rt: ResourceType, name: str, op: AclOperation) -> AclBinding:
    return AclBinding(rt, name, PatternType.LITERAL, "User:bob", "*", op, PermissionType.ALLOW)


def broker(*bindings: AclBinding, settings: BrokerSettings | None = None) -> Any:
    meta = ClusterMetadata("c", version=3)
    meta.brokers = {
        0: BrokerInfo(0, "b0", 9092),
        1: BrokerInfo(1, "b1", 9092),
        2: BrokerInfo(2, "b2", 9092, state="dead"),
        3: BrokerInfo(3, "b3", 9093, listeners=[Endpoint("SASL_SSL", "b3", 9093, "SASL_SSL")]),
    }
    meta.topics = {
        "orders": TopicInfo("orders", str(uuid.UUID(int=1)), [PartitionState(0, 0, [0])]),
        "__sq.hidden": TopicInfo(
            "__sq.hidden", str(uuid.UUID(int=2)), [PartitionState(0, 0, [0])], internal=True
        ),
        OFFSETS_TOPIC: TopicInfo(
            OFFSETS_TOPIC, str(uuid.UUID(int=3)), [PartitionState(1, 0, [1])], internal=True
        ),
    }
    authorizer = Authorizer(enabled=True)
    authorizer.load(list(bindings))
    settings = settings or BrokerSettings(controller_url="http://ctl:9690")
    return SimpleNamespace(
        metadata=meta,
        authorizer=authorizer,
        settings=settings,
        broker_id=settings.broker_id,
        advertised=[Endpoint("PLAINTEXT", "b0", 9092)],
        metadata_encodings=TopicEncodings(),
        groups=SimpleNamespace(partition_for=lambda key: 0),
        handovers=Handovers(settings.broker_id),
    )


BOB = SimpleNamespace(
    principal="User:bob", host="10.0.0.1", listener="PLAINTEXT", client_id="t", peer="10.0.0.1:5000"
)


async def call(b: Any, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """The handler's answer as a client reads it: request and response through kio."""
    request = decode_request(encode_request(api_key, version, 1, body)[4:], supported_versions())
    answer = await REGISTRY[api_key].handler(b, request, BOB)  # type: ignore[arg-type]
    raw = encode_response(api_key, version, 1, answer)
    return dataclasses.asdict(decode_response(api_key, version, raw[4:])[1])


# ---------------------------------------------------------------- versions
def test_versions_offered() -> None:
    offered = {
        a["api_key"]: (a["min_version"], a["max_version"]) for a in api_versions_body()["api_keys"]
    }
    assert offered[10] == (0, 6)  # FindCoordinator: kafka-python's api_version=(4, x) sends v6
    assert offered[74] == (0, 1)  # ListConfigResources
    assert offered[1] == (4, 17)  # Fetch: Kafka 4.3's range (v13+ by topic id, v16 KIP-951)
    assert supported_versions()[10] == (0, 6)


def test_readme_lists_exactly_the_apis_not_offered() -> None:
    text = " ".join(README.read_text().split())
    start = text.index("APIs of Apache Kafka 4.3.1's broker listener not offered")
    section = text[start : text.index("FindCoordinator answers share-group keys", start)]
    listed = set(re.findall(r"\b[A-Z][a-z]+[A-Z][A-Za-z]*\b", section.split("):", 1)[1]))
    missing = {name for key, name in KAFKA_BROKER_APIS.items() if key not in REGISTRY}
    assert listed == missing
    extra = {s.name for k, s in REGISTRY.items() if k not in KAFKA_BROKER_APIS}
    assert not extra, extra  # nothing offered that Kafka's broker listener does not offer


# ---------------------------------------------------------------- FindCoordinator
async def test_find_coordinator_v6_batched_group_keys() -> None:
    b = broker(allow(ResourceType.GROUP, "*", AclOperation.DESCRIBE))
    for version in (4, 5, 6):
        answer = await call(
            b, 10, version, {"key_type": GROUP_KEY, "coordinator_keys": ["g1", "g2"]}
        )
        found = [
            (c["key"], c["error_code"], c["node_id"], c["host"], c["port"])
            for c in answer["coordinators"]
        ]
        assert found == [
            ("g1", ErrorCode.none, 1, "b1", 9092),
            ("g2", ErrorCode.none, 1, "b1", 9092),
        ], version
    old = await call(b, 10, 3, {"key": "g1", "key_type": GROUP_KEY})
    assert (old["error_code"], old["node_id"]) == (ErrorCode.none, 1)


async def test_find_coordinator_share_keys_get_an_error_not_a_crash() -> None:
    share = {"key_type": SHARE_KEY, "coordinator_keys": ["g:topicid:0"]}
    b = broker()  # no CLUSTER_ACTION: as Kafka, refused first
    (c,) = (await call(b, 10, 6, share))["coordinators"]
    assert (c["error_code"], c["node_id"], c["port"]) == (
        ErrorCode.cluster_authorization_failed,
        -1,
        -1,
    )
    b = broker(allow(ResourceType.CLUSTER, CLUSTER, AclOperation.CLUSTER_ACTION))
    (c,) = (await call(b, 10, 6, share))["coordinators"]
    # Kafka without a share coordinator: INVALID_REQUEST (TidalMQ has no share groups)
    assert (c["error_code"], c["node_id"]) == (ErrorCode.invalid_request, -1)
    assert "share groups" in c["error_message"]
    (c,) = (await call(b, 10, 5, share))["coordinators"]  # below v6: INVALID_REQUEST
    assert c["error_code"] == ErrorCode.invalid_request


async def test_find_coordinator_v6_keeps_group_and_transaction_authorization() -> None:
    b = broker()
    (c,) = (await call(b, 10, 6, {"key_type": GROUP_KEY, "coordinator_keys": ["g"]}))[
        "coordinators"
    ]
    assert c["error_code"] == ErrorCode.group_authorization_failed
    (c,) = (await call(b, 10, 6, {"key_type": TXN_KEY, "coordinator_keys": ["t"]}))["coordinators"]
    assert c["error_code"] == ErrorCode.transactional_id_authorization_failed


# ---------------------------------------------------------------- ListConfigResources
async def test_list_config_resources_needs_describe_configs_on_the_cluster() -> None:
    for version in (0, 1):
        answer = await call(broker(), 74, version, {})
        assert answer["error_code"] == ErrorCode.cluster_authorization_failed
        assert answer["config_resources"] == ()


async def test_list_config_resources_v1_brokers_and_topics() -> None:
    b = broker(allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS))
    every = await call(b, 74, 1, {"resource_types": []})
    assert every["error_code"] == ErrorCode.none
    # the live brokers on the client's listener, then every topic (Kafka's internal one too,
    # not the hidden physical queues of static topics)
    assert [(r["resource_type"], r["resource_name"]) for r in every["config_resources"]] == [
        (BROKER, "0"),
        (BROKER, "1"),
        (TOPIC, OFFSETS_TOPIC),
        (TOPIC, "orders"),
    ]
    topics = await call(b, 74, 1, {"resource_types": [TOPIC]})
    assert [r["resource_name"] for r in topics["config_resources"]] == [OFFSETS_TOPIC, "orders"]
    # no group configs, client-metrics subscriptions or broker loggers to list
    none = await call(b, 74, 1, {"resource_types": [GROUP, CLIENT_METRICS, BROKER_LOGGER]})
    assert (none["error_code"], none["config_resources"]) == (ErrorCode.none, ())
    bad = await call(b, 74, 1, {"resource_types": [TOPIC, 99]})
    assert (bad["error_code"], bad["config_resources"]) == (ErrorCode.unsupported_version, ())


async def test_list_config_resources_v0_lists_client_metrics_only() -> None:
    b = broker(allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS))
    answer = await call(b, 74, 0, {})
    assert (answer["error_code"], answer["config_resources"]) == (ErrorCode.none, ())


# ---------------------------------------------------------------- DescribeConfigs (brokers)
async def describe_broker(b: Any, name: str = "0") -> dict[str, dict[str, Any]]:
    answer = await call(
        b,
        32,
        4,
        {
            "resources": [
                {"resource_type": BROKER, "resource_name": name, "configuration_keys": None}
            ],
            "include_synonyms": True,
            "include_documentation": False,
        },
    )
    (result,) = answer["results"]
    assert result["error_code"] == ErrorCode.none, result
    return {c["name"]: c for c in result["configs"]}


async def test_broker_configs_include_the_static_listener_and_role_settings() -> None:
    settings = BrokerSettings(
        listeners="PLAINTEXT://0.0.0.0:9092,SASL_SSL://0.0.0.0:9093",
        advertised_listeners="PLAINTEXT://b0:9092,SASL_SSL://b0.example:9093",
        storage_url="s3://bucket/prefix?endpoint_url=http://minio:9000&region=x",
        controller_url="http://ctl:9690",
        rack="zone-a",
    )
    b = broker(
        allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS), settings=settings
    )
    configs = await describe_broker(b)
    expected = {
        "listeners": "PLAINTEXT://0.0.0.0:9092,SASL_SSL://0.0.0.0:9093",
        "advertised.listeners": "PLAINTEXT://b0:9092,SASL_SSL://b0.example:9093",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "log.dirs": "s3://bucket/prefix",  # as DescribeLogDirs: no query, no credentials
        "process.roles": "broker",
        "broker.rack": "zone-a",
        "node.id": "0",
        "broker.id": "0",
        "auto.create.topics.enable": "true",
    }
    for name, value in expected.items():
        c = configs[name]
        assert (c["value"], c["read_only"], c["config_source"]) == (
            value,
            True,
            STATIC_BROKER_CONFIG,
        ), (name, c)
        assert [(s["name"], s["value"], s["source"]) for s in c["synonyms"]] == [
            (name, value, STATIC_BROKER_CONFIG)
        ]
    assert configs["advertised.listeners"]["config_type"] == 2  # STRING
    assert configs["process.roles"]["config_type"] == 7  # LIST
    assert configs["auto.create.topics.enable"]["config_type"] == 1  # BOOLEAN


async def test_broker_configs_defaults_of_an_embedded_controller_broker() -> None:
    settings = BrokerSettings(host="127.0.0.1", port=19092, storage_url="file:///data/objects")
    b = broker(
        allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS), settings=settings
    )
    b.advertised = [Endpoint("PLAINTEXT", "127.0.0.1", 19092)]
    configs = await describe_broker(b)
    assert configs["listeners"]["value"] == "PLAINTEXT://127.0.0.1:19092"
    # not set: the endpoints the broker registered
    assert configs["advertised.listeners"]["value"] == "PLAINTEXT://127.0.0.1:19092"
    assert configs["log.dirs"]["value"] == "/data/objects"
    assert configs["process.roles"]["value"] == "broker,controller"
    rack = configs["broker.rack"]  # Kafka's null default
    assert (rack["value"], rack["config_source"], rack["read_only"]) == (None, DEFAULT_CONFIG, True)


async def test_broker_configs_mask_the_key_password_as_kafka_masks_passwords() -> None:
    secret = "pem-key-secret-7f3a"
    grant = allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS)
    settings = BrokerSettings(
        ssl_keystore_location="/etc/tidalmq/broker.pem",
        ssl_key_password=secret,
        controller_url="http://ctl:9690",
    )
    b = broker(grant, settings=settings)
    for version in (1, 4):  # the oldest version kio has, and the newest
        body = {
            "resources": [
                {"resource_type": BROKER, "resource_name": "0", "configuration_keys": None}
            ],
            "include_synonyms": True,
            "include_documentation": False,
        }
        request = decode_request(encode_request(32, version, 1, body)[4:], supported_versions())
        answer = await REGISTRY[32].handler(b, request, BOB)  # type: ignore[arg-type]
        assert secret.encode() not in encode_response(32, version, 1, answer)
    configs = await describe_broker(b)
    key = configs["ssl.key.password"]
    assert (key["value"], key["is_sensitive"], key["config_source"], key["read_only"]) == (
        None,
        True,
        STATIC_BROKER_CONFIG,
        True,
    )
    assert [(s["value"], s["source"]) for s in key["synonyms"]] == [(None, STATIC_BROKER_CONFIG)]
    assert key["config_type"] == 9  # PASSWORD
    assert not any(c["is_sensitive"] for n, c in configs.items() if n != "ssl.key.password")
    assert configs["ssl.keystore.location"]["value"] == "/etc/tidalmq/broker.pem"
    assert configs["ssl.keystore.type"]["value"] == "PEM"  # Kafka's PEM store type
    # not set: Kafka's null default, still sensitive
    unset = (await describe_broker(broker(grant)))["ssl.key.password"]
    assert (unset["value"], unset["is_sensitive"], unset["config_source"]) == (
        None,
        True,
        DEFAULT_CONFIG,
    )
    assert (await describe_broker(broker(grant)))["ssl.truststore.location"]["value"] is None


async def test_broker_configs_fixed_by_the_design_are_defaults() -> None:
    """One replica per partition: what Metadata reports of every partition, the internal
    topics' too (the object store keeps the data durable, not replicas); Kafka's types (SHORT
    for the factors); no setting changes them, so Kafka's DEFAULT_CONFIG source."""
    b = broker(allow(ResourceType.CLUSTER, CLUSTER, AclOperation.DESCRIBE_CONFIGS))
    configs = await describe_broker(b)
    for name, kind in (
        ("default.replication.factor", 3),
        ("offsets.topic.replication.factor", 4),
        ("transaction.state.log.replication.factor", 4),
        ("transaction.state.log.min.isr", 3),
    ):
        c = configs[name]
        assert (c["value"], c["read_only"], c["config_type"], c["config_source"]) == (
            "1",
            True,
            kind,
            DEFAULT_CONFIG,
        ), name
    assert configs["delete.topic.enable"]["value"] == "true"
    # the group coordinator's fixed bounds, and the PEM store type, as Kafka names them
    assert configs["group.max.session.timeout.ms"]["value"] == "1800000"
    assert configs["offset.metadata.max.bytes"]["value"] == "4096"
    assert configs["ssl.truststore.type"]["value"] == "PEM"
    b = broker(allow(ResourceType.CLUSTER, CLUSTER, AclOperation.ALTER_CONFIGS))
    answer = await call(
        b,
        44,
        1,
        {
            "resources": [
                {
                    "resource_type": BROKER,
                    "resource_name": "0",
                    "configs": [
                        {"name": "default.replication.factor", "config_operation": 0, "value": "3"}
                    ],
                }
            ],
            "validate_only": False,
        },
    )
    (r,) = answer["responses"]
    assert r["error_code"] == ErrorCode.invalid_request  # as Kafka
    assert (
        r["error_message"]
        == "Cannot update these configs dynamically: [default.replication.factor]"
    )
    assert configs["connection.failed.authentication.delay.ms"]["value"] == "100"


# ---------------------------------------------------------------- Metadata auto-creation
def test_auto_creation_of_missing_topics() -> None:
    assert auto_creation("orders-2") is AutoCreation.TOPIC
    assert auto_creation("__my_topic") is AutoCreation.TOPIC  # not reserved in Kafka either
    assert auto_creation(TXN_STATE_TOPIC) is AutoCreation.TRANSACTION_STATE
    for name in (OFFSETS_TOPIC, "__sq.queue-0", "bad name", "", ".", "..", "x" * 250):
        assert auto_creation(name) is AutoCreation.NONE, name


async def test_metadata_does_not_create_internal_or_invalid_names() -> None:
    """With CREATE on the cluster and auto.create.topics.enable on (the default), a physical
    topic's name and an invalid one are answered without reaching the controller (this
    broker has none: asking it would raise)."""
    b = broker(
        allow(ResourceType.CLUSTER, CLUSTER, AclOperation.CREATE),
        allow(ResourceType.TOPIC, "*", AclOperation.DESCRIBE),
    )
    assert b.settings.auto_create_topics
    b.controller_id_for_clients = lambda: 0
    answer = await call(
        b,
        3,
        12,
        {
            "topics": [
                {"name": "__sq.other", "topic_id": None},
                {"name": "bad name", "topic_id": None},
            ],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
    )
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [
        ("__sq.other", ErrorCode.unknown_topic_or_partition),
        ("bad name", ErrorCode.invalid_topic_exception),
    ]


async def test_metadata_answers_while_the_controller_is_unreachable() -> None:
    """Auto-creation with the controller out of reach (a closed port): the topic is answered
    LEADER_NOT_AVAILABLE, which clients retry, and the connection is not closed (a handler
    that raises closes it)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = broker(
        allow(ResourceType.CLUSTER, CLUSTER, AclOperation.CREATE),
        allow(ResourceType.TOPIC, "*", AclOperation.DESCRIBE),
    )
    b.controller_id_for_clients = lambda: 0
    b.controller = HttpControllerClient(f"http://127.0.0.1:{port}", token="t", timeout_s=2.0)
    try:
        answer = await call(
            b,
            3,
            12,
            {
                "topics": [{"name": "new-topic", "topic_id": None}],
                "allow_auto_topic_creation": True,
                "include_topic_authorized_operations": False,
            },
        )
    finally:
        await b.controller.close()
    assert [(t["name"], t["error_code"]) for t in answer["topics"]] == [
        ("new-topic", ErrorCode.leader_not_available)
    ]


# ---------------------------------------------------------------- ListOffsets v8-v11
async def test_list_offsets_tiered_lookups_as_kafka_without_remote_storage() -> None:
    b = broker(allow(ResourceType.TOPIC, "orders", AclOperation.DESCRIBE))
    plog = SimpleNamespace(leader_epoch=3, log_start_offset=5, high_watermark=9)
    b.partitions = SimpleNamespace(get_log=lambda tp: plog)
    assert supported_versions()[2] == (1, 11)

    async def lookup(version: int, timestamp: int) -> tuple[int, int, int, int]:
        body: dict[str, Any] = {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}
                    ],
                }
            ],
        }
        if version >= 10:
            body["timeout"] = 1000
        (topic,) = (await call(b, 2, version, body))["topics"]
        (p,) = topic["partitions"]
        return p["error_code"], p["offset"], p["timestamp"], p["leader_epoch"]

    for version in (8, 9, 10, 11):
        # the whole log is local: earliest-local is the log start offset
        assert await lookup(version, -4) == (ErrorCode.none, 5, -1, 3), version
        assert await lookup(version, -2) == (ErrorCode.none, 5, -1, 3)
        assert await lookup(version, -1) == (ErrorCode.none, 9, -1, 3)
    for version in (9, 10, 11):  # nothing is tiered: Kafka's (-1, -1, epoch -1)
        assert await lookup(version, -5) == (ErrorCode.none, -1, -1, -1), version
    assert await lookup(11, -6) == (ErrorCode.none, -1, -1, -1)  # nothing waits for upload
