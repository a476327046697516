"""One move's release decision (tidalmq_controller/_moves.py, MoveStatus.release) driven by a fake
clock, and the tracker's count of moves in flight per broker (what the waves are capped by).

Clocks: `now` is monotonic (leases, not_before), `wall` is the wall clock the election timeout
counts in (from the durable start of the close, `started`)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
from tidalmq_controller._moves import MoveStatus, MoveTracker, Release, SourceView
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase

STARTED = 1_000.0  # wall clock of the close's durable start
TIMEOUT = 10.0
RECORDED = 40  # the metadata version that recorded the close


def closing() -> MoveStatus:
    status = MoveStatus("t", 0, source=1, target=2, phase=Phase.CLOSING, started=STARTED)
    status.recorded_version = RECORDED
    return status


def serving(**changes: object) -> SourceView:
    """A live source that has the partition open and has not applied the close yet."""
    view = SourceView(
        registered=True,
        known=True,
        has_it_open=True,
        applied_version=RECORDED - 1,
        fenced=False,
        lease_end=0.0,
        heard_s=3600.0,  # this controller has heard from it for long
    )
    return dataclasses.replace(view, **changes)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 500.0  # monotonic
        self.wall = STARTED

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds


def release(
    status: MoveStatus, source: SourceView | None, clock: Clock, not_before: float = 0.0
) -> Release:
    return status.release(clock.now, clock.wall, source, not_before, TIMEOUT)


@pytest.mark.parametrize(
    "phase", [Phase.PENDING, Phase.ELECTING, Phase.OPENING, Phase.DONE, Phase.CANCELLED]
)
def test_only_a_closing_move_is_released(phase: Phase) -> None:
    status = closing()
    status.phase = phase
    status.closed_reported = True
    assert release(status, None, Clock()) is Release.WAIT


def test_a_source_serving_it_keeps_the_move_waiting() -> None:
    assert release(closing(), serving(), Clock()) is Release.WAIT


def test_the_source_reporting_it_closed_elects() -> None:
    """Closed at the move's epoch (the controller counts only such reports): that source
    acknowledges nothing more for the partition, whatever else is still pending."""
    status = closing()
    status.closed_reported = True
    clock = Clock()
    assert release(status, serving(), clock) is Release.ELECT
    assert release(status, serving(), clock, not_before=clock.now + 5) is Release.ELECT


def test_an_earlier_owners_lease_is_waited_for() -> None:
    """not_before: an earlier owner (a previous incarnation) may still hold a lease on it."""
    clock = Clock()
    not_before = clock.now + 3
    gone = serving(registered=False)
    closed = serving(has_it_open=False, applied_version=RECORDED)
    for source in (None, gone, closed):
        assert release(closing(), source, clock, not_before) is Release.WAIT
    clock.advance(3)
    for source in (None, gone, closed):
        assert release(closing(), source, clock, not_before) is Release.ELECT


def test_an_unregistered_source_elects_at_once() -> None:
    clock = Clock()
    assert release(closing(), None, clock) is Release.ELECT
    assert release(closing(), serving(registered=False), clock) is Release.ELECT


def test_a_source_that_applied_the_close_and_has_it_closed_elects() -> None:
    clock = Clock()
    assert release(closing(), serving(has_it_open=False, applied_version=RECORDED), clock) is (
        Release.ELECT
    )
    assert release(closing(), serving(has_it_open=False, applied_version=99), clock) is (
        Release.ELECT
    )


@pytest.mark.parametrize(
    "source",
    [
        serving(has_it_open=False),  # not open, but it has not seen the close yet
        serving(has_it_open=False, applied_version=RECORDED, known=False),  # open set unknown
        serving(applied_version=RECORDED),  # applied the close, still has it open
    ],
    ids=["not applied", "unknown open set", "still open"],
)
def test_a_source_not_known_to_have_closed_it_waits(source: SourceView) -> None:
    assert release(closing(), source, Clock()) is Release.WAIT


def test_the_election_timeout_fences_then_the_lease_runs_out_then_it_elects() -> None:
    clock = Clock()
    status = closing()
    clock.advance(TIMEOUT)
    assert release(status, serving(), clock) is Release.WAIT, "at the timeout: not yet"
    clock.advance(0.01)
    assert release(status, serving(), clock) is Release.FENCE
    # the controller fences it: its last lease runs out 4 s from now
    fenced = serving(fenced=True, lease_end=clock.now + 4)
    for _ in range(3):
        clock.advance(1)
        assert release(status, fenced, clock) is Release.WAIT, "no second fence, no election"
    clock.advance(1)
    assert release(status, fenced, clock) is Release.ELECT


def test_the_timeout_counts_from_the_durable_start_of_the_close() -> None:
    """A controller that restarts keeps the move's start: the timeout does not start over."""
    status = closing()
    clock = Clock()
    clock.wall = STARTED + TIMEOUT + 1  # a new controller, a moment after it started
    assert release(status, serving(), clock) is Release.FENCE


def test_a_source_silent_since_the_controller_started_is_not_fenced() -> None:
    """A restarted controller past a move's timeout, whose source has not heartbeated to it
    yet (its process is restarting too, or it is not through yet: it may not have the close):
    nothing to blame it for. Its silence is the session timeout's (dead: elected at once)."""
    status = closing()
    clock = Clock()
    clock.wall = STARTED + 10 * TIMEOUT
    assert release(status, serving(heard_s=None, known=False), clock) is Release.WAIT
    # it heartbeats: it gets to say what it has open, for a timeout at most
    assert release(status, serving(heard_s=0.1, known=False), clock) is Release.WAIT
    assert release(status, serving(heard_s=TIMEOUT + 0.1, known=False), clock) is Release.FENCE
    # it said it still has the partition open, the move long overdue: fenced
    assert release(status, serving(heard_s=0.2), clock) is Release.FENCE
    # or it had closed it: elected, no fence
    closed = serving(heard_s=0.2, has_it_open=False, applied_version=RECORDED)
    assert release(status, closed, clock) is Release.ELECT


