"""A three-broker cluster on the real S3 server, an idempotent producer writing all the time, and
the cluster changing under it: every acknowledged record is read back exactly once, in order per
partition."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.local_cluster import LocalClusterProcess
from tests.support.producer_thread import ProducerThread, started_then_abandoned

pytestmark = pytest.mark.integration

PARTITIONS = 12


@pytest.fixture
def cluster(s3_server: Any, tmp_path: Path) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(
        tmp_path / "cluster",
        brokers=3,
        storage_url=s3_server.url(prefix=f"cluster-{uuid.uuid4().hex[:8]}"),
        env=s3_server.env(),
    ) as c:
        yield c


class ContinuousProducer(ProducerThread):
    """An idempotent producer writing keyed records until stopped; remembers what was acked."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: int = 1500) -> None:
        self.topic = topic
        self.rate = rate_per_s
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120000,
                "retry.backoff.ms": 20,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.acked: dict[int, list[tuple[int, int]]] = defaultdict(
            list
        )  # partition -> (offset, seq)
        self.errors: list[str] = []
        self.sent = 0
        self.flush_s = 150
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked[msg.partition()].append((msg.offset(), int(msg.value())))

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.producer.produce(
                    self.topic,
                    key=b"k%d" % (self.sent % 97),
                    value=b"%d" % self.sent,
                    on_delivery=self._on_delivery,
                )
                self.sent += 1
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.producer.poll(0)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def acked_count(self) -> int:
        return sum(len(v) for v in self.acked.values())


@pytest.fixture
def producing(cluster: LocalClusterProcess) -> Iterator[Callable[[str], ContinuousProducer]]:
    """Starts a ContinuousProducer to a topic of the cluster; one that a failed test left
    running is abandoned, not left producing to a stopped cluster for the rest of the session."""
    yield from started_then_abandoned(lambda topic: ContinuousProducer(cluster.bootstrap, topic))


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


