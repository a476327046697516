"""The planner end to end on Kubernetes: brokers under a skewed load, a Prometheus in the cluster
scraping them (found through the chart's headless Service), and a PartitionReassignment asking for a
generated plan. The operator launches the planner on Spark-on-Kubernetes (spark-submit in a pod
of the Spark image, then a driver and executor pods), puts the plan in the resource and, with
autoApprove, executes it; afterwards Prometheus shows the brokers' bytes-in within the threshold.

Printed figures: the planning time (request to plan), the execution time, the imbalance
(busiest broker's bytes-in / mean) the planner projected and the one measured afterwards.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.kube import Cluster, wait_until
from e2e.producing import RecordLoad
from e2e.prometheus import prometheus_manifests, prometheus_url
from e2e.tidalmq_release import (
    bootstrap,
    installed_release,
    ready,
    topic_status,
)

TOPIC = "skewed"
PARTITIONS = 8
THRESHOLD = 1.1
HOT_RATE = 120  # records/s of 1 KiB to each hot partition (the partitions of broker 0)
COLD_RATE = 10  # ... and to each cold one
RATE_WINDOW_S = 30
# History of the skewed load Prometheus holds before the plan is asked for: past two rate
# windows, so the rate measured before the plan is all skewed load.
SKEWED_HISTORY_S = 60


def prometheus_query(url: str, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=10
    ) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def broker_rates(url: str) -> dict[int, float]:
    rows = prometheus_query(
        url,
        f'sum by (broker) (rate(tidalmq_partition_bytes_in_total{{topic="{TOPIC}"}}'
        f"[{RATE_WINDOW_S}s]))",
    )
    return {int(r["metric"]["broker"]): float(r["value"][1]) for r in rows}


def imbalance(rates: dict[int, float], brokers: list[int]) -> float:
    values = [rates.get(b, 0.0) for b in brokers]
    return max(values) / (sum(values) / len(values))


def tpr(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return cluster.kubectl_json("-n", ns, "get", "partitionreassignment", name)


@pytest.fixture
def planner_release(
    cluster: Cluster, namespace: str, minio: str, prometheus_image: str
) -> Iterator[dict[str, Any]]:
    cluster.apply(prometheus_manifests(prometheus_image, namespace), namespace)
    s_repo, s_tag = cluster.images["spark"].rsplit(":", 1)
    with installed_release(
        cluster,
        namespace,
        minio,
        "--set",
        "spark.enabled=true",
        "--set",
        f"spark.image.repository={s_repo}",
        "--set",
        f"spark.image.tag={s_tag}",
        "--set",
        f"operator.prometheusUrl=http://prometheus.{namespace}.svc:9090",
        # the planner's Prometheus alone: the bytes-in adapter has its own test
        "--set",
        "metricsAdapter.enabled=false",
    ) as installed:
        installed["prometheus"] = prometheus_url(cluster, namespace)
        yield installed


@pytest.mark.timeout(1800)
def test_generated_plan_runs_on_spark_and_balances_the_brokers(
    cluster: Cluster, planner_release: dict[str, Any]
) -> None:
    ns, prom = planner_release["ns"], planner_release["prometheus"]
    cluster.apply(
        json.dumps(
            {
                "apiVersion": "tidalmq.io/v1alpha1",
                "kind": "Topic",
                "metadata": {"name": TOPIC},
                "spec": {"partitions": PARTITIONS},
            }
        ),
        ns,
    )
    wait_until("Topic Ready", lambda: ready(topic_status(cluster, ns, TOPIC)), timeout=180)
    leaders = {p["partition"]: p["broker"] for p in topic_status(cluster, ns, TOPIC)["partitions"]}
    brokers = sorted(set(leaders.values()))
    assert len(brokers) == 2, leaders
    # the partitions of the first broker are hot: it carries most of the bytes
    hot = {p for p, b in leaders.items() if b == brokers[0]}
    rates = {p: HOT_RATE if p in hot else COLD_RATE for p in leaders}
    load = RecordLoad(
        {
            "bootstrap.servers": bootstrap(cluster, ns),
            "acks": "1",
            "linger.ms": 20,
            "topic.metadata.refresh.interval.ms": 2000,
        },
        TOPIC,
        b"x" * 1024,
        {p: max(1, round(rate * RecordLoad.STEP_S)) for p, rate in rates.items()},
    ).start()
    figures: dict[str, Any] = {}
    try:
        # Prometheus scrapes both brokers (found through the chart's annotations) ...
        def both_scraped() -> bool | None:
            try:
                return len(broker_rates(prom)) == 2 or None
            except OSError:  # not serving yet
                return None

        wait_until(
            "Prometheus has the topic's bytes-in from both brokers",
            both_scraped,
            timeout=240,
            interval=5,
        )
        # ... and holds a minute of skewed history (the skew is there from the first sample;
        # the plan's 3-minute window reads more of it, as it accrues, when the Spark job runs)
        time.sleep(SKEWED_HISTORY_S)
        figures["imbalance_measured_before"] = round(imbalance(broker_rates(prom), brokers), 3)
        assert figures["imbalance_measured_before"] > 1.5, figures

        requested = time.monotonic()
        cluster.apply(
            json.dumps(
                {
                    "apiVersion": "tidalmq.io/v1alpha1",
                    "kind": "PartitionReassignment",
                    "metadata": {"name": "balance"},
                    "spec": {
                        "generate": {
                            "window": "3m",
                            "step": "15s",
                            "threshold": THRESHOLD,
                            "topics": [TOPIC],
                        },
                        "autoApprove": True,
                    },
                }
            ),
            ns,
        )
        phases: list[str] = []

        def planned() -> dict[str, Any] | None:
            obj = tpr(cluster, ns, "balance")
            status = obj.get("status") or {}
            if status.get("phase") and (not phases or phases[-1] != status["phase"]):
                phases.append(status["phase"])
            assert status.get("phase") != "Failed", json.dumps(status, indent=1)[-4000:]
            return status if status.get("plan") else None

        status = wait_until("the planner's plan", planned, timeout=900, interval=3)
        figures["planning_s"] = round(time.monotonic() - requested, 1)
        done = wait_until(
            "the plan executed",
            lambda: ((s := planned() or {}).get("phase") == "Completed" and s) or None,
            timeout=300,
            interval=2,
        )
        figures["request_to_done_s"] = round(time.monotonic() - requested, 1)
        figures["phases"] = phases

        plan = status["plan"]
        report = plan["report"]
        moves = {(m["topic"], m["partition"]): m["replicas"][0] for m in plan["partitions"]}
        projected = report.get("imbalanceByDimension", {})
        figures.update(moves=len(moves), projected=projected)
        assert moves and all(t == TOPIC for t, _ in moves), plan
        assert projected["before"]["bytes_in"] > THRESHOLD >= projected["after"]["bytes_in"], report
        assert report["imbalanceAfter"] <= THRESHOLD, report  # every dimension within it
        assert "Planning" in phases and done["phase"] == "Completed", phases
        # the Topic agrees with the plan
        now = {p["partition"]: p["broker"] for p in topic_status(cluster, ns, TOPIC)["partitions"]}
        for (_, partition), target in moves.items():
            assert now[partition] == target, (partition, target, now)

        # it ran on Spark-on-Kubernetes: the Events tell the driver pod's way to Succeeded
        events = cluster.kubectl_json(
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=PartitionReassignment,involvedObject.name=balance",
        )["items"]
        messages = " | ".join(e.get("message", "") for e in events)
        assert "-submit" in messages and "-driver is Succeeded" in messages, messages

        # fresh traffic: once the rate window holds only post-move samples
        time.sleep(RATE_WINDOW_S + 15)
        figures["imbalance_measured_after"] = round(imbalance(broker_rates(prom), brokers), 3)
    finally:
        load.stop()
    print(f"\nplanner on Spark-on-Kubernetes: {json.dumps(figures)}")
    assert not load.errors, load.errors[:5]
    # measured with real traffic: allow for the noise of a 30 s rate on a shared machine
    assert figures["imbalance_measured_after"] <= THRESHOLD + 0.1, figures
