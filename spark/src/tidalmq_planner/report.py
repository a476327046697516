"""The planner's outputs: the plan (Kafka's reassignment JSON, and a PartitionReassignment
waiting for approval), a rollback plan, and a report (table, JSON summary, PNG chart)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidalmq_core.balance import LoadPlan
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import format_plan

if TYPE_CHECKING:
    import pandas as pd

DIMENSIONS = ("bytes_in", "bytes_out")

_BROKER_RATE = "sum by (broker) (rate({metric}[{rate}]))"
# The queries behind the report's per-broker figures, as the chart's dashboards show them ("Bytes
# in per broker", "Bytes-in imbalance" and the planner's row: a test keeps them equal), so that a
# reader checks the projection against the cluster before and after the moves.
REPORT_QUERIES = {
    "broker bytes in": _BROKER_RATE.format(metric="tidalmq_topic_bytes_in_total", rate="{rate}"),
    "broker bytes out": _BROKER_RATE.format(metric="tidalmq_topic_bytes_out_total", rate="{rate}"),
    "bytes-in imbalance (max/avg)": "max({q}) / avg({q})".format(
        q=_BROKER_RATE.format(metric="tidalmq_topic_bytes_in_total", rate="{rate}")
    ),
}


def report_links(prometheus: str | None, window: str, rate: str) -> list[dict[str, str]]:
    """REPORT_QUERIES at the given rate window, each with a Prometheus graph link over the
    plan's window when the history came from Prometheus."""
    from urllib.parse import urlencode

    links = []
    for name, template in REPORT_QUERIES.items():
        query = template.format(rate=rate)
        url = ""
        if prometheus:
            params = {"g0.expr": query, "g0.tab": "0", "g0.range_input": window}
            url = f"{prometheus.rstrip('/')}/graph?{urlencode(params)}"
        links.append({"name": name, "query": query, "url": url})
    return links


@dataclass(slots=True)
class BrokerProjection:
    """A broker's projected load (bytes/s) under the current and the proposed assignment."""

    broker: int
    partitions_before: int
    partitions_after: int
    before: dict[str, float]  # "<dim>" (the balanced statistic) and "<dim>_peak_hour"
    after: dict[str, float]


@dataclass(slots=True)
class Report:
    statistic: str
    threshold: float
    floor: float
    window: str
    step: str
    source: str
    assignment_source: str
    partitions: int
    brokers: list[BrokerProjection]
    moves: int
    lower_bound: int
    max_moves: int | None
    balanced: bool
    within_threshold: bool
    stopped: str
    imbalance_before: dict[str, float]
    imbalance_after: dict[str, float]
    cap: dict[str, float]
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    links: list[dict[str, str]] = field(default_factory=list)  # report_links

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


@dataclass(slots=True)
class PlanResult:
    """What a planning run hands back: the plan, its report, the partition profiles it was
    computed from, and where the outputs were written (the driver publishes it, publish.py)."""

    plan: LoadPlan[TopicPartition]
    report: Report
    profiles: pd.DataFrame
    written: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        r = self.report
        return {
            "moves": r.moves,
            "lowerBound": r.lower_bound,
            "partitions": r.partitions,
            "brokers": [b.broker for b in r.brokers],
            "imbalanceBefore": r.imbalance_before,
            "imbalanceAfter": r.imbalance_after,
            "withinThreshold": r.within_threshold,
            "balanced": r.balanced,
            "stopped": r.stopped,
            "timings": r.timings_s,
            "written": self.written,
        }


