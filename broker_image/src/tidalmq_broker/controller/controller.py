"""The controller: the single writer of cluster metadata.

It owns topics, partition leadership and epochs, broker membership and producer-id allocation.
Every change is committed to the MetadataStore first (fenced by the store's version token), then
pushed as a full snapshot to every registered broker; brokers reconcile the partitions they own
against the snapshot (level-based: a lost push is repaired by the next one).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from tidalmq_core.metadata import (
    INTERNAL_TOPICS,
    NO_LEADER,
    OFFSETS_TOPIC,
    BrokerInfo,
    ClusterMetadata,
    PartitionState,
    TopicInfo,
    new_cluster_id,
)
from tidalmq_core.placement import place_partitions
from tidalmq_core.topics import (
    InvalidPartitions,
    validate_configs,
    validate_partition_count,
    validate_topic_name,
)

from tidalmq_broker.controller.store import MetadataStore, StaleMetadata

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK = 1000


class ControllerError(Exception):
    """Base of the controller's refusals; the API layer maps each to a Kafka error code."""


class TopicAlreadyExists(ControllerError):
    """TOPIC_ALREADY_EXISTS"""


class UnknownTopic(ControllerError):
    """UNKNOWN_TOPIC_OR_PARTITION / UNKNOWN_TOPIC_ID"""


class NoBrokers(ControllerError):
    """INVALID_REPLICATION_FACTOR (no live broker to place on)"""


class ControllerFenced(ControllerError):
    """NOT_CONTROLLER: another controller committed a newer version of the metadata."""


class BrokerChannel(Protocol):
    """How the controller reaches one broker."""

    async def push_metadata(self, snapshot: ClusterMetadata) -> None: ...


@dataclass(slots=True)
class NewTopic:
    name: str
    num_partitions: int
    configs: dict[str, str | None] = field(default_factory=dict)
    internal: bool = False


@dataclass(slots=True)
class TopicResult:
    name: str
    error: Exception | None = None
    topic_id: str | None = None
    num_partitions: int = -1
    configs: dict[str, str] = field(default_factory=dict)


