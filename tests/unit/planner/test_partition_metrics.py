"""The per-partition series the planner reads: labelled by broker, present while it leads."""

from __future__ import annotations

import aiohttp
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest
from tidalmq_broker.metrics import BrokerMetrics
from tidalmq_broker.server.http import HealthServer


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
    a.fetched("planner-metrics", 3, 400, 4)
    assert sample("tidalmq_partition_bytes_in_total", broker="901", **lab) == 1000.0
    assert sample("tidalmq_partition_records_in_total", broker="901", **lab) == 10.0
    assert sample("tidalmq_partition_bytes_out_total", broker="901", **lab) == 400.0
    topic = {"broker": "901", "topic": "planner-metrics"}
    assert sample("tidalmq_topic_bytes_in_total", **topic) == 1000.0
    assert sample("tidalmq_topic_records_in_total", **topic) == 10.0
    assert sample("tidalmq_topic_bytes_out_total", **topic) == 400.0
    assert sample("tidalmq_topic_records_out_total", **topic) == 4.0

    # moved to broker 902: the old broker's series go, the new one's start from zero
    a.partition_released("planner-metrics", 3)
    b.partition_led("planner-metrics", 3, epoch=6)
    b.produced("planner-metrics", 3, 50, 1)
    b.publish_led()
    assert sample("tidalmq_partition_bytes_in_total", broker="901", **lab) is None
    assert sample("tidalmq_partition_leader_epoch", broker="901", **lab) is None
    assert sample("tidalmq_partition_bytes_in_total", broker="902", **lab) == 50.0
    assert sample("tidalmq_partition_leader_epoch", broker="902", **lab) == 6.0
    # the topic's series go with the last of its partitions led here
    assert sample("tidalmq_topic_bytes_in_total", **topic) is None
    assert sample("tidalmq_topic_bytes_in_total", broker="902", topic="planner-metrics") == 50.0
    a.partition_released("planner-metrics", 3)  # twice is harmless


def test_partition_traffic_series_off_leaves_the_per_topic_ones_and_the_epoch() -> None:
    """partition_traffic_metrics=false: 3 series per partition fewer; the topic totals and the
    leader epoch (the planner's assignment) stay."""
    m = BrokerMetrics(905, {}, per_partition_traffic=False)
    lab = {"broker": "905", "topic": "quiet-parts", "partition": "1"}
    m.partition_led("quiet-parts", 1, epoch=3)
    m.publish_led()
    m.produced("quiet-parts", 1, 700, 7)
    m.fetched("quiet-parts", 1, 300, 3)
    for name in (
        "tidalmq_partition_bytes_in_total",
        "tidalmq_partition_records_in_total",
        "tidalmq_partition_bytes_out_total",
    ):
        assert sample(name, **lab) is None, name
    assert sample("tidalmq_partition_leader_epoch", **lab) == 3.0
    topic = {"broker": "905", "topic": "quiet-parts"}
    assert sample("tidalmq_topic_bytes_in_total", **topic) == 700.0
    assert sample("tidalmq_topic_records_in_total", **topic) == 7.0
    assert sample("tidalmq_topic_bytes_out_total", **topic) == 300.0
    m.partition_released("quiet-parts", 1)
    assert sample("tidalmq_partition_leader_epoch", **lab) is None
    assert sample("tidalmq_topic_bytes_in_total", **topic) is None


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


async def test_a_scrape_publishes_the_series_still_pending_first() -> None:
    """The broker's /metrics runs BrokerMetrics.publish_led(None) before rendering: a scrape
    right after a burst of opens sees every partition's series, not the chunks published so far."""
    m = BrokerMetrics(904, {})
    for p in range(1200):
        m.partition_led("scraped", p, epoch=2)
    server = HealthServer(lambda: (True, "serving"), before_scrape=lambda: m.publish_led(None))
    await server.start("127.0.0.1", 0)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{server.port}/metrics") as resp,
        ):
            text = await resp.text()
    finally:
        await server.stop()
    assert m.publish_led() == 0
    lines = [
        line
        for line in text.splitlines()
        if line.startswith("tidalmq_partition_leader_epoch{") and 'broker="904"' in line
    ]
    assert len(lines) == 1200


def test_partition_series_are_written_as_prometheus_client_counters_and_gauges_are() -> None:
    """The per-partition series are read at scrape time from BrokerMetrics' own numbers (no
    labelled child per partition): the exposition must be what labelled Counters and a Gauge
    of prometheus_client write for the same values (names, help, types, _total and _created)."""
    m = BrokerMetrics(905, {})
    m.partition_led("exposed", 2, epoch=4)
    m.publish_led(None)
    m.produced("exposed", 2, 1000, 10)
    m.fetched("exposed", 2, 400, 4)
    lab = {"broker": "905", "topic": "exposed", "partition": "2"}

    reference = CollectorRegistry()
    values = {"bytes_in": 1000, "records_in": 10, "bytes_out": 400}
    helps = {
        "bytes_in": "Record batch bytes appended",
        "records_in": "Records appended",
        "bytes_out": "Record batch bytes fetched",
    }
    labels = ("905", "exposed", "2")
    for what, value in values.items():
        counter = Counter(
            f"tidalmq_partition_{what}_total",
            helps[what],
            ["broker", "topic", "partition"],
            registry=reference,
        )
        child = counter.labels(*labels)
        child.inc(value)
        created = sample(f"tidalmq_partition_{what}_created", **lab)
        assert created is not None
        child._created = created  # the one figure a reference cannot share: when it began
    Gauge(
        "tidalmq_partition_leader_epoch",
        "Leader epoch of each partition this broker has open (present only while it leads it)",
        ["broker", "topic", "partition"],
        registry=reference,
    ).labels(*labels).set(4)

    def ours(text: str) -> list[str]:
        return [
            line
            for line in text.splitlines()
            if "tidalmq_partition_" in line and (line.startswith("#") or 'broker="905"' in line)
        ]

    expected = ours(generate_latest(reference).decode())
    # three counters (a _total and a _created sample each) and the gauge
    assert len([line for line in expected if not line.startswith("#")]) == 7
    got = ours(generate_latest(REGISTRY).decode())
    assert [line for line in got if not line.startswith("#")] == [
        line for line in expected if not line.startswith("#")
    ]
    assert set(expected) <= set(got)
    m.partition_released("exposed", 2)
    assert not [line for line in ours(generate_latest(REGISTRY).decode()) if "905" in line]
