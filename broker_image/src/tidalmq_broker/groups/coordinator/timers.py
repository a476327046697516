"""The shard's timeouts: a member whose session ran out leaves, a pending member (KIP-394) that
never came back is forgotten, a rebalance completes when its timeout passes, and the consumer
groups' sessions and revocations (groups/consumer_groups.py) expire."""

from __future__ import annotations

import asyncio
import logging

from tidalmq_core.metadata import OFFSETS_TOPIC

from tidalmq_broker.groups.consumer_group import ConsumerGroup
from tidalmq_broker.groups.coordinator.membership import Membership
from tidalmq_broker.groups.coordinator.state import CoordinatorError
from tidalmq_broker.groups.group import GroupState
from tidalmq_broker.storage.api import StorageError

log = logging.getLogger(__name__)


class Timers(Membership):
    """Session, join and rebalance timeouts."""

    async def _tick(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._settings.tick_s)
            try:
                self._expire(self._now())
            except Exception:
                log.exception("%s-%d: group timer failed", OFFSETS_TOPIC, self.partition)

    def _expire(self, now: float) -> None:
        for consumer_group in self.consumer.expire(now):
            self._spawn(self._store_expired(consumer_group))
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending_members.items()):
                if now >= deadline:
                    group.pending_members.pop(member_id, None)
                    self._maybe_complete_join(group)
            for member in list(group.members.values()):
                waiting = (
                    member.join_future is not None and group.state is GroupState.PREPARING_REBALANCE
                )
                if not waiting and now >= member.heartbeat_deadline:
                    self._remove_member(group, member, "session timed out")
            if group.state is GroupState.PREPARING_REBALANCE:
                if now >= group.rebalance_deadline:
                    self._maybe_complete_join(group, deadline_passed=True)
                else:
                    self._maybe_complete_join(group)

    async def _store_expired(self, group: ConsumerGroup) -> None:
        try:
            await self.consumer.store_if_changed(group)
        except (StorageError, CoordinatorError) as exc:
            log.warning("group %s: storing a departure failed: %s", group.group_id, exc)
