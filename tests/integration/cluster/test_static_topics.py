"""Static topics on a three-broker cluster on the real S3 server, with confluent-kafka:
keyed records keep their logic queue while every queue is remapped (both orders), a broker is
added and one drained, and a broker is killed; a consumer group reads every acknowledged record
once, at the offset its producer was told, in strictly increasing logic offsets, and resumes from
offsets committed before the remaps."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
)
from confluent_kafka import TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec
from kafka import KafkaConsumer

from tests.support.kafka_python_reads import read_to_end
from tests.support.local_cluster import LocalClusterProcess
from tests.support.producer_thread import ProducerThread, started_then_abandoned

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUEUES = 8
KEYS = 64


@pytest.fixture
def cluster(s3_server: Any, tmp_path: Path) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(
        tmp_path / "cluster",
        brokers=3,
        storage_url=s3_server.url(prefix=f"static-{uuid.uuid4().hex[:8]}"),
        env=s3_server.env(),
    ) as c:
        yield c


def describe(cluster: LocalClusterProcess, name: str) -> dict[str, Any]:
    return cluster.call("/v1/static-topics/describe", {"name": name})


def wait_until(predicate: Any, timeout_s: float = 90.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def settled(cluster: LocalClusterProcess, name: str) -> bool:
    d = describe(cluster, name)
    return (
        d["consistent"] and not d["busy"] and all(q["leader"] == q["broker"] for q in d["queues"])
    )


class KeyedProducer(ProducerThread):
    """An idempotent producer writing keyed records until stopped; remembers what was acked."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: int = 1000) -> None:
        self.topic = topic
        self.rate = rate_per_s
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 180000,
                "retry.backoff.ms": 20,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.acked: dict[int, tuple[int, int, bytes]] = {}  # value -> (partition, offset, key)
        self.errors: list[str] = []
        self.phase = "start"  # what the test was doing, recorded with each error
        self.sent = 0
        self.flush_s = 170
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"[{self.phase}] {err}")
        else:
            self.acked[int(msg.value())] = (msg.partition(), msg.offset(), msg.key())

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.producer.produce(
                    self.topic,
                    key=b"key-%d" % (self.sent % KEYS),
                    value=b"%d" % self.sent,
                    on_delivery=self._on_delivery,
                )
                self.sent += 1
            except BufferError:
                self.producer.poll(0.05)
                continue
            except KafkaException as exc:  # fatal (e.g. idempotence): nothing more is sent
                self.errors.append(f"[{self.phase}] produce() failed: {exc}")
                return
            self.producer.poll(0)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)


@pytest.fixture
def producing(cluster: LocalClusterProcess) -> Iterator[Callable[[str], KeyedProducer]]:
    """Starts a KeyedProducer to a topic of the cluster; one that a failed test left running is
    abandoned, not left producing to a stopped cluster for the rest of the session."""
    yield from started_then_abandoned(lambda topic: KeyedProducer(cluster.bootstrap, topic))


_COORDINATOR_MOVING = {
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
}


