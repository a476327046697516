"""Topics and configs: creation, deletion (and the cleanup of deleted topics' data), more
partitions, topic and dynamic broker configs. Each request is validated against the image and
becomes records; creating a topic of N partitions is one record naming N brokers."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidalmq_core.metadata import INTERNAL_TOPICS, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.placement import place_partitions
from tidalmq_core.records import (
    MetadataDelta,
    Record,
    broker_configs_record,
    deletion_record,
    partitions_added_record,
    static_topic_record,
    topic_configs_record,
    topic_record,
    topic_removed_record,
)
from tidalmq_core.static_mapping import is_physical_topic, physical_topic_name
from tidalmq_core.topics import (
    InvalidPartitions,
    validate_broker_config_scope,
    validate_broker_configs,
    validate_configs,
    validate_partition_count,
    validate_topic_name,
)

from tidalmq_controller._errors import (
    ControllerError,
    InternalTopic,
    InvalidReplicaAssignment,
    NoBrokers,
    TopicAlreadyExists,
    UnknownTopic,
)
from tidalmq_controller._journal import Journal
from tidalmq_controller._membership import Membership


class TopicsHost(Protocol):
    """What the topics manager reads and calls of the controller that hosts it (the controller is one;
    naming this instead of the Controller class keeps _controller.py -> _topics.py one-way)."""

    journal: Journal
    membership: Membership
    # deletes a deleted topic's data from object storage: (topic, topic id) -> objects deleted
    topic_data_deleter: Callable[[str, str], Awaitable[int]] | None

    @property
    def image(self) -> ClusterMetadata: ...

    def placeable_brokers(self) -> list[int]: ...

    def emit(self, reason: str, message: str, fields: dict[str, Any]) -> None: ...


log = logging.getLogger(__name__)


@dataclass(slots=True)
class NewTopic:
    name: str
    num_partitions: int
    configs: dict[str, str | None] = field(default_factory=dict)
    internal: bool = False
    # the broker of each partition when the client places them (kafka-topics
    # --replica-assignment); None: the controller places them (partition i on broker i mod n)
    assignment: list[int] | None = None


@dataclass(slots=True)
class TopicResult:
    name: str
    error: Exception | None = None
    topic_id: str | None = None
    num_partitions: int = -1
    configs: dict[str, str] = field(default_factory=dict)


class Topics:
    def __init__(self, controller: TopicsHost) -> None:
        self.c = controller
        self._cleaning: asyncio.Task[None] | None = None
        # (name, topic id) -> partition count of topics deleted since this controller started:
        # the cleanup looks for those partitions among the brokers' open ones, not through all
        self._deleted_partitions: dict[tuple[str, str], int] = {}

    def on_applied(self, delta: MetadataDelta) -> None:
        for name, info in delta.removed_topics.items():
            self._deleted_partitions[(name, info.topic_id)] = len(info.partitions)

    def check_assignment(self, owners: list[int], count: int) -> None:
        if len(owners) != count:
            raise InvalidReplicaAssignment(
                f"the assignment places {len(owners)} partitions, expected {count}"
            )
        live = set(self.c.placeable_brokers())
        unknown = sorted(set(owners) - live)
        if unknown:
            raise InvalidReplicaAssignment(
                f"broker(s) {unknown} in the replica assignment are not live brokers "
                f"(live: {sorted(live)})"
            )

    def create(self, topics: list[NewTopic]) -> tuple[list[TopicResult], list[Record]]:
        meta = self.c.image
        results: list[TopicResult] = []
        records: list[Record] = []
        seen: set[str] = set()
        brokers = self.c.placeable_brokers()
        for new in topics:
            try:
                validate_topic_name(new.name)
                if (
                    new.name in INTERNAL_TOPICS or is_physical_topic(new.name)
                ) and not new.internal:
                    raise TopicAlreadyExists(f"topic {new.name!r} is internal")
                if new.name in meta.topics or new.name in seen:
                    raise TopicAlreadyExists(f"topic {new.name!r} already exists")
                validate_partition_count(new.num_partitions)
                configs = validate_configs(new.configs)
                if not brokers:
                    raise NoBrokers("no live broker to place the partitions on")
                if new.assignment is not None:
                    self.check_assignment(new.assignment, new.num_partitions)
            except (ValueError, ControllerError) as exc:
                results.append(TopicResult(new.name, error=exc))
                continue
            seen.add(new.name)
            topic_id = str(uuid.uuid4())
            owners = (
                list(new.assignment)
                if new.assignment is not None
                else place_partitions(brokers, new.num_partitions)
            )
            info = TopicInfo(
                new.name,
                topic_id,
                [PartitionState(b, 0, [b]) for b in owners],
                configs,
                internal=new.internal,
            )
            records.append(topic_record(info))
            results.append(
                TopicResult(
                    new.name,
                    None,
                    topic_id,
                    new.num_partitions,
                    TopicInfo(new.name, topic_id, [], configs).effective_configs(),
                )
            )
        return results, records

    def delete(
        self, names: list[str], being_deleted: Set[str] = frozenset()
    ) -> tuple[list[TopicResult], list[tuple[int, list[Record]]], list[str]]:
        """The answers, and per topic deleted its partition count (its own and its physical
        topic's) and records. A topic `being_deleted` by an earlier request whose batches
        are still going in is as good as gone (its records are not written twice)."""
        meta = self.c.image
        results: list[TopicResult] = []
        groups: list[tuple[int, list[Record]]] = []
        doomed: list[str] = []
        for name in names:
            topic = meta.topics.get(name)
            if topic is None or name in being_deleted:
                results.append(TopicResult(name, UnknownTopic(f"topic {name!r} does not exist")))
            elif topic.internal:
                results.append(
                    TopicResult(name, InternalTopic(f"Cannot delete internal topic {name}"))
                )
            elif name in doomed:
                results.append(TopicResult(name, UnknownTopic(f"topic {name!r} does not exist")))
            else:
                doomed.append(name)
                results.append(TopicResult(name, None, topic.topic_id))
                data = topic
                partitions = len(topic.partitions)
                records = [topic_removed_record(name)]
                if topic.kind == "static":  # its data is in its physical topic
                    records.append(static_topic_record(name, None))
                    physical = meta.topics.get(physical_topic_name(name))
                    if physical is not None:
                        records.append(topic_removed_record(physical.name))
                        data = physical
                        partitions += len(physical.partitions)
                records.append(deletion_record(data.name, data.topic_id, pending=True))
                groups.append((partitions, records))
        return results, groups, doomed

    def grow(
        self, name: str, total: int, assignment: list[int] | None
    ) -> tuple[TopicResult, list[Record]]:
        topic = self.c.image.topics.get(name)
        if topic is None:
            return TopicResult(name, UnknownTopic(f"topic {name!r} does not exist")), []
        current = len(topic.partitions)
        if topic.internal:
            return TopicResult(
                name,
                InternalTopic(
                    f"Cannot add partitions to internal topic {name}: the group coordinator finds "
                    "a group's offsets by hashing its id over the partition count"
                ),
            ), []
        try:
            if topic.pinned:
                raise InvalidPartitions(
                    f"{name!r} is a static topic: its {current} logic queues are fixed"
                )
            validate_partition_count(total)
            if total <= current:
                raise InvalidPartitions(
                    f"topic {name!r} has {current} partitions; the count can only grow "
                    f"(asked for {total})"
                )
            brokers = self.c.placeable_brokers()
            if not brokers:
                raise NoBrokers("no live broker to place the partitions on")
            if assignment is not None:
                self.check_assignment(assignment, total - current)
        except (ValueError, ControllerError) as exc:
            return TopicResult(name, exc), []
        owners = (
            list(assignment)
            if assignment is not None
            else place_partitions(brokers, total - current, first_partition=current)
        )
        return TopicResult(name, None, topic.topic_id, total), [
            partitions_added_record(name, owners, at=current)
        ]

    def alter_configs(
        self, name: str, changes: dict[str, str | None], *, incremental: bool
    ) -> tuple[TopicResult, list[Record]]:
        topic = self.c.image.topics.get(name)
        if topic is None:
            return TopicResult(name, UnknownTopic(f"topic {name!r} does not exist")), []
        if topic.internal:
            return TopicResult(
                name, InternalTopic(f"Cannot alter the configs of internal topic {name}")
            ), []
        merged: dict[str, str | None] = dict(topic.configs) if incremental else {}
        merged.update(changes)
        try:
            configs = validate_configs(merged, static=topic.kind == "static")
        except ValueError as exc:
            return TopicResult(name, exc), []
        records = [topic_configs_record(name, configs)]
        if topic.kind == "static":  # its physical queues follow
            records.append(topic_configs_record(physical_topic_name(name), configs))
        return TopicResult(name, None, topic.topic_id, len(topic.partitions)), records

    def alter_broker_configs(
        self, scope: str, changes: dict[str, str | None], *, incremental: bool
    ) -> list[Record]:
        """Raises ValueError for an invalid change."""
        validate_broker_config_scope(scope)
        merged: dict[str, str | None] = (
            dict(self.c.image.broker_configs.get(scope, {})) if incremental else {}
        )
        merged.update(changes)
        configs = validate_broker_configs(merged)
        return [broker_configs_record(scope, configs)]

    # ------------------------------------------------------------------ deleted topics' data
    def clean(self) -> None:
        """Start deleting the data of deleted topics (one task at a time)."""
        if self.c.image.pending_deletions and (self._cleaning is None or self._cleaning.done()):
            self._cleaning = asyncio.create_task(self._clean(), name="topic cleanup")

    async def _clean(self) -> None:
        """Delete the stored data of deleted topics once every live broker has applied the
        deletion and reports none of their partitions open."""
        c = self.c
        meta: ClusterMetadata = c.image
        pending = list(meta.pending_deletions)
        version = c.journal.committed_version
        for name, topic_id in pending:
            current = meta.topics.get(name)
            behind = False
            still_open = False
            count = self._deleted_partitions.get((name, topic_id))
            for _, live in c.membership.items():
                if live.applied_version < version:
                    behind = True
                    break
                if current is None and (
                    any(TopicPartition(name, i) in live.open_partitions for i in range(count))
                    if count is not None  # O(the topic's partitions)
                    else any(tp.topic == name for tp in live.open_partitions)  # after a restart
                ):
                    still_open = True
                    break
            if still_open or behind:
                continue
            if c.topic_data_deleter is not None:
                try:
                    count = await c.topic_data_deleter(name, topic_id)
                    log.info("deleted the data of topic %s (%s): %d objects", name, topic_id, count)
                except Exception as exc:
                    log.warning("deleting the data of topic %s failed, will retry: %s", name, exc)
                    continue
            await c.journal.commit([deletion_record(name, topic_id, pending=False)])
            self._deleted_partitions.pop((name, topic_id), None)
            c.emit("TopicDataDeleted", f"data of topic {name} deleted", {"topic": name})

    def stop(self) -> None:
        if self._cleaning is not None:
            self._cleaning.cancel()
