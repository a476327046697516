"""One timer for the timeouts of every group on this broker, instead of a loop a shard.

Each group with a timeout ahead is in one deadline queue (keyed by its shard and id) at the time
its earliest timeout may pass: a member's session, a KIP-394 pending member's, a rebalance's,
the initial rebalance delay, a consumer-group member's session or revocation. One
`loop.call_at` handle waits for the earliest of them all; when it fires, the groups due are
checked (timers.py) and each is queued again at its next timeout. So an idle coordinator costs
nothing between deadlines, and a wakeup costs O(groups due), not O(groups).

A deadline that moves later (a heartbeat extends a session) needs no update: the check at the
old time finds nothing due and queues the group at the new one. One that may move earlier (a
member joins, a rebalance starts, a session timeout is lowered) is queued again by the shard
(`ShardState._watch`); the queue keeps the earlier of the two.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Protocol

from tidalmq_core.deadlines import DeadlineQueue

log = logging.getLogger(__name__)


class DeadlineOwner(Protocol):
    """A shard: checks a group's timeouts when its deadline passed."""

    def deadline_passed(self, group_id: str, now: float) -> None: ...


class GroupDeadlines:
    """The deadline queue of the groups of every shard, and the one timer that serves it."""

    def __init__(self) -> None:
        self._queue: DeadlineQueue[tuple[DeadlineOwner, str]] = DeadlineQueue()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = math.inf  # when the handle fires (inf: no handle)
        self.wakeups = 0  # times the timer fired
        self.checks = 0  # groups checked because a deadline of theirs passed

    def __len__(self) -> int:
        return len(self._queue)

    def check_by(self, owner: DeadlineOwner, group_id: str, at: float) -> None:
        """Have `owner` check group `group_id` at `at` at the latest (an earlier time already
        queued stays)."""
        key = (owner, group_id)
        queued = self._queue.deadline(key)
        if queued is not None and queued <= at:
            return
        self._queue.schedule(key, at)
        if at < self._armed_at:
            self._arm(at)

    def cancel(self, owner: DeadlineOwner, group_id: str) -> None:
        self._queue.cancel((owner, group_id))

    def next_wakeup(self) -> float | None:
        """When the timer fires next (loop time), None when nothing is queued."""
        return self._armed_at if self._handle is not None else None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self._armed_at = math.inf
        self._queue = DeadlineQueue()

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_at(at, self._fire)
        self._armed_at = at

    def _fire(self) -> None:
        # the loop runs a handle up to its clock's resolution early: the time is the deadline's
        now = max(asyncio.get_running_loop().time(), self._armed_at)
        self._handle = None
        self._armed_at = math.inf
        self.wakeups += 1
        for owner, group_id in self._queue.pop_due(now):
            self.checks += 1
            try:
                owner.deadline_passed(group_id, now)
            except Exception:
                log.exception("group %s: checking its timeouts failed", group_id)
        earliest = self._queue.earliest()
        if earliest is not None and earliest < self._armed_at:
            self._arm(earliest)
