"""Compacted topics end to end (docs/compaction.md): a topic created with
cleanup.policy=compact through a real AdminClient, many updates per key from a real producer,
the broker's own cleaner rounds, and a real consumer from the start that sees exactly the
latest value per key at the offset it was written, tombstones until delete.retention.ms and
then not; the same after kill -9 of the broker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from tests.integration.broker.conftest import topic_name
from tests.support.broker_process import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEYS = 20
UPDATES = 30
DELETED = {b"key-3", b"key-7"}
# the cleaner looks every 0.2 s; WAL ranges become segments after 0.3 s idle
FAST_CLEANER = {
    "TIDALMQ_COMPACTION_INTERVAL_S": "0.2",
    "TIDALMQ_COMPACTION_IDLE_S": "0.3",
    "TIDALMQ_CLEANER_BACKOFF_MS": "200",
}
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "4096",  # several segments: the cleaner's groups
    "segment.ms": "500",  # the last segment leaves the active part after half a second
    "min.cleanable.dirty.ratio": "0.01",
    # long enough for the reader to see the tombstones kept between the clean and the horizon
    "delete.retention.ms": "3000",
}

Row = tuple[int, bytes, bytes | None]


@pytest.fixture
def compacting_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(f"file://{tmp_path / 'objects'}", tmp_path / "logs",
                       env=FAST_CLEANER) as proc:  # fmt: skip
        yield proc


def produce(bootstrap: str, topic: str) -> list[Row]:
    """Every record written (offset, key, value): UPDATES rounds over KEYS keys, then a
    tombstone for each of DELETED."""
    written: list[Row] = []
    failed: list[str] = []

    def done(err: object, msg: object) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            written.append((msg.offset(), msg.key(), msg.value()))  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for round_ in range(UPDATES):
        for k in range(KEYS):
            value = b"v%d-%s" % (round_, b"x" * 40)
            producer.produce(topic, key=b"key-%d" % k, value=value, on_delivery=done)
        producer.flush(10)  # one round per few batches: many batches, many segments
    for key in sorted(DELETED):
        producer.produce(topic, key=key, value=None, on_delivery=done)
    assert producer.flush(10) == 0 and not failed, failed
    return sorted(written)


def read_all(bootstrap: str, topic: str, end: int) -> list[Row]:
    """Every record from the start up to `end`, by a consumer that commits nothing."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        rows: list[Row] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            offset, key = msg.offset(), msg.key()
            assert offset is not None
            error = msg.error()
            if error is not None:
                if error.code() == -191:  # _PARTITION_EOF
                    if offset >= end:  # the high watermark: all read
                        return rows
                    continue
                raise KafkaException(error)
            assert key is not None  # a compacted topic takes keyed records only
            rows.append((offset, key, msg.value()))
        raise AssertionError(f"did not reach offset {end}: {rows[-3:]}")
    finally:
        consumer.close()


def latest(written: list[Row], *, tombstones: bool) -> list[Row]:
    last = {key: offset for offset, key, _ in written}
    return [row for row in written if last[row[1]] == row[0] and (row[2] is not None or tombstones)]


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 25) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_consumer_from_the_start_reads_the_latest_value_per_key(
    compacting_broker: BrokerProcess,
) -> None:
    b = compacting_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": b})
    topic = topic_name()
    admin.create_topics([NewTopic(topic, 1, 1, config=TOPIC_CONFIGS)])[topic].result(15)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(15)
    assert described["cleanup.policy"].value == "compact"
    assert described["min.cleanable.dirty.ratio"].value == "0.01"
    assert described["max.compaction.lag.ms"].value == str(2**63 - 1)
    assert described["max.compaction.lag.ms"].is_default

    written = produce(b, topic)
    end = written[-1][0] + 1
    assert len(written) == KEYS * UPDATES + len(DELETED) == end

    # the cleaner keeps the latest record per key at the offset it was written, the
    # tombstones too until delete.retention.ms after the pass that first kept them
    compacted = latest(written, tombstones=True)
    seen: list[list[Row]] = []

    def reads(expected: list[Row]) -> bool:
        seen.append(read_all(b, topic, end))
        return seen[-1] == expected

    wait_for("the cleaner", lambda: reads(compacted))
    # ... and then a round drops the tombstones, with no new data in the partition
    wait_for("the tombstones' delete horizon", lambda: reads(latest(written, tombstones=False)))
    assert not {key for _, key, _ in seen[-1]} & DELETED
    metrics = compacting_broker.metrics()
    assert 'tidalmq_storage_cleaner_records_total{action="superseded",broker="0"}' in metrics
    assert (
        'tidalmq_storage_cleaner_records_total{action="tombstone_expired",broker="0"} 2.0'
        in metrics
    )

    # kill -9 and a restart on the same store: the cleaned log is what the next broker reads,
    # and an update after it is the key's latest value
    compacting_broker.restart(crash=True)
    assert read_all(b, topic, end) == seen[-1]
    producer = Producer({"bootstrap.servers": b})
    producer.produce(topic, key=b"key-0", value=b"after")
    assert producer.flush(10) == 0
    rows = read_all(b, topic, end + 1)
    assert rows[-1] == (end, b"key-0", b"after") and rows[:-1] == seen[-1]
