"""The chart's dashboards and alerts against a real Prometheus in the Kubernetes cluster
(docs/dashboards-and-alerts.md), the acceptance of issue #23 on the end-to-end cluster.

A Prometheus (e2e/prometheus.py) scrapes the release's broker pods and its operator (which hosts
the controller) and loads the chart's rules file (charts/tidalmq/monitoring/alerts.rules.yaml)
as a rule file, so Prometheus itself evaluates every alert. After produce, consume (a group that
lags) and a partition move:
- every alert is loaded and healthy (`/api/v1/rules`: health ok, no lastError);
- every dashboard query (panels and variables, variables at All) and every alert expression
  runs without error, and a query returns data exactly when every metric it names is exported
  in this cluster (tests/support/monitoring_queries.py, shared with the integration test).
The coverage (the queries with data; the ones without and the metrics they miss, e.g.
kube-state-metrics' HPA series: the e2e cluster runs no kube-state-metrics) is recorded as
figures.
"""

from __future__ import annotations

import json
import time

import pytest

from e2e.kube import Cluster, RecordFigure, wait_until
from e2e.prometheus import SCRAPE, prometheus_manifests, prometheus_url
from e2e.tidalmq_release import bootstrap, installed_release, ready, topic_status
from observability.generate import OUT
from tests.support.monitoring_queries import (
    check_queries,
    evaluate,
    lagging_group,
    rule_failures,
    rules,
    targets,
)

RULES = OUT / "alerts.rules.yaml"
TOPIC = "monitored"
GROUP = "dashboards"
# $__rate_interval: Grafana makes it at least four scrape intervals (20 s at 5 s); 30 s, as the
# bytes-in adapter's window, keeps two samples in it when a scrape lands late on a busy node
RATE_INTERVAL = "30s"


def leaders(cluster: Cluster, ns: str) -> dict[int, int]:
    return {p["partition"]: p["broker"] for p in topic_status(cluster, ns, TOPIC)["partitions"]}


def traffic(cluster: Cluster, ns: str) -> None:
    """Records in and out, a consumer group's committed offsets behind the end, one move."""
    cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "Topic",
                              "metadata": {"name": TOPIC}, "spec": {"partitions": 2}}), ns)  # fmt: skip
    wait_until("Topic Ready", lambda: ready(topic_status(cluster, ns, TOPIC)), timeout=180)
    servers = bootstrap(cluster, ns)
    lagging_group(servers, TOPIC, GROUP, 60)
    target = 1 - leaders(cluster, ns)[0]  # the brokers are 0 and 1 (their pods' ordinals)
    cluster.apply(json.dumps({"apiVersion": "tidalmq.io/v1alpha1", "kind": "PartitionReassignment",
                              "metadata": {"name": "move-monitored"},
                              "spec": {"partitions": [{"topic": TOPIC, "partition": 0,
                                                       "replicas": [target]}]}}), ns)  # fmt: skip
    wait_until("partition 0 to move", lambda: leaders(cluster, ns).get(0) == target, timeout=120)


def all_up(prom: str) -> dict[str, str]:
    """The targets once they are the two brokers and the operator, all up (else ValueError
    naming each target's health and last error: wait_until shows the last one)."""
    found = targets(prom)
    jobs = sorted(name.split()[0] for name in found)
    if jobs != ["tidalmq-brokers", "tidalmq-brokers", "tidalmq-operator"] or set(
        found.values()
    ) != {"up"}:
        raise ValueError(found)
    return found


@pytest.mark.timeout(900)  # the first run of a session may build the add-on images
def test_every_dashboard_query_and_alert_runs_on_the_clusters_prometheus(
    cluster: Cluster, namespace: str, minio: str, prometheus_image: str, figures: RecordFigure
) -> None:
    ns = namespace
    cluster.apply(
        prometheus_manifests(prometheus_image, ns, operator=True,
                             rule_files={RULES.name: RULES.read_text()}), ns,
    )  # fmt: skip
    # this test's Prometheus alone: the bytes-in adapter has its own test
    with installed_release(cluster, ns, minio, "--set", "metricsAdapter.enabled=false"):
        prom = prometheus_url(cluster, ns)
        traffic(cluster, ns)
        # two brokers and the operator scraped (a target's lastError says why not)
        wait_until("Prometheus to scrape both brokers and the operator",
                   lambda: all_up(prom), timeout=120, interval=3)  # fmt: skip
        wait_until(
            "Prometheus to hold the topic's partitions",
            lambda: evaluate(prom, f'count(tidalmq_partition_leader_epoch{{topic="{TOPIC}"}}) == 2')[1],
            timeout=120, interval=3,
        )  # fmt: skip

        # every alert is loaded and evaluated by Prometheus (health "unknown" until then), healthy
        wait_until(
            "every alert rule to be evaluated",
            lambda: all(r.get("health") != "unknown" for r in rules(prom).values()),
            timeout=60, interval=3,
        )  # fmt: skip
        assert not rule_failures(rules(prom)), rule_failures(rules(prom))

        # every query: no error; data exactly when its metrics are exported. A series that
        # appeared moments ago has one sample in a rate window: checked again, a scrape later,
        # until the rate windows hold the traffic (at most two of them).
        started = time.monotonic()
        coverage = check_queries(prom, RATE_INTERVAL)
        while coverage.inconsistent and time.monotonic() - started < 75:
            time.sleep(5)
            coverage = check_queries(prom, RATE_INTERVAL)
        figures(
            "dashboard_queries_with_data",
            f"{len(coverage.data)} of {len(coverage.data) + len(coverage.no_data)}",
            f"scrape {SCRAPE}, $__rate_interval {RATE_INTERVAL}",
        )
        figures(
            "dashboard_queries_without_data",
            coverage.no_data,
            "query -> the metrics it names that nothing in this cluster exports",
        )
        figures("alert_metrics_not_exported", coverage.alert_metrics_missing)
        print("\n" + coverage.report())
        assert not coverage.failures, "\n".join(coverage.failures)
