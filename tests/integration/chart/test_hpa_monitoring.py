"""The chart's broker-HPA monitoring against kube-state-metrics' real series: kube-state-metrics
(the binary built from its Go module, e2e/versions.env) watches the real kube-apiserver of the
chart integration tests, where the chart's own broker StatefulSet and HorizontalPodAutoscaler
(autoscaling/v2, `helm template` with the default values: maxReplicas 8, named FULLNAME-broker)
are applied; a real Prometheus scrapes kube-state-metrics and loads the chart's rules file.

No HPA controller runs there (the test API server has no kube-controller-manager, and no pods
or metrics to scale on), so the HPA's status is written the way the controller writes it: a
patch of its status subresource. With the status at the maximum (current and desired 8, the
ScalingLimited condition TooManyReplicas), TidalMQBrokersAtMaxReplicas goes pending, then fires
for that HPA, and resolves once desired is below the maximum again; before, with the status the
HPA has when created (desired 0), its expression returns nothing. Every dashboard query and alert
expression naming kube_horizontalpodautoscaler_* returns data, and the broker autoscaler panel
shows 8, 8 and 8. The rules file is the shipped one with only its `for:` durations shortened
to 2 s (TidalMQBrokersAtMaxReplicas has 15 minutes), the rest asserted byte-identical."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from observability.alerts import ALERTS
from observability.dashboards import ALL
from observability.generate import OUT
from observability.panels import queries_of
from tests.support.helm import FULL, STS, find, render
from tests.support.kube_apiserver import ApiServer, binaries
from tests.support.kube_state_metrics import KubeStateMetrics
from tests.support.monitoring_queries import (
    METRIC,
    active_alerts,
    check_queries,
    evaluate,
    rule_failures,
    rules,
    runnable,
    short_for,
)
from tests.support.prometheus_server import PrometheusServer, prometheus_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "hpa-at-max"
HPA = f"{FULL}-broker"
ALERT = "TidalMQBrokersAtMaxReplicas"
HPA_SERIES = "kube_horizontalpodautoscaler_"
SCRAPE_S = 1.0  # also the rules' evaluation interval
SHORT_FOR = "2s"
RULES = OUT / "alerts.rules.yaml"
RATE_INTERVAL = "10s"

prometheus = prometheus_fixture(SCRAPE_S)


def kubectl(server: ApiServer, *args: str, input: str | None = None) -> str:
    done = subprocess.run(
        [str(binaries()[1].parent / "kubectl"), "--kubeconfig", str(server.kubeconfig), *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def chart_broker_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    """The broker StatefulSet and its HPA as the chart renders them with its defaults, in
    NAMESPACE."""
    docs = render()
    objects = find(docs, "StatefulSet", STS), find(docs, "HorizontalPodAutoscaler", HPA)
    for obj in objects:
        obj["metadata"]["namespace"] = NAMESPACE
    return objects


def set_hpa_status(server: ApiServer, current: int, desired: int, limited: bool) -> None:
    """The HPA's status as the HPA controller writes it (through the status subresource)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def condition(kind: str, status: bool, reason: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": "True" if status else "False",
            "reason": reason,
            "lastTransitionTime": now,
        }

    status = {
        "currentReplicas": current,
        "desiredReplicas": desired,
        "lastScaleTime": now,
        "conditions": [
            condition("AbleToScale", True, "ReadyForNewScale"),
            condition("ScalingActive", True, "ValidMetricFound"),
            condition(
                "ScalingLimited",
                limited,
                "TooManyReplicas" if limited else "DesiredWithinRange",
            ),
        ],
    }
    kubectl(
        server,
        "-n",
        NAMESPACE,
        "patch",
        "horizontalpodautoscaler",
        HPA,
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        json.dumps({"status": status}),
    )


def hpa_alerts(prometheus: PrometheusServer) -> list[dict[str, Any]]:
    return active_alerts(prometheus.url, ALERT, namespace=NAMESPACE, horizontalpodautoscaler=HPA)


def wait_alert(prometheus: PrometheusServer, state: str | None, timeout_s: float) -> float:
    """Seconds until the alert is in `state` (None: not active)."""
    started = time.monotonic()
    found: list[dict[str, Any]] = []
    while time.monotonic() - started < timeout_s:
        found = hpa_alerts(prometheus)
        if [a["state"] for a in found] == ([state] if state else []):
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(
        f"{ALERT} not {state or 'resolved'} within {timeout_s} s: {found}; all alerts: "
        f"{prometheus.alerts()}"
    )


def hpa_queries() -> list[str]:
    """Every dashboard query naming kube-state-metrics' HPA series, as Grafana sends it."""
    return [
        runnable(q, RATE_INTERVAL)
        for build in ALL.values()
        for q in queries_of(build())
        if HPA_SERIES in q
    ]


