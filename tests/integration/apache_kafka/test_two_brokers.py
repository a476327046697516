"""The 2-broker KRaft cluster and kafka-reassign-partitions generate/execute/verify/cancel."""

from __future__ import annotations

import re
import uuid

import pytest

from bench.kafka.harness import (
    KafkaCluster,
    console_consume,
    console_produce,
    producer_perf_test,
    reassign_cancel,
    reassign_execute,
    reassign_generate,
    reassign_verify,
    reassignment_plan,
    run_tool,
    wait_reassigned,
)

from .test_cli_tools import describe_partitions

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_cluster_has_two_brokers_and_replicates(apache_kafka_2: KafkaCluster) -> None:
    b = apache_kafka_2.bootstrap
    assert apache_kafka_2.broker_ids == [1, 2]
    assert len(b.split(",")) == 2
    versions = run_tool("kafka-broker-api-versions", bootstrap=b, check=True).stdout
    assert sorted(map(int, re.findall(r"\(id: (\d+) rack", versions))) == [1, 2]
    quorum = run_tool(
        "kafka-metadata-quorum", "describe", "--status", bootstrap=b, check=True
    ).stdout
    assert re.search(rf"^LeaderId:\s+{KafkaCluster.CONTROLLER_ID}$", quorum, re.M), quorum

    topic = f"rf2-{uuid.uuid4().hex[:8]}"
    run_tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--partitions",
        "2",
        "--replication-factor",
        "2",
        bootstrap=b,
        check=True,
    )
    for part in describe_partitions(b, topic):
        assert sorted(part["Replicas"].split(",")) == ["1", "2"]
    # Every broker alone can serve as bootstrap.
    console_produce(apache_kafka_2.nodes[1].address, topic, ["x", "y"])
    assert sorted(console_consume(apache_kafka_2.nodes[2].address, topic, 2)) == ["x", "y"]


def test_reassign_generate_execute_verify(apache_kafka_2: KafkaCluster) -> None:
    b = apache_kafka_2.bootstrap
    topic = f"move-{uuid.uuid4().hex[:8]}"
    run_tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--replica-assignment",
        "1,1",
        bootstrap=b,
        check=True,
    )
    console_produce(b, topic, [f"r{i}" for i in range(100)])

    current, proposed = reassign_generate(b, [topic], [2])
    assert {(p["partition"], tuple(p["replicas"])) for p in current["partitions"]} == {
        (0, (1,)),
        (1, (1,)),
    }
    assert {(p["partition"], tuple(p["replicas"])) for p in proposed["partitions"]} == {
        (0, (2,)),
        (1, (2,)),
    }

    rollback = reassign_execute(b, proposed)
    assert rollback["partitions"] == current["partitions"]
    wait_reassigned(b, proposed, timeout=120)
    assert reassign_verify(b, proposed) == {f"{topic}-0": "completed", f"{topic}-1": "completed"}
    parts = describe_partitions(b, topic)
    assert all(p["Replicas"] == "2" and p["Leader"] == "2" for p in parts), parts
    # The data moved with the partitions.
    assert len(console_consume(b, topic, 100)) == 100


def test_reassign_cancel_reverts_a_throttled_move(apache_kafka_2: KafkaCluster) -> None:
    b = apache_kafka_2.bootstrap
    topic = f"cancel-{uuid.uuid4().hex[:8]}"
    run_tool(
        "kafka-topics",
        "--create",
        "--topic",
        topic,
        "--replica-assignment",
        "1",
        bootstrap=b,
        check=True,
    )
    # 8 MiB behind a 10 kB/s throttle: the copy cannot finish before the cancel.
    producer_perf_test(b, topic, num_records=8192, record_size=1024, acks="1")
    plan = reassignment_plan({(topic, 0): [2]})
    reassign_execute(b, plan, throttle_bytes_per_sec=10_000)
    assert reassign_verify(b, plan) == {f"{topic}-0": "in progress"}

    cancelled = reassign_cancel(b, plan)
    assert re.search(
        rf"Successfully cancelled partition reassignments? for: {topic}-0\b", cancelled.stdout
    )
    assert reassign_verify(b, plan) == {f"{topic}-0": "not as planned"}
    (part,) = describe_partitions(b, topic)
    assert part["Replicas"] == "1" and part["Leader"] == "1"
    # verify/cancel cleared the throttle configs.
    configs = run_tool(
        "kafka-configs",
        "--describe",
        "--entity-type",
        "brokers",
        "--entity-name",
        "1",
        bootstrap=b,
        check=True,
    ).stdout
    assert "throttled.rate" not in configs
