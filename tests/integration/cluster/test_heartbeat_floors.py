"""Heartbeats report what changed ([M1] 4), on a real local cluster: every advance of a
partition's acknowledged end reaches the controller as its durable floor, whether the partition
was open before (an incremental heartbeat), moved to another broker, or failed over from a
killed one, and partitions nothing was written to keep floor 0."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240, func_only=True)]

TOPIC = "floors"
PARTITIONS = 6


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    c = LocalClusterProcess(
        tmp_path / "cluster", brokers=2, env={"TIDALMQ_FLOOR_COMMIT_INTERVAL_S": "0.2"}
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def produce(bootstrap: str, partition: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    errors: list[str] = []
    for i in range(count):
        p.produce(
            TOPIC,
            f"r{i}".encode(),
            partition=partition,
            on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
        )
    assert p.flush(30) == 0 and not errors, errors


def floors(c: LocalClusterProcess) -> list[int]:
    return [p["end_offset_floor"] for p in c.metadata()["topics"][TOPIC]["partitions"]]


def wait_floors(c: LocalClusterProcess, want: dict[int, int], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = floors(c)
        if all(got[i] == v for i, v in want.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"floors {floors(c)}, wanted {want}")


def test_every_advance_reaches_the_controller_as_a_floor(cluster: LocalClusterProcess) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    produce(cluster.bootstrap, 1, 50)  # its first data: reported with the first checkpoint
    wait_floors(cluster, {1: 50})
    # the floor's commit reaches the broker, and a heartbeat or two later nothing about the
    # partition is news any more (heartbeats every second): only its advance is, from now on
    time.sleep(3)
    produce(cluster.bootstrap, 1, 30)
    produce(cluster.bootstrap, 4, 7)
    wait_floors(cluster, {1: 80, 4: 7})
    assert [f for i, f in enumerate(floors(cluster)) if i not in (1, 4)] == [0] * 4
    # moved to the other broker: its new leader reports its advances
    leader = cluster.leaders(TOPIC)[1]
    cluster.reassign({(TOPIC, 1): 1 - leader})
    cluster.wait_settled()
    assert cluster.leaders(TOPIC)[1] == 1 - leader
    produce(cluster.bootstrap, 1, 20)
    wait_floors(cluster, {1: 100, 4: 7})
    # its broker killed: the survivor opens it (failover) and reports its advances
    victim = cluster.leaders(TOPIC)[4]
    cluster.kill_broker(victim)
    deadline = time.monotonic() + 60
    while cluster.leaders(TOPIC)[4] == victim and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.wait_settled(60)
    produce(cluster.bootstrap, 4, 5)
    wait_floors(cluster, {1: 100, 4: 12})
