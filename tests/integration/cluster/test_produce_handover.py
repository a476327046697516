"""A producer writing through moves on a real two-broker local cluster ([L1] item 4,
handover.py): its requests for the partition in a handover are held instead of answered at once.
The source holds them while the partition is leaderless and then answers
NOT_LEADER_OR_FOLLOWER naming the elected target (KIP-951), so librdkafka goes there from the
answer; the target holds them while it opens the partition and appends them then, in order. No
partition is ever answered LEADER_NOT_AVAILABLE, and every record is acknowledged once, in
order. With `produce_handover_wait_ms` 0 (the behaviour before) the source names no leader, the
producer asks Metadata and backs off, and may meet the target still opening."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.client_log import captured_client_log
from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180, func_only=True)]

TOPIC = "orders"
MOVES = 6


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    c = LocalClusterProcess(tmp_path / "cluster", brokers=2)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_a_producer_writing_through_moves_is_held_and_redirected_not_refused(
    cluster: LocalClusterProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    logger, client_log = captured_client_log("handover-producer")
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 1,
            "debug": "metadata",
            "topic.metadata.refresh.interval.ms": 600_000,
        },
        logger=logger,
    )
    delivered: list[tuple[int, bytes]] = []  # (offset, value) in acknowledgement order
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered.append((msg.offset(), msg.value()))

    stop = threading.Event()
    sent = 0

    def write() -> None:  # a record every ~2 ms, throughout the moves
        nonlocal sent
        while not stop.is_set():
            producer.produce(TOPIC, value=b"%d" % sent, partition=0, on_delivery=on_delivery)
            sent += 1
            producer.poll(0.002)

    before = cluster.metric_totals("tidalmq_produce_handover_holds_total", "outcome")
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        for _ in range(MOVES):
            time.sleep(0.3)
            source = cluster.leaders(TOPIC)[0]
            target = next(b["broker"] for b in cluster.status()["brokers"] if b["broker"] != source)
            cluster.reassign({(TOPIC, 0): target})
            cluster.wait_settled()
            assert cluster.leaders(TOPIC) == [target]
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join(10)
    assert producer.flush(30) == 0
    assert failed == []
    held = cluster.metric_totals("tidalmq_produce_handover_holds_total", "outcome") - before
    refused = cluster.metric_totals("tidalmq_produce_errors_total", "error")

    # every record acknowledged once, at consecutive offsets, in the order it was sent
    assert [value for _, value in sorted(delivered)] == [b"%d" % i for i in range(sent)]
    assert [offset for offset, _ in sorted(delivered)] == list(range(sent))
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "handover-check",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(read) < sent and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=1):
            assert msg.error() is None, msg.error()
            read.append(msg.value())
    consumer.close()
    assert read == [b"%d" % i for i in range(sent)]

    # the source held the producer's requests while the partition had no leader and answered
    # them naming the target; nothing was refused as LEADER_NOT_AVAILABLE (the target held
    # what came while it opened), and librdkafka took the leader from the answers
    print(f"held through {MOVES} moves: {dict(held)}; refused: {dict(refused)}")
    assert held["redirected"] >= MOVES // 2, (held, refused)
    assert held["timed_out"] == 0 and held["failed"] == 0, held
    assert refused["leader_not_available"] == 0, refused
    assert any(" updated with leader " in line for line in client_log), "\n".join(client_log[-40:])
