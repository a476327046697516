"""The shard's timeouts: a member whose session ran out leaves, a pending member (KIP-394) that
never came back is forgotten, a rebalance completes when its timeout passes, and the consumer
groups' sessions and revocations (groups/consumer_groups.py) expire. Checked group by group when
the broker's timer (deadlines.py) finds a group's deadline passed, never by a walk over all."""

from __future__ import annotations

import logging

from tidalmq_broker.groups.consumer_group import ConsumerGroup
from tidalmq_broker.groups.coordinator.membership import Membership
from tidalmq_broker.groups.coordinator.state import CoordinatorError
from tidalmq_broker.groups.group import Group, GroupState
from tidalmq_broker.storage.api import StorageError

log = logging.getLogger(__name__)


class Timers(Membership):
    """Session, join and rebalance timeouts, checked when a group's deadline passes."""

    def deadline_passed(self, group_id: str, now: float) -> None:
        """The broker's timer (deadlines.py): a timeout of the group may have passed. Checks
        the group's, then queues it again at its next one."""
        if self._closed:
            return
        group = self.groups.get(group_id)
        if group is not None:
            self._expire(group, now)
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None and self.consumer.expire_group(consumer_group, now):
            self._spawn(self._store_expired(consumer_group))
        self._watch(group_id, now)

    def _expire(self, group: Group, now: float) -> None:
        """The timeouts are checked, and the join completed or not, at `now`, the timer's time
        (the one deadline_passed then queues the next timeout from), not at a second reading
        of the clock, which may have moved on meanwhile."""
        for member_id, deadline in list(group.pending_members.items()):
            if now >= deadline:
                group.pending_members.pop(member_id, None)
                self._maybe_complete_join(group, now=now)
        for member in list(group.members.values()):
            waiting = (
                member.join_future is not None and group.state is GroupState.PREPARING_REBALANCE
            )
            if not waiting and now >= member.heartbeat_deadline:
                self._remove_member(group, member, "session timed out")
        if group.state is GroupState.PREPARING_REBALANCE:
            if now >= group.rebalance_deadline:
                self._maybe_complete_join(group, now=now, deadline_passed=True)
            else:
                self._maybe_complete_join(group, now=now)

    async def _store_expired(self, group: ConsumerGroup) -> None:
        try:
            await self.consumer.store_if_changed(group)
        except (StorageError, CoordinatorError) as exc:
            log.warning("group %s: storing a departure failed: %s", group.group_id, exc)
