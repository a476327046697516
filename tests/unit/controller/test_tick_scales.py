"""[M1] The controller's per-tick move checks cost O(what changed), not O(moves).

A rebalance of a large cluster queues a quarter of its partitions at once (12,500 pending moves
at 50,000 partitions) and runs them in waves, so the moves a tick decides on (closing, opening)
stay few while the pending ones are many. The work of one tick's move checks (`releases`,
`due_elections`, `check_openings`, `stuck_openings`) is counted, not timed: the Python lines they execute
(sys.settrace, comprehension iterations included) with a quarter of 1,000 and of 50,000
partitions pending, another quarter leaderless with their elections deferred, and the same few
moves closing and opening. Walking every move each tick (what `MoveTracker.in_phase` did) or
every deferral (what `due_elections` did) costs at least a line per move or deferral.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from tidalmq_controller import Controller, ControllerSettings
from tidalmq_controller._log import MemoryMetadataLog
from tidalmq_controller._moves import MoveTracker
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import Phase

SIZES = (1_000, 50_000)
FEW = 5  # moves closing, freshly opening and overdue opening at each size
OPEN_TIMEOUT_S = 30.0


def count_lines(work: Callable[[], Any]) -> int:
    lines = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def calls(frame: FrameType, event: str, arg: object) -> Any:
        return local

    sys.settrace(calls)
    try:
        work()
    finally:
        sys.settrace(None)
    return lines


def add_moves(c: Controller, partitions: int) -> None:
    """A quarter of `partitions` pending (a queued rebalance), a quarter without a leader whose
    election waits for a dead broker's lease to run out (a failover), FEW closing, FEW opening
    since now and FEW opening since longer than the open timeout (none of them in the image:
    the controller's own ticks leave them alone)."""
    lead = c.leadership
    lead.restart_guard = 0.0  # a controller past its start (its guard would defer every election)
    moves = lead.moves
    wall = time.time()
    for i in range(partitions // 4):
        tp = TopicPartition("failed-over", i)
        lead.leaderless.add(tp)
        lead._deferred.schedule(tp, time.monotonic() + 3600)
    for i in range(partitions // 4):
        moves.begin(TopicPartition("pending", i), 0, 3, Phase.PENDING)
    for i in range(FEW):
        moves.begin(TopicPartition("closing", i), 0, 3, Phase.CLOSING)
        for name, elected in (("opening", wall), ("overdue", wall - 2 * OPEN_TIMEOUT_S)):
            status = moves.begin(TopicPartition(name, i), 0, 3, Phase.ELECTING)
            status.epoch = 1
            moves.mark(status.tp, Phase.OPENING, at=elected)


def tick_checks(c: Controller) -> None:
    lead = c.leadership
    now, wall = time.monotonic(), time.time()
    lead.releases(now, wall)
    lead.due_elections(now)
    lead.stuck_openings(wall)
    lead.check_openings()


async def test_move_checks_per_tick_do_not_grow_with_pending_moves() -> None:
    work: dict[int, list[int]] = {}
    for n in SIZES:
        c = Controller(MemoryMetadataLog(), ControllerSettings(open_timeout_s=OPEN_TIMEOUT_S))
        await c.start()
        try:  # no await from here to the counts: the controller's own ticks do not interleave
            add_moves(c, n)
            # the first tick takes the new openings and the overdue ones; later ticks look at
            # the overdue ones again (they cannot be handed on: their topics are not in the image)
            work[n] = [count_lines(lambda c=c: tick_checks(c)) for _ in range(3)]
            assert c.moves.count(Phase.PENDING) == n // 4
            assert c.moves.count(Phase.OPENING) == 2 * FEW
        finally:
            await c.stop()
    small, large = work[SIZES[0]], work[SIZES[1]]
    for tick, (lines_small, lines_large) in enumerate(zip(small, large, strict=True)):
        # a line per pending move would be 12,250 more: allow a few dozen
        assert lines_large <= lines_small + 50, (tick, small, large)
    assert small[1] < small[0]  # the fresh openings were checked once


def test_openings_come_due_by_election_time_once() -> None:
    moves = MoveTracker()
    for i, elected in enumerate((30.0, 10.0, 20.0)):
        status = moves.begin(TopicPartition("t", i), 0, 1, Phase.ELECTING)
        moves.mark(status.tp, Phase.OPENING, at=elected)
    assert [m.partition for m in moves.take_new_openings()] == [0, 1, 2]
    assert moves.take_new_openings() == []
    assert moves.openings_elected_before(5.0) == []
    assert [m.partition for m in moves.openings_elected_before(25.0)] == [1, 2]
    moves.mark(TopicPartition("t", 0), Phase.DONE, at=31.0)  # opened: never due
    assert moves.openings_elected_before(99.0) == []
    again = moves.begin(TopicPartition("t", 1), 1, 0, Phase.CLOSING)  # handed on
    assert moves.in_phase(Phase.CLOSING) == [again] and moves.count(Phase.OPENING) == 1
    assert [m.partition for m in moves.in_phase(Phase.OPENING)] == [2]
