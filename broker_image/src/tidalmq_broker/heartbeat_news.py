"""How much a broker's heartbeat carries: what changed, spread over heartbeats, oldest first.

A heartbeat reports the partitions that opened or closed since the controller last acknowledged,
and the high watermarks and acknowledged ends (floors) of those that changed. It is answered on
the controller's liveness thread, which shares the GIL with the controller's busy event loop:
one that carried every partition a topic's creation opened on the broker (11,000 opens and
floors, 1 MB of JSON) took 40-90 ms to answer where a small one takes 1-30 ms
(bench/metadata_scale.py, scenario at 50,000 partitions), so heartbeats carry at most
`NEWS_PER_HEARTBEAT` partitions of each kind and the next ones the rest. Nothing waits for that
news: a partition's opening and closing reach the controller at once through the partition
reports (the broker's report loop, in batches, not capped), which finish moves and creations;
the heartbeats confirm the same to the liveness table and carry the floors, which the controller
commits every few seconds anyway. A resync (the controller asked for everything) is not spread:
it names every open partition at once, and happens once per controller or registration.

`PendingLooks` keeps the partitions to look at in the order they first changed, so those left
for a later heartbeat go before any that changed since: a thousand partitions written to all
the time cannot starve the others.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from tidalmq_core.model import TopicPartition

NEWS_PER_HEARTBEAT = 1000


class PendingLooks:
    """Partitions the next heartbeats look at (opened, closed, high watermark advanced, wish
    changed), oldest first."""

    def __init__(self, per_heartbeat: int = NEWS_PER_HEARTBEAT) -> None:
        self.per_heartbeat = per_heartbeat
        self._order: dict[TopicPartition, None] = {}  # a dict for its insertion order

    def add(self, tps: Iterable[TopicPartition]) -> None:
        """Changed partitions; one already waiting keeps its place."""
        self._order.update(dict.fromkeys(tps))

    def next(self) -> set[TopicPartition]:
        """The next heartbeat's share: the `per_heartbeat` that have waited longest."""
        return set(itertools.islice(self._order, self.per_heartbeat))

    def all(self) -> set[TopicPartition]:
        return set(self._order)

    def done(self, looked: Iterable[TopicPartition]) -> None:
        """A heartbeat that looked at these was answered."""
        for tp in looked:
            self._order.pop(tp, None)

    def __len__(self) -> int:
        return len(self._order)
