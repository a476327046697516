"""The chart's dashboards and alerts against a real Prometheus: the checks shared by the
integration test (a Prometheus on the host scraping a local cluster,
tests/integration/chart/test_monitoring_queries.py) and the end-to-end test (a Prometheus in the
Kubernetes cluster scraping the chart's pods, e2e/test_monitoring.py).

Every dashboard query (panels and variables) is run as Grafana sends it with every variable at
All, and every alert's expression as Prometheus evaluates it. A query must run without error,
and must return data exactly when every metric it names is exported by what that Prometheus
scrapes: a panel whose metrics are all there and still shows nothing has a wrong query (a label
that never has that value, a typo in a filter); one that shows data although a metric it names
is missing hides it behind `or` / `absent`. The rest, the queries whose metrics are not exported
there, is the coverage a test prints: which queries could not be checked, and why.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import yaml
from confluent_kafka import Consumer, Producer

from observability.alerts import ALERTS
from observability.dashboards import ALL
from observability.panels import queries_of

METRIC = re.compile(r"\b((?:tidalmq|kube)_[a-z0-9_]+)\b")
LABEL_VALUES = re.compile(r"^label_values\((\w+), (\w+)\)$")


def lagging_group(bootstrap: str, topic: str, group: str, timeout_s: float) -> None:
    """Traffic the dashboards show: 200 records into `topic`'s two partitions, `group` reads at
    least 100 and commits, then 50 more arrive, so the group's committed offsets lag the end."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(200):
        producer.produce(topic, b"x" * 100, partition=i % 2)
    assert producer.flush(timeout_s) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + timeout_s
    while seen < 100 and time.monotonic() < deadline:
        seen += len(consumer.consume(100, timeout=1))
    assert seen >= 100, seen
    consumer.commit(asynchronous=False)
    consumer.close()
    for i in range(50):  # produced after the commit: the group lags
        producer.produce(topic, b"y" * 100, partition=i % 2)
    assert producer.flush(timeout_s) == 0


def runnable(expr: str, rate_interval: str) -> str:
    """A dashboard query as Grafana sends it with every variable at All; `rate_interval` is
    what Grafana's $__rate_interval stands for (at least four scrape intervals)."""
    if m := LABEL_VALUES.match(expr):
        return f"count by ({m.group(2)}) ({m.group(1)})"
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$(broker|topic|group)\b", ".*", expr)


def _api(url: str, path: str, params: dict[str, str]) -> dict[str, Any]:
    """Prometheus' answer to /api/v1/`path`, errors included (a 4xx carries its JSON)."""
    full = f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=30) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        doc = json.loads(exc.read())
    return doc


def evaluate(url: str, expr: str) -> tuple[str, int]:
    """(error, series): Prometheus' error for the expression ("" when none), series returned."""
    doc = _api(url, "query", {"query": expr})
    if doc.get("status") != "success":
        return f"{doc.get('errorType')}: {doc.get('error')}", 0
    return "", len(doc["data"]["result"])


def metric_names(url: str) -> set[str]:
    """The TidalMQ and kube-state-metrics metric names with a series now (not stale): what the
    scraped targets export at this moment. Prometheus' list of names (/api/v1/label/__name__/
    values) also holds series that went away, e.g. the operator's Degraded gauge of a Topic that
    was Degraded for a moment, whose queries rightly return nothing now."""
    doc = _api(url, "query", {"query": 'count by (__name__) ({__name__=~"(tidalmq|kube)_.+"})'})
    assert doc.get("status") == "success", doc
    return {row["metric"]["__name__"] for row in doc["data"]["result"]}


def rules(url: str) -> dict[str, dict[str, Any]]:
    """The loaded rules by name, each with its health ("unknown" until first evaluated) and
    its last evaluation's error."""
    doc = _api(url, "rules", {})
    assert doc.get("status") == "success", doc
    return {r["name"]: r for g in doc["data"]["groups"] for r in g["rules"]}


def targets(url: str) -> dict[str, str]:
    """Each active target (job and scrape URL): "up", or its health and last scrape error."""
    doc = _api(url, "targets", {"state": "active"})
    assert doc.get("status") == "success", doc
    return {
        f"{t['labels'].get('job')} {t['scrapeUrl']}": (
            "up" if t["health"] == "up" else f"{t['health']}: {t.get('lastError')}"
        )
        for t in doc["data"]["activeTargets"]
    }


