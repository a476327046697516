"""The per-partition series the planner reads: labelled by broker, present while it leads."""

from __future__ import annotations

from prometheus_client import REGISTRY
from tidalmq_broker.metrics import BrokerMetrics


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_partition_series_follow_leadership() -> None:
    a, b = BrokerMetrics(901, {}), BrokerMetrics(902, {})
    lab = {"topic": "planner-metrics", "partition": "3"}
    a.partition_led("planner-metrics", 3, epoch=5)
    assert sample("tidalmq_partition_leader_epoch", broker="901", **lab) is None
    assert a.publish_led() == 0  # published off the open's path, a chunk at a time
    # opened with no traffic yet: the series exist at zero, with the epoch
    assert sample("tidalmq_partition_bytes_in_total", broker="901", **lab) == 0.0
    assert sample("tidalmq_partition_leader_epoch", broker="901", **lab) == 5.0
    a.produced("planner-metrics", 3, 1000, 10)
    a.fetched("planner-metrics", 3, 400)
    assert sample("tidalmq_partition_bytes_in_total", broker="901", **lab) == 1000.0
    assert sample("tidalmq_partition_records_in_total", broker="901", **lab) == 10.0
    assert sample("tidalmq_partition_bytes_out_total", broker="901", **lab) == 400.0

    # moved to broker 902: the old broker's series go, the new one's start from zero
    a.partition_released("planner-metrics", 3)
    b.partition_led("planner-metrics", 3, epoch=6)
    b.produced("planner-metrics", 3, 50, 1)
    b.publish_led()
    assert sample("tidalmq_partition_bytes_in_total", broker="901", **lab) is None
    assert sample("tidalmq_partition_leader_epoch", broker="901", **lab) is None
    assert sample("tidalmq_partition_bytes_in_total", broker="902", **lab) == 50.0
    assert sample("tidalmq_partition_leader_epoch", broker="902", **lab) == 6.0
    a.partition_released("planner-metrics", 3)  # twice is harmless


def test_series_of_partitions_released_before_publication_never_appear() -> None:
    m = BrokerMetrics(903, {})
    for p in range(1200):
        m.partition_led("many", p, epoch=1)
    m.partition_released("many", 7)
    assert m.publish_led(500) == 699
    while m.publish_led(500):
        pass
    assert (
        sample("tidalmq_partition_leader_epoch", broker="903", topic="many", partition="8") == 1.0
    )
    assert (
        sample("tidalmq_partition_leader_epoch", broker="903", topic="many", partition="7") is None
    )