def verify_exactly_once_in_order(bootstrap: str, topic: str, producer: ContinuousProducer) -> None:
    assert not producer.errors, producer.errors[:5]
    expected = producer.acked_count()
    assert expected == producer.sent, "every produced record was acknowledged"
    # The log itself, read with assign() from the first offset to each high watermark: a
    # consumer group could re-read a partition after a rebalance (no offsets are committed),
    # which would look like a duplicate in the log.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1]
        for p in range(PARTITIONS)
    }
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got: dict[int, list[tuple[int, int]]] = defaultdict(list)
    done = {p for p, end in ends.items() if end == 0}
    count = 0
    deadline = time.monotonic() + 120
    while len(done) < PARTITIONS and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= ends[msg.partition()]:
                    done.add(msg.partition())
                continue
            raise KafkaException(msg.error())
        got[msg.partition()].append((msg.offset(), int(msg.value())))
        count += 1
        if msg.offset() + 1 >= ends[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    assert len(done) == PARTITIONS, f"read to the end of {sorted(done)} only; ends {ends}"
    for partition, rows in got.items():
        offsets = [o for o, _ in rows]
        assert len(offsets) == len(set(offsets)), f"partition {partition}: an offset served twice"
    values = [v for part in got.values() for _, v in part]
    if len(values) != len(set(values)):
        where: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for partition, rows in got.items():
            for offset, value in rows:
                where[value].append((partition, offset))
        twice = {v: at for v, at in where.items() if len(at) > 1}
        acked = {v: (p, o) for p, rows in producer.acked.items() for o, v in rows if v in twice}
        raise AssertionError(
            f"{len(twice)} records written twice (value: [(partition, offset)...]): "
            f"{dict(list(twice.items())[:10])}; their acknowledgements: {acked}"
        )
    assert count == expected, f"read {count} records, {expected} were acknowledged"
    for partition, acked in producer.acked.items():
        read = dict(got[partition])
        values_read = set(read.values())
        for offset, value in acked:
            if offset is None:
                # acknowledged without an offset: librdkafka infers a retried batch was persisted
                # when a later batch was acknowledged first; it must still be there
                assert value in values_read, f"partition {partition} lost value {value}"
            else:
                assert read.get(offset) == value, f"partition {partition} offset {offset}"
        # in order: the producer's sequence numbers increase along the offsets
        seqs = [v for _, v in sorted(got[partition])]
        assert seqs == sorted(seqs), f"partition {partition} out of order"


def brokers_of(cluster: LocalClusterProcess, topic: str) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for leader in cluster.leaders(topic):
        counts[leader] += 1
    return dict(counts)


def test_move_every_partition_once(
    cluster: LocalClusterProcess, producing: Callable[[str], ContinuousProducer]
) -> None:
    topic = f"moves-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    producer = producing(topic)
    time.sleep(2)
    leaders = cluster.leaders(topic)
    brokers = sorted({b["broker"] for b in cluster.status()["brokers"]})
    targets = {
        (topic, p): brokers[(brokers.index(b) + 1) % len(brokers)] for p, b in enumerate(leaders)
    }
    result = cluster.reassign(targets)
    assert all(r["error"] is None for r in result["results"]), result
    cluster.wait_settled(60)
    assert cluster.leaders(topic) == [targets[(topic, p)] for p in range(PARTITIONS)]
    time.sleep(2)
    producer.stop()
    verify_exactly_once_in_order(cluster.bootstrap, topic, producer)
    done = [m for m in cluster.moves()["recent"] if m["topic"] == topic]
    assert len(done) == PARTITIONS and all(m["phase"] == "Done" for m in done)


def test_add_a_broker(
    cluster: LocalClusterProcess, producing: Callable[[str], ContinuousProducer]
) -> None:
    topic = f"add-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    producer = producing(topic)
    time.sleep(2)
    new = cluster.add_broker()
    cluster.wait_settled(60)
    status = {b["broker"]: b["partitions"] for b in cluster.status()["brokers"]}
    counts = sorted(status.values())
    assert status[new] > 0 and counts[-1] - counts[0] <= 1, status
    time.sleep(2)
    producer.stop()
    verify_exactly_once_in_order(cluster.bootstrap, topic, producer)


def test_drain_and_remove_a_broker(
    cluster: LocalClusterProcess, producing: Callable[[str], ContinuousProducer]
) -> None:
    topic = f"drain-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    producer = producing(topic)
    time.sleep(2)
    cluster.remove_broker(1)
    cluster.wait_settled(60)
    assert 1 not in cluster.leaders(topic)
    assert {b["broker"] for b in cluster.status()["brokers"]} == {0, 2}
    time.sleep(2)
    producer.stop()
    verify_exactly_once_in_order(cluster.bootstrap, topic, producer)


def test_kill_9_a_broker(
    cluster: LocalClusterProcess, producing: Callable[[str], ContinuousProducer]
) -> None:
    topic = f"kill-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    producer = producing(topic)
    time.sleep(3)
    victim = 2
    cluster.kill_broker(victim)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and victim in cluster.leaders(topic):
        time.sleep(0.2)
    assert victim not in cluster.leaders(topic), "the dead broker's partitions moved"
    cluster.wait_settled(60)
    time.sleep(3)
    producer.stop()
    verify_exactly_once_in_order(cluster.bootstrap, topic, producer)


def test_cancel_a_move_half_way(
    cluster: LocalClusterProcess, producing: Callable[[str], ContinuousProducer]
) -> None:
    """A move whose source never closes (its process is stopped with SIGSTOP) stays in Closing;
    cancelling it rolls the partition back to the original broker with a higher epoch."""
    topic = f"cancel-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    producer = producing(topic)
    time.sleep(2)
    meta = cluster.metadata()
    part0 = meta["topics"][topic]["partitions"][0]
    source, epoch = part0["leader"], part0["leader_epoch"]
    target = next(b["broker"] for b in cluster.status()["brokers"] if b["broker"] != source)
    pid = next(b["pid"] for b in cluster.status()["brokers"] if b["broker"] == source)
    import os
    import signal as sig

    os.kill(pid, sig.SIGSTOP)  # the source cannot close: the move is stuck half way
    try:
        cluster.reassign({(topic, 0): target})
        time.sleep(0.5)
        moving = [m for m in cluster.moves()["active"] if m["topic"] == topic]
        assert moving and moving[0]["phase"] == "Closing"
        cluster.reassign({(topic, 0): None})  # cancel
    finally:
        os.kill(pid, sig.SIGCONT)
    cluster.wait_settled(60)
    after = cluster.metadata()["topics"][topic]["partitions"][0]
    assert after["leader"] == source and after["leader_epoch"] > epoch
    cancelled = [
        m for m in cluster.moves()["recent"] if m["topic"] == topic and m["partition"] == 0
    ]
    assert cancelled and cancelled[-1]["phase"] == "Cancelled"
    time.sleep(2)
    producer.stop()
    verify_exactly_once_in_order(cluster.bootstrap, topic, producer)


def _post_error(cluster: LocalClusterProcess, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """(HTTP status, error message) of a local-cluster command that must fail."""
    import json
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as info:
        cluster._post(path, body)
    return info.value.code, json.loads(info.value.read())["error"]


def test_local_cluster_restart_and_remove_broker(tmp_path: Path) -> None:
    """`local up` stopped with Ctrl-C and started again finds the assignment as it was (its
    brokers stop without draining into each other); remove-broker reports a broker that does
    not stop in time, and refuses to remove the last broker."""
    import os
    import signal as sig

    cluster = LocalClusterProcess(tmp_path / "cluster", brokers=3)  # local-directory store
    cluster.start()
    try:
        topic = f"restart-{uuid.uuid4().hex[:6]}"
        create_topic(cluster.bootstrap, topic)
        cluster.wait_settled(60)
        before = cluster.leaders(topic)
        assert sorted(set(before)) == [0, 1, 2]
        cluster.stop()
        cluster.log_path.rename(cluster.log_path.with_suffix(".first"))  # parse the new run's
        cluster.start()
        cluster.wait_settled(60)
        states = {b["broker"]: b["state"] for b in cluster.status()["brokers"]}
        assert states == {0: "alive", 1: "alive", 2: "alive"}, states
        assert cluster.leaders(topic) == before, "the restart moved partitions"
        assert cluster.moves()["recent"] == [], "the restart moved partitions"

        # a broker that does not exit after SIGTERM: a clear error, not a server error
        pid = next(b["pid"] for b in cluster.status()["brokers"] if b["broker"] == 2)
        os.kill(pid, sig.SIGSTOP)
        try:
            status, error = _post_error(
                cluster,
                "/v1/local/remove-broker",
                {"broker_id": 2, "drain_timeout_s": 1, "stop_timeout_s": 1},
            )
        finally:
            os.kill(pid, sig.SIGCONT)  # it handles the SIGTERM now, and exits
        assert status == 504 and "did not exit within 1s of SIGTERM" in error, error
        cluster.wait_settled(60)  # declared dead after the session timeout: failed over

        cluster.remove_broker(1)
        cluster.wait_settled(60)
        assert set(cluster.leaders(topic)) == {0}
        status, error = _post_error(cluster, "/v1/local/remove-broker", {"broker_id": 0})
        assert status == 409 and "last broker" in error, error
        assert set(cluster.leaders(topic)) == {0}
    finally:
        cluster.stop()
