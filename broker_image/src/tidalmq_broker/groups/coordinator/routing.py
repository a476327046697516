"""GroupCoordinator: a group's requests go to the shard of the `__consumer_offsets` partition
its id hashes to; a shard is loaded when that partition opens on this broker and dropped when it
closes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import OFFSETS_TOPIC
from tidalmq_core.model import TopicPartition

from tidalmq_broker.groups.coordinator.deadlines import GroupDeadlines
from tidalmq_broker.groups.coordinator.shard import GroupShard
from tidalmq_broker.groups.coordinator.state import (
    CoordinatorError,
    GroupSettings,
    OffsetKeys,
)
from tidalmq_broker.groups.records import partition_for_group
from tidalmq_broker.internal_shards import InternalShards
from tidalmq_broker.storage.api import PartitionLog

log = logging.getLogger(__name__)


class GroupCoordinator:
    """Routes group requests to the shard of the `__consumer_offsets` partition they hash to."""

    def __init__(self, settings: GroupSettings, offsets_partitions: Callable[[], int]) -> None:
        self._offsets_partitions = offsets_partitions
        self.offset_keys = OffsetKeys()
        self.deadlines = GroupDeadlines()  # one timer for the timeouts of every shard's groups
        self._shards = InternalShards(
            OFFSETS_TOPIC,
            "groups",
            lambda partition, plog: GroupShard(
                partition, plog, settings, self.offset_keys, self.deadlines
            ),
        )

    def partition_for(self, group_id: str) -> int:
        n = self._offsets_partitions()
        if n <= 0:
            raise CoordinatorError(ErrorCode.coordinator_not_available)
        return partition_for_group(group_id, n)

    async def on_partition(self, tp: TopicPartition, plog: PartitionLog | None) -> None:
        """PartitionManager hook: load a shard when its partition opens, drop it on close."""
        self._shards.on_partition(tp, plog)

    def shard(self, group_id: str) -> GroupShard:
        if not group_id:
            raise CoordinatorError(ErrorCode.invalid_group_id, "group id is empty")
        shard = self._shards.get(self.partition_for(group_id))
        if shard is None:
            raise CoordinatorError(ErrorCode.not_coordinator)
        if not shard.loaded.is_set():
            raise CoordinatorError(ErrorCode.coordinator_load_in_progress)
        return shard

    def shards(self) -> list[GroupShard]:
        return self._shards.loaded()

    async def on_txn_marker(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """WriteTxnMarkers listener: a marker is durable in `tp`; on a `__consumer_offsets`
        partition it settles the transaction's pending offsets."""
        if tp.topic != OFFSETS_TOPIC:
            return
        shard = self._shards.get(tp.partition)
        if shard is not None:
            await shard.complete_txn(producer_id, commit)

    async def close(self) -> None:
        self._shards.close()
        self.deadlines.close()
