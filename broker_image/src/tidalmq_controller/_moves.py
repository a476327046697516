"""Partition moves as the controller runs them: one `MoveStatus` per move, with explicit steps.

The durable part of a move (original and target replicas, and when its source was asked to
close) is in the cluster metadata; this is the observed part and the controller's bookkeeping:
when each step happened (status fields, Events, the CLI progress bar, metrics), the metadata
version at which the close was recorded, and whether the source reported it closed.

    Pending   queued: the target is recorded, the source still serves (waits for its wave)
    Closing   the source was asked to close (leader none) at `recorded_version`
    Electing  the source closed (or its lease ran out): the target is being elected
    Opening   the target leads at `epoch` and opens the partition
    Done      the target reported it open at `epoch`
    Cancelled rolled back to the source (a user's cancel, or its target went away before the
              election); Failed: could not complete (topic deleted, or the target went away
              after its election, before it opened the partition)

Each end of a move *attempt* (one source, one target) is counted once, in
`tidalmq_controller_reassignments_total{outcome}`, with an `Outcome` that says what happened, not
only the phase it ended in: a move rolled back because its target went away is Cancelled like a
user's cancel, but counted `target_lost`; a target that did not open in time has its move handed
on to another broker (a new attempt replaces the record) and the old attempt is counted
`retargeted`. docs/architecture/partition-move.md ("How a move ends") lists every path.

`release` decides, from the move alone, the source's liveness and a clock, whether the target
may be elected now, the source must be fenced, or the move waits: a unit test drives it with a
fake clock. A controller that restarts rebuilds the moves from the metadata (a move that was
closing keeps its durable start, so its election timeout does not start over).
"""

from __future__ import annotations

import enum
import heapq
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase

