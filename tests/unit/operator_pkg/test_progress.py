"""A PartitionReassignment's status rows and step Events (tidalmq_operator.progress): finished
rows survive an operator restart with their figures, and every step of a move is announced once,
in order, with the tracker's own time, however short it was."""

from __future__ import annotations

from typing import Any

from tidalmq_controller import MoveStatus
from tidalmq_core.metadata import PartitionState
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase, PlanEntry
from tidalmq_operator.progress import (
    RESUMED_NOTE,
    now_iso,
    reassignment_row,
    steps_of,
    steps_to_emit,
    summary,
)

TP = TopicPartition("orders", 3)
ENTRY = PlanEntry(TP, 2)
T0 = 1_800_000_000.0


def move(phase: Phase, **kw: Any) -> MoveStatus:
    return MoveStatus("orders", 3, 0, 2, phase, started=kw.pop("started", T0), **kw)


def done_move() -> MoveStatus:
    return move(
        Phase.DONE,
        closed=T0 + 0.2,
        elected=T0 + 0.2,
        opened=T0 + 0.35,
        finished=T0 + 0.35,
        epoch=7,
        reason="requested",
    )


def part(leader: int, *, moving_to: int | None = None) -> PartitionState:
    if moving_to is None:
        return PartitionState(leader, 7, [leader])
    return PartitionState(
        -1, 6, [moving_to], original_replicas=[leader], target_replicas=[moving_to]
    )


def test_every_step_of_a_move_is_announced_in_order_with_its_own_time() -> None:
    steps = steps_of(done_move())
    assert [s.phase for s in steps] == ["Closing", "Electing", "Opening", "Done"]
    assert [s.at for s in steps] == [T0, T0 + 0.2, T0 + 0.2, T0 + 0.35]
    assert "unavailable 350 ms" in steps[-1].message
    assert "epoch 7" in steps[2].message


def test_steps_missed_between_two_polls_are_all_emitted_once() -> None:
    # the last poll saw Closing; the move has since been elected, opened and finished
    todo = steps_to_emit(done_move(), "Done", "Closing", str(TP))
    assert [s.phase for s in todo] == ["Electing", "Opening", "Done"]
    # nothing twice: once Done was announced, nothing more
    assert steps_to_emit(done_move(), "Done", "Done", str(TP)) == []
    # a fresh operator (nothing announced yet) announces every step
    assert len(steps_to_emit(done_move(), "Done", None, str(TP))) == 4


def test_a_cancelled_move_goes_from_closing_to_cancelled() -> None:
    m = move(
        Phase.CANCELLED, finished=T0 + 3, reason="cancelled: rolled back to the original broker"
    )
    assert [s.phase for s in steps_of(m)] == ["Closing", "Cancelled"]
    assert [s.phase for s in steps_to_emit(m, "Cancelled", "Closing", str(TP))] == ["Cancelled"]


def test_a_move_whose_target_went_away_ends_with_a_warning_and_a_users_cancel_without() -> None:
    """The Event of a move's end is a warning when the move ended in trouble (its target lost,
    its topic deleted), not when a user cancelled it."""
    users = move(Phase.CANCELLED, finished=T0 + 3, outcome="cancelled", reason="cancelled")
    lost = move(
        Phase.CANCELLED,
        finished=T0 + 3,
        outcome="target_lost",
        reason="target broker 2 went away: rolled back to broker 0",
    )
    failed = move(Phase.FAILED, finished=T0 + 3, outcome="target_lost", reason="target gone")
    assert [s.warning for s in steps_of(users)] == [False, False]
    assert [(s.warning, s.message) for s in steps_of(lost)][-1] == (
        True,
        "orders-3: target broker 2 went away: rolled back to broker 0",
    )
    assert steps_of(failed)[-1].warning


def test_without_a_tracked_move_the_metadata_decides_and_is_announced_once() -> None:
    todo = steps_to_emit(None, "Done", "Opening", str(TP))
    assert [(s.phase, s.at) for s in todo] == [("Done", None)]
    assert steps_to_emit(None, "Opening", "Opening", str(TP)) == []


def test_a_row_from_the_tracker_has_the_moves_figures() -> None:
    row = reassignment_row(ENTRY, done_move(), None, part(2), cancel_requested=False)
    assert row == {
        "topic": "orders",
        "partition": 3,
        "target": 2,
        "source": 0,
        "phase": "Done",
        "startTime": now_iso(T0),
        "endTime": now_iso(T0 + 0.35),
        "unavailableMs": 350,
        "message": "requested",
    }


def test_a_finished_row_keeps_its_figures_after_an_operator_restart() -> None:
    before = reassignment_row(ENTRY, done_move(), None, part(2), cancel_requested=False)
    # the restarted operator's controller no longer tracks that move
    after = reassignment_row(ENTRY, None, before, part(2), cancel_requested=False)
    assert after == before
    # and a later move of the same partition (a rebalance) does not rewrite it
    later = move(Phase.CLOSING, started=T0 + 60)
    assert (
        reassignment_row(ENTRY, later, before, part(2, moving_to=1), cancel_requested=False)
        == before
    )


