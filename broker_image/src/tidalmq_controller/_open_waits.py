"""CreateTopics (and the transaction state topic) waiting for their partitions to open.

Owns: the waits of requests that answer only once every new partition is open on its leader at
its current epoch (so a client that produces right after creating gets no
LEADER_NOT_AVAILABLE): each wait's pending partitions, struck off as brokers report them open,
and checked in full once a second (an open known only from a heartbeat's full report, a leader
changed by a move).

Must not touch: the partitions or their leaders (it only reads leadership and membership).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.model import TopicPartition

from tidalmq_controller._leadership import Leadership
from tidalmq_controller._membership import Membership


class _OpenWaiter:
    """A CreateTopics waiting for its partitions to be open on their leaders."""

    __slots__ = ("done", "pending")

    def __init__(self, pending: set[TopicPartition]) -> None:
        self.pending = pending
        self.done = asyncio.Event()


class OpenWaits:
    """The waits in progress; `observe` is told of every partition reported open."""

    def __init__(
        self, image: Callable[[], ClusterMetadata], leadership: Leadership, membership: Membership
    ) -> None:
        self._image = image
        self._leadership = leadership
        self._membership = membership
        self.waiting: list[_OpenWaiter] = []

    def observe(self, opened: set[TopicPartition]) -> None:
        """Partitions a broker reported open: strike them off the waits they end."""
        for waiter in self.waiting:
            for tp in opened & waiter.pending:
                if self.open_at_epoch(tp):
                    waiter.pending.discard(tp)
            if not waiter.pending:
                waiter.done.set()

    async def wait(self, topics: list[str], wait_s: float, first_partition: int = 0) -> bool:
        """Until the leaders of these topics' partitions report them open at their epoch. The
        reports strike partitions off (O(reported)); every pending partition is checked in full
        once a second only (an open known from a heartbeat's full report, a leader changed by
        a move), not every few milliseconds: 6,000 of them took a third of a busy controller's
        time."""
        deadline = time.monotonic() + wait_s
        # reports that came while the records were being committed (the image had them
        # already) struck nothing off: look once now, O(new partitions), rather than leave
        # them to the check once a second. One pass over the topics' partitions as the image
        # holds them (no set of all of them first, no lookup of each by name)
        is_open = self._membership.is_open
        image_topics = self._image().topics
        pending: set[TopicPartition] = set()
        for name in topics:
            topic = image_topics.get(name)
            if topic is None:
                continue
            parts = topic.partitions
            for i in range(first_partition, len(parts)):
                part = parts[i]
                tp = TopicPartition(name, i)
                if not is_open(part.leader, tp, part.leader_epoch):
                    pending.add(tp)
        waiter = _OpenWaiter(pending)
        if not waiter.pending:
            return True
        self.waiting.append(waiter)
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.done.wait(), min(remaining, 1.0))
                waiter.pending = {tp for tp in waiter.pending if not self.open_at_epoch(tp)}
                if not waiter.pending:
                    return True
        finally:
            self.waiting.remove(waiter)

    def open_at_epoch(self, tp: TopicPartition) -> bool:
        """The partition's leader reported it open at its current epoch (or it is gone)."""
        part = self._leadership.partition(tp)
        return part is None or self._membership.is_open(part.leader, tp, part.leader_epoch)
