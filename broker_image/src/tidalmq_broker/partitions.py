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

from tidalmq_core.metadata import ClusterMetadata, TopicInfo
from tidalmq_core.model import TopicPartition

from tidalmq_broker.storage.api import (
    PartitionConfig,
    PartitionFenced,
    PartitionLog,
    StorageError,
    StreamEngine,
)

log = logging.getLogger(__name__)


class NotLeader(Exception):
    """NOT_LEADER_OR_FOLLOWER: another broker leads this partition (or none does yet)."""


class LeaderNotAvailable(Exception):
    """LEADER_NOT_AVAILABLE: this broker will lead the partition once it has opened it."""


class UnknownPartition(Exception):
    """UNKNOWN_TOPIC_OR_PARTITION"""


@dataclass(frozen=True, slots=True)
class Wish:
    topic_id: str
    epoch: int
    config: PartitionConfig


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

PartitionReport = Callable[[str, TopicPartition, int], Awaitable[None]]
"""Called with ("opened" | "closed", partition, epoch) once the engine finished the step."""


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

    async def _report(self, kind: str, tp: TopicPartition, epoch: int) -> None:
        for report in self._reports:
            try:
                await report(kind, tp, epoch)
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
        if plog is None or plog.leader_epoch != wish.epoch:
            raise LeaderNotAvailable(f"{tp} is opening on this broker")
        return plog

    def leading(self) -> list[TopicPartition]:
        return sorted(self._wishes)

    def is_settled(self) -> bool:
        for tp, wish in self._wishes.items():
            plog = self._engine.get(tp)
            if plog is None or plog.leader_epoch != wish.epoch:
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
                        topic.topic_id, part.leader_epoch, config
                    )
        self._known_topics = {t.name: len(t.partitions) for t in meta.topics.values()}
        touched = set(wishes) | set(self._wishes) | set(self._engine.partitions())
        self._wishes = wishes
        for tp in touched:
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
                    await asyncio.wait_for(event.wait(), timeout=60)
                except TimeoutError:
                    if tp not in self._wishes and self._engine.get(tp) is None:
                        break
        self._workers.pop(tp, None)

    async def _step(self, tp: TopicPartition, opened_id: str | None) -> tuple[bool, str | None]:
        """One reconciliation step; returns (settled, topic id of the open partition)."""
        wish = self._wishes.get(tp)
        plog = self._engine.get(tp)
        if wish is None:
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
            started = time.perf_counter()
            plog = await self._engine.open_partition(tp, wish.topic_id, wish.epoch, wish.config)
            self.open_seconds.append(time.perf_counter() - started)
            del self.open_seconds[:-1000]
            log.info(
                "%s: open at epoch %d in %.0f ms", tp, wish.epoch,
                (time.perf_counter() - started) * 1000,
            )  # fmt: skip
            for hook in self._hooks:
                await hook(tp, plog)
            await self._report("opened", tp, wish.epoch)
            return True, wish.topic_id
        if plog.config != wish.config:
            await self._engine.update_config(tp, wish.config)
        return True, wish.topic_id

    async def _close(self, tp: TopicPartition) -> None:
        plog = self._engine.get(tp)
        epoch = plog.leader_epoch if plog is not None else -1
        for hook in self._hooks:
            await hook(tp, None)
        started = time.perf_counter()
        await self._engine.close_partition(tp)
        log.info("%s: closed in %.0f ms", tp, (time.perf_counter() - started) * 1000)
        await self._report("closed", tp, epoch)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._workers.values()):
            task.cancel()
        await asyncio.gather(*self._workers.values(), return_exceptions=True)
        for tp in self._engine.partitions():
            for hook in self._hooks:
                await hook(tp, None)