def test_a_move_in_flight_across_a_restart_keeps_its_start() -> None:
    before = {
        "topic": "orders",
        "partition": 3,
        "target": 2,
        "source": 0,
        "phase": "Closing",
        "startTime": now_iso(T0),
    }
    resumed = move(
        Phase.DONE,
        started=T0 + 30,
        closed=T0 + 30.1,
        elected=T0 + 30.1,
        opened=T0 + 30.2,
        finished=T0 + 30.2,
        reason="resumed after controller restart",
    )
    row = reassignment_row(ENTRY, resumed, before, part(2), cancel_requested=False)
    assert row["startTime"] == now_iso(T0) and row["endTime"] == now_iso(T0 + 30.2)
    assert RESUMED_NOTE in row["message"]


def test_a_move_resumed_from_its_durable_start_keeps_the_reported_start() -> None:
    """The durable start is stamped before the metadata commit, the first tracker's after it:
    across a second boundary the resumed move looked as if it had started a second earlier."""
    before = {
        "topic": "orders",
        "partition": 3,
        "target": 2,
        "source": 0,
        "phase": "Closing",
        "startTime": now_iso(T0 + 1),
    }
    resumed = move(
        Phase.OPENING,
        started=T0 + 0.98,
        closed=T0 + 5,
        elected=T0 + 5,
        reason="resumed after controller restart",
    )
    row = reassignment_row(ENTRY, resumed, before, part(0, moving_to=2), cancel_requested=False)
    assert row["startTime"] == now_iso(T0 + 1) and row["phase"] == "Opening"
    assert row["message"] == "resumed after controller restart"  # not timed again


def test_untracked_rows_follow_the_metadata() -> None:
    pending = {
        "topic": "orders",
        "partition": 3,
        "target": 2,
        "source": 0,
        "phase": "Closing",
        "startTime": now_iso(T0),
    }
    landed = reassignment_row(ENTRY, None, pending, part(2), cancel_requested=False)
    assert (
        landed["phase"] == "Done" and landed["startTime"] == now_iso(T0) and landed["source"] == 0
    )
    # still moving: unchanged
    moving = reassignment_row(ENTRY, None, pending, part(0, moving_to=2), cancel_requested=False)
    assert moving["phase"] == "Closing"
    # back on its source after a cancel (rolled back while no operator watched)
    back = reassignment_row(ENTRY, None, pending, part(0), cancel_requested=True)
    assert back["phase"] == "Cancelled"
    # ... but without a cancel, a partition elsewhere is not called Cancelled
    assert (
        reassignment_row(ENTRY, None, pending, part(0), cancel_requested=False)["phase"]
        == "Closing"
    )


def test_summary() -> None:
    rows = [{"phase": "Done"}, {"phase": "Cancelled"}, {"phase": "Done"}]
    assert summary(rows) == ("Cancelled", True, "2 of 3 moved, 1 rolled back")
    assert summary([{"phase": "Done"}, {"phase": "Closing"}])[:2] == ("Running", False)
    assert summary([{"phase": "Done"}])[:2] == ("Completed", True)
    assert summary([{"phase": "Done"}, {"phase": "Failed"}])[0] == "Failed"
    # a failure's reason is in the account (the Complete condition's message, a printer column)
    failed = [
        {"phase": "Done"},
        {"phase": "Failed", "topic": "orders", "partition": 3, "message": "broker 9 left"},
    ]
    assert summary(failed) == ("Failed", True, "1 of 2 moved, 1 failed (orders-3: broker 9 left)")


def test_a_move_elected_before_an_operator_restart_is_done_once_its_target_opened() -> None:
    """The new controller tracks only moves still recorded as moving; one elected before the
    restart is Opening until its target reports it open, and its unavailability is measured
    by the operator that saw it open (from the row's start), never silently dropped."""
    opening = {
        "topic": "orders",
        "partition": 3,
        "target": 2,
        "source": 0,
        "phase": "Opening",
        "startTime": now_iso(T0),
    }
    served = part(2)  # elected on the target: leader 2, not moving
    waiting = reassignment_row(ENTRY, None, opening, served, cancel_requested=False, opened=False)
    assert waiting["phase"] == "Opening" and "unavailableMs" not in waiting
    done = reassignment_row(
        ENTRY,
        None,
        waiting,
        served,
        cancel_requested=False,
        opened=True,
        seen_unopened=True,
        now=T0 + 2.5,
    )
    assert done["phase"] == "Done" and done["unavailableMs"] == 2500
    assert done["endTime"] == now_iso(T0 + 2.5) and "measured" in done["message"]
    # already open when first seen: Done, and the row says the figure was not measured
    late = reassignment_row(ENTRY, None, opening, served, cancel_requested=False, opened=True)
    assert late["phase"] == "Done" and "unavailableMs" not in late
    assert "not measured" in late["message"]
