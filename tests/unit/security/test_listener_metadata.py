"""Each broker is described by its endpoint of the client's listener (Metadata, DescribeCluster,
FindCoordinator), as Kafka does; a broker without that listener is left out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kio.schema.errors import ErrorCode
from tidalmq_broker.apis.groups import _find
from tidalmq_broker.apis.metadata import brokers_body, topic_body, unreachable_brokers
from tidalmq_core.metadata import (
    OFFSETS_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    Endpoint,
    PartitionState,
    TopicInfo,
)


def cluster() -> ClusterMetadata:
    meta = ClusterMetadata("c")
    both = [Endpoint("PLAINTEXT", "b0", 9092), Endpoint("SASL_SSL", "b0.example", 9093, "SASL_SSL")]
    meta.brokers = {
        0: BrokerInfo(0, "b0", 9092, listeners=both),
        1: BrokerInfo(1, "b1", 9092),  # written before listeners: PLAINTEXT only
        2: BrokerInfo(2, "b2", 9092, state="dead", listeners=both),
    }
    parts = [PartitionState(0, 3, [0]), PartitionState(1, 5, [1])]
    meta.topics = {
        "t": TopicInfo("t", "00000000-0000-0000-0000-000000000001", parts),
        OFFSETS_TOPIC: TopicInfo(
            OFFSETS_TOPIC,
            "00000000-0000-0000-0000-000000000002",
            [PartitionState(1, 0, [1])],
            internal=True,
        ),
    }
    return meta


def test_brokers_at_the_endpoint_of_the_clients_listener() -> None:
    meta = cluster()
    plain = {(b["node_id"], b["host"], b["port"]) for b in brokers_body(meta, "PLAINTEXT")}
    assert plain == {(0, "b0", 9092), (1, "b1", 9092)}  # the dead one is never listed
    sasl = {(b["node_id"], b["host"], b["port"]) for b in brokers_body(meta, "SASL_SSL")}
    assert sasl == {(0, "b0.example", 9093)}


def test_a_partition_led_by_a_broker_without_the_listener() -> None:
    meta = cluster()
    assert unreachable_brokers(meta, "PLAINTEXT") == set()
    assert unreachable_brokers(meta, "SASL_SSL") == {1}
    parts = topic_body(meta.topics["t"], unreachable_brokers(meta, "SASL_SSL"), 12)["partitions"]
    assert (parts[0]["error_code"], parts[0]["leader_id"]) == (ErrorCode.none, 0)
    assert (parts[1]["error_code"], parts[1]["leader_id"]) == (ErrorCode.listener_not_found, -1)
    old = topic_body(meta.topics["t"], {1}, 5)["partitions"][1]
    assert old["error_code"] == ErrorCode.leader_not_available  # before Metadata v6


def test_the_coordinator_on_the_clients_listener() -> None:
    broker: Any = SimpleNamespace(
        metadata=cluster(), groups=SimpleNamespace(partition_for=lambda k: 0)
    )
    found = _find(broker, "g", 0, "PLAINTEXT")
    assert (found["node_id"], found["host"], found["port"]) == (1, "b1", 9092)
    missing = _find(broker, "g", 0, "SASL_SSL")
    assert missing["error_code"] == ErrorCode.coordinator_not_available
    assert "no listener SASL_SSL" in missing["error_message"]
