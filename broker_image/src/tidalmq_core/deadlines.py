"""Keys with a deadline each, taken when it passes: the heap behind every "O(what is due)"
periodic check (a broker's upkeep passes, the controller's deferred elections, a transaction
coordinator's timeouts), instead of a walk over everything each interval."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class DeadlineQueue(Generic[K]):
    """Keys with a deadline each (a new one replaces the old): `pop_due` returns those whose
    deadline passed, earliest first, in O(due log n). Replaced deadlines stay in the heap until
    popped or until they outnumber the live ones (then the heap is rebuilt)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._at: dict[K, float] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def deadline(self, key: K) -> float | None:
        return self._at.get(key)

    def schedule(self, key: K, at: float) -> None:
        if self._at.get(key) == at:
            return
        self._at[key] = at
        heapq.heappush(self._heap, (at, next(self._seq), key))
        if len(self._heap) > 2 * len(self._at) + 64:
            self._heap = [(t, next(self._seq), k) for k, t in self._at.items()]
            heapq.heapify(self._heap)

    def earliest(self) -> float | None:
        """The earliest deadline of any key (None when there is none)."""
        heap = self._heap
        while heap and self._at.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # a replaced or cancelled deadline
        return heap[0][0] if heap else None

    def cancel(self, key: K) -> None:
        self._at.pop(key, None)

    def pop_due(self, now: float) -> list[K]:
        due: list[K] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, key = heapq.heappop(heap)
            if self._at.get(key) == at:
                del self._at[key]
                due.append(key)
        return due
