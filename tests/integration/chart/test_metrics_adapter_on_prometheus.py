"""The chart's metrics adapter serving bytes-in per broker pod from a real Prometheus scraping a
real local cluster (2 brokers): prometheus-adapter (the binary of the chart's image) runs with the
rule the chart renders, against a real kube-apiserver holding the broker pods, and its
custom.metrics.k8s.io answer gives every broker pod a value: 0 for the broker leading nothing that
receives records, and for the leader of the partition being written the rate Prometheus itself
computes from the broker's counters. (e2e/test_bytes_in_autoscaling.py runs the same adapter
behind the aggregation layer of the e2e cluster, with the HPA.)"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.helm import find, render
from tests.support.kube_apiserver import ApiServer, binaries
from tests.support.local_cluster import LocalClusterProcess
from tests.support.metrics_adapter import MetricsAdapter
from tests.support.prometheus_server import PrometheusServer, prometheus_fixture

pytestmark = pytest.mark.integration

NAMESPACE = "streaming"
STS = "tmq-tidalmq-broker"
METRIC = "tidalmq_broker_bytes_in_per_second"
TOPIC = "bytes-in"
SCRAPE_S = 1.0
RATE_WINDOW = "10s"


def chart_rule() -> str:
    """The adapter configuration exactly as the chart renders it (a rate window of ten scrapes)."""
    docs = render(
        {"metricsAdapter": {"prometheusUrl": "http://prometheus:9090", "rateWindow": RATE_WINDOW}}
    )
    return str(find(docs, "ConfigMap", "rel-tidalmq-metrics-adapter")["data"]["config.yaml"])


def quantity(text: str) -> float:
    factors = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    return float(text[:-1]) * factors[text[-1]] if text[-1] in factors else float(text)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    with LocalClusterProcess(tmp_path / "cluster", brokers=2) as c:
        yield c


prometheus = prometheus_fixture(SCRAPE_S)


def kubectl(server: ApiServer, *args: str, input: str | None = None) -> str:
    kubectl_bin = str(binaries()[1].parent / "kubectl")
    done = subprocess.run(
        [kubectl_bin, "--kubeconfig", str(server.kubeconfig), *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def broker_pods(server: ApiServer, brokers: list[int]) -> None:
    """The broker pods the series name (no node runs them: the adapter only lists them)."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    ]
    for broker in brokers:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{STS}-{broker}", "namespace": NAMESPACE},
                "spec": {"containers": [{"name": "broker", "image": "tidalmq.local/tidalmq:test"}]},
            }
        )
    kubectl(server, "apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in objects))


def bytes_in(adapter: MetricsAdapter) -> dict[str, float]:
    doc = adapter.get(f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/*/{METRIC}")
    return {i["describedObject"]["name"]: quantity(i["value"]) for i in doc["items"]}


def wait(what: str, probe: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except OSError as exc:  # the adapter answering 404 before its first relist
            last = exc
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


@pytest.mark.timeout(240)
def test_adapter_serves_each_broker_pods_bytes_in_from_prometheus(
    cluster: LocalClusterProcess,
    prometheus: PrometheusServer,
    kube_apiserver: ApiServer,
    tmp_path: Path,
) -> None:
    brokers = {
        row["broker"]: f"127.0.0.1:{row['http_port']}" for row in cluster.status()["brokers"]
    }
    assert len(brokers) == 2, brokers
    broker_pods(kube_apiserver, sorted(brokers))
    # the labels Kubernetes service discovery (or the Prometheus Operator) puts on every series
    prometheus.start(
        {"tidalmq-broker": list(brokers.values())},
        labels={t: {"namespace": NAMESPACE, "pod": f"{STS}-{b}"} for b, t in brokers.items()},
    )

    with MetricsAdapter(
        tmp_path / "adapter",
        chart_rule(),
        prometheus.url,
        kube_apiserver.kubeconfig,
        kube_apiserver.token,
    ) as adapter:
        # before any record: both pods have a value, 0 (each leads __consumer_offsets
        # partitions, so each has bytes-in series; a broker leading nothing, e.g. one the HPA
        # just added, reads 0 through the rule's partitions_led fallback: the e2e test)
        idle = wait("both broker pods' bytes-in", lambda: len(v := bytes_in(adapter)) == 2 and v)
        assert idle == {f"{STS}-{b}": 0.0 for b in brokers}, idle

        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        cluster.wait_settled()
        leader = f"{STS}-{cluster.leaders(TOPIC)[0]}"
        other = next(f"{STS}-{b}" for b in brokers if f"{STS}-{b}" != leader)

        producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
        value = b"x" * 64 * 1024
        deadline = time.monotonic() + 3 * SCRAPE_S * 4
        while time.monotonic() < deadline:  # ~1 MiB/s for 12 s, then served while it lasts
            for _ in range(4):
                producer.produce(TOPIC, value)
            producer.poll(0)
            time.sleep(0.25)
        served = wait("the leader's bytes-in", lambda: (v := bytes_in(adapter))[leader] > 0 and v)
        assert producer.flush(30) == 0
        # the value is Prometheus' own rate of the broker's counter, summed over its topics
        expected = prometheus.query(
            f'sum(rate(tidalmq_topic_bytes_in_total{{pod="{leader}"}}[{RATE_WINDOW}]))'
        )
        assert expected, "Prometheus has no bytes-in series of the leader"
        rate = float(expected[0]["value"][1])
        assert rate > 100_000, rate
        assert served[leader] == pytest.approx(rate, rel=0.5), (served, rate)
        assert served[other] == 0.0, served
        # one pod asked by name, as the HPA's client also does
        one = adapter.get(
            f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/{leader}/{METRIC}"
        )
        assert [i["describedObject"]["name"] for i in one["items"]] == [leader], json.dumps(one)
