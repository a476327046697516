"""Sealing a static topic's physical queues: nobody writes them any more, their end is exact.

Owns: waiting until a physical queue's broker can no longer acknowledge a write to it (it closed
the queue, it is gone, or it was fenced and its lease ran out; a broker that does not close in
time is fenced), sealing it from object storage (replaying the WAL tail of a dead or fenced
broker, so every acknowledged record stays), sealing again when its checkpoint changed under the
seal, and compacting sealed queues afterwards.

Must not touch: the mapping or the metadata (the manager, _static_topics.py, commits what the
seals found), nor brokers other than the one fenced for not closing in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from prometheus_client import Counter
from tidalmq_broker.storage.api import ObjectStoreUnavailable, PartitionFenced
from tidalmq_broker.storage.objectstore.base import ObjectStore
from tidalmq_broker.storage.sealed import SealResult, compact_sealed, seal_partition
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.model import TopicPartition
from tidalmq_core.static_mapping import physical_topic_name
from tidalmq_core.topics import effective_segment_bytes

from tidalmq_controller._errors import StaticTopicError
from tidalmq_controller._membership import BrokerLiveness
from tidalmq_controller._settings import ControllerSettings

log = logging.getLogger(__name__)

SEALS = Counter(
    "tidalmq_static_seals_total", "Physical queues sealed, by how", ["how"]
)  # closed by its broker / recovered from the WAL of a dead or fenced broker


class SealerHost(Protocol):
    """What sealing reads and calls of the controller (the controller is one)."""

    settings: ControllerSettings

    @property
    def metadata(self) -> ClusterMetadata: ...

    def broker_liveness(self) -> dict[int, BrokerLiveness]: ...

    def fence_broker(self, broker_id: int, reason: str) -> None: ...


class QueueSealer:
    """Seals the old physical queues of remaps and repairs, and compacts sealed ones."""

    def __init__(self, controller: SealerHost, store: ObjectStore | None) -> None:
        self._c = controller
        self._store = store
        self._closed: dict[TopicPartition, asyncio.Event] = {}

    def closed(self, tp: TopicPartition) -> None:
        """Its broker reported the physical queue closed."""
        self._closed.setdefault(tp, asyncio.Event()).set()

    def forget_closed(self, tp: TopicPartition) -> None:
        """A remap starts: an earlier close of this physical queue says nothing of this one."""
        self._closed.pop(tp, None)

    def require_store(self) -> ObjectStore:
        if self._store is None:
            raise StaticTopicError(
                "static topics need the controller to reach the object store (set its storage "
                "URL): it seals the physical queues of dead brokers there"
            )
        return self._store

    async def seal_all(self, name: str, queues: list[int], version: int) -> dict[int, SealResult]:
        results = await asyncio.gather(*(self._seal(name, pid, version) for pid in queues))
        return dict(zip(queues, results, strict=True))

    async def _seal(self, name: str, pid: int, version: int) -> SealResult:
        """Wait until nobody can write physical queue `pid` any more, then seal it. If its
        checkpoint changes under the seal (its broker was still opening or closing it), wait
        for that broker again and seal once more."""
        phys_name = physical_topic_name(name)
        tp = TopicPartition(phys_name, pid)
        for attempt in range(20):
            why = await self._until_unwritable(tp, version)
            try:
                result = await self._seal_once(tp)
            except PartitionFenced as exc:
                log.info("%s changed while sealing it (%s); waiting for its broker again", tp, exc)
                self._closed.pop(tp, None)
                await asyncio.sleep(min(0.05 * (attempt + 1), 1.0))
                continue
            log.info(
                "%s sealed at offset %d (%s%s)",
                tp,
                result.end_offset,
                why,
                ", WAL tail replayed" if result.recovered else "",
            )
            SEALS.labels("recovered" if result.recovered else "closed").inc()
            return result
        raise StaticTopicError(f"{tp} kept changing while being sealed")

    async def _until_unwritable(self, tp: TopicPartition, version: int) -> str:
        """Until the physical queue's broker can no longer acknowledge a write to it: it closed
        it (or never had it open at `version`), it is gone, or it was fenced and its lease ran
        out (a broker that does not close it within the election timeout is fenced)."""
        c = self._c
        part = c.metadata.topics[tp.topic].partitions[tp.partition]
        broker = part.replicas[0] if part.replicas else None
        event = self._closed.setdefault(tp, asyncio.Event())
        deadline = time.monotonic() + c.settings.election_timeout_s
        while True:
            info = c.metadata.brokers.get(broker) if broker is not None else None
            live = c.broker_liveness().get(broker) if broker is not None else None
            now = time.monotonic()
            if info is None or info.state == "dead" or live is None:
                return "its broker is gone"  # declared dead after the session timeout
            if live.fenced_at is not None:
                if now >= live.last_grant + c.settings.lease_s + c.settings.clock_margin_s:
                    return "its broker was fenced and its lease ran out"
            elif event.is_set() or (
                live.applied_version >= version and tp not in live.open_partitions
            ):
                return "closed by its broker"
            elif now > deadline:
                c.fence_broker(broker, f"did not close physical queue {tp} in time")  # type: ignore[arg-type]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await event.wait()

    async def _seal_once(self, tp: TopicPartition) -> SealResult:
        store = self.require_store()
        topic = self._c.metadata.topics[tp.topic]
        part = topic.partitions[tp.partition]
        delay = 0.1
        for attempt in range(8):
            try:
                return await seal_partition(
                    store, tp, topic.topic_id, min_epoch=part.leader_epoch + 1
                )
            except ObjectStoreUnavailable as exc:
                if attempt == 7:
                    raise
                log.warning("sealing %s failed, retrying: %s", tp, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    async def compact(self, name: str, pid: int) -> None:
        store = self._store
        topic = self._c.metadata.topics.get(physical_topic_name(name))
        if store is None or topic is None:
            return
        segment_bytes = effective_segment_bytes(topic.effective_configs())
        tp = TopicPartition(topic.name, pid)
        try:
            await compact_sealed(store, tp, topic.topic_id, segment_bytes=segment_bytes)
        except Exception as exc:
            log.warning("compacting sealed %s failed (reads still work): %s", tp, exc)