def test_a_new_incarnation_is_not_fenced_before_its_first_heartbeat() -> None:
    """A source that registered again (a new incarnation: fenced, or restarted) has nothing open
    but has not said which metadata it applied: until its first heartbeat it could be opening
    the partition from metadata older than the close, so the move waits; fencing it there, for
    a close long overdue, made it register again and be fenced again (the livelock). It gets
    an election timeout from its registration; its first heartbeat elects."""
    status = closing()
    clock = Clock()
    clock.wall = STARTED + 10 * TIMEOUT  # the close is long overdue
    registered = serving(heard_s=0.1, has_it_open=False, applied_version=-1)
    assert release(status, registered, clock) is Release.WAIT
    stuck = serving(heard_s=TIMEOUT + 0.1, has_it_open=False, applied_version=-1)
    assert release(status, stuck, clock) is Release.FENCE
    first_heartbeat = serving(heard_s=0.5, has_it_open=False, applied_version=RECORDED + 5)
    assert release(status, first_heartbeat, clock) is Release.ELECT


def test_a_fenced_source_whose_lease_ran_out_elects_before_the_timeout() -> None:
    clock = Clock()
    assert release(closing(), serving(fenced=True, lease_end=clock.now - 1), clock) is (
        Release.ELECT
    )
    assert release(closing(), serving(fenced=True, lease_end=clock.now + 1), clock) is (
        Release.WAIT
    )


# ------------------------------------------------------------------ the tracker
TP = [TopicPartition("t", i) for i in range(4)]


def test_the_tracker_counts_moves_in_flight_per_broker() -> None:
    moves = MoveTracker()
    moves.begin(TP[0], 1, 2, Phase.PENDING)
    assert moves.inflight_on(1) == moves.inflight_on(2) == 0, "queued is not in flight"
    moves.mark(TP[0], Phase.CLOSING, at=10.0)
    moves.begin(TP[1], 1, 3)
    moves.begin(TP[2], None, 2, Phase.OPENING)  # a failover: no source
    assert (moves.inflight_on(1), moves.inflight_on(2), moves.inflight_on(3)) == (2, 2, 1)
    assert moves.inflight_on(None) == 0
    assert moves.count(Phase.CLOSING) == 2 and moves.count(Phase.OPENING) == 1
    moves.retarget(TP[1], 2)
    assert (moves.inflight_on(2), moves.inflight_on(3)) == (3, 0)
    moves.mark(TP[0], Phase.ELECTING)
    moves.mark(TP[0], Phase.OPENING)
    assert moves.inflight_on(2) == 3, "still in flight until done"
    done = moves.mark(TP[0], Phase.DONE, at=12.5)
    assert done is not None and done.unavailable_s == 2.5 and done.finished == 12.5
    assert moves.get(TP[0]) is None and moves.recent()[-1] is done
    assert (moves.inflight_on(1), moves.inflight_on(2)) == (1, 2)
    moves.begin(TP[1], 1, 3)  # begun again: the old one no longer counts
    assert (moves.inflight_on(1), moves.inflight_on(2), moves.inflight_on(3)) == (1, 1, 1)
    moves.mark(TP[1], Phase.CANCELLED)
    moves.mark(TP[2], Phase.FAILED)
    assert all(moves.inflight_on(b) == 0 for b in (1, 2, 3)) and not moves.active()
    assert moves.mark(TP[3], Phase.DONE) is None


def test_finished_moves_are_kept_bounded() -> None:
    moves = MoveTracker(keep_finished=3)
    for i in range(10):
        tp = TopicPartition("t", i)
        moves.begin(tp, 0, 1)
        moves.mark(tp, Phase.DONE)
    assert len(moves.recent()) <= 6
    assert moves.recent()[-1].partition == 9


def test_a_status_shows_no_bookkeeping() -> None:
    status = closing()
    doc = status.to_json()
    assert doc["phase"] == "Closing" and doc["unavailable_s"] is None
    assert "recorded_version" not in doc and "closed_reported" not in doc


def exposition(code: str) -> str:
    """The metrics a fresh interpreter exports after `code` (this process' other tests end
    moves of every outcome)."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            f"import prometheus_client; {code}; print(prometheus_client.generate_latest().decode())",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def test_every_outcome_is_exported_before_its_first_move() -> None:
    """Prometheus' increase() sees nothing in a series that first appears at 1: each outcome's
    series is there (at 0 until a move ends so) from the controller's start, so the first
    failed move fires TidalMQMovesFailing. A process that only imports the module (a broker)
    exports none."""
    count = re.compile(r'^tidalmq_controller_reassignments_total\{outcome="(\w+)"\} 0\.0$', re.M)
    controller = exposition("from tidalmq_controller._moves import MoveTracker; MoveTracker()")
    assert sorted(count.findall(controller)) == [
        "cancelled",
        "done",
        "failed",
        "retargeted",
        "superseded",
        "target_lost",
    ], controller
    broker = exposition("import tidalmq_controller._moves")
    assert "tidalmq_controller_reassignments_total{" not in broker, broker