def values(prometheus: PrometheusServer, query: str) -> list[float]:
    return [float(s["value"][1]) for s in prometheus.query(query)]


@pytest.fixture
def kube_state_metrics(kube_apiserver: ApiServer, tmp_path: Path) -> Iterator[KubeStateMetrics]:
    kubectl(kube_apiserver, "create", "namespace", NAMESPACE)
    statefulset, hpa = chart_broker_objects()
    kubectl(kube_apiserver, "apply", "-f", "-", input=yaml.safe_dump_all([statefulset, hpa]))
    try:
        with KubeStateMetrics(
            tmp_path / "kube-state-metrics",
            kube_apiserver.kubeconfig,
            ["horizontalpodautoscalers", "statefulsets"],
            [NAMESPACE],
        ) as ksm:
            yield ksm
    finally:
        kubectl(kube_apiserver, "delete", "namespace", NAMESPACE, "--wait=false")


# The first run on a machine may wait for the cold build of kube-state-metrics (9 min on the
# loaded 2-core machine) and of the API server; once built, the test takes seconds.
@pytest.mark.timeout(1500)
def test_hpa_at_its_maximum_fires_and_its_panel_and_alert_read_kube_state_metrics(
    kube_apiserver: ApiServer,
    kube_state_metrics: KubeStateMetrics,
    prometheus: PrometheusServer,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    expr = next(a.expr for a in ALERTS if a.name == ALERT)
    panel_queries = hpa_queries()
    assert panel_queries, "no dashboard panel reads the broker HPA"
    rules_file = tmp_path / RULES.name
    rules_file.write_text(short_for(RULES.read_text(), SHORT_FOR))
    prometheus.start({"kube-state-metrics": [kube_state_metrics.address]}, rule_files=[rules_file])
    loaded = rules(prometheus.url)
    assert loaded[ALERT]["duration"] == 2, loaded[ALERT]
    selector = f'namespace="{NAMESPACE}", horizontalpodautoscaler="{HPA}"'

    # The HPA as created: no status yet (desired 0), its spec's maximum the chart's default 8.
    prometheus.wait_for(
        f"kube_horizontalpodautoscaler_spec_max_replicas{{{selector}}}",
        lambda r: [float(s["value"][1]) for s in r] == [8.0],
        timeout_s=30,
    )
    desired = f"kube_horizontalpodautoscaler_status_desired_replicas{{{selector}}}"
    assert values(prometheus, desired) == [0.0]
    assert prometheus.query(expr) == [], "the alert's expression holds for an HPA wanting 0"
    assert hpa_alerts(prometheus) == []

    # The HPA at its maximum, as the controller reports it when the load wants more brokers.
    set_hpa_status(kube_apiserver, current=8, desired=8, limited=True)
    at_max = time.monotonic()
    pending_s = wait_alert(prometheus, "pending", 30)
    firing_s = pending_s + wait_alert(prometheus, "firing", 30)
    fired = hpa_alerts(prometheus)[0]
    assert fired["labels"]["severity"] == "warning", fired
    assert HPA in fired["annotations"]["summary"], fired

    # Every rule healthy; every dashboard query and alert expression runs; those naming the HPA
    # series return data (the others name TidalMQ's metrics, not scraped here: no data).
    assert not rule_failures(loaded := rules(prometheus.url)), rule_failures(loaded)
    coverage = check_queries(prometheus.url, RATE_INTERVAL)
    assert not coverage.failures, "\n".join(coverage.failures)
    assert set(panel_queries) <= set(coverage.data), {
        q: coverage.no_data.get(q) for q in panel_queries if q not in coverage.data
    }
    hpa_alert_exprs = [a.expr for a in ALERTS if HPA_SERIES in a.expr]
    assert hpa_alert_exprs == [expr]
    assert evaluate(prometheus.url, expr) == ("", 1)
    assert set(METRIC.findall(expr)) <= set(coverage.alert_metrics_exported), coverage.report()
    # the broker autoscaler panel shows current, desired and maximum: 8 each
    assert [values(prometheus, q) for q in panel_queries] == [[8.0]] * len(panel_queries)

    # Below the maximum again (the load fell): the alert resolves.
    set_hpa_status(kube_apiserver, current=8, desired=6, limited=False)
    resolved_s = wait_alert(prometheus, None, 30)
    print(
        f"\n{ALERT}: pending {pending_s:.1f} s and firing {firing_s:.1f} s after the HPA's "
        f"status reached its maximum (for: {SHORT_FOR}, scrape and evaluation every "
        f"{SCRAPE_S:g} s), resolved {resolved_s:.1f} s after it fell below; "
        f"{len(panel_queries)} panel queries on the HPA series: {panel_queries}; "
        f"test body {time.monotonic() - started:.1f} s ({time.monotonic() - at_max:.1f} s "
        "from the status patch)"
    )
