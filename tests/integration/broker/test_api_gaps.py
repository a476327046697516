"""The last API gaps of [E2] with real clients against a real broker: kafka-python configured
for Kafka 4.0 (FindCoordinator v6) consuming in a group, confluent-kafka's describe_configs of a
broker (its listeners, read-only, its key password masked) and Kafka 4.3.1's kafka-configs
describing it, producers to unknown topics with auto.create.topics.enable on (Kafka's default)
and off, __transaction_state auto-created as its coordinator creates it, and ListConfigResources
through kafka-configs and the wire."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from kafka import KafkaConsumer, KafkaProducer
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.structs import TopicPartition
from kio.schema.errors import ErrorCode
from tidalmq_broker.admin_client import AdminClient as ProtocolAdmin

from bench.kafka.harness import KafkaDist, run_tool
from tests.integration.broker.clients import create_topic, producer
from tests.support.broker_process import BrokerProcess
from tests.support.fetch_requests import fetch_body

pytestmark = pytest.mark.integration

DEFAULT_PARTITIONS = 2
TXN_STATE_PARTITIONS = 3
KEY_PASSWORD = "pem-key-secret-91c2"  # set, never used (no SSL listener), never reported


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """auto.create.topics.enable left at its default (on, as Kafka)."""
    base = tmp_path_factory.mktemp("api-gaps")
    with BrokerProcess(
        f"file://{base / 'objects'}",
        base / "logs",
        env={"TIDALMQ_SSL_KEY_PASSWORD": KEY_PASSWORD},
        args=[
            "--default-partitions",
            str(DEFAULT_PARTITIONS),
            "--transaction-state-partitions",
            str(TXN_STATE_PARTITIONS),
        ],
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("api-gaps-strict")
    with BrokerProcess(
        f"file://{base / 'objects'}", base / "logs", args=["--auto-create-topics", "false"]
    ) as proc:
        yield proc


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def topics(bootstrap: str) -> dict[str, int]:
    """Every topic and its partition count (an every-topic request creates nothing)."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in md.topics.items()}


# ---------------------------------------------------------------- FindCoordinator v6
def test_kafka_python_for_kafka_4_consumes_in_a_group(broker: BrokerProcess) -> None:
    # api_version=(4, 0) makes kafka-python use Kafka 4.0's versions (FindCoordinator v6), not
    # the broker's ApiVersions answer
    assert BrokerVersionData((4, 0)).api_versions[10] == (0, 6)
    topic, group = unique("kp4"), unique("kp4-group")
    create_topic(broker.bootstrap, topic, 3)
    p = producer(broker.bootstrap)
    for i in range(30):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    assert p.flush(30) == 0

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        api_version=(4, 0),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1000,
    )
    try:
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 30 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen.update(r.value for r in records)
        assert seen == {b"v%d" % i for i in range(30)}
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition(topic, p)) for p in range(3)}
        assert committed == {0: 10, 1: 10, 2: 10}
    finally:
        consumer.close()


def test_find_coordinator_v6_on_the_wire(broker: BrokerProcess) -> None:
    with ProtocolAdmin(broker.bootstrap) as admin:
        found = admin.call(10, 6, {"key_type": 0, "coordinator_keys": ["g-a", "g-b"]})
        assert [(c.key, c.error_code, c.node_id) for c in found.coordinators] == [
            ("g-a", ErrorCode.none, 0),
            ("g-b", ErrorCode.none, 0),
        ]
        # a share-group key (KIP-932): an error, and the connection stays usable
        share = admin.call(10, 6, {"key_type": 2, "coordinator_keys": ["g:id:0"]})
        (c,) = share.coordinators
        assert c.error_code == ErrorCode.invalid_request and c.node_id == -1
        again = admin.call(10, 6, {"key_type": 0, "coordinator_keys": ["g-a"]})
        assert again.coordinators[0].error_code == ErrorCode.none