def imbalance_of(values: Sequence[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def moved_plan(plan: LoadPlan[TopicPartition]) -> dict[TopicPartition, int]:
    return {m.partition: m.target for m in plan.moves}


def rollback_plan(plan: LoadPlan[TopicPartition]) -> dict[TopicPartition, int]:
    return {m.partition: m.source for m in plan.moves if m.source is not None}


def reassignment_resource(
    name: str,
    namespace: str | None,
    moves: Mapping[TopicPartition, int],
    summary: Mapping[str, Any],
) -> dict[str, Any]:
    """A PartitionReassignment for the plan, not approved (an operator approves it with
    `kubectl patch tpr NAME --type merge -p '{"spec":{"approved":true}}'`)."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            "app.kubernetes.io/part-of": "tidalmq",
            "app.kubernetes.io/component": "planner",
        },
        "annotations": {"tidalmq.io/plan-summary": json.dumps(summary, sort_keys=True)},
    }
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "tidalmq.io/v1alpha1",
        "kind": "PartitionReassignment",
        "metadata": meta,
        "spec": {
            "approved": False,
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition, "replicas": [b]}
                for tp, b in sorted(moves.items())
            ],
        },
    }


def to_yaml(doc: Any, indent: int = 0) -> str:
    """YAML for plain JSON-like data (block style; scalars as JSON, which YAML reads)."""
    pad = "  " * indent
    if isinstance(doc, dict):
        if not doc:
            return pad + "{}\n"
        out = []
        for k, v in doc.items():
            if isinstance(v, dict | list) and v:
                out.append(f"{pad}{json.dumps(str(k))}:\n{to_yaml(v, indent + 1)}")
            else:
                out.append(f"{pad}{json.dumps(str(k))}: {_scalar(v)}\n")
        return "".join(out)
    if isinstance(doc, list):
        if not doc:
            return pad + "[]\n"
        out = []
        for v in doc:
            if isinstance(v, dict) and v:
                body = to_yaml(v, indent + 1)
                out.append(f"{pad}- {body.lstrip()}")
            else:
                out.append(f"{pad}- {_scalar(v)}\n")
        return "".join(out)
    return pad + _scalar(doc) + "\n"


def _scalar(v: Any) -> str:
    if isinstance(v, list | dict):
        return json.dumps(v)
    return json.dumps(v)


def format_table(report: Report) -> str:
    mb = 1024 * 1024
    stat = report.statistic
    lines = [
        f"{'BROKER':>6} {'PARTS':>11}  {'IN ' + stat + ' MiB/s':>22}  {'OUT ' + stat + ' MiB/s':>22}"
        f"  {'IN peak hour':>19}",
        f"{'':>6} {'now -> new':>11}  {'now -> new':>22}  {'now -> new':>22}  {'now -> new':>19}",
    ]
    for b in report.brokers:
        lines.append(
            f"{b.broker:>6} {b.partitions_before:>5} -> {b.partitions_after:<4}"
            f"  {b.before['bytes_in'] / mb:>10.3f} -> {b.after['bytes_in'] / mb:<8.3f}"
            f"  {b.before['bytes_out'] / mb:>10.3f} -> {b.after['bytes_out'] / mb:<8.3f}"
            f"  {b.before['bytes_in_peak_hour'] / mb:>8.3f} -> {b.after['bytes_in_peak_hour'] / mb:<8.3f}"
        )
    ib, ia = report.imbalance_before, report.imbalance_after
    lines.append(
        f"imbalance (max/mean): bytes in {ib['bytes_in']:.3f} -> {ia['bytes_in']:.3f}, "
        f"bytes out {ib['bytes_out']:.3f} -> {ia['bytes_out']:.3f} (threshold {report.threshold:g})"
    )
    budget = f", budget {report.max_moves}" if report.max_moves is not None else ""
    lines.append(
        f"moves: {report.moves} (lower bound {report.lower_bound}{budget}); "
        f"{'within threshold' if report.within_threshold else 'NOT within threshold'}"
        f"{'' if report.balanced else f' ({report.stopped}: outside the band)'}"
    )
    lines.extend(f"note: {n}" for n in report.notes)
    lines.extend(f"check: {x['name']}: {x['url'] or x['query']}" for x in report.links)
    return "\n".join(lines)


def chart(report: Report, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    brokers = [str(b.broker) for b in report.brokers]
    x = list(range(len(brokers)))
    width = 0.4
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 0.5 * len(brokers) + 3), 7), sharex=True)
    for ax, dim, label in zip(axes, DIMENSIONS, ("bytes in", "bytes out"), strict=True):
        before = [b.before[dim] / 1024 / 1024 for b in report.brokers]
        after = [b.after[dim] / 1024 / 1024 for b in report.brokers]
        ax.bar([i - width / 2 for i in x], before, width, label="current", color="#c0504d")
        ax.bar([i + width / 2 for i in x], after, width, label="proposed", color="#4f81bd")
        mean = sum(after) / len(after) if after else 0.0
        ax.axhline(mean, color="black", linewidth=0.8, linestyle="--", label="mean")
        ax.axhline(
            mean * report.cap[dim],
            color="grey",
            linewidth=0.8,
            linestyle=":",
            label=f"cap ({report.cap[dim]:.2f} x mean)",
        )
        ax.set_ylabel(f"{label}, {report.statistic} (MiB/s)")
        ax.set_title(
            f"{label}: max/mean {report.imbalance_before[dim]:.2f} -> {report.imbalance_after[dim]:.2f}"
        )
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xticks(x, brokers)
    axes[-1].set_xlabel("broker")
    fig.suptitle(
        f"TidalMQ rebalance plan: {report.moves} moves (lower bound {report.lower_bound})\n"
        f"{report.partitions} partitions, {len(report.brokers)} brokers, window {report.window}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(
    report: Report,
    plan: LoadPlan[TopicPartition],
    *,
    out: Path | None,
    report_dir: Path | None,
    yaml_path: Path | None,
    name: str,
    namespace: str | None,
) -> dict[str, str]:
    """Write what was asked for; returns what was written, by kind."""
    written: dict[str, str] = {}
    moves = moved_plan(plan)
    plan_text = format_plan(moves)
    summary = {
        "moves": report.moves,
        "lowerBound": report.lower_bound,
        "imbalanceBefore": report.imbalance_before,
        "imbalanceAfter": report.imbalance_after,
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(plan_text + "\n")
        written["plan"] = str(out)
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "plan.json").write_text(plan_text + "\n")
        (report_dir / "rollback.json").write_text(format_plan(rollback_plan(plan)) + "\n")
        (report_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
        (report_dir / "report.txt").write_text(format_table(report) + "\n")
        written["report"] = str(report_dir / "report.json")
        written["chart"] = str(chart(report, report_dir / "load.png"))
        if yaml_path is None:
            yaml_path = report_dir / "partitionreassignment.yaml"
    if yaml_path is not None:
        yaml_path.parent.mkdir(parents=True, exist_ok=True)
        yaml_path.write_text(to_yaml(reassignment_resource(name, namespace, moves, summary)))
        written["resource"] = str(yaml_path)
    return written
