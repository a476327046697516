"""Progress of partition moves as the controller observes them (phases and timings).

The durable part of a move (original and target replicas, and when it started) is in the
cluster metadata; this is the observed part: when each step happened, for status fields, Events,
the CLI progress bar and metrics. A controller that restarts rebuilds the phases from the
metadata and broker heartbeats (a move in flight keeps its start time, so its election timeout
does not start over; the times of its earlier steps are lost).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase

MOVES = Counter("tidalmq_controller_reassignments_total", "Partition moves by outcome", ["outcome"])
MOVE_SECONDS = Histogram(
    "tidalmq_controller_reassignment_seconds",
    "Time from recording a move to the target serving (the client-visible unavailability)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


@dataclass(slots=True)
class MoveStatus:
    topic: str
    partition: int
    source: int | None
    target: int
    phase: Phase = Phase.PENDING
    reason: str = ""
    started: float = field(default_factory=time.time)
    closed: float | None = None
    elected: float | None = None
    opened: float | None = None
    finished: float | None = None
    epoch: int | None = None  # epoch the target was elected with

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def unavailable_s(self) -> float | None:
        """From the move being recorded (source stops serving) to the target serving."""
        if self.opened is None:
            return None
        return self.opened - self.started

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["phase"] = self.phase.value
        doc["unavailable_s"] = self.unavailable_s
        return doc


class MoveTracker:
    def __init__(self, keep_finished: int = 10_000) -> None:
        self._moves: dict[TopicPartition, MoveStatus] = {}
        self._finished: list[MoveStatus] = []
        self._keep = keep_finished

    def begin(self, tp: TopicPartition, source: int | None, target: int) -> MoveStatus:
        status = MoveStatus(tp.topic, tp.partition, source, target, Phase.CLOSING)
        self._moves[tp] = status
        return status

    def get(self, tp: TopicPartition) -> MoveStatus | None:
        return self._moves.get(tp)

    def active(self) -> list[MoveStatus]:
        return list(self._moves.values())

    def recent(self, limit: int = 1000) -> list[MoveStatus]:
        return self._finished[-limit:]

    def mark(self, tp: TopicPartition, phase: Phase, reason: str = "") -> MoveStatus | None:
        status = self._moves.get(tp)
        if status is None:
            return None
        now = time.time()
        status.phase = phase
        if reason:
            status.reason = reason
        if phase is Phase.ELECTING and status.closed is None:
            status.closed = now
        elif phase is Phase.OPENING:
            status.elected = now
        elif phase is Phase.DONE:
            status.opened = now
        if phase.finished:
            status.finished = now
            self._moves.pop(tp, None)
            self._finished.append(status)
            del self._finished[: -self._keep]
            MOVES.labels(phase.value.lower()).inc()
            if phase is Phase.DONE and status.unavailable_s is not None:
                MOVE_SECONDS.observe(status.unavailable_s)
        return status