# ---------------------------------------------------------------- DescribeConfigs
def test_describe_configs_of_a_broker_shows_its_listeners_read_only(
    broker: BrokerProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = admin.describe_configs([res])[res].result(30)
    expected = {
        "listeners": f"PLAINTEXT://127.0.0.1:{broker.port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker.port}",
        "log.dirs": str(Path(broker.storage_url.removeprefix("file://"))),
        "process.roles": "broker,controller",  # the embedded controller
        "node.id": "0",
        "auto.create.topics.enable": "true",
        "num.partitions": str(DEFAULT_PARTITIONS),
    }
    for name, value in expected.items():
        entry = configs[name]
        assert (entry.value, entry.is_read_only, entry.source) == (
            value,
            True,
            ConfigSource.STATIC_BROKER_CONFIG.value,
        ), name
    assert "listener.security.protocol.map" in configs
    assert configs["broker.rack"].value is None and configs["broker.rack"].is_default
    key = configs["ssl.key.password"]  # masked, as Kafka masks its passwords
    assert (key.value, key.is_sensitive, key.source) == (
        None,
        True,
        ConfigSource.STATIC_BROKER_CONFIG.value,
    )


def test_kafka_configs_describes_a_broker(
    broker: BrokerProcess, apache_kafka_dist: KafkaDist
) -> None:
    """Kafka 4.3.1's kafka-configs --describe --entity-type brokers --all: every static
    setting with its value and source, the key password masked."""
    proc = run_tool(
        "kafka-configs",
        "--describe",
        "--entity-type",
        "brokers",
        "--entity-name",
        "0",
        "--all",
        bootstrap=broker.bootstrap,
        dist=apache_kafka_dist,
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    assert KEY_PASSWORD not in output
    lines = {line.strip().split("=", 1)[0]: line.strip() for line in proc.stdout.splitlines()}
    listener = f"PLAINTEXT://127.0.0.1:{broker.port}"
    assert lines["listeners"] == (
        f"listeners={listener} sensitive=false "
        f"synonyms={{STATIC_BROKER_CONFIG:listeners={listener}}}"
    ), output
    assert lines["advertised.listeners"].startswith(f"advertised.listeners={listener} "), output
    assert lines["ssl.key.password"] == (
        "ssl.key.password=null sensitive=true synonyms={STATIC_BROKER_CONFIG:ssl.key.password=null}"
    )
    assert lines["node.id"].startswith("node.id=0 sensitive=false"), output


# ---------------------------------------------------------------- auto.create.topics.enable
def test_a_producer_creates_an_unknown_topic(broker: BrokerProcess) -> None:
    topic = unique("auto")
    assert topic not in topics(broker.bootstrap)
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 30_000})
    errors: list[KafkaError | None] = []
    for i in range(4):
        p.produce(topic, b"x%d" % i, on_delivery=lambda e, m: errors.append(e))
    assert p.flush(30) == 0
    assert errors == [None] * 4
    assert topics(broker.bootstrap)[topic] == DEFAULT_PARTITIONS  # num.partitions


def test_kafka_python_for_kafka_4_produces_to_an_unknown_topic(broker: BrokerProcess) -> None:
    """kafka-python's producer (Metadata v12 with allow_auto_topic_creation) creates it too."""
    topic = unique("auto-kp")
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=(4, 0), max_block_ms=30_000)
    try:
        metadata = p.send(topic, b"first").get(timeout=30)
    finally:
        p.close()
    assert metadata.topic == topic and metadata.offset == 0
    assert topics(broker.bootstrap)[topic] == DEFAULT_PARTITIONS