class GroupReader:
    """A consumer of group `group` that commits synchronously after every poll batch."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumer.subscribe([topic])
        self.got: list[tuple[int, int, int, bytes]] = []  # (partition, offset, value, key)
        self.commit_retries = 0

    def poll_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msgs = self.consumer.consume(500, 0.3)
            for m in msgs:
                if m.error():
                    raise KafkaException(m.error())
                self.got.append((m.partition(), m.offset(), int(m.value()), m.key()))
            if msgs:
                self.commit()

    def commit(self, timeout_s: float = 30) -> None:
        """Commit synchronously, retrying what Kafka clients retry: while the fleet changes, the
        group's coordinator partition moves and answers COORDINATOR_LOAD_IN_PROGRESS or
        NOT_COORDINATOR until it has loaded on its new broker (a real Kafka does the same)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.consumer.commit(asynchronous=False)
                return
            except KafkaException as exc:
                if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                    raise
                self.commit_retries += 1
                time.sleep(0.2)

    def drain(self, expected: set[int], seen: set[int], timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not expected <= seen | {v for _, _, v, _ in self.got}:
            self.poll_for(1.0)

    def close(self) -> None:
        self.consumer.close()


def test_keyed_records_keep_their_queue_through_remaps_and_fleet_changes(
    cluster: LocalClusterProcess, producing: Callable[[str], KeyedProducer]
) -> None:
    name = f"orders-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    created = cluster.call("/v1/static-topics/create", {"name": name, "total_queues": QUEUES})
    assert created["totalQueues"] == QUEUES and created["consistent"]
    # the controller pushes the new metadata to the brokers asynchronously: wait for it
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(name, timeout=30)
        if meta.topics[name].error is None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(meta.topics[name].partitions) == QUEUES, meta.topics[name]
    assert not any(t.startswith("__sq.") for t in meta.topics)  # the physical queues are hidden

    producer = producing(name)
    reader = GroupReader(cluster.bootstrap, name, group)
    reader.poll_for(5)
    # the group commits and leaves before the remap: its offsets are stored under the physical
    # queues that lead now
    committed = {
        tp.partition: tp.offset
        for tp in reader.consumer.committed([KafkaTP(name, q) for q in range(QUEUES)], timeout=30)
    }
    assert all(offset > 0 for offset in committed.values()), committed
    seen_before = {v for _, _, v, _ in reader.got}
    reader.close()

    # remap every logic queue while producing: half in each order
    producer.phase = "remap"
    queues = describe(cluster, name)["queues"]
    brokers = sorted({b["broker"] for b in cluster.status()["brokers"]})
    moves = [
        {
            "queue": q["queue"],
            "broker": brokers[(brokers.index(q["broker"]) + 1) % len(brokers)],
            "mode": "strict" if q["queue"] % 2 else "available",
        }
        for q in queues
    ]
    records = cluster.call("/v1/static-topics/remap", {"name": name, "moves": moves})
    assert len(records) == QUEUES and all(r["opened_ms"] is not None for r in records)
    assert all(r["jump"] == 0 for r in records if r["mode"] == "strict")
    assert all(q["gen"] == 1 for q in describe(cluster, name)["queues"])

    # committed offsets survive the remap (Double-Read-Check finds them under the old physical
    # queues): a new member of the group resumes exactly there
    reader = GroupReader(cluster.bootstrap, name, group)
    again = {
        tp.partition: tp.offset
        for tp in reader.consumer.committed([KafkaTP(name, q) for q in range(QUEUES)], timeout=30)
    }
    assert again == committed
    # the admin view of the group (OffsetFetch of every partition) shows the logic queues
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # alive until the answer
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    listed = future.result(30)
    assert {
        tp.partition: tp.offset for tp in listed.topic_partitions if tp.topic == name
    } == committed
    assert not any(tp.topic.startswith("__sq.") for tp in listed.topic_partitions)
    reader.poll_for(3)
    first: dict[int, int] = {}
    for partition, offset, _, _ in reader.got:
        first.setdefault(partition, offset)
    assert all(first[q] >= committed[q] for q in first), (first, committed)
    assert not seen_before & {v for _, _, v, _ in reader.got}, "nothing committed is read again"

    # a broker joins: it takes a fair share of the logic queues
    producer.phase = "broker joins"
    new = cluster.add_broker()
    wait_until(
        lambda: (
            any(q["broker"] == new for q in describe(cluster, name)["queues"])
            and settled(cluster, name)
        ),
        what="queues on the new broker",
    )
    reader.poll_for(2)
    # a broker is drained and removed: its queues move away
    producer.phase = "broker drained"
    cluster.remove_broker(1)
    wait_until(
        lambda: (
            all(q["broker"] != 1 for q in describe(cluster, name)["queues"])
            and settled(cluster, name)
        ),
        what="queues off broker 1",
    )
    reader.poll_for(2)
    # a broker is killed: its physical queues are sealed from object storage, its logic queues
    # continue elsewhere at exactly the offset where they ended
    victim = next(q["broker"] for q in describe(cluster, name)["queues"])
    producer.phase = f"broker {victim} killed"
    cluster.kill_broker(victim)
    wait_until(
        lambda: (
            all(q["broker"] != victim for q in describe(cluster, name)["queues"])
            and settled(cluster, name)
        ),
        timeout_s=120,
        what="queues off the dead broker",
    )
    reader.poll_for(2)
    producer.phase = "flush"
    producer.stop()

    assert not producer.errors, producer.errors[:5]
    assert len(producer.acked) == producer.sent
    reader.drain(set(producer.acked), seen_before)
    reader.close()

    # every acknowledged record read once by the group (before or after the restart)
    after = [v for _, _, v, _ in reader.got]
    assert len(after) == len(set(after)), "no record is read twice by the new member"
    assert not set(after) & seen_before, "the new member read nothing the old one had committed"
    assert set(producer.acked) == seen_before | set(after), "every acknowledged record was read"
    # ... at the logic offset its producer was told, each key in one queue, offsets increasing
    by_key: dict[bytes, set[int]] = defaultdict(set)
    for partition, _, key in producer.acked.values():
        by_key[key].add(partition)
    assert all(len(parts) == 1 for parts in by_key.values()), "a key changed its logic queue"
    for partition, offset, value, _ in reader.got:
        acked_partition, acked_offset, _ = producer.acked[value]
        # (an offset of None: librdkafka acknowledged a retried batch without one, having seen a
        # later batch acknowledged first)
        assert acked_partition == partition and acked_offset in (offset, None), (value, offset)
    for q in range(QUEUES):
        offsets = [o for p, o, _, _ in reader.got if p == q]
        assert offsets == sorted(set(offsets)), f"logic offsets of queue {q} not increasing"

    final = describe(cluster, name)
    assert final["consistent"] and final["epoch"] >= 3
    assert all(q["gen"] >= 1 for q in final["queues"])
    # every logic queue's items tile its offsets: contiguous for strict switches, bounded jumps
    for q, items in final["mapping"].items():
        for prev, item in itertools.pairwise(items):
            end = prev["logicOffset"] + prev["endOffset"] - prev["startOffset"]
            assert 0 <= item["logicOffset"] - end <= final["jump"], (q, prev, item)


def cli(cluster: LocalClusterProcess, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tidalmq_broker.cli", "static-topic", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_cli_admin_apis_and_other_clients_see_one_topic(cluster: LocalClusterProcess) -> None:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    # the admin's certificate (control-plane mTLS) comes from the data dir
    ctl = [
        "--controller-url",
        cluster.controller_url,
        "--data-dir",
        str(cluster.data_dir),
        "--control-token-file",
        str(cluster.data_dir / "control-token"),
    ]
    out = cli(cluster, "create", name, "--queues", "4", *ctl)
    assert f"static topic {name}: 4 logic queues" in out
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    acked: dict[int, tuple[int, int, int]] = {}  # value -> (partition, offset, timestamp)

    def produce(values: range) -> None:
        for v in values:
            producer.produce(
                name,
                key=b"k%d" % (v % 7),
                value=b"%d" % v,
                on_delivery=lambda e, m: acked.__setitem__(
                    int(m.value()), (m.partition(), m.offset(), m.timestamp()[1])
                ),
            )
            producer.poll(0)
        assert producer.flush(60) == 0

    produce(range(0, 200))
    # one record in queue 0 timestamped a minute ahead: after the remap it lies in the sealed
    # item, where the greatest timestamp must still be found
    producer.produce(
        name,
        value=b"400",
        partition=0,
        timestamp=int(time.time() * 1000) + 60_000,
        on_delivery=lambda e, m: acked.__setitem__(
            400, (m.partition(), m.offset(), m.timestamp()[1])
        ),
    )
    assert producer.flush(60) == 0
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    out = cli(cluster, "remap", name, "--move", "0:1:strict", "--move", "1:2:available", *ctl)
    assert "queue 0: broker 0 -> 1 (strict)" in out and "queue 1: broker 1 -> 2 (available)" in out
    produce(range(200, 400))

    # describe through the Kafka protocol alone: the mapping travels as read-only topic configs
    described = cli(cluster, "describe", name, "--bootstrap-server", cluster.bootstrap)
    assert "epoch 1, consistent" in described
    rows = {int(line.split()[0]): line.split() for line in described.splitlines()[2:6]}
    assert rows[0][1:5] == ["1", "1", "1", "2"] and rows[1][1:5] == ["2", "2", "1", "2"]
    as_json = json.loads(cli(cluster, "describe", name, "--json", *ctl))
    assert len(as_json["mapping"]["0"]) == 2 and as_json["consistent"]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    resource = ConfigResource("topic", name)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["static.total.queues"].value == "4" and configs["static.epoch"].value == "1"

    # the fixed partition count cannot change, the name cannot be reused, the physical queues
    # cannot be written directly
    with pytest.raises(KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([NewPartitions(name, 8)])[name].result(30)
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):
        admin.create_topics([NewTopic(name, 4, 1)])[name].result(30)
    direct = Producer({"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 10000})
    errors: list[str] = []
    active = as_json["queues"][2]["physicalQueue"]  # a physical queue some broker writes
    direct.produce(
        f"__sq.{name}", value=b"x", partition=active, on_delivery=lambda e, m: errors.append(str(e))
    )
    direct.flush(20)
    assert errors and "TOPIC_EXCEPTION" in errors[0], errors  # INVALID_TOPIC_EXCEPTION

    # another client library reads across the remap boundary in increasing logic offsets
    consumer = KafkaConsumer(
        name,
        bootstrap_servers=cluster.bootstrap.split(","),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=8000,
        group_id=None,
    )
    seen = [(m.partition, m.offset, int(m.value)) for m in read_to_end(consumer, 401)]
    consumer.close()
    assert sorted(v for _, _, v in seen) == list(range(401))
    for partition, offset, value in seen:
        assert acked[value][:2] == (partition, offset)
    for q in range(4):
        offsets = [o for p, o, _ in seen if p == q]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    # ListOffsets: earliest is the oldest item's start, latest the leader's end, by time the
    # items are searched by their time range first
    probe = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "probe"})
    for q in (0, 1):
        low, high = probe.get_watermark_offsets(KafkaTP(name, q), timeout=30)
        last = max(o for p, o, _ in seen if p == q)
        assert low == 0 and high == last + 1
        (found,) = probe.offsets_for_times([KafkaTP(name, q, boundary)], timeout=30)
        after = [acked[v][1] for v in range(200, 400) if acked[v][0] == q]
        # in queue 0 the record a minute ahead, written before the remap, comes first
        expected = acked[400][1] if q == 0 else min(after)
        assert found.offset == expected, (q, found.offset, expected)
        # MAX_TIMESTAMP (ListOffsets v7): the first record with the greatest timestamp, over
        # every item of the logic queue
        in_queue = [(ts, offset) for p, offset, ts in acked.values() if p == q]
        top = max(ts for ts, _ in in_queue)
        want = min(offset for ts, offset in in_queue if ts == top)
        assert q != 0 or want == acked[400][1]  # the test's own record is queue 0's greatest
        tp = KafkaTP(name, q)
        got = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(30)
        assert (got.offset, got.timestamp) == (want, top), (q, got, want, top)
    probe.close()

    # deleting the static topic deletes its physical queues too
    admin.delete_topics([name])[name].result(30)
    wait_until(
        lambda: (
            name not in cluster.metadata()["topics"]
            and f"__sq.{name}" not in cluster.metadata()["topics"]
        ),
        what="deletion",
    )
    assert name not in cluster.metadata().get("static_topics", {})
