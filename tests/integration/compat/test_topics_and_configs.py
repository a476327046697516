"""kafka-topics, kafka-configs, kafka-broker-api-versions, kafka-get-offsets and kafka-log-dirs
against one TidalMQ broker; every output is parsed and checked."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from tidalmq_broker.apis.kafka_registry import REGISTRY

from bench.kafka.harness import console_produce, run_tool
from tests.integration.compat.conftest import (
    create_topic,
    describe_topic,
    name,
    parse_describe,
    tool,
)
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def failure(proc: object) -> str:
    """What a failed tool printed (Kafka tools report errors on stdout or stderr)."""
    return f"{getattr(proc, 'stdout', '')}\n{getattr(proc, 'stderr', '')}"


def test_topics_create_list_describe_alter_delete(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic = name("topics")
    create_topic(b, topic, 2, "--replication-factor", "1", "--config", "retention.ms=3600000")
    assert topic in tool("kafka-topics", "--list", bootstrap=b).split()

    header, parts = describe_topic(b, topic)
    assert header["PartitionCount"] == "2" and header["ReplicationFactor"] == "1", header
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", header["TopicId"]), header
    assert header["Configs"] == "retention.ms=3600000", header
    assert [p["Partition"] for p in parts] == ["0", "1"]
    for p in parts:
        assert p["Leader"] == p["Replicas"] == p["Isr"] == "0", p
        # DescribeTopicPartitions answered (the Metadata fallback prints N/A for the ELR)
        assert p["Elr"] == "" and p["LastKnownElr"] == "", p

    out = tool("kafka-topics", "--alter", "--topic", topic, "--partitions", "5", bootstrap=b)
    assert "Error" not in out, out
    # paged: DescribeTopicPartitions with one partition per response, following the cursor
    paged = tool(
        "kafka-topics",
        "--describe",
        "--topic",
        topic,
        "--partition-size-limit-per-response",
        "1",
        bootstrap=b,
    )
    header, parts = parse_describe(paged, topic)
    assert header["PartitionCount"] == "5"
    assert [p["Partition"] for p in parts] == ["0", "1", "2", "3", "4"]

    shrink = run_tool("kafka-topics", "--alter", "--topic", topic, "--partitions", "3", bootstrap=b)
    assert shrink.returncode != 0
    assert "InvalidPartitionsException" in failure(shrink), failure(shrink)

    dup = run_tool("kafka-topics", "--create", "--topic", topic, bootstrap=b)
    assert dup.returncode != 0 and "already exists" in failure(dup), failure(dup)
    rf = run_tool(
        "kafka-topics", "--create", "--topic", name("rf3"), "--replication-factor", "3", bootstrap=b
    )
    assert rf.returncode != 0
    assert "InvalidReplicationFactorException" in failure(rf), failure(rf)
    # an unknown cleanup policy: kafka-topics refuses it before sending (LogConfig.validate),
    # and the broker refuses it from any other client with INVALID_CONFIG and the same text
    kafkas = (
        "Invalid value shred for configuration cleanup.policy: String must be one of: "
        "compact, delete"
    )
    compact = run_tool(
        "kafka-topics",
        "--create",
        "--topic",
        name("cfg"),
        "--config",
        "cleanup.policy=compact,shred",
        bootstrap=b,
    )
    assert compact.returncode != 0 and kafkas in failure(compact), failure(compact)
    admin = AdminClient({"bootstrap.servers": b})
    refused = admin.create_topics(
        [NewTopic(name("cfg"), 1, 1, config={"cleanup.policy": "compact,shred"})]
    )
    with pytest.raises(KafkaException) as invalid:
        next(iter(refused.values())).result(15)
    assert invalid.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert kafkas in invalid.value.args[0].str()

    tool("kafka-topics", "--delete", "--topic", topic, bootstrap=b)
    assert topic not in tool("kafka-topics", "--list", bootstrap=b).split()
    gone = run_tool("kafka-topics", "--describe", "--topic", topic, bootstrap=b)
    assert gone.returncode != 0 and f"Topic '{topic}' does not exist" in failure(gone)


def _config_lines(out: str) -> dict[str, tuple[str, str]]:
    """name -> (value, synonyms) from kafka-configs --describe output."""
    found = {}
    for m in re.finditer(r"^\s+(\S+?)=(\S*) sensitive=\w+ synonyms=\{(.*)\}$", out, re.M):
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


def test_configs_describe_and_alter_topic(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic = name("configs")
    create_topic(b, topic)
    entity = ("--entity-type", "topics", "--entity-name", topic)
    out = tool(
        "kafka-configs",
        "--alter",
        *entity,
        "--add-config",
        "retention.ms=123456,max.message.bytes=65536",
        bootstrap=b,
    )
    assert f"Completed updating config for topic {topic}." in out
    out = tool("kafka-configs", "--describe", *entity, bootstrap=b)
    assert f"Dynamic configs for topic {topic} are:" in out
    dynamic = _config_lines(out)
    assert set(dynamic) == {"retention.ms", "max.message.bytes"}, out
    assert dynamic["retention.ms"] == (
        "123456",
        "DYNAMIC_TOPIC_CONFIG:retention.ms=123456, DEFAULT_CONFIG:retention.ms=604800000",
    )
    every = _config_lines(tool("kafka-configs", "--describe", *entity, "--all", bootstrap=b))
    assert every["cleanup.policy"][0] == "delete"
    assert every["max.message.bytes"][0] == "65536"
    assert every["leader.replication.throttled.replicas"][0] == ""

    tool("kafka-configs", "--alter", *entity, "--delete-config", "retention.ms", bootstrap=b)
    assert set(_config_lines(tool("kafka-configs", "--describe", *entity, bootstrap=b))) == {
        "max.message.bytes"
    }
    bad = run_tool(
        "kafka-configs", "--alter", *entity, "--add-config", "retention.ms=abc", bootstrap=b
    )
    assert bad.returncode != 0
    assert (
        "InvalidConfigurationException: Invalid value abc for configuration retention.ms: "
        "Not a number of type LONG"
    ) in failure(bad)


def test_configs_describe_and_alter_broker(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    broker = ("--entity-type", "brokers", "--entity-name", "0")
    every = _config_lines(tool("kafka-configs", "--describe", *broker, "--all", bootstrap=b))
    assert every["num.partitions"] == ("1", "STATIC_BROKER_CONFIG:num.partitions=1")
    assert every["broker.id"][0] == "0"

    out = tool(
        "kafka-configs",
        "--alter",
        *broker,
        "--add-config",
        "leader.replication.throttled.rate=1000",
        bootstrap=b,
    )
    assert "Completed updating config for broker 0." in out
    out = tool(
        "kafka-configs",
        "--alter",
        "--entity-type",
        "brokers",
        "--entity-default",
        "--add-config",
        "follower.replication.throttled.rate=2000",
        bootstrap=b,
    )
    assert "Completed updating default config for brokers in the cluster." in out
    try:
        dynamic = _config_lines(tool("kafka-configs", "--describe", *broker, bootstrap=b))
        assert dynamic == {
            "leader.replication.throttled.rate": (
                "1000",
                "DYNAMIC_BROKER_CONFIG:leader.replication.throttled.rate=1000, "
                "DEFAULT_CONFIG:leader.replication.throttled.rate=9223372036854775807",
            )
        }
        defaults = tool(
            "kafka-configs",
            "--describe",
            "--entity-type",
            "brokers",
            "--entity-default",
            bootstrap=b,
        )
        assert "Default configs for brokers in the cluster are:" in defaults
        assert _config_lines(defaults) == {
            "follower.replication.throttled.rate": (
                "2000",
                "DYNAMIC_DEFAULT_BROKER_CONFIG:follower.replication.throttled.rate=2000",
            )
        }
        every = _config_lines(tool("kafka-configs", "--describe", *broker, "--all", bootstrap=b))
        assert every["follower.replication.throttled.rate"][0] == "2000"
    finally:
        tool(
            "kafka-configs",
            "--alter",
            *broker,
            "--delete-config",
            "leader.replication.throttled.rate",
            bootstrap=b,
        )
        tool(
            "kafka-configs",
            "--alter",
            "--entity-type",
            "brokers",
            "--entity-default",
            "--delete-config",
            "follower.replication.throttled.rate",
            bootstrap=b,
        )
    assert _config_lines(tool("kafka-configs", "--describe", *broker, bootstrap=b)) == {}

    static = run_tool(
        "kafka-configs", "--alter", *broker, "--add-config", "num.partitions=3", bootstrap=b
    )
    assert static.returncode != 0
    assert "Cannot update these configs dynamically: [num.partitions]" in failure(static)
    unknown = run_tool(
        "kafka-configs", "--alter", *broker, "--add-config", "no.such.config=1", bootstrap=b
    )
    assert unknown.returncode != 0
    assert "unknown dynamic broker config 'no.such.config'" in failure(unknown)


_API_LINE = re.compile(r"^\s+(\w+)\((\d+)\): (?:(\d+)(?: to (\d+))? \[usable: (\d+)\]|UNSUPPORTED)")


def test_broker_api_versions_lists_what_the_broker_serves(tidalmq: BrokerProcess) -> None:
    out = tool("kafka-broker-api-versions", bootstrap=tidalmq.bootstrap)
    assert re.search(rf"^{re.escape(tidalmq.bootstrap)} \(id: 0 rack: null", out, re.M), out
    served: dict[int, tuple[int, int]] = {}
    unsupported: set[int] = set()
    for line in out.splitlines():
        m = _API_LINE.match(line)
        if m is None:
            continue
        key = int(m.group(2))
        if m.group(3) is None:
            unsupported.add(key)
        else:
            low = int(m.group(3))
            served[key] = (low, int(m.group(4) or low))
    expected = {k: (s.min_version, s.max_version) for k, s in REGISTRY.items()}
    assert served == expected, (served, expected)
    # what Kafka 4's tools need beyond produce/consume
    for key in (32, 34, 35, 43, 44, 45, 46, 60, 61, 75):
        assert key in served, key
    # transactions: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
    # WriteTxnMarkers, TxnOffsetCommit, DescribeTransactions, ListTransactions
    for key in (22, 24, 25, 26, 27, 28, 65, 66):
        assert key in served and key not in unsupported, key


def test_get_offsets_and_log_dirs(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic = name("offsets")
    create_topic(b, topic, 2)
    console_produce(b, topic, [f"k{i}:v{i}" for i in range(10)], key_separator=":")
    latest = tool("kafka-get-offsets", "--topic", topic, bootstrap=b).split()
    assert [line.rsplit(":", 1)[0] for line in latest] == [f"{topic}:0", f"{topic}:1"]
    assert sum(int(line.rsplit(":", 1)[1]) for line in latest) == 10
    earliest = tool("kafka-get-offsets", "--topic", topic, "--time", "-2", bootstrap=b).split()
    assert earliest == [f"{topic}:0:0", f"{topic}:1:0"]
    # by timestamp: the first offset whose timestamp is at or after 0 is the first record
    by_time = tool("kafka-get-offsets", "--topic", topic, "--time", "0", bootstrap=b).split()
    assert all(line.endswith(":0") for line in by_time), by_time

    out = tool("kafka-log-dirs", "--describe", "--topic-list", topic, bootstrap=b)
    report = json.loads(out.strip().splitlines()[-1])
    (entry,) = report["brokers"]
    assert entry["broker"] == 0
    (log_dir,) = entry["logDirs"]
    assert log_dir["error"] is None
    url = urlsplit(tidalmq.storage_url)
    assert log_dir["logDir"] == f"s3://{url.netloc}{url.path}"
    sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
    assert set(sizes) == {f"{topic}-0", f"{topic}-1"}
    counts = {line.rsplit(":", 2)[1]: int(line.rsplit(":", 1)[1]) for line in latest}
    for partition, count in counts.items():
        # the stored batches: at least the records' bytes, nothing for an empty partition
        size = sizes[f"{topic}-{partition}"]
        assert size > 10 * count if count else size == 0, sizes
    assert all(not p["isFuture"] and p["offsetLag"] == 0 for p in log_dir["partitions"])


def test_get_offsets_max_timestamp(tidalmq: BrokerProcess) -> None:
    """`kafka-get-offsets --time -3` (ListOffsets v7, KIP-734): the offset of the record with
    the greatest timestamp, which is neither the newest record nor a batch's first offset."""
    b = tidalmq.bootstrap
    topic = name("maxts")
    create_topic(b, topic, 1)
    producer = Producer({"bootstrap.servers": b, "acks": "all", "linger.ms": 50})
    t0 = 1_700_000_000_000
    for ts in (t0 + 5, t0 + 40, t0 + 900, t0 + 10, t0 + 900, t0 + 20):  # one batch (linger)
        producer.produce(topic, b"v", partition=0, timestamp=ts)
    assert producer.flush(30) == 0
    producer.produce(topic, b"later", partition=0, timestamp=t0 + 100)  # a newer batch
    assert producer.flush(30) == 0
    out = tool("kafka-get-offsets", "--topic", topic, "--time", "-3", bootstrap=b).split()
    assert out == [f"{topic}:0:2"], out  # the first of the two records at t0 + 900
    latest = tool("kafka-get-offsets", "--topic", topic, bootstrap=b).split()
    assert latest == [f"{topic}:0:7"], latest


def test_leader_election_finds_the_preferred_leader_in_place(tidalmq: BrokerProcess) -> None:
    b = tidalmq.bootstrap
    topic = name("elect")
    create_topic(b, topic, 2)
    out = tool(
        "kafka-leader-election",
        "--election-type",
        "preferred",
        "--topic",
        topic,
        "--partition",
        "1",
        bootstrap=b,
    )
    assert out.strip() == f"Valid replica already elected for partitions {topic}-1", out
    every = tool(
        "kafka-leader-election", "--election-type", "unclean", "--all-topic-partitions", bootstrap=b
    )
    assert f"{topic}-0" in every and f"{topic}-1" in every, every
    missing = run_tool(
        "kafka-leader-election",
        "--election-type",
        "preferred",
        "--topic",
        name("nope"),
        "--partition",
        "0",
        bootstrap=b,
    )
    assert missing.returncode != 0
    assert "UnknownTopicOrPartitionException" in failure(missing), failure(missing)