def test_metadata_has_the_transaction_state_topic_created_by_its_coordinator(
    broker: BrokerProcess,
) -> None:
    """As Kafka's auto-creation: __transaction_state with its own partition count, internal
    (not an ordinary topic of num.partitions: the controller refuses internal names)."""
    request = {
        "topics": [{"name": "__transaction_state", "topic_id": None}],
        "allow_auto_topic_creation": True,
        "include_topic_authorized_operations": False,
    }
    codes = []
    with ProtocolAdmin(broker.bootstrap) as admin:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            (topic,) = admin.call(3, 12, request).topics
            codes.append(topic.error_code)
            if topic.error_code == ErrorCode.none:
                break
            time.sleep(0.2)
    assert set(codes[:-1]) <= {ErrorCode.leader_not_available}, codes
    assert codes[-1] == ErrorCode.none, codes
    assert topic.is_internal and len(topic.partitions) == TXN_STATE_PARTITIONS


def test_with_auto_create_off_a_producer_gets_unknown_topic(strict: BrokerProcess) -> None:
    topic = unique("noauto")
    p = Producer(
        {
            "bootstrap.servers": strict.bootstrap,
            "message.timeout.ms": 20_000,
            "topic.metadata.propagation.max.ms": 100,
        }
    )
    errors: list[KafkaError] = []
    p.produce(topic, b"x", on_delivery=lambda e, m: errors.append(e))
    assert p.flush(15) == 0
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, errors[0]
    assert topic not in topics(strict.bootstrap)


# ---------------------------------------------------------------- ListConfigResources
def test_list_config_resources_on_the_wire(broker: BrokerProcess) -> None:
    topic = unique("lcr")
    create_topic(broker.bootstrap, topic, 1)
    with ProtocolAdmin(broker.bootstrap) as admin:
        every = admin.call(74, 1, {"resource_types": []})
        assert every.error_code == ErrorCode.none
        listed = {(r.resource_type, r.resource_name) for r in every.config_resources}
        assert (4, "0") in listed and (2, topic) in listed and (2, "__consumer_offsets") in listed
        brokers = admin.call(74, 1, {"resource_types": [4]})
        assert [(r.resource_type, r.resource_name) for r in brokers.config_resources] == [(4, "0")]
        assert admin.call(74, 1, {"resource_types": [1]}).error_code == (
            ErrorCode.unsupported_version
        )
        v0 = admin.call(74, 0, {})  # client-metrics resources: none
        assert (v0.error_code, v0.config_resources) == (ErrorCode.none, ())


def test_kafka_configs_lists_client_metrics(
    broker: BrokerProcess, apache_kafka_dist: KafkaDist
) -> None:
    """kafka-configs --describe --entity-type client-metrics without --entity-name asks
    Admin#listConfigResources (ListConfigResources v1, type 16): none to list. (With
    --entity-type groups it then describes each group's configs, which TidalMQ does not offer:
    README, Status and limits.)"""
    proc = run_tool(
        "kafka-configs",
        "--describe",
        "--entity-type",
        "client-metrics",
        bootstrap=broker.bootstrap,
        dist=apache_kafka_dist,
    )
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    assert "Exception" not in output and proc.stdout.strip() == "", output


# ---------------------------------------------------------------- ListOffsets v8+
def test_kafka_get_offsets_tiered_lookups(
    broker: BrokerProcess, apache_kafka_dist: KafkaDist
) -> None:
    """ListOffsets v8+ (kafka-python for Kafka 4.x sends v10 when a group has no offsets):
    answered as by a Kafka without remote storage."""
    topic = unique("tiers")
    create_topic(broker.bootstrap, topic, 1)
    p = producer(broker.bootstrap)
    for i in range(5):
        p.produce(topic, b"v%d" % i, partition=0)
    assert p.flush(30) == 0
    # -5 (latest tiered) is offset -1, which the tool leaves out of its output
    for time_arg, expected in (("-4", [f"{topic}:0:0"]), ("-5", []), ("-1", [f"{topic}:0:5"])):
        proc = run_tool(
            "kafka-get-offsets",
            "--topic",
            topic,
            "--time",
            time_arg,
            bootstrap=broker.bootstrap,
            dist=apache_kafka_dist,
        )
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        assert proc.stdout.split() == expected, (time_arg, proc.stdout, proc.stderr)


