"""Which open partitions each periodic upkeep pass looks at: only those that changed or are due.

The engine's passes (checkpoints, WAL-to-segment compaction, the log cleaner, retention) used to
walk every open partition each interval and test it cheaply: at 50,000 open partitions that was
50,000 tests per pass per interval, on the event loop, for a broker with nothing to do. Here each
pass has

- a set of the partitions changed since the pass last ran (a flush, a new segment, a config
  change, an open): the engine adds them as they change; and
- a queue of deadlines (a heap keyed by when a partition is next due, at most one per partition):
  an idle partition's oldest WAL range reaching compaction_idle_s, a partition's oldest segment
  reaching retention.ms.

A pass takes both (`take`), does its work on each, and says when each is next due (`due_at`, or
nothing: only a change brings it back). So a pass costs O(partitions changed or due), whatever
the number of open partitions; `taken` counts what the passes were given (for tests and the
benchmark).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from tidalmq_core.deadlines import DeadlineQueue

K = TypeVar("K", bound=Hashable)

CHECKPOINTS = "checkpoints"
COMPACTION = "compaction"
CLEANER = "cleaner"
RETENTION = "retention"
PASSES = (CHECKPOINTS, COMPACTION, CLEANER, RETENTION)


class UpkeepSchedule(Generic[K]):
    """Per pass: the partitions changed since it last ran, and the deadlines it set."""

    def __init__(self) -> None:
        self._changed: dict[str, set[K]] = {name: set() for name in PASSES}
        self._deadlines: dict[str, DeadlineQueue[K]] = {name: DeadlineQueue() for name in PASSES}
        self.taken: dict[str, int] = dict.fromkeys(PASSES, 0)  # partitions given to each pass

    def changed(self, key: K) -> None:
        """Something a checkpoint carries changed (a flush, a new segment, a config): every
        pass looks at it the next time it runs."""
        for changed in self._changed.values():
            changed.add(key)

    def again(self, name: str, key: K) -> None:
        """`name` looks at `key` again the next time it runs (it failed, or is not done)."""
        self._changed[name].add(key)

    def due_at(self, name: str, key: K, at: float | None) -> None:
        """`name` looks at `key` again at `at` (on its own clock), or only on a change (None)."""
        if at is None:
            self._deadlines[name].cancel(key)
        else:
            self._deadlines[name].schedule(key, at)

    def forget(self, key: K) -> None:
        """The partition is no longer open here."""
        for name in PASSES:
            self._changed[name].discard(key)
            self._deadlines[name].cancel(key)

    def take(self, name: str, now: float) -> list[K]:
        """What `name` looks at now: changed since its last run, or due by `now`. Each once."""
        changed, self._changed[name] = self._changed[name], set()
        for key in self._deadlines[name].pop_due(now):
            changed.add(key)
        for key in changed:
            self._deadlines[name].cancel(key)  # the pass sets the next deadline itself
        self.taken[name] += len(changed)
        return list(changed)

    def pending(self, name: str) -> int:
        """Partitions `name` has a change or a deadline of (for tests)."""
        return len(self._changed[name]) + len(self._deadlines[name])
