"""TidalMQ on Kubernetes, end to end: `helm install` with the locally built images, a Topic with
24 partitions, an idempotent producer writing at a fixed rate while the broker fleet changes
under it, and a consumer that afterwards reads every acknowledged record exactly once, in order
per partition.

While the producer runs: (a) the StatefulSet scales 2 -> 4, first by changing replicas, then by
the HPA under a CPU load this test generates; (b) it scales 4 -> 2; (c) a broker pod is deleted
with grace period 0; (d) a PartitionReassignment moves 6 partitions and another is cancelled half
way; (e) the operator pod is deleted during a reassignment. Printed figures: the time from a new
broker pod Ready to its partitions serving, and the client-visible unavailability per partition
during scale-in.
"""

from __future__ import annotations

import calendar
import json
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer

from e2e.kube import Cluster, wait_until
from e2e.tidalmq_release import (
    CHART,
    RELEASE,
    STS,
    addon_image,
    bootstrap,
    broker_pods,
    installed_release,
    ready,
    topic_status,
)

PARTITIONS = 24


@pytest.fixture(scope="module")
def minio(cluster: Cluster) -> str:
    return addon_image("minio")


@pytest.fixture
def release(cluster: Cluster, namespace: str, minio: str) -> Iterator[dict[str, Any]]:
    with installed_release(cluster, namespace, minio) as installed:
        yield installed


class RateProducer:
    """An idempotent producer at a fixed rate; remembers (produced, acked, partition, offset)."""

    def __init__(self, servers: str, topic: str, rate: int = 400) -> None:
        self.topic = topic
        self.rate = rate
        self.producer = Producer({
            "bootstrap.servers": servers, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 300000, "retry.backoff.ms": 50,
            "topic.metadata.refresh.interval.ms": 2000,
        })  # fmt: skip
        self.records: list[tuple[float, float, int, int, int]] = []
        self.errors: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            seq = self.sent
            produced = time.time()

            def done(err: Any, msg: Any, seq: int = seq, produced: float = produced) -> None:
                if err is not None:
                    self.errors.append(str(err))
                else:
                    with self._lock:
                        self.records.append(
                            (produced, time.time(), msg.partition(), msg.offset(), seq)
                        )

            try:
                self.producer.produce(self.topic, key=b"k%d" % (seq % 101), value=b"%d" % seq,
                                      on_delivery=done)  # fmt: skip
                self.sent += 1
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.producer.poll(0)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    def start(self) -> RateProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert self.producer.flush(300) == 0, "records never delivered"

    def worst_wait_by_partition(self, start: float, end: float) -> dict[int, float]:
        out: dict[int, float] = {}
        with self._lock:
            for produced, acked, partition, _, _ in self.records:
                if start <= produced <= end:
                    out[partition] = max(out.get(partition, 0.0), acked - produced)
        return out


def verify(servers: str, topic: str, producer: RateProducer) -> None:
    assert not producer.errors, producer.errors[:5]
    assert len(producer.records) == producer.sent
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"verify-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    got: dict[int, list[tuple[int, int]]] = defaultdict(list)
    count, deadline, idle = 0, time.monotonic() + 300, time.monotonic()
    while time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            if count >= producer.sent and time.monotonic() - idle > 5:
                break
            continue
        if msg.error():
            raise KafkaException(msg.error())
        idle = time.monotonic()
        got[msg.partition()].append((msg.offset(), int(msg.value())))
        count += 1
    consumer.close()
    values = [v for part in got.values() for _, v in part]
    assert len(values) == len(set(values)), "a record was read twice"
    assert count == producer.sent, f"read {count}, {producer.sent} were acknowledged"
    by_offset = {p: dict(rows) for p, rows in got.items()}
    in_partition = {p: {v for _, v in rows} for p, rows in got.items()}
    for _, _, partition, offset, seq in producer.records:
        if offset is None:
            # librdkafka acknowledges a retried batch without an offset when a later batch of the
            # same producer was acknowledged first (it infers the retry was persisted): such a
            # record must still be in its partition
            assert seq in in_partition.get(partition, set()), (partition, seq, "missing")
        else:
            assert by_offset[partition].get(offset) == seq, (partition, offset, seq)
    for rows in got.values():
        seqs = [v for _, v in sorted(rows)]
        assert seqs == sorted(seqs), "out of order within a partition"


