"""Kafka's own CLI tools through the harness, against the real 1-broker Apache Kafka.

Every helper takes only a bootstrap address, so the same calls later run against TidalMQ.
"""

from __future__ import annotations

import re
import uuid

import pytest

from bench.kafka.harness import (
    KafkaCluster,
    console_consume,
    console_produce,
    parse_table,
    run_tool,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def describe_partitions(bootstrap: str, topic: str) -> list[dict[str, str]]:
    """kafka-topics --describe, one dict per partition line (Partition, Leader, Replicas, Isr)."""
    out = run_tool("kafka-topics", "--describe", "--topic", topic, bootstrap=bootstrap, check=True)
    rows = []
    for line in out.stdout.splitlines():
        if "Partition:" in line:
            fields = dict(re.findall(r"(\w+): (\S*)", line))
            rows.append(fields)
    return rows


def test_topics_create_list_describe_alter(apache_kafka: KafkaCluster) -> None:
    b = apache_kafka.bootstrap
    topic = name("topics")
    created = run_tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--config",
        "cleanup.policy=delete",
        bootstrap=b,
        check=True,
    )
    assert f"Created topic {topic}." in created.stdout
    listed = run_tool("kafka-topics", "--list", bootstrap=b, check=True).stdout.split()
    assert topic in listed
    parts = describe_partitions(b, topic)
    assert [p["Partition"] for p in parts] == ["0", "1"]
    assert all(p["Leader"] == "1" and p["Replicas"] == "1" for p in parts)

    run_tool(
        "kafka-topics", "--alter", "--topic", topic, "--partitions", "4", bootstrap=b, check=True
    )
    assert len(describe_partitions(b, topic)) == 4

    duplicate = run_tool("kafka-topics", "--create", "--topic", topic, bootstrap=b)
    assert duplicate.returncode != 0
    assert "already exists" in duplicate.stdout + duplicate.stderr


def test_console_producer_and_consumer_round_trip(apache_kafka: KafkaCluster) -> None:
    b = apache_kafka.bootstrap
    topic = name("console")
    run_tool(
        "kafka-topics", "--create", "--topic", topic, "--partitions", "1", bootstrap=b, check=True
    )
    sent = [f"k{i}:value {i} with spaces" for i in range(50)]
    console_produce(b, topic, sent, key_separator=":")
    got = console_consume(b, topic, len(sent), print_key=True)
    assert got == [line.replace(":", "\t", 1) for line in sent]
    # A consumer on an empty topic times out with nothing rather than hanging.
    empty = name("empty")
    run_tool("kafka-topics", "--create", "--topic", empty, bootstrap=b, check=True)
    assert console_consume(b, empty, 1, timeout_ms=3000) == []


def test_consumer_groups_describe_and_reset_offsets(apache_kafka: KafkaCluster) -> None:
    b = apache_kafka.bootstrap
    topic, group = name("groups"), name("g")
    run_tool(
        "kafka-topics", "--create", "--topic", topic, "--partitions", "2", bootstrap=b, check=True
    )
    console_produce(b, topic, [f"m{i}" for i in range(20)])
    assert len(console_consume(b, topic, 20, group=group)) == 20

    listed = run_tool("kafka-consumer-groups", "--list", bootstrap=b, check=True)
    assert group in listed.stdout.split()
    described = run_tool(
        "kafka-consumer-groups", "--describe", "--group", group, bootstrap=b, check=True
    )
    rows = parse_table(described.stdout, "GROUP")
    assert sorted(r["PARTITION"] for r in rows) == ["0", "1"]
    assert sum(int(r["CURRENT-OFFSET"]) for r in rows) == 20
    assert all(r["LAG"] == "0" and r["TOPIC"] == topic for r in rows)

    reset = run_tool(
        "kafka-consumer-groups",
        "--reset-offsets",
        "--group",
        group,
        "--topic",
        topic,
        "--to-earliest",
        "--execute",
        bootstrap=b,
        check=True,
    )
    assert {r["NEW-OFFSET"] for r in parse_table(reset.stdout, "GROUP")} == {"0"}
    described = run_tool(
        "kafka-consumer-groups", "--describe", "--group", group, bootstrap=b, check=True
    )
    rows = parse_table(described.stdout, "GROUP")
    assert sum(int(r["LAG"]) for r in rows) == 20
    # After the reset the group reads everything again.
    assert len(console_consume(b, topic, 20, group=group, from_beginning=False)) == 20


def test_configs_alter_and_describe(apache_kafka: KafkaCluster) -> None:
    b = apache_kafka.bootstrap
    topic = name("configs")
    run_tool("kafka-topics", "--create", "--topic", topic, bootstrap=b, check=True)
    run_tool(
        "kafka-configs",
        "--alter",
        "--entity-type",
        "topics",
        "--entity-name",
        topic,
        "--add-config",
        "retention.ms=123456,max.message.bytes=65536",
        bootstrap=b,
        check=True,
    )
    out = run_tool(
        "kafka-configs",
        "--describe",
        "--entity-type",
        "topics",
        "--entity-name",
        topic,
        bootstrap=b,
        check=True,
    ).stdout
    assert f"Dynamic configs for topic {topic} are:" in out
    assert "retention.ms=123456" in out
    assert "max.message.bytes=65536" in out
    broker = run_tool(
        "kafka-configs",
        "--describe",
        "--entity-type",
        "brokers",
        "--entity-name",
        "1",
        "--all",
        bootstrap=b,
        check=True,
    ).stdout
    assert re.search(r"^\s*num\.partitions=1 ", broker, re.M), broker[-2000:]


def test_offsets_api_versions_and_quorum(apache_kafka: KafkaCluster) -> None:
    b = apache_kafka.bootstrap
    topic = name("offsets")
    run_tool("kafka-topics", "--create", "--topic", topic, bootstrap=b, check=True)
    console_produce(b, topic, ["a", "b", "c"])
    offsets = run_tool("kafka-get-offsets", "--topic", topic, bootstrap=b, check=True)
    assert offsets.stdout.split() == [f"{topic}:0:3"]

    versions = run_tool("kafka-broker-api-versions", bootstrap=b, check=True).stdout
    assert f"{b} (id: 1 rack: null" in versions
    for api in ("Produce(0)", "Fetch(1)", "Metadata(3)", "InitProducerId(22)"):
        assert api in versions

    quorum = run_tool("kafka-metadata-quorum", "describe", "--status", bootstrap=b, check=True)
    assert re.search(r"^LeaderId:\s+1$", quorum.stdout, re.M), quorum.stdout
    cluster_id = run_tool("kafka-cluster", "cluster-id", bootstrap=b, check=True)
    assert cluster_id.stdout.strip() == f"Cluster ID: {apache_kafka.cluster_id}"
