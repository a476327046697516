"""Planner-generated PartitionReassignments (`spec.generate`): the pure decisions.

The lifecycle, level-based (each step is decided again from the resource after any change or
operator restart, so nothing that already ran runs twice):

    (no status.plan) --planner--> Planning --plan stored--> AwaitingApproval
        --spec.approved or spec.autoApprove--> Running --moves done--> Completed
    an empty plan (already balanced) --> Completed at once
    PlannerFailed --> Failed;  spec.cancel before any move --> Cancelled (the driver pod goes)

`status.plan` holds the plan in the shape of the CRD (`partitions`: Kafka's reassignment JSON
entries; `report`: movesCount, imbalanceBefore, imbalanceAfter, chart, more planner figures).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import PlanEntry

from tidalmq_operator.models import ReassignmentSpec

TERMINAL = ("Completed", "Cancelled", "Failed")
CHART_LIMIT = 16_000  # characters of the planner's report table kept in status
REPORT_FIELDS = ("lowerBound", "withinThreshold", "balanced", "stopped", "brokers")


class Step(enum.Enum):
    NOTHING = "nothing"  # terminal, or the planner of this resource is running
    CANCEL = "cancel"  # cancelled before any move was submitted
    PLAN = "plan"  # launch the planner (or attach to the driver of an earlier launch)
    AWAIT_APPROVAL = "await-approval"
    COMPLETE_EMPTY = "complete-empty"  # nothing to move: done
    EXECUTE = "execute"  # submit the moves of status.plan
    WATCH = "watch"  # moves were submitted (phase Running): track them


def next_step(
    spec: ReassignmentSpec,
    status: Mapping[str, Any] | None,
    *,
    planner_running: bool,
    tracked: bool,
) -> Step:
    status = status or {}
    phase = status.get("phase")
    if phase in TERMINAL:
        return Step.NOTHING
    if phase == "Running":  # a cancel now rolls moves back (the spec.cancel handler)
        return Step.NOTHING if tracked else Step.WATCH
    if spec.cancel:
        return Step.CANCEL
    plan = status.get("plan")
    if plan is None:
        return Step.NOTHING if planner_running else Step.PLAN
    if not plan.get("partitions"):
        return Step.COMPLETE_EMPTY
    if spec.approved or spec.auto_approve:
        return Step.EXECUTE
    return Step.AWAIT_APPROVAL


def plan_status(
    entries: Iterable[PlanEntry], summary: Mapping[str, Any], report: str
) -> dict[str, Any]:
    """status.plan from the planner's outcome (entries, summary.json, report.txt)."""
    partitions = [
        {"topic": e.tp.topic, "partition": e.tp.partition, "replicas": [e.target]}
        for e in entries
        if e.target is not None
    ]
    figures: dict[str, Any] = {"movesCount": len(partitions)}
    by_dimension: dict[str, dict[str, float]] = {}
    for key, when in (("imbalanceBefore", "before"), ("imbalanceAfter", "after")):
        value = summary.get(key)
        if _is_number(value):
            figures[key] = float(value)
        elif isinstance(value, Mapping):
            # the planner reports one figure per balanced dimension (bytes_in, bytes_out): the
            # headline is the worst of them
            dims = {str(d): float(v) for d, v in value.items() if _is_number(v)}
            if dims:
                figures[key] = max(dims.values())
                by_dimension[when] = dims
    if by_dimension:
        figures["imbalanceByDimension"] = by_dimension
    for key in REPORT_FIELDS:
        if key in summary:
            figures[key] = summary[key]
    if report:
        figures["chart"] = (
            report if len(report) <= CHART_LIMIT else report[:CHART_LIMIT] + "\n... (truncated)"
        )
    return {"partitions": partitions, "report": figures}


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def plan_entries(plan: Mapping[str, Any] | None) -> list[PlanEntry]:
    """The moves of status.plan."""
    return [
        PlanEntry(TopicPartition(p["topic"], int(p["partition"])), int(p["replicas"][0]))
        for p in (plan or {}).get("partitions") or []
    ]


def plan_summary(plan: Mapping[str, Any]) -> str:
    """One line for conditions and Events: the moves and the projected imbalance."""
    report = plan.get("report") or {}
    moves = len(plan.get("partitions") or [])
    text = f"{moves} move{'s' if moves != 1 else ''} proposed"
    before, after = report.get("imbalanceBefore"), report.get("imbalanceAfter")
    if before is not None and after is not None:
        text += f"; imbalance (busiest broker / mean) {before:.3f} -> {after:.3f}"
    return text


def moves_to_submit(entries: Iterable[PlanEntry], meta: ClusterMetadata) -> list[PlanEntry]:
    """The entries that still need a move: not already served by their target and not already
    moving there (a resubmission after an operator restart starts nothing twice)."""
    out = []
    for e in entries:
        topic = meta.topics.get(e.tp.topic)
        part = (
            topic.partitions[e.tp.partition]
            if topic is not None and e.tp.partition < len(topic.partitions)
            else None
        )
        if part is not None:
            if part.moving and part.target_replicas and part.target_replicas[0] == e.target:
                continue
            if not part.moving and part.leader == e.target:
                continue
        out.append(e)
    return out


def with_condition(
    conditions: Iterable[Mapping[str, Any]] | None, new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """`conditions` with `new` replacing the one of its type (lastTransitionTime kept when the
    status did not change)."""
    out: list[dict[str, Any]] = []
    placed = False
    for c in conditions or []:
        if c.get("type") == new["type"]:
            merged = dict(new)
            if c.get("status") == new["status"] and c.get("lastTransitionTime"):
                merged["lastTransitionTime"] = c["lastTransitionTime"]
            out.append(merged)
            placed = True
        else:
            out.append(dict(c))
    if not placed:
        out.append(dict(new))
    return out
