"""The chart's alerts on the operator's metrics fire when their condition happens, and resolve
when it clears: a real Prometheus loads the chart's own rules file
(charts/tidalmq/monitoring/alerts.rules.yaml, only its `for:` durations shortened to 2 s, the
rest asserted byte-identical) and scrapes the operator's /metrics, the operator running against
the session's real kube-apiserver with the controller in it and three real broker processes
(the fixtures of test_operator.py), evaluating every second:

1. every broker of a Topic killed: the controller declares them dead after the session timeout
   and, with no live broker to open them on, leaves their partitions without a leader; past the
   operator's grace (1 s here, 15 s by default) the Topic is Degraded (Leaderless) and
   TidalMQPartitionsWithoutLeader fires for it with that reason; the brokers back (new
   incarnations take their partitions again), it resolves;
2. the metadata log the ClusterState points to taken out of the object store while the operator
   is down (as a wiped or replaced store does): the operator that starts refuses to start the
   controller on it (MetadataLost, no empty cluster) and TidalMQMetadataLost fires; the log put
   back, the next look finds it, the controller starts and the alert resolves.

Each is read from Prometheus' /api/v1/alerts (what Alertmanager gets)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.chart.test_alerts_fire import (
    active,
    expr_of,
    firing,
    resolved,
    start_with_rules,
    wait_alert,
    wait_evaluated,
)
from tests.integration.operator.test_operator import (  # noqa: F401  (fixtures)
    api_with_crds,
    condition,
    deployment,
    get,
    ready_topic,
    wait_for,
)
from tests.support.prometheus_server import PrometheusServer, prometheus_fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRAPE_S = 1.0  # also the rules' evaluation interval
LEADERLESS_GRACE_S = 1
# the operator's defaults (lease 4 s, session timeout 6 s): brokers declared dead within seconds
LEADERLESS = {"TIDALMQ_LEADERLESS_GRACE_S": str(LEADERLESS_GRACE_S)}
# a controller that finds its metadata log missing looks again this often (30 s by default)
METADATA_RETRY_S = 1
METADATA_RETRY = {"TIDALMQ_METADATA_RETRY_S": str(METADATA_RETRY_S)}

prometheus = prometheus_fixture(SCRAPE_S)


def scrape_operator(d: dict[str, Any], prometheus: PrometheusServer, tmp_path: Path) -> None:
    start_with_rules(
        prometheus, {"tidalmq-operator": [f"127.0.0.1:{d['operator'].http_port}"]}, tmp_path
    )


def scraped(prometheus: PrometheusServer, series: str, value: float) -> None:
    """Until Prometheus has scraped `series` at `value`."""
    prometheus.wait_for(
        series, lambda r: bool(r) and float(r[0]["value"][1]) == value, timeout_s=30
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("deployment", [LEADERLESS], indirect=True)
def test_partitions_without_leader_fires(
    deployment: dict[str, Any],  # noqa: F811
    prometheus: PrometheusServer,
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    d = deployment
    alert = "TidalMQPartitionsWithoutLeader"
    labels = {"kind": "Topic", "resource": "orders", "reason": "Leaderless"}
    scrape_operator(d, prometheus, tmp_path)
    ready_topic(d, "orders", 3)
    # served: its Leaderless series is scraped at 0 and the alert's expression names nothing
    scraped(
        prometheus,
        'tidalmq_operator_degraded{kind="Topic",resource="orders",reason="Leaderless"}',
        0,
    )
    assert prometheus.query(expr_of(alert)) == []
    wait_evaluated(prometheus, alert)
    assert not active(prometheus, alert)

    for b in d["brokers"]:
        b.kill()
    killed = time.monotonic()
    fired = wait_alert(prometheus, firing, alert, 45, **labels)
    fired_after = time.monotonic() - killed
    degraded = condition(get(d, "topic", "orders"), "Degraded") or {}
    assert (degraded.get("status"), degraded.get("reason")) == ("True", "Leaderless"), degraded
    assert "3 partitions: 0-2 without a leader" in degraded["message"], degraded
    [found] = active(prometheus, alert, **labels)
    assert found["labels"]["severity"] == "critical", found
    assert found["annotations"]["summary"] == (
        "Partitions of Topic orders have no serving leader"
    ), found

    # the brokers back: new incarnations take their partitions again
    for b in d["brokers"]:
        b.spawn()
    restarted = time.monotonic()
    wait_alert(prometheus, resolved, alert, 60, kind="Topic", resource="orders")
    resolved_after = time.monotonic() - restarted
    print(
        f"\npartitions without leader: fired {fired_after:.1f} s after every broker was killed "
        f"(session timeout 6 s, grace {LEADERLESS_GRACE_S} s; {fired:.1f} s of waiting), "
        f"resolved {resolved_after:.1f} s after they were started again; "
        f"{time.monotonic() - began:.1f} s in all"
    )


def metadata_log_head(d: dict[str, Any]) -> int:
    """The last batch version the ClusterState says was committed (its metadata-log pointer)."""
    obj = get(d, "clusterstate", "tidalmq")
    raw = (obj["metadata"].get("annotations") or {}).get("tidalmq.io/metadata-log")
    return int(json.loads(raw).get("head", 0)) if raw else 0


def serves_metrics(d: dict[str, Any]) -> bool:
    try:
        url = f"http://127.0.0.1:{d['operator'].http_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("deployment", [METADATA_RETRY], indirect=True)
def test_metadata_lost_fires(
    deployment: dict[str, Any],  # noqa: F811
    prometheus: PrometheusServer,
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    d = deployment
    alert = "TidalMQMetadataLost"
    scrape_operator(d, prometheus, tmp_path)
    ready_topic(d, "orders", 3)
    # the ClusterState points past the log's first batches (the pointer follows every 5 s)
    wait_for(lambda: metadata_log_head(d) > 0, timeout_s=30, what="the metadata-log pointer")
    scraped(prometheus, "tidalmq_operator_metadata_lost", 0)
    assert prometheus.query(expr_of(alert)) == []
    wait_evaluated(prometheus, alert)
    assert not active(prometheus, alert)

    # the operator down, its metadata log taken out of the store (the brokers' identity marker
    # beside it kept), the operator started again
    d["operator"].kill()
    cluster = d["tmp"] / "objects" / "cluster"
    aside = d["tmp"] / "metadata-aside"
    aside.mkdir()
    moved = [p for p in (cluster / "log", cluster / "snapshots") if p.exists()]
    assert moved, sorted(cluster.iterdir())
    for p in moved:
        p.rename(aside / p.name)
    d["operator"].launch()
    started = time.monotonic()
    wait_for(lambda: serves_metrics(d), timeout_s=30, what="the operator's /metrics")
    fired = wait_alert(prometheus, firing, alert, 45)
    fired_after = time.monotonic() - started
    ready = condition(get(d, "clusterstate", "tidalmq"), "Ready") or {}
    assert (ready.get("status"), ready.get("reason")) == ("False", "MetadataLost"), ready
    assert not d["operator"].ready()  # no controller on the store that lost its log
    [found] = active(prometheus, alert)
    assert found["labels"]["severity"] == "critical", found
    assert found["annotations"]["summary"] == (
        "The metadata log the ClusterState points to is missing"
    ), found
    # it looks again every METADATA_RETRY_S, each look said once (not in a loop)
    looks = d["operator"].log.read_text().count("MetadataLost: the metadata log")
    assert 1 <= looks <= 4 + (time.monotonic() - started) / METADATA_RETRY_S, looks

    # the log back: the next look finds it, the controller starts
    for p in moved:
        (aside / p.name).rename(p)
    restored = time.monotonic()
    wait_for(d["operator"].ready, timeout_s=60, what="the controller started")
    wait_alert(prometheus, resolved, alert, 30)
    resolved_after = time.monotonic() - restored
    print(
        f"\nmetadata lost: fired {fired_after:.1f} s after the operator started on the store "
        f"without its metadata log ({fired:.1f} s of waiting), resolved {resolved_after:.1f} s "
        f"after the log was back; {time.monotonic() - began:.1f} s in all"
    )
