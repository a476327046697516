"""Classic groups (Kafka's rebalance protocol): JoinGroup (KIP-394's member id first, static
members taking over their instance's slot), the rebalance prepared and completed when every
member rejoined or the rebalance timeout passed, SyncGroup (the leader's assignment stored
before anyone gets it), Heartbeat, LeaveGroup, and what DescribeGroups and ListGroups read."""

from __future__ import annotations

import asyncio
import logging
import uuid

from kio.schema.errors import ErrorCode

from tidalmq_broker.groups.coordinator.persistence import ShardPersistence
from tidalmq_broker.groups.coordinator.state import (
    CoordinatorError,
    _now_ms,
    _resolve,
    _resolve_join,
    _resolve_sync,
)
from tidalmq_broker.groups.group import Group, GroupState, JoinResult, Member
from tidalmq_broker.storage.api import StorageError

log = logging.getLogger(__name__)


class Membership(ShardPersistence):
    """Classic groups: join, sync, heartbeat, leave, describe."""

    async def join(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> JoinResult:
        s = self._settings
        if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
            return JoinResult(error=ErrorCode.invalid_session_timeout, member_id=member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            if consumer_group.members:  # as Kafka with no migration between the protocols
                return JoinResult(error=ErrorCode.inconsistent_group_protocol, member_id=member_id)
            self.consumer.forget(group_id)  # an empty consumer group becomes a classic one
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(error=ErrorCode.unknown_member_id, member_id=member_id)
            group = self.groups[group_id] = Group(group_id)
        if not group.supports(protocol_type, protocols):
            return JoinResult(error=ErrorCode.inconsistent_group_protocol, member_id=member_id)
        now = self._now()
        loop = asyncio.get_running_loop()

        if not member_id:
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if group_instance_id is not None:
                old = group.member_by_instance(group_instance_id)
                if old is not None:
                    # a static member restarted: it takes over its old identity's slot
                    group.members.pop(old.member_id)
                    _resolve_join(old, JoinResult(error=ErrorCode.fenced_instance_id))
                    _resolve_sync(old, ErrorCode.fenced_instance_id, b"")
                    if group.leader == old.member_id:
                        group.leader = new_id
            elif require_known_member_id:
                # KIP-394: hand out the id first, so a client that never comes back is not a
                # member the whole group waits for
                group.pending_members[new_id] = now + session_timeout_ms / 1000
                self._watch(group_id)
                return JoinResult(error=ErrorCode.member_id_required, member_id=new_id)
            member_id = new_id
        elif member_id not in group.members and member_id not in group.pending_members:
            return JoinResult(error=ErrorCode.unknown_member_id, member_id=member_id)

        future: asyncio.Future[JoinResult]  # answered when the join completes
        member = group.members.get(member_id)
        if member is None:
            group.pending_members.pop(member_id, None)
            member = Member(
                member_id=member_id,
                group_instance_id=group_instance_id,
                client_id=client_id,
                client_host=client_host,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                protocol_type=protocol_type,
                protocols=protocols,
            )
            group.members[member_id] = member
            if group.protocol_type is None or len(group.members) == 1:
                group.protocol_type = protocol_type
            member.touch(now)
            future = member.join_future = loop.create_future()
            self._prepare_rebalance(group, f"{member_id} joined")
        else:
            member.touch(now)
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            changed = not member.same_protocols(protocols)
            member.protocols = protocols
            if member.join_future is not None:
                _resolve_join(member, JoinResult(error=ErrorCode.rebalance_in_progress))
            future = member.join_future = loop.create_future()
            if group.state is GroupState.PREPARING_REBALANCE:
                pass
            elif (
                group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
                and not changed
                and member_id != group.leader
            ):
                # a follower re-sent its join: answer with the current generation
                member.join_future = None
                _resolve(future, self._join_result(group, member, include_members=False))
            else:
                self._prepare_rebalance(group, f"{member_id} rejoined")
        self._maybe_complete_join(group)
        self._watch(group_id)  # its session, a rebalance's timeouts
        return await future

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        now = self._now()
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                _resolve_sync(member, ErrorCode.rebalance_in_progress, b"")
                member.assignment = b""
        if group.state is not GroupState.PREPARING_REBALANCE:
            was_empty = group.state is GroupState.EMPTY
            group.state = GroupState.PREPARING_REBALANCE
            group.state_timestamp_ms = _now_ms()
            group.rebalance_deadline = now + group.max_rebalance_timeout_s()
            delay = self._settings.initial_rebalance_delay_ms / 1000 if was_empty else 0.0
            group.initial_delay_deadline = now + delay
            log.info("group %s: preparing rebalance (%s)", group.group_id, reason)
        else:
            group.rebalance_deadline = max(
                group.rebalance_deadline, now + group.max_rebalance_timeout_s()
            )
        self._watch(group.group_id)

    def _maybe_complete_join(
        self, group: Group, *, now: float | None = None, deadline_passed: bool = False
    ) -> None:
        """Completes the join if every member rejoined (or the rebalance timed out) and the
        initial delay is over. `now`: the time of the check (the timer's: its deadline's, which
        the clock may read a hair before the handle runs), else the clock's."""
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        if now is None:
            now = self._now()
        if now < group.initial_delay_deadline and not deadline_passed:
            # The check at the delay's end is queued here, not left to the caller's _watch:
            # that one reads the clock again, and uvloop's millisecond clock may tick past
            # the deadline in between, so next_deadline would leave the delay out and the
            # group would wait for its rebalance timeout (5 min for librdkafka's members)
            self._check_by(group.group_id, group.initial_delay_deadline)
            return
        if not (group.all_members_joined() or deadline_passed):
            return
        # members that did not rejoin in time are out
        for member in [m for m in group.members.values() if m.join_future is None]:
            log.info("group %s: removing %s (did not rejoin)", group.group_id, member.member_id)
            group.members.pop(member.member_id)
            _resolve_sync(member, ErrorCode.unknown_member_id, b"")
        group.pending_members.clear()
        group.generation += 1
        group.state_timestamp_ms = _now_ms()
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_name = None
            group.leader = None
            self._spawn_persist(group)
            return
        group.protocol_name = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        log.info(
            "group %s: generation %d with %d members, protocol %s, leader %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
            group.leader,
        )
        for member in group.members.values():
            member.touch(now)
            member.is_new = False
            result = self._join_result(
                group, member, include_members=member.member_id == group.leader
            )
            future, member.join_future = member.join_future, None
            if future is not None:
                _resolve(future, result)
        self._watch(group.group_id)  # the sessions of those that were waiting in the join

    def _join_result(self, group: Group, member: Member, *, include_members: bool) -> JoinResult:
        members = []
        if include_members:
            members = [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "metadata": m.metadata_for(group.protocol_name),
                }
                for m in group.members.values()
            ]
        return JoinResult(
            error=ErrorCode.none,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader or "",
            member_id=member.member_id,
            members=members,
        )

    async def sync(
        self,
        *,
        group_id: str,
        generation: int,
        member_id: str,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> tuple[int, bytes, str | None, str | None]:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id, b"", None, None
        if generation != group.generation:
            return ErrorCode.illegal_generation, b"", None, None
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return ErrorCode.inconsistent_group_protocol, b"", None, None
        member = group.members[member_id]
        member.touch(self._now())
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress, b"", None, None
        if group.state is GroupState.STABLE:
            return ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
        if group.state is not GroupState.COMPLETING_REBALANCE:
            return ErrorCode.unknown_member_id, b"", None, None
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        _resolve_sync(member, ErrorCode.rebalance_in_progress, b"")
        member.sync_future = future
        if member_id == group.leader:
            for mid, m in group.members.items():
                m.assignment = assignments.get(mid, b"")
            gen = group.generation
            try:
                await self._persist_group(group)
            except (StorageError, CoordinatorError) as exc:
                log.warning("group %s: storing generation %d failed: %s", group_id, gen, exc)
                if group.generation == gen and group.state is GroupState.COMPLETING_REBALANCE:
                    for m in group.members.values():
                        m.assignment = b""
                        _resolve_sync(m, ErrorCode.coordinator_not_available, b"")
                    self._prepare_rebalance(group, "could not store the assignment")
                return ErrorCode.coordinator_not_available, b"", None, None
            if group.generation == gen and group.state is GroupState.COMPLETING_REBALANCE:
                group.state = GroupState.STABLE
                group.state_timestamp_ms = _now_ms()
                for m in group.members.values():
                    _resolve_sync(m, ErrorCode.none, m.assignment)
        code, assignment = await future
        return code, assignment, group.protocol_type, group.protocol_name

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        group.members[member_id].touch(self._now())
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[int]:
        """(member id, group instance id) pairs; a static member may leave by instance id."""
        group = self.groups.get(group_id)
        codes: list[int] = []
        for member_id, instance_id in members:
            if group is None:
                codes.append(ErrorCode.unknown_member_id)
                continue
            member = group.members.get(member_id) if member_id else None
            if member is None and instance_id is not None:
                member = group.member_by_instance(instance_id)
                if member is not None and member_id and member.member_id != member_id:
                    codes.append(ErrorCode.fenced_instance_id)
                    continue
            if member is None:
                if member_id in group.pending_members:
                    group.pending_members.pop(member_id)
                    codes.append(ErrorCode.none)
                else:
                    codes.append(ErrorCode.unknown_member_id)
                continue
            self._remove_member(group, member, "left the group")
            codes.append(ErrorCode.none)
        if group is not None:  # a pending member that left may be the one the join waited for
            self._maybe_complete_join(group)
        return codes

    def _remove_member(self, group: Group, member: Member, reason: str) -> None:
        group.members.pop(member.member_id, None)
        _resolve_join(member, JoinResult(error=ErrorCode.unknown_member_id))
        _resolve_sync(member, ErrorCode.unknown_member_id, b"")
        log.info("group %s: member %s %s", group.group_id, member.member_id, reason)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"{member.member_id} {reason}")
        self._maybe_complete_join(group)

    def list_groups(self) -> list[Group]:
        groups = list(self.groups.values())
        # groups that exist only through committed offsets (simple consumers, admin resets)
        for group_id in self.offsets:
            if group_id not in self.groups and group_id not in self.consumer.groups:
                groups.append(Group(group_id))
        return groups

    def describe(self, group_id: str) -> Group | None:
        """A classic group (None for a consumer group: DescribeGroups does not describe
        those, as in Kafka)."""
        if group_id in self.consumer.groups:
            return None
        group = self.groups.get(group_id)
        if group is None and group_id in self.offsets:
            return Group(group_id)
        return group