MOVES = Counter(
    "tidalmq_controller_reassignments_total",
    "Partition move attempts ended, by outcome (Outcome: done, cancelled, failed, target_lost, "
    "retargeted, superseded)",
    ["outcome"],
)
MOVE_SECONDS = Histogram(
    "tidalmq_controller_reassignment_seconds",
    "Time from recording a move to the target serving (the client-visible unavailability)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
MOVES_IN_FLIGHT = Gauge(
    "tidalmq_controller_moves_in_flight", "Moves started and not finished, by phase", ["phase"]
)


class Outcome(enum.StrEnum):
    """How one move attempt ended: the `outcome` label (bounded: these six values only)."""

    DONE = "done"  # the target serves the partition
    CANCELLED = "cancelled"  # a user's cancel (or a reassignment back to the original broker)
    FAILED = "failed"  # the topic was deleted under the move
    TARGET_LOST = "target_lost"  # the target broker went away before it served the partition
    RETARGETED = "retargeted"  # the target did not open it within the open timeout: handed on
    SUPERSEDED = "superseded"  # a new reassignment of the partition replaced a move still opening

    @classmethod
    def of(cls, phase: Phase) -> Outcome:
        """The outcome a finished phase counts as unless the caller says otherwise."""
        return {Phase.DONE: cls.DONE, Phase.CANCELLED: cls.CANCELLED}.get(phase, cls.FAILED)


# the outcomes an operator must look at (TidalMQMovesFailing): not a user's cancel, not done
TROUBLE = (Outcome.FAILED, Outcome.TARGET_LOST, Outcome.RETARGETED)


class Release(enum.Enum):
    WAIT = "wait"
    ELECT = "elect"  # the source no longer acknowledges writes: elect the target
    FENCE = "fence"  # the source did not close within the election timeout: fence it


@dataclass(slots=True)
class SourceView:
    """What the controller knows of a move's source when deciding."""

    registered: bool  # in the metadata and not dead
    known: bool  # its open partitions are known to this controller
    has_it_open: bool  # it reports the partition open
    # the metadata version it has applied, as its last heartbeat said; -1 until the first
    # heartbeat of this incarnation to this controller (a registration does not say)
    applied_version: int
    fenced: bool
    lease_end: float  # monotonic: every lease it may hold has run out by then
    # seconds since this controller first heard from it (its registration or its first
    # heartbeat to this controller); None: silent since this controller started
    heard_s: float | None = None


@dataclass(slots=True)
class MoveStatus:
    topic: str
    partition: int
    source: int | None
    target: int
    phase: Phase = Phase.PENDING
    reason: str = ""
    started: float = field(default_factory=time.time)  # wall clock, for status and figures
    closed: float | None = None
    elected: float | None = None
    opened: float | None = None
    finished: float | None = None
    epoch: int | None = None  # epoch the target was elected with
    outcome: str = ""  # an Outcome's value once the move ended (or was replaced)
    # bookkeeping (not shown): the version that recorded the close, the source's report
    recorded_version: int = -1
    closed_reported: bool = False

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def unavailable_s(self) -> float | None:
        """From the move's start (the source stops serving) to the target serving."""
        if self.opened is None:
            return None
        return self.opened - self.started

    @property
    def in_flight(self) -> bool:
        return self.phase in (Phase.CLOSING, Phase.ELECTING, Phase.OPENING)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["recorded_version"], doc["closed_reported"]
        doc["phase"] = self.phase.value
        doc["unavailable_s"] = self.unavailable_s
        return doc

    # ------------------------------------------------------------------ the steps
    def release(
        self,
        now: float,
        wall: float,
        source: SourceView | None,
        not_before: float,
        election_timeout_s: float,
    ) -> Release:
        """May the target be elected now (the source certainly acknowledges no more)?"""
        if self.phase is not Phase.CLOSING:
            return Release.WAIT
        if self.closed_reported:
            return Release.ELECT  # closed at the move's epoch: it acknowledges no more
        if now < not_before:
            return Release.WAIT  # an earlier owner may still hold a lease on it
        if source is None or not source.registered:
            return Release.ELECT
        if source.fenced:
            return Release.ELECT if now >= source.lease_end else Release.WAIT
        if (
            source.known
            and source.applied_version >= self.recorded_version
            and not source.has_it_open
        ):
            return Release.ELECT  # it applied the close and does not have it open
        if wall - self.started <= election_timeout_s:
            return Release.WAIT
        # The timeout counts from the durable start of the close, across controller restarts;
        # but only a source that could have closed is to blame. One silent since this
        # controller started (down, or not through to it yet: it may not even have the close)
        # is the session timeout's business: declared dead, its move elects at once. One that
        # has not told this controller what it has open, or which metadata it applied (no
        # heartbeat since it registered: a new incarnation catching up before its first
        # one), gets to, for a timeout at most. Fencing a new incarnation then, for a close
        # its predecessor was sent, made it register again, to be fenced again before its
        # first heartbeat: a livelock (docs/control-plane.md, "A controller restart").
        if source.heard_s is None:
            return Release.WAIT
        told = source.known and source.applied_version >= 0
        if not told and source.heard_s <= election_timeout_s:
            return Release.WAIT
        return Release.FENCE


class MoveTracker:
    """Every move not finished, indexed by phase, so a tick looks at the moves in the phase it
    decides on (a rebalance of the whole cluster queues thousands of pending moves: no tick
    walks them). Two views of the opening moves cost O(what changed): `take_new_openings`
    (entered Opening since the last call) and `openings_elected_before` (a heap by election
    time)."""

    def __init__(self, keep_finished: int = 10_000) -> None:
        self._moves: dict[TopicPartition, MoveStatus] = {}
        self._finished: list[MoveStatus] = []
        self._keep = keep_finished
        self._inflight: dict[int, int] = {}  # broker -> moves in flight it is source or target of
        self._phases: dict[Phase, int] = {}
        self._by_phase: dict[Phase, dict[TopicPartition, MoveStatus]] = {}
        self._new_openings: dict[TopicPartition, MoveStatus] = {}
        self._elected: list[tuple[float, int, MoveStatus]] = []  # heap: (elected, seq, move)
        self._seq = 0
        self._gauges: dict[Phase, Any] = {}  # MOVES_IN_FLIGHT's child per phase
        # every outcome's series exists from the controller's start, at 0: Prometheus'
        # increase() sees no increase in a series that first appears at 1, so without this
        # the first failed move never fired TidalMQMovesFailing (nor did the first done move
        # count in TidalMQMoveStuck). Here, not at import: brokers import this module too
        self._outcomes = {outcome: MOVES.labels(outcome.value) for outcome in Outcome}

    def begin(
        self,
        tp: TopicPartition,
        source: int | None,
        target: int,
        phase: Phase = Phase.CLOSING,
        *,
        replaces: Outcome = Outcome.SUPERSEDED,
    ) -> MoveStatus:
        """A new move attempt of `tp`. One that was not finished (a target still opening) ends
        here, counted as `replaces`: it is not listed among the finished moves (the new attempt
        is the partition's move; its reason says why it was handed on)."""
        old = self._moves.get(tp)
        if old is not None:
            self._count(old, -1)
            old.outcome = replaces.value
            old.finished = time.time()
            self._outcomes[replaces].inc()
        status = MoveStatus(tp.topic, tp.partition, source, target, phase)
        self._moves[tp] = status
        self._count(status, +1)
        return status

    def get(self, tp: TopicPartition) -> MoveStatus | None:
        return self._moves.get(tp)

    def active(self) -> list[MoveStatus]:
        return list(self._moves.values())

    def in_phase(self, phase: Phase) -> list[MoveStatus]:
        return list(self._by_phase.get(phase, {}).values())

    def take_new_openings(self) -> list[MoveStatus]:
        """The moves that entered Opening since the last call and are still opening."""
        fresh = [m for m in self._new_openings.values() if self._opening(m)]
        self._new_openings = {}
        return fresh

    def opening_since(self, status: MoveStatus) -> None:
        """`status.elected` was set: its open timeout counts from then."""
        if status.elected is not None and self._opening(status):
            self._seq += 1
            heapq.heappush(self._elected, (status.elected, self._seq, status))

    def opening(self, tp: TopicPartition) -> MoveStatus | None:
        """The move of `tp` if it is opening (O(1))."""
        return self._by_phase.get(Phase.OPENING, {}).get(tp)

    def reelected(self, status: MoveStatus, epoch: int, at: float | None = None) -> None:
        """The target of an opening move was elected again, at `epoch` (a new incarnation of it
        took its partitions back, fencing the one elected first): the move now waits for an
        open at that epoch, its open timeout counting from this election."""
        status.epoch = epoch
        status.elected = time.time() if at is None else at
        if self._opening(status):
            self._new_openings[status.tp] = status  # it may already be open at that epoch
            self.opening_since(status)

    def openings_elected_before(self, wall: float) -> list[MoveStatus]:
        """Opening moves elected before `wall` that were not returned before (O(those))."""
        out: list[MoveStatus] = []
        heap = self._elected
        while heap and heap[0][0] < wall:
            elected, _, status = heapq.heappop(heap)
            if self._opening(status) and status.elected == elected:
                out.append(status)
        return out

    def _opening(self, status: MoveStatus) -> bool:
        return status.phase is Phase.OPENING and self._moves.get(status.tp) is status

    def count(self, phase: Phase) -> int:
        return self._phases.get(phase, 0)

    def inflight_on(self, broker: int | None) -> int:
        return self._inflight.get(broker, 0) if broker is not None else 0

    def recent(self, limit: int = 1000) -> list[MoveStatus]:
        return self._finished[-limit:]

    def retarget(self, tp: TopicPartition, target: int) -> None:
        status = self._moves.get(tp)
        if status is not None:
            self._count(status, -1)
            status.target = target
            self._count(status, +1)

    def _count(self, status: MoveStatus, sign: int) -> None:
        n = self._phases[status.phase] = self._phases.get(status.phase, 0) + sign
        in_phase = self._by_phase.setdefault(status.phase, {})
        if sign > 0:
            in_phase[status.tp] = status
            if status.phase is Phase.OPENING:
                self._new_openings[status.tp] = status
        elif in_phase.get(status.tp) is status:
            del in_phase[status.tp]
        gauge = self._gauges.get(status.phase)
        if gauge is None:  # resolving the label each time cost a rebalance a tenth of its CPU
            gauge = self._gauges[status.phase] = MOVES_IN_FLIGHT.labels(status.phase.value)
        gauge.set(n)
        if status.in_flight:
            for b in {status.source, status.target}:
                if b is not None:
                    self._inflight[b] = self._inflight.get(b, 0) + sign

    def attempt_ended(self, outcome: Outcome) -> None:
        """A move goes on to another target in place (its record continues): the attempt on
        the old target is counted."""
        self._outcomes[outcome].inc()

    def mark(
        self,
        tp: TopicPartition,
        phase: Phase,
        reason: str = "",
        at: float | None = None,
        *,
        outcome: Outcome | None = None,
    ) -> MoveStatus | None:
        """Move `tp` to `phase`; a finished phase counts the move once, as `outcome` (by
        default the phase's own: done, cancelled, failed)."""
        status = self._moves.get(tp)
        if status is None:
            return None
        now = time.time() if at is None else at
        self._count(status, -1)
        status.phase = phase
        if reason:
            status.reason = reason
        if phase is Phase.CLOSING:
            status.started = now
        elif phase is Phase.ELECTING and status.closed is None:
            status.closed = now
        elif phase is Phase.OPENING:
            status.elected = now
        elif phase is Phase.DONE:
            status.opened = now
        if phase.finished:
            status.finished = now
            self._moves.pop(tp, None)
            self._finished.append(status)
            if len(self._finished) > 2 * self._keep:
                del self._finished[: -self._keep]
            ended = outcome if outcome is not None else Outcome.of(phase)
            status.outcome = ended.value
            self._outcomes[ended].inc()
            if phase is Phase.DONE and status.unavailable_s is not None:
                MOVE_SECONDS.observe(status.unavailable_s)
        else:
            self._count(status, +1)
            if phase is Phase.OPENING:
                self.opening_since(status)
        return status
