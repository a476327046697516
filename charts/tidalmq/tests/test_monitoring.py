"""The dashboards and alerts the chart ships: the committed files are what observability/
generates, the dashboards render as ConfigMaps Grafana's sidecar picks up, and the alerts as a
PrometheusRule whose spec is the plain rules file. (tests/integration/chart/test_monitoring_queries.py
runs every query against a real Prometheus.)"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from observability import generate
from observability.alerts import ALERTS, rules_file
from observability.dashboards import ALL
from observability.panels import queries_of
from tests.support.helm import FULL, NAMESPACE, find, find_all, render

CHART = Path(__file__).resolve().parents[1]


def test_committed_files_are_the_generated_ones() -> None:
    """Nobody edits the JSON or the rules by hand: `make monitoring` writes them from code."""
    assert generate.stale() == [], "run `make monitoring` and commit the result"


def test_the_check_names_a_hand_edited_dashboard(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "dashboards").mkdir()
    monkeypatch.setattr(generate, "OUT", tmp_path)
    assert generate.main([]) == 0
    assert generate.stale() == []
    edited = tmp_path / "dashboards" / "storage.json"
    edited.write_text(edited.read_text().replace("TidalMQ / Storage", "Storage"))
    (tmp_path / "dashboards" / "extra.json").write_text("{}")
    assert generate.stale() == [edited, tmp_path / "dashboards" / "extra.json"]
    assert generate.main(["--check"]) == 1


def dashboards_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for cm in find_all(docs, "ConfigMap"):
        if cm["metadata"]["labels"].get("app.kubernetes.io/component") != "monitoring":
            continue
        ((key, text),) = cm["data"].items()
        out[cm["metadata"]["name"]] = {"key": key, "board": json.loads(text), "cm": cm}
    return out


@pytest.mark.usefixtures("helm")
def test_one_configmap_per_dashboard_with_the_sidecar_label() -> None:
    found = dashboards_of(render())
    assert set(found) == {f"{FULL}-dashboard-{name}" for name in ALL}
    for name in ALL:
        got = found[f"{FULL}-dashboard-{name}"]
        assert got["key"] == f"tidalmq-{name}.json"
        assert got["cm"]["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert got["cm"]["metadata"]["namespace"] == NAMESPACE
        # the ConfigMap holds the committed file, byte for byte (a JSON dashboard Grafana loads)
        committed = (CHART / "monitoring" / "dashboards" / f"{name}.json").read_text()
        assert got["cm"]["data"][got["key"]] + "\n" == committed
    boards = [f["board"] for f in found.values()]
    assert len({b["uid"] for b in boards}) == len(boards)
    assert {b["title"] for b in boards} == {
        "TidalMQ / Brokers", "TidalMQ / Topics and consumer lag", "TidalMQ / Moves and rebalances",
        "TidalMQ / Operator, controller and planner", "TidalMQ / Storage",
    }  # fmt: skip
    for board in boards:
        panels = [p for p in board["panels"] if p["type"] != "row"]
        assert panels, board["title"]
        for p in panels:
            assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
            assert p["description"], p["title"]
        # panels do not overlap on Grafana's 24-column grid
        cells = set()
        for p in board["panels"]:
            pos = p["gridPos"]
            assert pos["x"] + pos["w"] <= 24, p["title"]
            mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                    for y in range(pos["y"], pos["y"] + pos["h"])}  # fmt: skip
            assert not cells & mine, f"{board['title']}: {p['title']} overlaps"
            cells |= mine


@pytest.mark.usefixtures("helm")
def test_dashboard_label_namespace_and_annotations_follow_values() -> None:
    docs = render({"metrics": {"dashboards": {
        "label": "grafana_dashboards", "labelValue": "tidalmq", "namespace": "monitoring",
        "labels": {"team": "streaming"}, "annotations": {"grafana_folder": "TidalMQ"}}}})  # fmt: skip
    found = dashboards_of(docs)
    assert len(found) == len(ALL)
    for got in found.values():
        meta = got["cm"]["metadata"]
        assert meta["namespace"] == "monitoring"
        assert meta["labels"]["grafana_dashboards"] == "tidalmq"
        assert "grafana_dashboard" not in meta["labels"]
        assert meta["labels"]["team"] == "streaming"
        assert meta["annotations"] == {"grafana_folder": "TidalMQ"}
    assert dashboards_of(render({"metrics": {"dashboards": {"enabled": False}}})) == {}


@pytest.mark.usefixtures("helm")
def test_prometheus_rule_is_the_plain_rules_file() -> None:
    assert not find_all(render(), "PrometheusRule")
    docs = render({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "p"}}}})
    rule = find(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == FULL and rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "p"
    plain = yaml.safe_load((CHART / "monitoring" / "alerts.rules.yaml").read_text())
    assert rule["spec"] == plain == rules_file()


def test_the_alerts_cover_what_users_must_hear_about() -> None:
    """Partitions without a leader, a lost or unwritable store, a broker fenced or not answering
    its scrapes, a move stuck,
    consumer lag growing, the broker HPA at its maximum: each has an alert on the metric that
    shows it."""
    by_name = {a.name: a for a in ALERTS}
    wanted = {
        "TidalMQPartitionsWithoutLeader": "tidalmq_operator_degraded",
        "TidalMQObjectStoreLost": "tidalmq_controller_store_lost",
        "TidalMQObjectStoreUnwritable": "tidalmq_storage_store_unwritable",
        "TidalMQBrokerFenced": "tidalmq_controller_brokers_declared_dead_total",
        "TidalMQBrokerUnreachable": "up == 0",
        "TidalMQMoveStuck": "tidalmq_controller_moves_in_flight",
        "TidalMQConsumerLagGrowing": "tidalmq_consumer_group_lag_sum_records",
        "TidalMQBrokersAtMaxReplicas": "kube_horizontalpodautoscaler_spec_max_replicas",
        "TidalMQTlsCertificateExpiring": "tidalmq_tls_certificate_expiry_timestamp_seconds",
    }
    for name, metric in wanted.items():
        assert metric in by_name[name].expr, name
    for a in ALERTS:
        assert a.severity in {"critical", "warning"}, a.name
        assert a.summary and a.description, a.name


METRIC = re.compile(r"\b((?:tidalmq|kube)_[a-z0-9_]+)\b")


def defined_metrics() -> set[str]:
    """The series names the brokers, the controller and the operator can export: every metric
    their modules register in prometheus_client's default registry (with or without series)."""
    for package in ("tidalmq_broker", "tidalmq_controller", "tidalmq_operator"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith(".__main__"):  # that one runs the program
                importlib.import_module(info.name)
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),  # the broker's have no quantiles
    }
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_every_metric_queried_is_one_tidalmq_exports() -> None:
    """A misspelled metric would make a panel or an alert silently empty."""
    defined = defined_metrics()
    assert "tidalmq_partition_bytes_in_total" in defined
    queries = [(name, q) for name, build in ALL.items() for q in queries_of(build())]
    queries += [(a.name, a.expr) for a in ALERTS]
    unknown = {
        (where, metric)
        for where, query in queries
        for metric in METRIC.findall(query)
        if metric not in defined
        and not metric.startswith("kube_horizontalpodautoscaler_")  # kube-state-metrics'
    }
    assert not unknown, sorted(unknown)


def test_the_plan_report_links_to_the_dashboards_own_queries() -> None:
    """The planner's report (report.txt/json: "check: ...") names the same per-broker queries the
    dashboards show, so its before/after projection is checked on the same curves."""
    from tidalmq_planner.report import REPORT_QUERIES, report_links

    dashboard_queries = {q for build in ALL.values() for q in queries_of(build())}
    for name, template in REPORT_QUERIES.items():
        assert template.format(rate="$__rate_interval") in dashboard_queries, name
    links = report_links("http://prom:9090/", "7d", "2m")
    assert [x["name"] for x in links] == list(REPORT_QUERIES)
    assert links[0]["url"].startswith("http://prom:9090/graph?g0.expr=sum+by+%28broker%29")
    assert "g0.range_input=7d" in links[0]["url"] and "%5B2m%5D" in links[0]["url"]
    assert all(x["url"] == "" and "[2m]" in x["query"] for x in report_links(None, "7d", "2m"))
