"""Planner-generated PartitionReassignments: the pure decisions (tidalmq_operator.generated); the
handler path with the launcher runs against a real kube-apiserver in tests/integration/planner."""

from __future__ import annotations

from typing import Any

import pytest
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import PlanEntry
from tidalmq_operator.generated import (
    CHART_LIMIT,
    Step,
    moves_to_submit,
    next_step,
    plan_entries,
    plan_status,
    plan_summary,
    with_condition,
)
from tidalmq_operator.models import ReassignmentSpec, parse

PLAN = {
    "partitions": [{"topic": "orders", "partition": 3, "replicas": [2]}],
    "report": {"movesCount": 1},
}


def spec(**kw: Any) -> ReassignmentSpec:
    return parse(ReassignmentSpec, {"generate": {"window": "1h"}, **kw})


def step(
    status: dict[str, Any] | None, *, running: bool = False, tracked: bool = False, **kw: Any
) -> Step:
    return next_step(spec(**kw), status, planner_running=running, tracked=tracked)


def test_a_new_resource_is_planned_once() -> None:
    assert step(None) is Step.PLAN
    assert step({"phase": "Pending"}) is Step.PLAN
    # an operator restart while planning: launch again (the launcher attaches to the driver)
    assert step({"phase": "Planning"}) is Step.PLAN
    # ... but never a second planner next to the running one
    assert step({"phase": "Planning"}, running=True) is Step.NOTHING
    assert step(None, running=True, approved=True) is Step.NOTHING


def test_a_plan_waits_for_approval() -> None:
    status = {"phase": "AwaitingApproval", "plan": PLAN}
    assert step(status) is Step.AWAIT_APPROVAL
    assert step(status, approved=True) is Step.EXECUTE
    assert step(status, autoApprove=True) is Step.EXECUTE
    # the plan was stored but the phase not yet updated: still a plan to approve
    assert step({"phase": "Planning", "plan": PLAN}) is Step.AWAIT_APPROVAL


def test_an_empty_plan_completes_without_approval() -> None:
    empty = {"partitions": [], "report": {"movesCount": 0}}
    assert step({"phase": "AwaitingApproval", "plan": empty}) is Step.COMPLETE_EMPTY
    assert step({"phase": "AwaitingApproval", "plan": empty}, approved=True) is Step.COMPLETE_EMPTY


def test_running_moves_are_watched_not_resubmitted() -> None:
    status = {"phase": "Running", "plan": PLAN, "startTime": "2026-01-01T00:00:00Z"}
    assert step(status, approved=True) is Step.WATCH  # after a restart: track, do not submit
    assert step(status, approved=True, tracked=True) is Step.NOTHING
    # a cancel while running is the spec.cancel handler's (it rolls the moves back)
    assert step(status, approved=True, cancel=True) is Step.WATCH


@pytest.mark.parametrize("phase", ["Completed", "Cancelled", "Failed"])
def test_terminal_phases_do_nothing(phase: str) -> None:
    assert step({"phase": phase, "plan": PLAN}, approved=True) is Step.NOTHING
    assert step({"phase": phase}, cancel=True) is Step.NOTHING


def test_cancel_before_any_move() -> None:
    assert step(None, cancel=True) is Step.CANCEL
    assert step({"phase": "Planning"}, running=True, cancel=True) is Step.CANCEL
    assert (
        step({"phase": "AwaitingApproval", "plan": PLAN}, cancel=True, approved=True) is Step.CANCEL
    )


