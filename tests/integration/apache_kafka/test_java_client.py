"""The Apache Kafka Java client on default settings (idempotence on) and a Java consumer group,
against the real Apache Kafka (bench/kafka/java/ClientCheck.java)."""

from __future__ import annotations

import uuid

import pytest

from bench.kafka.harness import KafkaCluster, java_consume, java_produce, parse_table, run_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

COUNT = 2000


@pytest.mark.parametrize("cluster_fixture", ["apache_kafka", "apache_kafka_2"])
def test_default_producer_is_idempotent_and_group_consumes_all(
    cluster_fixture: str, request: pytest.FixtureRequest
) -> None:
    cluster: KafkaCluster = request.getfixturevalue(cluster_fixture)
    b = cluster.bootstrap
    topic, group = f"java-{uuid.uuid4().hex[:8]}", f"jg-{uuid.uuid4().hex[:8]}"
    rf = str(len(cluster.broker_ids))
    run_tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--partitions",
        "3",
        "--replication-factor",
        rf,
        bootstrap=b,
        check=True,
    )

    produced = java_produce(b, topic, COUNT)
    assert produced["client_version"] == cluster.version
    assert produced["enable_idempotence"] is True
    assert produced["acks"] == "-1"  # acks=all, the default that idempotence needs
    assert produced["acked"] == COUNT
    assert produced["contiguous"] is True
    assert produced["describe_producers_error"] is None
    # An idempotent producer got a producer id from the cluster and the partitions know it.
    assert produced["producer_ids"], produced
    assert all(pid >= 0 for pid in produced["producer_ids"])
    assert sum(p["count"] for p in produced["partitions"].values()) == COUNT

    consumed = java_consume(b, topic, group, COUNT)
    assert consumed["received"] == COUNT
    assert consumed["distinct_keys"] == COUNT
    assert consumed["assignment"] == [0, 1, 2]
    assert sum(consumed["committed"].values()) == COUNT

    described = run_tool(
        "kafka-consumer-groups", "--describe", "--group", group, bootstrap=b, check=True
    )
    rows = parse_table(described.stdout, "GROUP")
    assert len(rows) == 3
    assert all(r["LAG"] == "0" for r in rows), described.stdout
