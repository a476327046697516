"""The planner end to end on one machine: a 3-broker local cluster under a skewed produce load,
a real Prometheus scraping the brokers and the controller, `tidalmq plan` (Spark in local mode)
reading the history and the current assignment from Prometheus, `tidalmq reassign` executing the
plan, and fresh Prometheus data showing broker bytes-in within the threshold afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from tidalmq_core.reassignment import parse_plan
from tidalmq_planner import assignment as sources
from tidalmq_planner import prometheus as prom
from tidalmq_planner.history import read_row_group, row_groups

from tests.support.local_cluster import LocalClusterProcess
from tests.support.prometheus_server import PrometheusServer, prometheus_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "planner-load"
PARTITIONS = 12
HOT, COLD = 4, 1  # records per tick of a hot and a cold partition
THRESHOLD = 1.1
SCRAPE_S = 2.0
LOAD_S = 30  # history before planning: 6 points per partition at the plan's 5 s step
RATE_WINDOW = "20s"


@pytest.fixture
def cluster(s3_server: Any, tmp_path: Path) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(
        tmp_path / "cluster",
        brokers=3,
        storage_url=s3_server.url(prefix=f"planner-{uuid.uuid4().hex[:8]}"),
        env=s3_server.env(),
    ) as c:
        yield c


prometheus = prometheus_fixture(SCRAPE_S)


class SkewedProducer:
    """Every 100 ms, `weight` 1 KiB records to each partition: hot partitions get 4x."""

    def __init__(self, bootstrap: str, weights: dict[int, int]) -> None:
        self.weights = weights
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 20,
                "enable.idempotence": True,
                "message.timeout.ms": 120_000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def _run(self) -> None:
        value = b"x" * 1024
        next_at = time.monotonic()
        while not self._stop.is_set():
            for partition, weight in self.weights.items():
                for _ in range(weight):
                    while True:
                        try:
                            self.producer.produce(
                                TOPIC, value, partition=partition, on_delivery=self._delivered
                            )
                            break
                        except BufferError:
                            self.producer.poll(0.05)
                    self.sent += 1
            self.producer.poll(0)
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))

    def start(self) -> SkewedProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        remaining = self.producer.flush(120)
        if remaining:  # their delivery callbacks hold this object and with it the producer
            self.producer.purge()  # (a cycle the collector cannot see): released by the purge
            self.producer.flush(1)
        assert remaining == 0, f"{remaining} records never delivered"


def run(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


def broker_rates(prometheus: PrometheusServer) -> dict[int, float]:
    result = prometheus.query(
        f'sum by (broker) (rate(tidalmq_partition_bytes_in_total{{topic="{TOPIC}"}}[{RATE_WINDOW}]))'
    )
    return {int(r["metric"]["broker"]): float(r["value"][1]) for r in result}


def imbalance(rates: dict[int, float], brokers: list[int]) -> float:
    values = [rates.get(b, 0.0) for b in brokers]
    return max(values) / (sum(values) / len(values))


@pytest.mark.timeout(900)
def test_plan_from_prometheus_history_balances_bytes_in(
    cluster: LocalClusterProcess, prometheus: PrometheusServer, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    leaders = cluster.leaders(TOPIC)
    brokers = sorted({row["broker"] for row in cluster.status()["brokers"]})
    assert brokers == [0, 1, 2] and set(leaders) == {0, 1, 2}
    # the skew: every partition broker 0 leads is hot
    weights = {p: HOT if leader == 0 else COLD for p, leader in enumerate(leaders)}
    hot = sorted(p for p, w in weights.items() if w == HOT)

    status = cluster.status()
    targets = {
        "tidalmq-broker": [f"127.0.0.1:{row['http_port']}" for row in status["brokers"]],
        "tidalmq-controller": [cluster.controller_url.removeprefix("http://")],  # https: TLS
    }
    prometheus.start(targets)
    producer = SkewedProducer(cluster.bootstrap, weights).start()
    try:
        prometheus.wait_for(
            f'count(rate(tidalmq_partition_bytes_in_total{{topic="{TOPIC}"}}[{RATE_WINDOW}]) > 0)',
            lambda r: bool(r) and float(r[0]["value"][1]) == PARTITIONS,
            timeout_s=90,
        )
        assert all(prometheus.targets_up().values()), prometheus.targets_up()
        # history to plan from: the plan's window, and one step more so that its first point
        # too comes after every partition's rate showed in Prometheus
        time.sleep(LOAD_S + 5)
        before = broker_rates(prometheus)
        assert imbalance(before, brokers) > 1.5, before  # the skew is real

        # the current assignment as Prometheus sees it (leader epochs) is the cluster's own
        client = prom.connect(prometheus.url)
        seen = {k: v for k, v in prom.current_assignment(client).items() if k[0] == TOPIC}
        assert seen == {(TOPIC, p): b for p, b in enumerate(leaders)}
        assert prom.live_brokers(client) == brokers
        via_kafka = sources.from_bootstrap(cluster.bootstrap)
        assert {k: v for k, v in via_kafka.assignment.items() if k[0] == TOPIC} == seen
        assert via_kafka.brokers == brokers
        via_controller = sources.from_controller(
            cluster.controller_url, token=cluster.control_token, tls=cluster.control_tls
        )
        assert {k: v for k, v in via_controller.assignment.items() if k[0] == TOPIC} == seen
        assert via_controller.brokers == brokers

        # plan: Spark in local mode over the last LOAD_S seconds at a 5 s step
        plan_file, report_dir = tmp_path / "plan.json", tmp_path / "report"
        planned = run(
            [
                sys.executable,
                "-m",
                "tidalmq_broker.cli",
                "plan",
                "--prometheus",
                prometheus.url,
                "--window",
                f"{LOAD_S}s",
                "--step",
                "5s",
                "--rate-window",
                RATE_WINDOW,
                "--threshold",
                str(THRESHOLD),
                "--out",
                str(plan_file),
                "--report-dir",
                str(report_dir),
                "--save-history",
                str(tmp_path / "history"),
                "--master",
                "local[2]",
                "--driver-memory",
                "1g",
                "--json",
            ],
            600,
        )
        assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-6000:]
        summary = json.loads(planned.stdout)
        entries = parse_plan(plan_file.read_text())
        assert len(entries) == summary["moves"] >= 1
        assert summary["imbalanceBefore"]["bytes_in"] > 1.5
        assert summary["imbalanceAfter"]["bytes_in"] <= THRESHOLD
        assert summary["withinThreshold"]
        # broker 0 sheds two of its hot partitions, one to each other broker: the fewest moves
        assert summary["lowerBound"] == 2 and summary["moves"] == 2, summary
        assert {e.tp.partition for e in entries} <= set(hot)
        assert sorted(e.target for e in entries) == [1, 2]
        for name in (
            "load.png",
            "report.json",
            "report.txt",
            "rollback.json",
            "partitionreassignment.yaml",
        ):
            assert (report_dir / name).stat().st_size > 0, name

        # the history it fetched, saved for offline runs: 6 points per partition (30 s at 5 s)
        saved = pd.concat(read_row_group(f, i) for f, i in row_groups(tmp_path / "history"))
        ours = saved[saved["topic"] == TOPIC]
        assert sorted(ours["partition"]) == list(range(PARTITIONS))
        assert {len(v) for v in ours["bytes_in"]} == {LOAD_S // 5}
        assert dict(zip(ours["partition"], ours["broker"], strict=True)) == dict(enumerate(leaders))
        hot_rate = np.nanmean(np.stack(ours[ours["partition"].isin(hot)]["bytes_in"]))
        cold_rate = np.nanmean(np.stack(ours[~ours["partition"].isin(hot)]["bytes_in"]))
        assert 3 < hot_rate / cold_rate < 5, (hot_rate, cold_rate)  # 4x as produced

        # execute it as an operator would
        executed = run(
            [
                sys.executable,
                "-m",
                "tidalmq_broker.cli",
                "reassign",
                "--bootstrap-server",
                cluster.bootstrap,
                "--execute",
                "--reassignment-json-file",
                str(plan_file),
                "--wait",
                "--timeout",
                "120s",
            ],
            240,
        )
        assert executed.returncode == 0, executed.stdout[-3000:] + executed.stderr[-3000:]
        cluster.wait_settled()
        moved_at = time.time()
        new_leaders = cluster.leaders(TOPIC)
        for e in entries:
            assert new_leaders[e.tp.partition] == e.target

        # fresh data: once the rate window holds only post-move samples
        time.sleep(25)
        deadline = time.monotonic() + 60
        while True:
            after = broker_rates(prometheus)
            if imbalance(after, brokers) <= THRESHOLD or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert imbalance(after, brokers) <= THRESHOLD, (before, after, new_leaders)

        # the old broker's series went with the partition: one epoch series per partition
        epochs = prometheus.query(
            f'count by (topic, partition) (tidalmq_partition_leader_epoch{{topic="{TOPIC}"}})'
        )
        assert len(epochs) == PARTITIONS and all(float(r["value"][1]) == 1 for r in epochs)
        done = prometheus.wait_for(
            'sum(tidalmq_controller_reassignments_total{outcome="done"})',
            lambda r: bool(r) and float(r[0]["value"][1]) >= len(entries),
            timeout_s=30,
        )
        assert float(done[0]["value"][1]) >= len(entries)
        assert time.time() - moved_at < 200
    finally:
        producer.stop()
    assert not producer.errors, producer.errors[:5]
