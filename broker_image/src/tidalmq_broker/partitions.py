"""The partitions this broker leads, reconciled against the controller's metadata.

Level-based: the metadata says which partitions this broker should lead and at which epoch. A
change wakes the partitions it names; a fixed pool of workers opens, closes, re-opens (higher
epoch) or deletes each until the engine matches the wish, retrying storage errors with backoff,
so a lost update is repaired by the next one. The pool bounds the work in flight and yields to
the event loop after every partition: a wave of thousands of partitions moving in or out never
holds up the broker's heartbeats or its clients.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from tidalmq_core.metadata import ClusterMetadata, DataLoss, PartitionState, TopicInfo
from tidalmq_core.model import PartitionMap, TopicPartition
from tidalmq_core.records import MetadataDelta
from tidalmq_core.topics import cleanup_policy, config_number, effective_segment_bytes

from tidalmq_broker.storage.api import (
    PartitionConfig,
    PartitionDataLost,
    PartitionFenced,
    PartitionLog,
    StorageError,
    StoreLost,
    StreamEngine,
)

log = logging.getLogger(__name__)

# A partition whose data is lost is not opened again in a loop: only when a new snapshot changes
# what is wished of it (an accepted loss bumps the epoch), or this often, to notice a restored
# store.
LOST_RETRY_S = 30.0
# a partition lost to another owner's checkpoint is looked at again after this (see `fenced`)
FENCED_RETRY_S = 1.0
FENCED_RETRY_MAX_S = 30.0
# partitions reconciled at once (each may wait on the object store)
WORKERS = 64
# How long the workers may keep the event loop per turn when reconciling needs no waiting (new
# partitions open without a store round trip): a creation's thousands of opens go in slices this
# long, one task switch per slice instead of one per partition, and requests wait at most this.
SLICE_S = 0.002


class NotLeader(Exception):
    """NOT_LEADER_OR_FOLLOWER: another broker leads this partition (or none does yet)."""


class LeaderNotAvailable(Exception):
    """LEADER_NOT_AVAILABLE: this broker will lead the partition once it has opened it."""


class PartitionOpening(LeaderNotAvailable):
    """LEADER_NOT_AVAILABLE while this broker opens a partition it was elected to lead (a
    produce request's append is held until it opens: handover.py)."""


class UnknownPartition(Exception):
    """UNKNOWN_TOPIC_OR_PARTITION"""


class PartitionStorageError(StorageError):
    """KAFKA_STORAGE_ERROR (retriable): this broker leads the partition but its data is lost
    (or the whole store is), so it serves neither appends nor reads."""


@dataclass(frozen=True, slots=True)
class Wish:
    topic_id: str
    epoch: int
    config: PartitionConfig
    created: bool = False
    end_offset_floor: int = 0
    accepted_from: int | None = None

    @classmethod
    def of(cls, topic: TopicInfo, part: PartitionState, config: PartitionConfig) -> Wish:
        """The wish for a partition of `topic` this broker leads (`part`, its metadata)."""
        return cls(
            topic.topic_id,
            part.leader_epoch,
            config,
            part.created,
            part.end_offset_floor,
            part.accepted_from,
        )

    @property
    def attempt(self) -> tuple[str, int, int | None]:
        """What a new open attempt of a lost partition must differ in to be worth it."""
        return (self.topic_id, self.epoch, self.accepted_from)


@dataclass(slots=True)
class LostPartition:
    attempt: tuple[str, int, int | None]
    loss: DataLoss
    retry_at: float  # monotonic


def partition_config(topic: TopicInfo) -> PartitionConfig:
    c = topic.effective_configs()

    def number(name: str) -> int:
        return int(config_number(name, c[name]))

    return PartitionConfig(
        retention_ms=number("retention.ms"),
        retention_bytes=number("retention.bytes"),
        max_message_bytes=number("max.message.bytes"),
        segment_bytes=effective_segment_bytes(c),
        message_timestamp_type=c["message.timestamp.type"].strip(),
        segment_ms=number("segment.ms"),
        segment_jitter_ms=number("segment.jitter.ms"),
        cleanup_policy=cleanup_policy(c["cleanup.policy"]),
        delete_retention_ms=number("delete.retention.ms"),
        min_compaction_lag_ms=number("min.compaction.lag.ms"),
        max_compaction_lag_ms=number("max.compaction.lag.ms"),
        min_cleanable_dirty_ratio=float(
            config_number("min.cleanable.dirty.ratio", c["min.cleanable.dirty.ratio"])
        ),
    )


class LogicQueues(Protocol):
    """Static topics: the logs of the logic queues this broker leads."""

    def get_log(self, tp: TopicPartition) -> PartitionLog | None:
        """None when `tp.topic` is not a static topic (raises for its hidden physical topic)."""
        ...


PartitionHook = Callable[[TopicPartition, PartitionLog | None], Awaitable[None]]
"""Called after a partition opened (with its log) or before it closes (with None)."""

PartitionReport = Callable[..., Awaitable[None]]
"""Called as (kind, partition, epoch, topic_id=..., high_watermark=..., loss=...) once the
engine finished the step: kind "opened" or "closed" (with the partition's next offset then, its
high watermark), or "lost" (with the DataLoss, once per detection and epoch)."""


class PartitionManager:
    def __init__(self, engine: StreamEngine, broker_id: int) -> None:
        self._engine = engine
        self._broker_id = broker_id
        if hasattr(engine, "on_stored"):
            engine.on_stored = self._stored
        # (knows the topics it holds partitions of: see _adopt_topic)
        self._wishes: PartitionMap[Wish] = PartitionMap()
        # wishes changed since take_changed (None: all of them, after a snapshot or a release)
        self._wishes_changed: set[TopicPartition] | None = None
        self._known_topics: dict[str, int] = {}  # name -> partition count, last snapshot
        self._has_metadata = False  # no snapshot applied yet (a broker just started)
        # fenced (release_all) and not registered again yet (rejoin): metadata still arrives
        # and is followed (topics known, partitions given up), but no partition is wished
        self._released = False
        # partitions to look at, in order (each once), those being looked at now, those woken
        # again meanwhile; the worker pool; pending retries
        self._queue: deque[TopicPartition] = deque()
        self._queued: set[TopicPartition] = set()
        # queued partitions a client asked for while they wait their turn (see `_hurry`): taken
        # before the others; their entries in `_queue` are then passed over (not in `_queued`)
        self._urgent: deque[TopicPartition] = deque()
        self._busy: set[TopicPartition] = set()
        self._again: set[TopicPartition] = set()
        self._ready = asyncio.Event()
        self._pool: list[asyncio.Task[None]] = []
        self._retries: dict[TopicPartition, asyncio.TimerHandle] = {}
        self._backoff: dict[TopicPartition, float] = {}
        # what the pool did since it was last idle (one log line per round, not per partition)
        self._round: dict[str, int] = {"opened": 0, "closed": 0}
        self._round_started = 0.0
        self._slice_ends = 0.0  # see _may_work
        self._turn_pending = False
        self._hooks: list[PartitionHook] = []
        self._serving_listeners: list[Callable[[TopicPartition], None]] = []
        self._reports: list[PartitionReport] = []
        self._stopping = False
        self.open_seconds: list[float] = []  # recent open durations (for metrics/benchmarks)
        self.logic_queues: LogicQueues | None = None
        self._lost: dict[TopicPartition, LostPartition] = {}
        # partitions whose wish may not be met (every woken one, until a look finds it met):
        # is_settled looks at these, not at every partition led here
        self._unsettled: set[TopicPartition] = set()
        # opened (epoch) or closed (None) since the last heartbeat the controller answered
        self._open_changes: dict[TopicPartition, int | None] = {}

    def _stored(self, plog: PartitionLog) -> None:
        """A new partition's first checkpoint was written (with its first data): from now on
        its data must exist, tell the controller."""
        wish = self._wishes.get(plog.tp)
        if wish is None or plog.leader_epoch != wish.epoch:
            return
        task = asyncio.ensure_future(
            self._report(
                "opened",
                plog.tp,
                wish.epoch,
                topic_id=wish.topic_id,
                high_watermark=plog.high_watermark,
                stored=True,
            )
        )
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def open_changes(self, limit: int | None = None) -> dict[TopicPartition, int | None]:
        """What opened and closed since the controller last acknowledged (heartbeats): all
        of it, or the `limit` oldest."""
        if limit is None or len(self._open_changes) <= limit:
            return dict(self._open_changes)
        return dict(itertools.islice(self._open_changes.items(), limit))

    def ack_open_changes(self, sent: dict[TopicPartition, int | None]) -> None:
        """The controller has these: forget those that did not change again since."""
        for tp, value in sent.items():
            if self._open_changes.get(tp, -2) == value:
                del self._open_changes[tp]

    def add_hook(self, hook: PartitionHook) -> None:
        self._hooks.append(hook)

    def add_serving_listener(self, listener: Callable[[TopicPartition], None]) -> None:
        """Called synchronously when a partition's state here changes for a client: opened
        (it serves from now; before the open hooks), or found lost. Appends held through the
        handover (handover.py) are started in that same step, ahead of any later request."""
        self._serving_listeners.append(listener)

    def add_report(self, report: PartitionReport) -> None:
        self._reports.append(report)

    def open_partitions(self) -> dict[TopicPartition, int]:
        """What the engine has open right now, with epochs (reported in heartbeats)."""
        out = {}
        for tp in self._engine.partitions():
            plog = self._engine.get(tp)
            if plog is not None:
                out[tp] = plog.leader_epoch
        return out

    def take_changed(self) -> set[TopicPartition] | None:
        """Partitions opened, closed, whose high watermark advanced or whose wish changed since
        the last call; None when every partition must be looked at (a snapshot was applied)."""
        changed = self._engine.take_changed()
        wishes, self._wishes_changed = self._wishes_changed, set()
        return None if wishes is None else changed | wishes

    def high_watermarks(
        self, wanted: Callable[[str], bool], only: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int | None]:
        """High watermarks of the open partitions of the topics `wanted` accepts (of those in
        `only`, where a partition not open is None; else of every open partition)."""
        out: dict[TopicPartition, int | None] = {}
        for tp in self._engine.partitions() if only is None else only:
            if not wanted(tp.topic):
                continue
            plog = self._engine.get(tp)
            if plog is not None:
                out[tp] = plog.high_watermark
            elif only is not None:
                out[tp] = None
        return out

    def open_high_watermarks(
        self, only: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, tuple[str, int]]:
        """(topic id, high watermark) of every partition open here at the wished epoch (of
        those in `only`, if given): the acknowledged ends the controller keeps as floors."""
        out = {}
        for tp in self._engine.partitions() if only is None else only:
            plog = self._engine.get(tp)
            wish = self._wishes.get(tp)
            if plog is None or wish is None or plog.leader_epoch != wish.epoch:
                continue
            if getattr(plog, "topic_id", wish.topic_id) == wish.topic_id:
                out[tp] = (wish.topic_id, plog.high_watermark)
        return out

    def lost_partitions(self) -> dict[TopicPartition, DataLoss]:
        """The partitions this broker leads whose data it found missing."""
        return {tp: lost.loss for tp, lost in self._lost.items() if tp in self._wishes}

    def wake_all(self) -> None:
        """Look at every partition again (the store came back, or was lost)."""
        for tp in set(self._wishes) | set(self._engine.partitions()) | set(self._lost):
            lost = self._lost.get(tp)
            if lost is not None:
                lost.retry_at = 0.0
            self._wake(tp)

    async def _report(self, kind: str, tp: TopicPartition, epoch: int, **detail: object) -> None:
        for report in self._reports:
            try:
                await report(kind, tp, epoch, **detail)
            except Exception as exc:
                log.debug("%s: reporting %s failed: %s", tp, kind, exc)

    # ------------------------------------------------------------------ reads
    def get_log(self, tp: TopicPartition) -> PartitionLog:
        if self.logic_queues is not None:
            logic = self.logic_queues.get_log(tp)
            if logic is not None:
                return logic
        return self.local_log(tp)

    def local_log(self, tp: TopicPartition) -> PartitionLog:
        """The log of a partition this broker leads, static topics' physical queues included."""
        plog = self._engine.get(tp)
        wish = self._wishes.get(tp)
        if wish is None:
            if 0 <= tp.partition < self._known_topics.get(tp.topic, 0):
                raise NotLeader(f"{tp} is led by another broker")
            if not self._has_metadata:
                # just started, the controller's snapshot not here yet: not "unknown" (Kafka's
                # brokers serve clients only once they caught up with the metadata)
                raise NotLeader(f"{tp}: this broker has no metadata yet")
            raise UnknownPartition(f"{tp} does not exist")
        problem = getattr(self._engine, "store_problem", None)
        if problem is not None:
            raise PartitionStorageError(f"{tp}: {problem}")
        lost = self._lost.get(tp)
        if lost is not None and (plog is None or plog.leader_epoch != wish.epoch):
            loss = lost.loss
            raise PartitionStorageError(
                f"{tp}: data lost ({loss.reason}): {loss.missing_offsets} acknowledged offsets "
                f"missing ({loss.found_end}-{loss.expected_end}); "
                f"`tidalmq recover --accept-data-loss {tp.topic}` continues without them"
            )
        if plog is None or plog.leader_epoch != wish.epoch:
            self._hurry(tp)
            raise PartitionOpening(f"{tp} is opening on this broker")
        return plog

    def _hurry(self, tp: TopicPartition) -> None:
        """A client wants `tp`, queued to be opened here: open it before the partitions
        nobody asked for yet. A new broker's moves arrive by the thousand and take it 0.2-0.4 s
        to open; a producer answered LEADER_NOT_AVAILABLE meanwhile tries again after its
        backoff, and found its partition still waiting behind the others."""
        if tp in self._queued:
            self._urgent.append(tp)  # asked again before its turn: a second entry, passed over

    def leading(self) -> list[TopicPartition]:
        """The partitions this broker leads, in no particular order (sorting thousands of them
        on every readiness probe cost more than the probe's other work)."""
        return list(self._wishes)

    def leading_count(self) -> int:
        return len(self._wishes)

    def working(self) -> bool:
        """Partitions are being opened or closed right now (or wait their turn)."""
        return bool(self._queue or self._busy)

    def _settled(self, tp: TopicPartition) -> bool:
        wish = self._wishes.get(tp)
        plog = self._engine.get(tp)
        if wish is None:
            return plog is None
        if plog is not None and plog.leader_epoch == wish.epoch:
            return True
        lost = self._lost.get(tp)
        return lost is not None and lost.attempt == wish.attempt  # until a loss is accepted

    def is_settled(self) -> bool:
        """Every wish is met. O(partitions woken since the last call): every change of a wish
        or of what the engine has open wakes the partition (apply, _adopt, fenced, wake_all),
        and a woken one stays in `_unsettled` until a look finds it met."""
        unsettled = self._unsettled
        for tp in list(unsettled):
            if not self._settled(tp):
                return False
            unsettled.discard(tp)
        return True

    def leads(self, tp: TopicPartition) -> bool:
        return tp in self._wishes

    async def wait_settled(self, timeout_s: float) -> bool:
        """Until every wish is met (checked every few ms, each check O(partitions not yet
        settled): thousands of partitions settle at once when a wave of moves lands)."""
        deadline = time.monotonic() + timeout_s
        while not self.is_settled():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    # ------------------------------------------------------------------ reconcile
    def apply(self, meta: ClusterMetadata) -> None:
        """Adopt the wishes of a snapshot and wake the workers of every affected partition."""
        if self._stopping:
            return
        wishes: PartitionMap[Wish] = PartitionMap()
        for topic in meta.topics.values():
            if topic.kind == "static":
                continue  # logic queues have no storage of their own: their physical queues do
            config = partition_config(topic)
            for index, part in enumerate(topic.partitions):
                if part.leader == self._broker_id:
                    wishes[TopicPartition(topic.name, index)] = Wish.of(topic, part, config)
        self._known_topics = {t.name: len(t.partitions) for t in meta.topics.values()}
        self._has_metadata = True
        if self._released:
            wishes = PartitionMap()  # see release_all
        touched = set(wishes) | set(self._wishes) | set(self._engine.partitions())
        self._wishes = wishes
        self._wishes_changed = None
        for tp in touched:
            self._wake(tp)

    def apply_delta(self, meta: ClusterMetadata, delta: MetadataDelta) -> None:
        """Adopt what changed (O(changed partitions)): the partitions of `delta` only. A
        changed topic's partitions are walked in place (a creation of thousands of partitions
        makes no set of them first); a partition neither wished nor open here costs two
        lookups."""
        if self._stopping:
            return
        for name in delta.removed_topics:
            if name not in meta.topics:
                self._known_topics.pop(name, None)
        walked: dict[str, int] = {}  # topic -> partitions walked (0..n-1)
        for name in delta.topics:
            topic = meta.topics.get(name)
            if topic is not None:
                self._known_topics[name] = walked[name] = len(topic.partitions)
                self._adopt_topic(topic)
        for name, info in delta.removed_topics.items():  # as they were, beyond what exists now
            if not self._holds(name):
                continue  # none of its partitions is wished or open here
            for i in range(walked.get(name, 0), len(info.partitions)):
                self._adopt(TopicPartition(name, i), None)
        # A topic's configs once per delta, not per partition: parsing them costs about
        # 0.15 ms, and the deltas of a wave of moves or of first writes (a partition's first
        # checkpoint stored marks it created) name hundreds of partitions of one topic
        configs: dict[str, PartitionConfig] = {}
        for tp in delta.partitions:
            if tp.partition < walked.get(tp.topic, 0):
                continue  # walked with its topic
            topic = meta.topics.get(tp.topic)
            if topic is None or topic.kind == "static" or tp.partition >= len(topic.partitions):
                self._adopt(tp, None)
                continue
            part = topic.partitions[tp.partition]
            wish = None
            if part.leader == self._broker_id:
                config = configs.get(tp.topic)
                if config is None:
                    config = configs[tp.topic] = partition_config(topic)
                wish = Wish.of(topic, part, config)
            self._adopt(tp, wish)

    def _holds(self, name: str) -> bool:
        """Whether a partition of topic `name` is wished or open here (O(1))."""
        return self._wishes.has_topic(name) or self._engine.has_topic(name)

    def _adopt_topic(self, topic: TopicInfo) -> None:
        """Every partition of a created, replaced or grown topic (as it is now). When none of
        its partitions is wished or open here (a creation), only those this broker leads are
        looked at: for the others there is nothing to give up, and nothing is woken."""
        name, me = topic.name, self._broker_id
        wishes, open_log = self._wishes, self._engine.get
        config: PartitionConfig | None = None
        # A wish is immutable and compared by value: the partitions wishing alike (all of a
        # creation's: epoch 0, nothing stored) share one, not one object each
        alike: dict[tuple[int, bool, int, int | None], Wish] = {}

        def wish_for(part: PartitionState) -> Wish:
            nonlocal config
            key = (part.leader_epoch, part.created, part.end_offset_floor, part.accepted_from)
            wish = alike.get(key)
            if wish is None:
                if config is None:
                    config = partition_config(topic)
                wish = alike[key] = Wish.of(topic, part, config)
            return wish

        static = topic.kind == "static"
        if not self._holds(name):
            if static:
                return  # logic queues have no storage of their own
            for i, part in enumerate(topic.partitions):
                if part.leader == me:
                    self._adopt(TopicPartition(name, i), wish_for(part))
            return
        for i, part in enumerate(topic.partitions):
            tp = TopicPartition(name, i)
            if static or part.leader != me:
                if tp in wishes or open_log(tp) is not None:
                    self._adopt(tp, None)
                continue
            self._adopt(tp, wish_for(part))

    def _adopt(self, tp: TopicPartition, new: Wish | None) -> None:
        if self._released:
            new = None  # see release_all
        old = self._wishes.get(tp)
        if new is None:
            self._wishes.pop(tp, None)
        else:
            self._wishes[tp] = new
        if new != old and self._wishes_changed is not None:
            self._wishes_changed.add(tp)
        if (
            new != old
            and old is not None
            and new is not None
            and self._met_but_created(tp, old, new)
        ):
            return
        if new != old or (new is None and self._engine.get(tp) is not None):
            self._wake(tp)

    def _met_but_created(self, tp: TopicPartition, old: Wish, new: Wish) -> bool:
        """Whether the wish differs from a met one only in `created` (the controller marked
        the partition created once its first checkpoint was stored, which this broker reported
        itself): nothing to do then. A wave of first writes marks hundreds at once, and looking
        at each again cost every broker a worker step per partition."""
        if replace(old, created=new.created) != new or tp in self._busy or tp in self._queued:
            return False
        plog = self._engine.get(tp)
        return (
            plog is not None
            and plog.leader_epoch == new.epoch
            and getattr(plog, "topic_id", None) in (None, new.topic_id)
            and plog.config == new.config
        )

    def release_all(self) -> None:
        """Give up every partition (this broker was fenced): close them, keep topic data, and
        wish none again until `rejoin`. Metadata applied meanwhile still names this broker as
        the leader at the old epochs (the controller hands its partitions back at a new epoch
        once the new incarnation registers): serving them at those epochs again took appends
        that could no longer be acknowledged, and a partition that refused a producer's batch
        (its wish gone) and then took the next one found it ahead of the sequence, answered
        OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka bumped the producer's epoch, sending the
        durable but unacknowledged batches again as new records (docs/exactly-once-and-
        restarts.md, "After a fence")."""
        self._released = True
        touched = set(self._wishes) | set(self._engine.partitions())
        self._wishes = PartitionMap()
        self._wishes_changed = None
        for tp in touched:
            self._wake(tp)

    def rejoin(self, meta: ClusterMetadata) -> None:
        """Registered again after `release_all`: wish what `meta` gives this broker."""
        self._released = False
        self.apply(meta)

    async def fenced(self, tp: TopicPartition) -> None:
        """The engine lost `tp` to another owner's checkpoint and no longer serves it. The
        services holding state of it (groups, transactions) let go of it, the controller learns
        from the next heartbeat that it is not open here, and it is looked at again shortly:
        opened again at the wished epoch when the checkpoint that won carries no newer one (an
        earlier owner wrote late; nothing of ours was acknowledged, since a new owner's first
        checkpoint is written before its first data), else left as fenced until newer metadata
        names its owner. Without this a partition the metadata still gives to this broker
        stayed unserved for good (producers retrying NOT_LEADER until their timeout)."""
        if self._stopping:
            return
        self._open_changes[tp] = None
        self._unsettled.add(tp)
        for hook in self._hooks:
            await hook(tp, None)
        if tp in self._wishes:
            self._wake_later(tp, FENCED_RETRY_S)

    def _wake(self, tp: TopicPartition) -> None:
        if self._stopping:
            return
        self._unsettled.add(tp)
        retry = self._retries.pop(tp, None)
        if retry is not None:
            retry.cancel()
        if tp in self._busy:
            self._again.add(tp)
            return
        if tp in self._queued:
            return
        self._queued.add(tp)
        self._queue.append(tp)
        self._ready.set()
        if not self._pool:
            self._pool = [
                asyncio.create_task(self._worker(), name=f"partition worker {i}")
                for i in range(WORKERS)
            ]

    def _wake_later(self, tp: TopicPartition, delay_s: float) -> None:
        old = self._retries.pop(tp, None)
        if old is not None:
            old.cancel()
        self._retries[tp] = asyncio.get_running_loop().call_later(delay_s, self._retry, tp)

    def _retry(self, tp: TopicPartition) -> None:
        self._retries.pop(tp, None)
        lost = self._lost.get(tp)
        if lost is not None:
            lost.retry_at = 0.0
        self._wake(tp)

    async def _worker(self) -> None:
        while not self._stopping:
            if not self._queue:
                if not self._busy and (self._round["opened"] or self._round["closed"]):
                    log.info(
                        "partitions: %d opened, %d closed in %.2fs",
                        self._round["opened"],
                        self._round["closed"],
                        time.monotonic() - self._round_started,
                    )
                    self._round = {"opened": 0, "closed": 0}
                self._ready.clear()
                await self._ready.wait()
                continue
            if not self._may_work():
                await asyncio.sleep(0)  # this turn's slice is used: let the loop go round
                continue
            if not self._busy and not any(self._round.values()):
                self._round_started = time.monotonic()
            tp = self._urgent.popleft() if self._urgent else self._queue.popleft()
            if tp not in self._queued:
                continue  # taken already, from `_urgent`
            self._queued.discard(tp)
            self._busy.add(tp)
            try:
                await self._reconcile(tp)
            finally:
                self._busy.discard(tp)
                if tp in self._again:
                    self._again.discard(tp)
                    self._wake(tp)

    def _may_work(self) -> bool:
        """Whether this event-loop turn's slice has time left; when not, the next turn's slice
        is started by a callback queued ahead of the workers that yield now (so one worker
        works per slice and the others only pass)."""
        if time.perf_counter() < self._slice_ends:
            return True
        if not self._turn_pending:
            self._turn_pending = True
            asyncio.get_running_loop().call_soon(self._new_turn)
        return False

    def _new_turn(self) -> None:
        self._turn_pending = False
        self._slice_ends = time.perf_counter() + SLICE_S

    async def _reconcile(self, tp: TopicPartition) -> None:
        backoff = self._backoff.get(tp, 0.05)
        try:
            await self._step(tp)
            self._backoff.pop(tp, None)
            if tp in self._lost:
                self._wake_later(tp, LOST_RETRY_S)  # a restored store is noticed
            return
        except PartitionFenced as exc:
            # Either the checkpoint carries a newer epoch (the metadata naming its owner is on
            # its way and wakes the partition at once), or a write raced our open: an earlier
            # owner's late clean close, which a fresh read takes in. Look again, slowly.
            delay = max(backoff, FENCED_RETRY_S)
            log.info(
                "%s: fenced (%s); trying again in %.1fs unless newer metadata comes first",
                tp,
                exc,
                delay,
            )
            self._backoff[tp] = min(delay * 2, FENCED_RETRY_MAX_S)
            self._wake_later(tp, delay)
            return
        except StoreLost as exc:
            # the engine tells (on_store_state) when the store is back: no retry loop
            log.debug("%s: not opened: %s", tp, exc)
            return
        except asyncio.CancelledError:
            raise
        except StorageError as exc:
            log.warning("%s: storage error, retrying in %.2fs: %s", tp, backoff, exc)
        except Exception:
            log.exception("%s: unexpected error while reconciling", tp)
        self._backoff[tp] = min(backoff * 2, 2.0)
        self._wake_later(tp, backoff)

    async def _step(self, tp: TopicPartition) -> None:
        """One reconciliation step of one partition."""
        wish = self._wishes.get(tp)
        plog = self._engine.get(tp)
        opened_id = getattr(plog, "topic_id", None) if plog is not None else None
        if wish is None:
            if self._lost.pop(tp, None) is not None:
                await self._report("forgotten", tp, -1)
            if plog is not None:
                await self._close(tp)  # the controller deletes a deleted topic's data
            return
        if plog is not None and opened_id not in (None, wish.topic_id):
            # same name, new topic: the old one was deleted and re-created
            await self._close(tp)
            plog = None
        if plog is None or plog.leader_epoch < wish.epoch:
            if plog is not None:
                await self._close(tp)
            lost = self._lost.get(tp)
            if (
                lost is not None
                and lost.attempt == wish.attempt
                and time.monotonic() < lost.retry_at
            ):
                return  # lost: not again before a new wish or the slow retry
            started = time.perf_counter()
            try:
                plog = await self._engine.open_partition(
                    tp,
                    wish.topic_id,
                    wish.epoch,
                    wish.config,
                    created=wish.created,
                    end_offset_floor=wish.end_offset_floor,
                    accepted_from=wish.accepted_from,
                )
            except PartitionDataLost as exc:
                await self._mark_lost(tp, wish, exc)
                return
            if self._lost.pop(tp, None) is not None:
                log.warning("%s: serving again at offset %d", tp, plog.high_watermark)
            for listener in self._serving_listeners:
                listener(tp)
            self.open_seconds.append(time.perf_counter() - started)
            del self.open_seconds[:-1000]
            log.debug(
                "%s: open at epoch %d in %.0f ms",
                tp,
                wish.epoch,
                (time.perf_counter() - started) * 1000,
            )
            self._round["opened"] += 1
            self._open_changes[tp] = wish.epoch
            for hook in self._hooks:
                await hook(tp, plog)
            await self._report(
                "opened",
                tp,
                wish.epoch,
                topic_id=wish.topic_id,
                high_watermark=plog.high_watermark,
                stored=not getattr(plog, "unstored", False),
            )
            return
        if plog.config != wish.config:
            await self._engine.update_config(tp, wish.config)

    async def _mark_lost(self, tp: TopicPartition, wish: Wish, exc: PartitionDataLost) -> None:
        """Keep the partition as lost (get_log answers KAFKA_STORAGE_ERROR) and tell the
        controller, once per detection and epoch: a slow retry at the same epoch that finds
        the same is not news, but the same loss found at a new epoch is reported again. The
        controller records a loss only at the partition's current epoch (an older one is a
        stale report, ignored), and a broker may refuse a partition at an epoch the controller
        has already bumped: a new incarnation's registration bumps the epochs of its
        partitions, and a push of an earlier committed version (another broker's registration,
        a commit of a loss) can reach it first, so it opens them at the old epoch, and then at
        the new one. Reporting only the first refusal left such a partition unrecorded."""
        previous = self._lost.get(tp)
        loss = DataLoss(
            expected_end=exc.expected_end,
            found_end=exc.found_end,
            detected_ms=int(time.time() * 1000),
            broker=self._broker_id,
            reason=exc.reason,
        )
        same = previous is not None and (
            previous.loss.expected_end,
            previous.loss.found_end,
            previous.loss.reason,
        ) == (loss.expected_end, loss.found_end, loss.reason)
        if same:
            assert previous is not None
            loss = previous.loss  # detected when first found
        self._lost[tp] = LostPartition(wish.attempt, loss, time.monotonic() + LOST_RETRY_S)
        for listener in self._serving_listeners:
            listener(tp)  # held appends are answered KAFKA_STORAGE_ERROR now
        if same:
            assert previous is not None
            if previous.attempt != wish.attempt:  # a new epoch: the controller needs it
                log.info("%s: data still lost at epoch %d; reported again", tp, wish.epoch)
                await self._report("lost", tp, wish.epoch, topic_id=wish.topic_id, loss=loss)
            return
        log.warning(
            "%s: DATA LOST, not serving it: %s (%d acknowledged offsets missing: %d-%d). "
            "`tidalmq recover --accept-data-loss %s` continues it at offset %d",
            tp,
            loss.reason,
            loss.missing_offsets,
            loss.found_end,
            loss.expected_end,
            tp.topic,
            max(loss.expected_end, loss.found_end),
        )
        await self._report("lost", tp, wish.epoch, topic_id=wish.topic_id, loss=loss)

    async def _close(self, tp: TopicPartition) -> None:
        plog = self._engine.get(tp)
        epoch = plog.leader_epoch if plog is not None else -1
        for hook in self._hooks:
            await hook(tp, None)
        started = time.perf_counter()
        await self._engine.close_partition(tp)
        self._open_changes[tp] = None
        log.debug("%s: closed in %.0f ms", tp, (time.perf_counter() - started) * 1000)
        self._round["closed"] += 1
        detail: dict[str, object] = {}
        if plog is not None:
            detail = {
                "topic_id": getattr(plog, "topic_id", None),
                "high_watermark": plog.high_watermark,
            }
        await self._report("closed", tp, epoch, **detail)

    async def stop(self) -> None:
        self._stopping = True
        for retry in self._retries.values():
            retry.cancel()
        for task in self._pool:
            task.cancel()
        await asyncio.gather(*self._pool, return_exceptions=True)
        for tp in self._engine.partitions():
            for hook in self._hooks:
                await hook(tp, None)
