"""The partitions this broker leads, reconciled against the controller's latest snapshot.

Level-based: each snapshot says which partitions this broker should lead and at which epoch.
One worker per partition opens, closes, re-opens (higher epoch) or deletes until the engine
matches the wish, retrying storage errors with backoff, so a lost or reordered push is repaired by
the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from tidalmq_core.metadata import ClusterMetadata, DataLoss, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import MetadataDelta

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


class NotLeader(Exception):
    """NOT_LEADER_OR_FOLLOWER: another broker leads this partition (or none does yet)."""


class LeaderNotAvailable(Exception):
    """LEADER_NOT_AVAILABLE: this broker will lead the partition once it has opened it."""


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
    return PartitionConfig(
        retention_ms=int(c["retention.ms"]),
        retention_bytes=int(c["retention.bytes"]),
        max_message_bytes=int(c["max.message.bytes"]),
        segment_bytes=int(c["segment.bytes"]),
        message_timestamp_type=c["message.timestamp.type"],
    )


class LogicQueues(Protocol):
    """Static topics (seed 002): the logs of the logic queues this broker leads."""

    def get_log(self, tp: TopicPartition) -> PartitionLog | None:
        """None when `tp.topic` is not a static topic (raises for its hidden physical topic)."""
        ...


PartitionHook = Callable[[TopicPartition, PartitionLog | None], Awaitable[None]]
"""Called after a partition opened (with its log) or before it closes (with None)."""

PartitionReport = Callable[..., Awaitable[None]]
"""Called as (kind, partition, epoch, topic_id=..., high_watermark=..., loss=...) once the
engine finished the step: kind "opened" or "closed" (with the partition's next offset then, its
high watermark), or "lost" (with the DataLoss, once per detection)."""


class PartitionManager:
    def __init__(self, engine: StreamEngine, broker_id: int) -> None:
        self._engine = engine
        self._broker_id = broker_id
        self._wishes: dict[TopicPartition, Wish] = {}
        self._known_topics: dict[str, int] = {}  # name -> partition count, last snapshot
        self._workers: dict[TopicPartition, asyncio.Task[None]] = {}
        self._kick: dict[TopicPartition, asyncio.Event] = {}
        self._hooks: list[PartitionHook] = []
        self._reports: list[PartitionReport] = []
        self._settled = asyncio.Condition()
        self._stopping = False
        self.open_seconds: list[float] = []  # recent open durations (for metrics/benchmarks)
        self.logic_queues: LogicQueues | None = None
        self._lost: dict[TopicPartition, LostPartition] = {}
        # opened (epoch) or closed (None) since the last heartbeat the controller answered
        self._open_changes: dict[TopicPartition, int | None] = {}

    def open_changes(self) -> dict[TopicPartition, int | None]:
        """What opened and closed since the controller last acknowledged (heartbeats)."""
        return dict(self._open_changes)

    def ack_open_changes(self, sent: dict[TopicPartition, int | None]) -> None:
        """The controller has these: forget those that did not change again since."""
        for tp, value in sent.items():
            if self._open_changes.get(tp, -2) == value:
                del self._open_changes[tp]

    def add_hook(self, hook: PartitionHook) -> None:
        self._hooks.append(hook)

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

    def high_watermarks(self, wanted: Callable[[str], bool]) -> dict[TopicPartition, int]:
        """High watermarks of the open partitions of the topics `wanted` accepts."""
        out = {}
        for tp in self._engine.partitions():
            plog = self._engine.get(tp)
            if plog is not None and wanted(tp.topic):
                out[tp] = plog.high_watermark
        return out

    def open_high_watermarks(self) -> dict[TopicPartition, tuple[str, int]]:
        """(topic id, high watermark) of every partition open here at the wished epoch: the
        acknowledged ends the controller keeps as durable floors."""
        out = {}
        for tp in self._engine.partitions():
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
            raise LeaderNotAvailable(f"{tp} is opening on this broker")
        return plog

    def leading(self) -> list[TopicPartition]:
        return sorted(self._wishes)

    def is_settled(self) -> bool:
        for tp, wish in self._wishes.items():
            plog = self._engine.get(tp)
            if plog is None or plog.leader_epoch != wish.epoch:
                lost = self._lost.get(tp)
                if lost is not None and lost.attempt == wish.attempt:
                    continue  # as settled as it gets until someone accepts the loss
                return False
        return all(tp in self._wishes for tp in self._engine.partitions())

    async def wait_settled(self, timeout_s: float) -> bool:
        async with self._settled:
            try:
                await asyncio.wait_for(self._settled.wait_for(self.is_settled), timeout_s)
            except TimeoutError:
                return False
        return True

    # ------------------------------------------------------------------ reconcile
    def apply(self, meta: ClusterMetadata) -> None:
        """Adopt the wishes of a snapshot and wake the workers of every affected partition."""
        if self._stopping:
            return
        wishes: dict[TopicPartition, Wish] = {}
        for topic in meta.topics.values():
            if topic.kind == "static":
                continue  # logic queues have no storage of their own: their physical queues do
            config = partition_config(topic)
            for index, part in enumerate(topic.partitions):
                if part.leader == self._broker_id:
                    wishes[TopicPartition(topic.name, index)] = Wish(
                        topic.topic_id, part.leader_epoch, config,
                        part.created, part.end_offset_floor, part.accepted_from,
                    )  # fmt: skip
        self._known_topics = {t.name: len(t.partitions) for t in meta.topics.values()}
        touched = set(wishes) | set(self._wishes) | set(self._engine.partitions())
        self._wishes = wishes
        for tp in touched:
            self._wake(tp)

    def apply_delta(self, meta: ClusterMetadata, delta: MetadataDelta) -> None:
        """Adopt what changed (O(changed partitions)): the partitions of `delta` only."""
        if self._stopping:
            return
        for name in delta.removed_topics:
            if name not in meta.topics:
                self._known_topics.pop(name, None)
        configs: dict[str, PartitionConfig] = {}
        for name in delta.topics:
            topic = meta.topics.get(name)
            if topic is not None:
                self._known_topics[name] = len(topic.partitions)
        for tp in delta.changed_partitions(meta):
            topic = meta.topics.get(tp.topic)
            old = self._wishes.get(tp)
            new: Wish | None = None
            if (
                topic is not None
                and topic.kind != "static"
                and tp.partition < len(topic.partitions)
            ):
                part = topic.partitions[tp.partition]
                if part.leader == self._broker_id:
                    config = configs.get(tp.topic)
                    if config is None:
                        config = configs[tp.topic] = partition_config(topic)
                    new = Wish(topic.topic_id, part.leader_epoch, config, part.created,
                               part.end_offset_floor, part.accepted_from)  # fmt: skip
            if new is None:
                self._wishes.pop(tp, None)
            else:
                self._wishes[tp] = new
            if new != old or (new is None and self._engine.get(tp) is not None):
                self._wake(tp)

    def release_all(self) -> None:
        """Give up every partition (this broker was fenced): close them, keep topic data."""
        touched = set(self._wishes) | set(self._engine.partitions())
        self._wishes = {}
        for tp in touched:
            self._wake(tp)

    def _wake(self, tp: TopicPartition) -> None:
        event = self._kick.setdefault(tp, asyncio.Event())
        event.set()
        worker = self._workers.get(tp)
        if worker is None or worker.done():
            self._workers[tp] = asyncio.create_task(self._work(tp), name=f"partition {tp}")

    async def _work(self, tp: TopicPartition) -> None:
        event = self._kick[tp]
        backoff = 0.05
        opened_topic_id: str | None = None
        while not self._stopping:
            event.clear()
            try:
                done, opened_topic_id = await self._step(tp, opened_topic_id)
                backoff = 0.05
            except PartitionFenced as exc:
                log.info("%s: fenced (%s); waiting for a newer snapshot", tp, exc)
                done = True
            except StoreLost as exc:
                # the engine tells (on_store_state) when the store is back: no retry loop
                log.debug("%s: not opened: %s", tp, exc)
                done = True
            except StorageError as exc:
                log.warning("%s: storage error, retrying in %.2fs: %s", tp, backoff, exc)
                done = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception:
                log.exception("%s: unexpected error while reconciling", tp)
                done = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            async with self._settled:
                self._settled.notify_all()
            if done:
                if event.is_set():
                    continue
                try:
                    await asyncio.wait_for(
                        event.wait(), timeout=LOST_RETRY_S if tp in self._lost else 60
                    )
                except TimeoutError:
                    if tp not in self._wishes and self._engine.get(tp) is None:
                        break
        self._workers.pop(tp, None)

    async def _step(self, tp: TopicPartition, opened_id: str | None) -> tuple[bool, str | None]:
        """One reconciliation step; returns (settled, topic id of the open partition)."""
        wish = self._wishes.get(tp)
        plog = self._engine.get(tp)
        if wish is None:
            if self._lost.pop(tp, None) is not None:
                await self._report("forgotten", tp, -1)
            if plog is not None:
                await self._close(tp)  # the controller deletes a deleted topic's data
            return True, None
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
                return True, None  # lost: not again before a new wish or the slow retry
            started = time.perf_counter()
            try:
                plog = await self._engine.open_partition(
                    tp, wish.topic_id, wish.epoch, wish.config, created=wish.created,
                    end_offset_floor=wish.end_offset_floor, accepted_from=wish.accepted_from,
                )  # fmt: skip
            except PartitionDataLost as exc:
                await self._mark_lost(tp, wish, exc)
                return True, None
            if self._lost.pop(tp, None) is not None:
                log.warning("%s: serving again at offset %d", tp, plog.high_watermark)
            self.open_seconds.append(time.perf_counter() - started)
            del self.open_seconds[:-1000]
            log.info(
                "%s: open at epoch %d in %.0f ms", tp, wish.epoch,
                (time.perf_counter() - started) * 1000,
            )  # fmt: skip
            self._open_changes[tp] = wish.epoch
            for hook in self._hooks:
                await hook(tp, plog)
            await self._report(
                "opened", tp, wish.epoch, topic_id=wish.topic_id,
                high_watermark=plog.high_watermark,
            )  # fmt: skip
            return True, wish.topic_id
        if plog.config != wish.config:
            await self._engine.update_config(tp, wish.config)
        return True, wish.topic_id

    async def _mark_lost(self, tp: TopicPartition, wish: Wish, exc: PartitionDataLost) -> None:
        """Keep the partition as lost (get_log answers KAFKA_STORAGE_ERROR) and tell the
        controller, once per detection (a slow retry that finds the same is not news)."""
        previous = self._lost.get(tp)
        loss = DataLoss(
            expected_end=exc.expected_end,
            found_end=exc.found_end,
            detected_ms=int(time.time() * 1000),
            broker=self._broker_id,
            reason=exc.reason,
        )
        again = previous is not None and (
            previous.loss.expected_end,
            previous.loss.found_end,
            previous.loss.reason,
        ) == (loss.expected_end, loss.found_end, loss.reason)
        if again:
            assert previous is not None
            loss = previous.loss
        self._lost[tp] = LostPartition(wish.attempt, loss, time.monotonic() + LOST_RETRY_S)
        if again:
            return
        log.warning(
            "%s: DATA LOST, not serving it: %s (%d acknowledged offsets missing: %d-%d). "
            "`tidalmq recover --accept-data-loss %s` continues it at offset %d",
            tp, loss.reason, loss.missing_offsets, loss.found_end, loss.expected_end,
            tp.topic, max(loss.expected_end, loss.found_end),
        )  # fmt: skip
        await self._report("lost", tp, wish.epoch, topic_id=wish.topic_id, loss=loss)

    async def _close(self, tp: TopicPartition) -> None:
        plog = self._engine.get(tp)
        epoch = plog.leader_epoch if plog is not None else -1
        for hook in self._hooks:
            await hook(tp, None)
        started = time.perf_counter()
        await self._engine.close_partition(tp)
        self._open_changes[tp] = None
        log.info("%s: closed in %.0f ms", tp, (time.perf_counter() - started) * 1000)
        detail: dict[str, object] = {}
        if plog is not None:
            detail = {"topic_id": getattr(plog, "topic_id", None),
                      "high_watermark": plog.high_watermark}  # fmt: skip
        await self._report("closed", tp, epoch, **detail)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._workers.values()):
            task.cancel()
        await asyncio.gather(*self._workers.values(), return_exceptions=True)
        for tp in self._engine.partitions():
            for hook in self._hooks:
                await hook(tp, None)