def rule_failures(loaded: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with the loaded rules: an alert of ALERTS missing or unknown to it, a rule
    that is not healthy or whose last evaluation failed."""
    failures = []
    if set(loaded) != {a.name for a in ALERTS}:
        failures.append(f"rules loaded {sorted(loaded)} != ALERTS {sorted(a.name for a in ALERTS)}")
    for name, rule in loaded.items():
        if rule.get("health") != "ok" or rule.get("lastError"):
            failures.append(f"rule {name}: health {rule.get('health')}, {rule.get('lastError')}")
    return failures


@dataclass
class Coverage:
    """The outcome of every dashboard query and alert expression against one Prometheus."""

    data: list[str] = field(default_factory=list)
    # query -> the metrics it names that are not exported (why it has no data)
    no_data: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    alert_metrics_exported: list[str] = field(default_factory=list)
    alert_metrics_missing: list[str] = field(default_factory=list)

    @property
    def inconsistent(self) -> list[str]:
        """The failures of the data-exactly-when-exported rule (a later scrape may fix them:
        a series that appeared within the rate window)."""
        return [f for f in self.failures if " series although " in f]

    def report(self) -> str:
        total = len(self.data) + len(self.no_data)
        missing = "\n  ".join(
            f"{q}  (not exported: {', '.join(m)})" for q, m in self.no_data.items()
        )
        return (
            f"dashboard queries returning data: {len(self.data)} of {total}; without data "
            f"(their metrics are not exported here):\n  {missing}\n"
            f"alert metrics exported here: {self.alert_metrics_exported}; not: "
            f"{self.alert_metrics_missing}"
        )


def check_queries(url: str, rate_interval: str) -> Coverage:
    """Runs every dashboard query and alert expression on the Prometheus at `url` (see the
    module's docstring for what fails)."""
    exported = metric_names(url)
    coverage = Coverage()
    for board_name, build in ALL.items():
        for expr in queries_of(build()):
            query = runnable(expr, rate_interval)
            error, series = evaluate(url, query)
            if error:
                coverage.failures.append(f"{board_name}: {query}: {error}")
                continue
            missing = sorted(set(METRIC.findall(query)) - exported)
            if series:
                coverage.data.append(query)
            else:
                coverage.no_data[query] = missing
            if bool(series) != (not missing):
                coverage.failures.append(
                    f"{board_name}: {query}: {series} series although "
                    + (f"{missing} are not exported" if missing else "every metric is exported")
                )
    alert_metrics = {m for a in ALERTS for m in METRIC.findall(a.expr)}
    coverage.alert_metrics_exported = sorted(alert_metrics & exported)
    coverage.alert_metrics_missing = sorted(alert_metrics - exported)
    for a in ALERTS:
        error, _ = evaluate(url, a.expr)
        if error:
            coverage.failures.append(f"alert {a.name}: {error}")
    return coverage


FOR_LINE = re.compile(r"^(    for: )(\S+)$", re.M)


def _without_for(doc: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in rule.items() if k != "for"} for rule in doc["groups"][0]["rules"]]


def short_for(shipped: str, duration: str) -> str:
    """The chart's rules file (its text) with every nonzero `for:` shortened to `duration`, so
    that an alert fires seconds after its condition holds instead of minutes; nothing else
    changes (the expressions, labels and annotations stay byte-identical: asserted)."""
    text, count = FOR_LINE.subn(
        lambda m: m.group(1) + (m.group(2) if m.group(2) == "0m" else duration), shipped
    )
    assert count == len(ALERTS), f"{count} `for:` lines for {len(ALERTS)} alerts"
    assert _without_for(yaml.safe_load(text)) == _without_for(yaml.safe_load(shipped))
    changed = [
        (a, b) for a, b in zip(shipped.splitlines(), text.splitlines(), strict=True) if a != b
    ]
    assert changed and all(FOR_LINE.match(a) and FOR_LINE.match(b) for a, b in changed)
    return text


def active_alerts(url: str, alertname: str, **labels: str) -> list[dict[str, Any]]:
    """The alerts named `alertname` with `labels` that are pending or firing (/api/v1/alerts,
    what Alertmanager gets)."""
    return [
        a
        for a in _api(url, "alerts", {})["data"]["alerts"]
        if a["labels"].get("alertname") == alertname
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]