def test_plan_status_matches_the_crd_shape() -> None:
    entries = [PlanEntry(TopicPartition("orders", 3), 2), PlanEntry(TopicPartition("logs", 0), 0)]
    summary = {
        "moves": 2,
        "imbalanceBefore": 1.5,
        "imbalanceAfter": 1,
        "lowerBound": 2,
        "withinThreshold": True,
        "timings": {"load": 1.0},
        "written": "x",
    }
    plan = plan_status(entries, summary, "BROKER  BEFORE  AFTER\n0  10  8\n")
    assert plan == {
        "partitions": [
            {"topic": "orders", "partition": 3, "replicas": [2]},
            {"topic": "logs", "partition": 0, "replicas": [0]},
        ],
        "report": {
            "movesCount": 2,
            "imbalanceBefore": 1.5,
            "imbalanceAfter": 1.0,
            "lowerBound": 2,
            "withinThreshold": True,
            "chart": "BROKER  BEFORE  AFTER\n0  10  8\n",
        },
    }
    assert plan_entries(plan) == entries
    assert (
        plan_summary(plan) == "2 moves proposed; imbalance (busiest broker / mean) 1.500 -> 1.000"
    )
    big = plan_status([], {}, "x" * (CHART_LIMIT + 10))
    assert big["report"]["chart"].endswith("(truncated)") and big["report"]["movesCount"] == 0
    assert "imbalanceBefore" not in big["report"]
    assert plan_summary(big) == "0 moves proposed"
    assert plan_entries(None) == [] and plan_entries({"partitions": None}) == []


def test_plan_status_takes_the_planners_own_summary() -> None:
    """The planner's summary.json (tidalmq_planner.report.PlanResult.summary) gives the imbalance per
    balanced dimension: the headline is the worst one, the rest is kept per dimension."""
    summary = {
        "moves": 1,
        "imbalanceBefore": {"bytes_in": 1.9, "bytes_out": 1.0},
        "imbalanceAfter": {"bytes_in": 1.02, "bytes_out": 1.05},
        "withinThreshold": True,
    }
    report = plan_status([PlanEntry(TopicPartition("t", 0), 1)], summary, "")["report"]
    assert report["imbalanceBefore"] == 1.9 and report["imbalanceAfter"] == 1.05
    assert report["imbalanceByDimension"] == {
        "before": {"bytes_in": 1.9, "bytes_out": 1.0},
        "after": {"bytes_in": 1.02, "bytes_out": 1.05},
    }


def _meta(parts: list[PartitionState]) -> ClusterMetadata:
    meta = ClusterMetadata(cluster_id="c")
    meta.topics["t"] = TopicInfo("t", "00000000-0000-0000-0000-000000000001", parts)
    return meta


def test_moves_to_submit_skips_what_is_done_or_under_way() -> None:
    meta = _meta(
        [
            PartitionState(leader=1, leader_epoch=1, replicas=[1]),  # 0: already on its target
            PartitionState(
                leader=-1, leader_epoch=1, replicas=[2], original_replicas=[0], target_replicas=[2]
            ),  # 1: moving to its target
            PartitionState(leader=0, leader_epoch=1, replicas=[0]),  # 2: to move
            PartitionState(
                leader=-1, leader_epoch=1, replicas=[1], original_replicas=[0], target_replicas=[1]
            ),  # 3: moving elsewhere: re-target
        ]
    )
    entries = [PlanEntry(TopicPartition("t", i), t) for i, t in enumerate([1, 2, 1, 2])]
    entries.append(PlanEntry(TopicPartition("gone", 0), 1))  # left for validation to refuse
    assert moves_to_submit(entries, meta) == [entries[2], entries[3], entries[4]]


def test_with_condition_replaces_by_type_and_keeps_transition_times() -> None:
    old = [
        {"type": "Planned", "status": "False", "reason": "Running", "lastTransitionTime": "t0"},
        {"type": "Complete", "status": "False", "reason": "Planning", "lastTransitionTime": "t0"},
    ]
    new = with_condition(
        old,
        {"type": "Planned", "status": "False", "reason": "Succeeded", "lastTransitionTime": "t1"},
    )
    assert new[0] == {
        "type": "Planned",
        "status": "False",
        "reason": "Succeeded",
        "lastTransitionTime": "t0",
    }
    assert new[1] == old[1]
    flipped = with_condition(new, {"type": "Planned", "status": "True", "lastTransitionTime": "t2"})
    assert flipped[0]["lastTransitionTime"] == "t2"
    added = with_condition(None, {"type": "Complete", "status": "True"})
    assert added == [{"type": "Complete", "status": "True"}]