# ---------------------------------------------------------------- Fetch v13-v17 (topic ids)


def test_fetch_by_topic_id_on_the_wire(broker: BrokerProcess) -> None:
    """Fetch v13-v17 name topics by id (KIP-516): the broker reads the topic the id names and
    answers with the same id, UNKNOWN_TOPIC_ID for an id that names no topic (the other topics
    of the request still read), and refuses a follower named in v15's ReplicaState as it
    refuses one named by v4-v14's ReplicaId."""
    name = unique("by-id")
    create_topic(broker.bootstrap, name, 1)
    p = producer(broker.bootstrap)
    p.produce(name, b"by-id", partition=0)
    assert p.flush(30) == 0
    with ProtocolAdmin(broker.bootstrap) as admin:
        meta = admin.call(
            3,
            12,
            {
                "topics": [{"name": name, "topic_id": None}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
        topic_id = meta.topics[0].topic_id
        assert isinstance(topic_id, uuid.UUID) and topic_id.int != 0
        unknown = uuid.uuid4()
        for version in range(12, 18):
            key: str | uuid.UUID = name if version < 13 else topic_id
            answer = admin.call(1, version, fetch_body(version, key))
            (topic,) = answer.responses
            assert (topic.topic if version < 13 else topic.topic_id) == key, version
            (part,) = topic.partitions
            assert part.error_code == ErrorCode.none, (version, part)
            assert b"by-id" in bytes(part.records) and part.high_watermark == 1, version
            if version < 13:
                continue
            body = fetch_body(version, unknown)
            body["topics"] = [*fetch_body(version, topic_id)["topics"], *body["topics"]]  # type: ignore[misc]
            mixed = admin.call(1, version, body)
            assert [t.topic_id for t in mixed.responses] == [topic_id, unknown], version
            known, missing = (t.partitions[0] for t in mixed.responses)
            assert known.error_code == ErrorCode.none and known.high_watermark == 1, version
            assert missing.error_code == ErrorCode.unknown_topic_id, (version, missing)
            assert missing.records is None or not bytes(missing.records)
        for version in (14, 15, 17):
            follower = admin.call(1, version, fetch_body(version, topic_id, replica_id=3))
            part = follower.responses[0].partitions[0]
            assert part.error_code == ErrorCode.not_leader_or_follower, (version, part)
            assert follower.error_code == ErrorCode.not_leader_or_follower

        # deleted and created again under its name, while the broker runs (its image changes in
        # place, its index of topics by id with it): the old id names nothing, the new one the
        # new, empty topic
        kafka_admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept while it waits
        kafka_admin.delete_topics([name])[name].result(30)
        deadline = time.monotonic() + 30
        while True:
            try:
                create_topic(broker.bootstrap, name, 1)
                break
            except KafkaException:  # the deletion still in progress
                assert time.monotonic() < deadline, "the topic could not be created again"
                time.sleep(0.2)
        by_name = {
            "topics": [{"name": name, "topic_id": None}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        new_id = topic_id
        while new_id in (topic_id, None) or new_id.int == 0:
            assert time.monotonic() < deadline, "the broker never saw the topic created again"
            time.sleep(0.1)
            new_id = admin.call(3, 12, by_name).topics[0].topic_id
        for version in (13, 17):
            old = admin.call(1, version, fetch_body(version, topic_id)).responses[0]
            assert old.partitions[0].error_code == ErrorCode.unknown_topic_id, (version, old)
            while True:
                new = admin.call(1, version, fetch_body(version, new_id)).responses[0]
                if new.partitions[0].error_code == ErrorCode.none:
                    break
                assert new.partitions[0].error_code != ErrorCode.unknown_topic_id, version
                assert time.monotonic() < deadline, (version, new)  # the partition opening
                time.sleep(0.1)
            assert new.topic_id == new_id and new.partitions[0].high_watermark == 0, version
