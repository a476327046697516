"""Small helpers around the real Kafka clients used by the integration tests."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, name: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs)],
        operation_timeout=30,
    )
    futures[name].result(30)


class AckedLog:
    """What the broker acknowledged, per partition, in produce order."""

    def __init__(self) -> None:
        self.acked: dict[int, list[tuple[int, bytes]]] = defaultdict(
            list
        )  # partition -> (offset, value)
        self.errors: list[str] = []

    def callback(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked[msg.partition()].append((msg.offset(), msg.value()))

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def producer(bootstrap: str, **extra: Any) -> Producer:
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"}
    conf.update(extra)
    return Producer(conf)


def consume_all(
    bootstrap: str,
    topic: str,
    expected: int,
    *,
    group: str | None = None,
    timeout_s: float = 60.0,
    **extra: Any,
) -> list[Any]:
    """Consume until `expected` messages arrived (or timeout); returns the messages."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group or f"g-{time.time_ns()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    conf.update(extra)
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            out.append(msg)
        if group:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return out


def watermarks(
    bootstrap: str, topic: str, partitions: int, *, retry_s: float = 0.0
) -> dict[int, tuple[int, int]]:
    """(low, high) watermark per partition. With retry_s, a partition a (re)starting broker is
    still opening is asked again until retry_s has passed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets-probe"})
    deadline = time.monotonic() + retry_s
    out: dict[int, tuple[int, int]] = {}
    try:
        for p in range(partitions):
            while True:
                try:
                    out[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        return out
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    return {p: high for p, (_, high) in watermarks(bootstrap, topic, partitions).items()}