def scale(cluster: Cluster, ns: str, replicas: int) -> None:
    cluster.kubectl("-n", ns, "scale", f"statefulset/{STS}", f"--replicas={replicas}")


def wait_brokers_serving(
    cluster: Cluster, ns: str, topic: str, brokers: set[int], timeout: float = 300
) -> float:
    """Until the Topic's partitions are led exactly by `brokers`, fairly; returns when."""

    def probe() -> float | None:
        st = topic_status(cluster, ns, topic)
        parts = st.get("partitions", [])
        leaders = [p.get("broker") for p in parts]
        if not ready(st) or set(leaders) != brokers:
            return None
        counts = [leaders.count(b) for b in brokers]
        return time.time() if max(counts) - min(counts) <= 1 else None

    return wait_until(f"topic led by brokers {sorted(brokers)}", probe, timeout=timeout)


def pod_ready_time(pod: dict[str, Any]) -> float | None:
    for c in pod["status"].get("conditions", []):
        if c["type"] == "Ready" and c["status"] == "True":
            return calendar.timegm(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
    return None


def cancel_outcome(cluster: Cluster, ns: str, source: dict[int, int]) -> dict[str, int] | None:
    """Once the reassignment `cancelled` has settled: how many of its partitions moved and how
    many rolled back, after checking each against where the Topic says the partition lives."""
    st = cluster.kubectl_json("-n", ns, "get", "tpr", "cancelled").get("status") or {}
    if st.get("phase") not in ("Cancelled", "Completed"):
        return None
    topic = topic_status(cluster, ns, "events")
    if not ready(topic):
        return None
    now = {p["partition"]: p.get("broker") for p in topic["partitions"]}
    outcome = {"moved": 0, "rolled_back": 0}
    # a disagreement raises ValueError: wait_until retries (the Topic's status may lag a beat)
    # and reports the last one if it never resolves
    for row in st["partitions"]:
        p = row["partition"]
        if row["phase"] == "Done":
            if now[p] != row["target"]:
                raise ValueError(f"partition {p} Done but led by {now[p]}: {row}")
            outcome["moved"] += 1
        elif row["phase"] == "Cancelled":
            if now[p] != source[p]:
                raise ValueError(f"partition {p} Cancelled but led by {now[p]}: {row}")
            outcome["rolled_back"] += 1
        else:
            raise ValueError(f"partition {p} ended {row['phase']}: {row}")
    if (st["phase"] == "Cancelled") != (outcome["rolled_back"] > 0):
        raise ValueError(f"overall phase {st['phase']} with {outcome}")
    return outcome


def test_fleet_changes_under_a_producer(cluster: Cluster, release: dict[str, Any]) -> None:
    ns = release["ns"]
    cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "Topic",
                              "metadata": {"name": "events"}, "spec": {"partitions": PARTITIONS}}), ns)  # fmt: skip
    wait_until("Topic Ready", lambda: ready(topic_status(cluster, ns, "events")), timeout=180)
    servers = bootstrap(cluster, ns)
    producer = RateProducer(servers, "events").start()
    figures: dict[str, Any] = {}
    try:
        time.sleep(5)
        # (a) 2 -> 4 by replicas: each new pod's partitions serve soon after it is Ready
        scale(cluster, ns, 4)
        served_at = wait_brokers_serving(cluster, ns, "events", {0, 1, 2, 3})
        ready_times = [pod_ready_time(p) for p in broker_pods(cluster, ns)[2:]]
        figures["ready_to_serving_s"] = served_at - max(t for t in ready_times if t)
        # (b) 4 -> 2: the brokers drain (preStop) and their partitions move
        start = time.time()
        scale(cluster, ns, 2)
        wait_brokers_serving(cluster, ns, "events", {0, 1})
        wait_until("brokers 2,3 gone", lambda: len(broker_pods(cluster, ns)) == 2, timeout=180)
        time.sleep(3)
        waits = producer.worst_wait_by_partition(start, time.time() - 3)
        figures["scale_in_wait_p50_s"] = statistics.median(waits.values())
        figures["scale_in_wait_p99_s"] = sorted(waits.values())[
            max(0, round(0.99 * (len(waits) - 1)))
        ]
        # (c) a broker pod deleted with grace period 0: fenced and recovered elsewhere
        cluster.kubectl("-n", ns, "delete", "pod", f"{STS}-1", "--grace-period=0", "--force")
        wait_until("broker 1 back", lambda: len([p for p in broker_pods(cluster, ns) if pod_ready_time(p)]) == 2,
                   timeout=240)  # fmt: skip
        wait_brokers_serving(cluster, ns, "events", {0, 1})
        # (d) a reassignment of 6 partitions, and one cancelled half way
        status = topic_status(cluster, ns, "events")
        moves = [{"topic": "events", "partition": p["partition"], "replicas": [1 - p["broker"]]}
                 for p in status["partitions"][:6]]  # fmt: skip
        cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
                                  "metadata": {"name": "six"}, "spec": {"partitions": moves}}), ns)  # fmt: skip
        wait_until("six moved", lambda: (cluster.kubectl_json("-n", ns, "get", "tpr", "six").get("status") or {})
                   .get("phase") == "Completed", timeout=180)  # fmt: skip
        # ... and another cancelled half way: `cancel: true` right after it is created. Each
        # partition ends either moved (Done, on its target) or rolled back (Cancelled, on its
        # source); the status must say which, and the Topic must agree.
        status = topic_status(cluster, ns, "events")
        source = {p["partition"]: p["broker"] for p in status["partitions"]}
        back = [{"topic": "events", "partition": p, "replicas": [1 - b]}
                for p, b in sorted(source.items())[12:]]  # fmt: skip
        cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
                                  "metadata": {"name": "cancelled"}, "spec": {"partitions": back}}), ns)  # fmt: skip
        cluster.kubectl("-n", ns, "patch", "tpr", "cancelled", "--type=merge",
                        "-p", '{"spec": {"cancel": true}}')  # fmt: skip
        figures["cancel_half_way"] = wait_until(
            "the cancelled reassignment settles, its status agreeing with the Topic",
            lambda: cancel_outcome(cluster, ns, source), timeout=180,
        )  # fmt: skip
        # (e) the operator pod deleted during a reassignment: it resumes
        status = topic_status(cluster, ns, "events")
        more = [{"topic": "events", "partition": p["partition"], "replicas": [1 - p["broker"]]}
                for p in status["partitions"][6:12]]  # fmt: skip
        cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
                                  "metadata": {"name": "interrupted"}, "spec": {"partitions": more}}), ns)  # fmt: skip
        cluster.kubectl(
            "-n", ns, "delete", "pod", "-l", "app.kubernetes.io/component=operator", "--wait=false"
        )
        wait_until("interrupted completes", lambda: (cluster.kubectl_json("-n", ns, "get", "tpr", "interrupted")
                   .get("status") or {}).get("phase") == "Completed", timeout=300)  # fmt: skip
        time.sleep(5)
    finally:
        producer.stop()
    verify(bootstrap(cluster, ns), "events", producer)
    print(f"\nTidalMQ on Kubernetes: {json.dumps(figures, indent=1)}")
    assert figures["ready_to_serving_s"] <= 5.0 or pytest.fail(f"new broker to serving: {figures}")


def test_hpa_scales_brokers_under_cpu_load(cluster: Cluster, release: dict[str, Any]) -> None:
    ns = release["ns"]
    cluster.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", ns, "--reuse-values",
        "--set", "autoscaling.enabled=true", "--set", "autoscaling.minReplicas=2",
        "--set", "autoscaling.maxReplicas=4", "--set", "autoscaling.targetCPUUtilizationPercentage=50",
        timeout=300,
    )  # fmt: skip
    cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "Topic",
                              "metadata": {"name": "load"}, "spec": {"partitions": 12}}), ns)  # fmt: skip
    wait_until("Topic Ready", lambda: ready(topic_status(cluster, ns, "load")), timeout=180)
    servers = bootstrap(cluster, ns)
    producer = RateProducer(servers, "load", rate=3000).start()  # the CPU load
    try:
        wait_until("HPA scales out", lambda: len(broker_pods(cluster, ns)) >= 3, timeout=420)
        wait_until(
            "new brokers serve", lambda: ready(topic_status(cluster, ns, "load")), timeout=180
        )
    finally:
        producer.stop()
    verify(bootstrap(cluster, ns), "load", producer)
