"""KIP-951: what a broker tells a producer (Produce v10+) or a consumer (Fetch v16+) about
partitions it does not lead, from its metadata image: each partition's leader and epoch, and where
each leader is on the client's listener."""

from __future__ import annotations

from tidalmq_broker.apis.leader_hints import current_leaders
from tidalmq_broker.metrics import LEADER_HINTS, BrokerMetrics
from tidalmq_core.metadata import (
    NO_LEADER,
    BrokerInfo,
    ClusterMetadata,
    Endpoint,
    PartitionState,
    TopicInfo,
)


def image() -> ClusterMetadata:
    internal = Endpoint("INTERNAL", "10.0.0.2", 19093)
    brokers = {
        1: BrokerInfo(1, "b1.local", 9092, rack="a"),
        2: BrokerInfo(
            2, "b2.local", 9092, listeners=[Endpoint("PLAINTEXT", "b2.local", 9092), internal]
        ),
        3: BrokerInfo(3, "b3.local", 9092, listeners=[internal]),  # not on PLAINTEXT
        4: BrokerInfo(4, "b4.local", 9092, state="dead"),
    }
    leaders = [(2, 7), (2, 3), (NO_LEADER, 4), (3, 1), (4, 9), (1, 0)]
    partitions = [PartitionState(leader, epoch, [leader]) for leader, epoch in leaders]
    topic = TopicInfo("orders", "6f1c7d3e-0b8a-4f0e-9a51-3c2d1e0f4a5b", partitions)
    return ClusterMetadata("cluster", brokers=brokers, topics={"orders": topic})


def test_each_leader_with_its_endpoint_on_the_clients_listener() -> None:
    asked = [("orders", i) for i in range(6)] + [("orders", 6), ("gone", 0)]
    leaders, endpoints = current_leaders(image(), "PLAINTEXT", asked)
    # no leader, past the partition count, unknown topic: (-1, -1), left out; a leader without
    # an endpoint on the listener (3) or dead (4): named, without an endpoint
    assert leaders == {
        ("orders", 0): (2, 7),
        ("orders", 1): (2, 3),
        ("orders", 3): (3, 1),
        ("orders", 4): (4, 9),
        ("orders", 5): (1, 0),
    }
    assert endpoints == [(1, "b1.local", 9092, "a"), (2, "b2.local", 9092, None)]


def test_the_endpoint_of_the_listener_the_client_is_on() -> None:
    _, endpoints = current_leaders(image(), "INTERNAL", [("orders", 0), ("orders", 3)])
    assert endpoints == [(2, "10.0.0.2", 19093, None), (3, "10.0.0.2", 19093, None)]


def test_hints_are_counted_by_api() -> None:
    metrics = BrokerMetrics(951, {})
    counted = LEADER_HINTS.labels("951", "produce")
    before = counted._value.get()
    metrics.leader_hints("produce", 3)
    metrics.leader_hints("produce", 0)  # a misdirected partition without a leader: no hint
    assert counted._value.get() == before + 3
    assert LEADER_HINTS.labels("951", "fetch")._value.get() == 0