class Controller:
    def __init__(
        self,
        store: MetadataStore,
        *,
        offsets_topic_partitions: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._offsets_topic_partitions = offsets_topic_partitions
        self._clock = clock
        self._meta: ClusterMetadata | None = None
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._channels: dict[int, BrokerChannel] = {}
        self._listeners: list[Callable[[ClusterMetadata], Awaitable[None]]] = []
        self._producer_ids: tuple[int, int] = (0, 0)  # [next, end) of the reserved block

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Load the metadata (or create the cluster) and claim the controller role by bumping
        the controller epoch: any older controller's next write fails."""
        async with self._lock:
            meta, token = await self._store.load()
            if meta is None:
                meta = ClusterMetadata(cluster_id=new_cluster_id())
                log.info("creating new cluster %s", meta.cluster_id)
            self._meta, self._token = meta, token
            await self._commit_locked(
                lambda m: setattr(m, "controller_epoch", m.controller_epoch + 1)
            )
            log.info(
                "controller active for cluster %s, controller epoch %d, metadata version %d",
                meta.cluster_id,
                self.metadata.controller_epoch,
                self.metadata.version,
            )

    @property
    def metadata(self) -> ClusterMetadata:
        if self._meta is None:
            raise RuntimeError("controller not started")
        return self._meta

    def snapshot(self) -> ClusterMetadata:
        return self.metadata.copy()

    def add_listener(self, listener: Callable[[ClusterMetadata], Awaitable[None]]) -> None:
        """Called with each committed snapshot (used by the operator to mirror status)."""
        self._listeners.append(listener)

    # ---------------------------------------------------------------- brokers
    async def register_broker(self, info: BrokerInfo, channel: BrokerChannel) -> ClusterMetadata:
        """A broker (re)joins: record its endpoint and incarnation and hand it leadership of
        the partitions assigned to it, with bumped epochs so its previous incarnation is
        fenced. Partitions without a broker (none was alive) are placed now."""
        self._channels[info.broker_id] = channel

        def mutate(meta: ClusterMetadata) -> None:
            info.state = "alive"
            meta.brokers[info.broker_id] = info
            for topic in meta.topics.values():
                for index, part in enumerate(topic.partitions):
                    if part.replicas == [info.broker_id] or not part.replicas:
                        if not part.replicas:
                            part.replicas = [info.broker_id]
                        part.leader = info.broker_id
                        part.leader_epoch += 1
                        log.debug("%s-%d led by %d", topic.name, index, info.broker_id)

        async with self._lock:
            await self._commit_locked(mutate)
            if OFFSETS_TOPIC not in self.metadata.topics:
                await self._create_topics_locked(
                    [NewTopic(OFFSETS_TOPIC, self._offsets_topic_partitions, internal=True)],
                    validate_only=False,
                )
            snapshot = self.snapshot()
        await self._push(snapshot)
        return snapshot

    # ---------------------------------------------------------------- topics
    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> list[TopicResult]:
        async with self._lock:
            results = await self._create_topics_locked(list(topics), validate_only=validate_only)
            snapshot = self.snapshot()
        if not validate_only:
            await self._push(snapshot)
        return results

    async def _create_topics_locked(
        self, topics: list[NewTopic], *, validate_only: bool
    ) -> list[TopicResult]:
        meta = self.metadata
        results: list[TopicResult] = []
        accepted: list[tuple[NewTopic, dict[str, str], str]] = []
        seen: set[str] = set()
        for new in topics:
            try:
                validate_topic_name(new.name)
                if new.name in INTERNAL_TOPICS and not new.internal:
                    raise TopicAlreadyExists(f"topic {new.name!r} is internal")
                if new.name in meta.topics or new.name in seen:
                    raise TopicAlreadyExists(f"topic {new.name!r} already exists")
                validate_partition_count(new.num_partitions)
                configs = validate_configs(new.configs)
                if not meta.live_brokers():
                    raise NoBrokers("no live broker to place the partitions on")
            except (ValueError, ControllerError) as exc:
                results.append(TopicResult(new.name, error=exc))
                continue
            seen.add(new.name)
            topic_id = str(uuid.uuid4())
            accepted.append((new, configs, topic_id))
            full = TopicInfo(new.name, topic_id, [], configs).effective_configs()
            results.append(TopicResult(new.name, None, topic_id, new.num_partitions, full))
        if accepted and not validate_only:

            def mutate(m: ClusterMetadata) -> None:
                brokers = m.live_brokers()
                for new, configs, topic_id in accepted:
                    owners = place_partitions(brokers, new.num_partitions)
                    m.topics[new.name] = TopicInfo(
                        name=new.name,
                        topic_id=topic_id,
                        partitions=[PartitionState(b, 0, [b]) for b in owners],
                        configs=configs,
                        internal=new.internal,
                    )

            await self._commit_locked(mutate)
        return results

    async def delete_topics(self, names: Iterable[str]) -> list[TopicResult]:
        async with self._lock:
            meta = self.metadata
            results: list[TopicResult] = []
            doomed: list[str] = []
            for name in names:
                topic = meta.topics.get(name)
                if topic is None:
                    results.append(
                        TopicResult(name, UnknownTopic(f"topic {name!r} does not exist"))
                    )
                elif topic.internal:
                    results.append(
                        TopicResult(name, ControllerError(f"topic {name!r} is internal"))
                    )
                else:
                    doomed.append(name)
                    results.append(TopicResult(name, None, topic.topic_id))
            if doomed:
                await self._commit_locked(lambda m: [m.topics.pop(n) for n in doomed])
            snapshot = self.snapshot()
        await self._push(snapshot)
        return results

    async def create_partitions(
        self, name: str, total: int, *, validate_only: bool = False
    ) -> TopicResult:
        async with self._lock:
            topic = self.metadata.topics.get(name)
            if topic is None:
                return TopicResult(name, UnknownTopic(f"topic {name!r} does not exist"))
            current = len(topic.partitions)
            try:
                validate_partition_count(total)
                if total <= current:
                    raise InvalidPartitions(
                        f"topic {name!r} has {current} partitions; the count can only grow "
                        f"(asked for {total})"
                    )
                if not self.metadata.live_brokers():
                    raise NoBrokers("no live broker to place the partitions on")
            except (ValueError, ControllerError) as exc:
                return TopicResult(name, exc)
            if not validate_only:

                def mutate(m: ClusterMetadata) -> None:
                    owners = place_partitions(
                        m.live_brokers(), total - current, first_partition=current
                    )
                    m.topics[name].partitions.extend(PartitionState(b, 0, [b]) for b in owners)

                await self._commit_locked(mutate)
            snapshot = self.snapshot()
        if not validate_only:
            await self._push(snapshot)
        return TopicResult(name, None, topic.topic_id, total)

    async def alter_topic_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool, validate_only: bool
    ) -> TopicResult:
        """Set (value) or delete (None) config overrides. Non-incremental replaces all."""
        async with self._lock:
            topic = self.metadata.topics.get(name)
            if topic is None:
                return TopicResult(name, UnknownTopic(f"topic {name!r} does not exist"))
            merged: dict[str, str | None] = dict(topic.configs) if incremental else {}
            merged.update(changes)
            try:
                configs = validate_configs(merged)
            except ValueError as exc:
                return TopicResult(name, exc)
            if not validate_only:
                await self._commit_locked(lambda m: setattr(m.topics[name], "configs", configs))
            snapshot = self.snapshot()
        if not validate_only:
            await self._push(snapshot)
        return TopicResult(name, None, topic.topic_id, len(topic.partitions))

    # ---------------------------------------------------------------- producer ids
    async def allocate_producer_id(self) -> int:
        """A cluster-unique producer id. Blocks of ids are reserved in the metadata so no id
        is handed out twice across controller restarts."""
        async with self._lock:
            nxt, end = self._producer_ids
            if nxt >= end:
                start = self.metadata.next_producer_id

                def mutate(m: ClusterMetadata) -> None:
                    m.next_producer_id = start + PRODUCER_ID_BLOCK

                await self._commit_locked(mutate)
                nxt, end = start, start + PRODUCER_ID_BLOCK
            self._producer_ids = (nxt + 1, end)
            return nxt

    # ---------------------------------------------------------------- internals
    async def _commit_locked(self, mutate: Callable[[ClusterMetadata], object]) -> None:
        new = self.metadata.copy()
        mutate(new)
        new.version += 1
        try:
            token = await self._store.save(new, self._token)
        except StaleMetadata as exc:
            raise ControllerFenced(str(exc)) from exc
        self._meta, self._token = new, token

    async def _push(self, snapshot: ClusterMetadata) -> None:
        async def push_one(broker_id: int, channel: BrokerChannel) -> None:
            try:
                await channel.push_metadata(snapshot)
            except Exception:
                log.warning(
                    "metadata v%d push to broker %d failed",
                    snapshot.version,
                    broker_id,
                    exc_info=True,
                )

        await asyncio.gather(*(push_one(b, c) for b, c in list(self._channels.items())))
        for listener in self._listeners:
            await listener(snapshot)


def leader_of(meta: ClusterMetadata, topic: str, partition: int) -> int:
    info = meta.topics.get(topic)
    if info is None or partition >= len(info.partitions):
        return NO_LEADER
    return info.partitions[partition].leader
