"""Produce appends held through a partition's handover instead of answered with an error.

A move closes the partition on its source, the controller elects the target, the target opens
it (docs/architecture/partition-move.md): ~30 ms in all, during which the partition has no
leader and then a leader that is not serving yet. Answered at once, a producer is told
NOT_LEADER_OR_FOLLOWER with no leader to name (KIP-951 cannot help: there is none yet), asks
Metadata, is told LEADER_NOT_AVAILABLE, backs off (librdkafka doubles its backoff each time),
then meets the target still opening and backs off again: 130-250 ms per move for ~30 ms of
handover, and more for a scale-in's waves (docs/performance.md, "Leader discovery").

So a produce request's partition in a handover is *held*, up to `produce_handover_wait_ms`
(and never past half the request's own timeout), and tried again when something about it
changes:
- leaderless in this broker's metadata image (closing on its source, electing, its broker
  dead and not failed over yet): tried again when a metadata change names it. If the image
  then names another leader, the answer is NOT_LEADER_OR_FOLLOWER *with that leader* (KIP-951),
  and the producer goes there without a Metadata round trip or a backoff;
- opening here (elected, its checkpoint being read): tried again when the open completes,
  and appended then.

Only a request with nothing else appended here is held. One answer carries every partition of
a request, so holding one in its handover would hold back the acknowledgements of the others
until the slowest handover ended: on a draining broker those of its partitions that have not
moved yet, on a target those it has opened already. That widened the end-to-end scale-in's
per-partition worst wait (docs/performance.md). Such a request's partitions in a handover are
answered at once with the error they would have been held on (apis/produce.py).

Held appends of a partition are tried again in arrival order, synchronously, and a request
arriving while some are held queues behind them, so pipelined requests keep their order (an
idempotent producer's sequence numbers, a plain producer's records). Past its wait a held
append is answered with the error it was held on, as before (the client backs off and
retries), and is never started afterwards. What a held request costs is what any request in
flight costs: it stays charged to its connection's and the broker's request bounds.

Counted in `tidalmq_produce_handover_holds_total{outcome}` (served here, redirected to the new
leader, timed_out, failed) and `tidalmq_produce_handover_hold_seconds`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tidalmq_core.model import TopicPartition
from tidalmq_core.records import MetadataDelta

from tidalmq_broker import metrics

Retry = Callable[[], bool]
"""Tries a held append again: True when it is settled (started, or answered an error), False
when its partition is still in its handover (it is then held again, in its place). It never
holds anything itself."""


@dataclass(slots=True, eq=False)
class HeldAppend:
    tp: TopicPartition
    retry: Retry
    expire: Callable[[], None]  # answers it with the error it was held on (its wait is over)
    held_at: float
    timer: asyncio.TimerHandle | None = field(default=None)


class Handovers:
    """The appends held for partitions in a handover on this broker (O(held) per change)."""

    def __init__(self, broker_id: int) -> None:
        self._held: dict[TopicPartition, deque[HeldAppend]] = {}
        self._outcomes = {
            outcome: metrics.HANDOVER_HOLDS.labels(str(broker_id), outcome)
            for outcome in ("served", "redirected", "timed_out", "failed")
        }
        self._seconds = metrics.HANDOVER_HOLD_SECONDS.labels(str(broker_id))

    def holding(self, tp: TopicPartition) -> bool:
        """Whether appends of `tp` are held (a new one then queues behind them)."""
        return tp in self._held

    def held(self) -> int:
        return sum(len(q) for q in self._held.values())

    def hold(
        self, tp: TopicPartition, retry: Retry, expire: Callable[[], None], wait_s: float
    ) -> None:
        """Hold an append of `tp` for at most `wait_s`, behind those held already."""
        entry = HeldAppend(tp, retry, expire, time.monotonic())
        entry.timer = asyncio.get_running_loop().call_later(wait_s, self._expire, entry)
        queue = self._held.get(tp)
        if queue is None:
            queue = self._held[tp] = deque()
        queue.append(entry)

    def settled(self, entry_outcome: str, held_at: float) -> None:
        """A held append ended with `entry_outcome` ("served", "redirected", "failed",
        "timed_out")."""
        self._outcomes[entry_outcome].inc()
        self._seconds.observe(time.monotonic() - held_at)

    # ------------------------------------------------------------ what wakes them
    def changed(self, tp: TopicPartition) -> None:
        """Something about `tp` changed (opened here, lost, its metadata): try its held appends
        again, in order; those still in a handover are held again in their places."""
        queue = self._held.pop(tp, None)
        if queue is None:
            return
        while queue:
            entry = queue.popleft()
            if entry.retry():
                if entry.timer is not None:
                    entry.timer.cancel()
                continue
            # still handing over: this one and every later one wait on, in order (a later one
            # must not start before it)
            queue.appendleft(entry)
            self._held[tp] = queue
            return

    def metadata_changed(self, delta: MetadataDelta) -> None:
        """A metadata delta was applied: the held partitions it names are tried again."""
        if not self._held:
            return
        for tp in [
            tp
            for tp in self._held
            if tp in delta.partitions
            or tp.topic in delta.topics
            or tp.topic in delta.removed_topics
        ]:
            self.changed(tp)

    def everything_changed(self) -> None:
        """A whole new image (a snapshot): every held partition is tried again."""
        for tp in list(self._held):
            self.changed(tp)

    def release_all(self) -> None:
        """The broker stops: every held append is answered with the error it was held on."""
        held, self._held = self._held, {}
        for queue in held.values():
            for entry in queue:
                if entry.timer is not None:
                    entry.timer.cancel()
                self._answer_expired(entry)

    def _expire(self, entry: HeldAppend) -> None:
        queue = self._held.get(entry.tp)
        if queue is None or entry not in queue:
            return
        queue.remove(entry)
        if not queue:
            del self._held[entry.tp]
        self._answer_expired(entry)

    def _answer_expired(self, entry: HeldAppend) -> None:
        self.settled("timed_out", entry.held_at)
        entry.expire()
