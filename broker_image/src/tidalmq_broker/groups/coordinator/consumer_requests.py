"""The consumer group protocol (KIP-848) in the shard: ConsumerGroupHeartbeat beside the classic
groups (a group id names one kind or the other, an empty group of one kind becomes the other),
and the epoch check of a consumer-group member's OffsetFetch. The groups themselves are
groups/consumer_groups.py's."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from tidalmq_broker.groups.consumer_group import ConsumerGroup
from tidalmq_broker.groups.consumer_groups import (
    Heartbeat,
    HeartbeatResult,
    Topics,
)
from tidalmq_broker.groups.coordinator.persistence import ShardPersistence
from tidalmq_broker.groups.coordinator.state import (
    CoordinatorError,
    _storage_code,
)
from tidalmq_broker.groups.group import GroupState
from tidalmq_broker.storage.api import StorageError

log = logging.getLogger(__name__)


class ConsumerGroupRequests(ShardPersistence):
    """ConsumerGroupHeartbeat and the checks of consumer-group members' offset requests."""

    async def consumer_heartbeat(self, request: Heartbeat, topics: Topics) -> HeartbeatResult:
        """ConsumerGroupHeartbeat (KIP-848). A classic group of that id with members is
        another kind of group (GROUP_ID_NOT_FOUND, as Kafka); an empty one becomes a consumer
        group, keeping its offsets."""
        classic = self.groups.get(request.group_id)
        if classic is not None:
            if classic.members or classic.state is not GroupState.EMPTY:
                return HeartbeatResult(
                    error=ErrorCode.group_id_not_found,
                    message=f"Group {request.group_id} is not a consumer group.",
                    member_epoch=-1,
                )
            del self.groups[request.group_id]
        try:
            return await self.consumer.heartbeat(request, topics, self._now())
        except (StorageError, CoordinatorError) as exc:
            log.warning("group %s: storing the group failed: %s", request.group_id, exc)
            return HeartbeatResult(error=_storage_code(exc), member_epoch=-1)
        finally:
            # the member's session (and revocation) deadlines, set as the heartbeat was applied
            self._watch(request.group_id)

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer.groups.get(group_id)

    def validate_offset_fetch(self, group_id: str, member_id: str | None, epoch: int) -> int:
        """OffsetFetch v9 from a member of a consumer group: a member at its epoch."""
        if group_id not in self.consumer.groups or (member_id is None and epoch < 0):
            return ErrorCode.none
        return self.consumer.validate_offsets(group_id, member_id or "", epoch)
