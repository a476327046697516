"""The group coordinator: consumer groups and committed offsets, durable in `__consumer_offsets`.

As in Kafka, group G is coordinated by the broker leading partition
`abs(hash(G)) % partitions` of `__consumer_offsets`. When that partition opens on this broker
its log is replayed into a GroupShard (groups, members, generations, assignments, offsets); when
it closes (a move, a drain) the shard is dropped and waiting members are told NOT_COORDINATOR so
they find the new coordinator, which replays the same log. Every state change that must survive a
restart (a completed rebalance, an emptied group, an offset commit, a deletion) is appended and
acknowledged by the storage engine before it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import OFFSETS_TOPIC
from tidalmq_core.model import TopicPartition

from tidalmq_broker.groups.consumer_group import ConsumerGroup
from tidalmq_broker.groups.consumer_groups import (
    ConsumerGroups,
    ConsumerGroupSettings,
    Heartbeat,
    HeartbeatResult,
    TopicInfo,
    group_document,
)
from tidalmq_broker.groups.group import Group, GroupState, JoinResult, Member
from tidalmq_broker.groups.records import (
    ConsumerGroupValue,
    GroupKey,
    GroupValue,
    Key,
    MemberValue,
    OffsetKey,
    OffsetValue,
    TxnOffsetKey,
    Value,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    marker_is_commit,
    partition_for_group,
)
from tidalmq_broker.protocol.records import (
    TRANSACTIONAL_FLAG,
    build_batch,
    iter_complete_headers,
    iter_records,
)
from tidalmq_broker.storage.api import (
    UNVERIFIED,
    InvalidProducerEpoch,
    InvalidTxnState,
    PartitionLog,
    StorageError,
    VerificationGuard,
)

log = logging.getLogger(__name__)

# KIP-890's question to the transaction coordinator for a TxnOffsetCommit: (the group's
# `__consumer_offsets` partition, producer id, epoch) -> its verify-only error code
Verify = Callable[[TopicPartition, int, int], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class GroupSettings:
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_metadata_bytes: int = 4096  # offset.metadata.max.bytes
    # rewrite live keys and trim the log after this many (not on a compacted log)
    snapshot_after_records: int = 20_000
    tick_s: float = 0.1
    consumer: ConsumerGroupSettings = field(default_factory=ConsumerGroupSettings)  # KIP-848


class CoordinatorError(Exception):
    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class OffsetKeys:
    """Where committed offsets are stored. The identity, except for static topics,
    whose offsets go under the physical queue leading the logic queue at commit time and are
    read with Double-Read-Check (see tidalmq_broker.static_topics.service)."""

    def commit_key(self, topic: str, partition: int) -> tuple[str, int]:
        return topic, partition

    def read_keys(self, topic: str, partition: int) -> list[tuple[str, int]]:
        return [(topic, partition)]

    def logical(self, topic: str, partition: int) -> tuple[tuple[str, int], int] | None:
        """(the partition clients know, rank among keys of that partition), None if stale."""
        return (topic, partition), 0


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None


class GroupShard:
    """The groups of one `__consumer_offsets` partition led by this broker."""

    def __init__(
        self,
        partition: int,
        plog: PartitionLog,
        settings: GroupSettings,
        keys: OffsetKeys | None = None,
    ) -> None:
        self.partition = partition
        self._keys = keys or OffsetKeys()
        self._log = plog
        self._settings = settings
        self.groups: dict[str, Group] = {}  # classic groups
        # groups of the consumer group protocol (KIP-848); a group id names one kind or the other
        self.consumer = ConsumerGroups(settings.consumer, self._store_consumer_group)
        self.offsets: dict[str, dict[tuple[str, int], OffsetValue]] = {}
        # offsets of open transactions (TxnOffsetCommit), by producer id, until their marker
        self.pending: dict[int, dict[TxnOffsetKey, OffsetValue]] = {}
        # settled by a marker, their outcome not yet written as plain records (_materialise)
        self._unmaterialised: set[TxnOffsetKey] = set()
        self.loaded = asyncio.Event()
        self._closed = False
        self._records_since_snapshot = 0
        self._ticker: asyncio.Task[None] | None = None
        # What the log holds: every live key with its last durable value. Updated by _append as
        # soon as the log acknowledges (before the caller applies the change to groups and
        # offsets), so a snapshot writes exactly what replay would rebuild, nothing less.
        self._durable: dict[Key, Value] = {}
        self._appends_open = asyncio.Event()  # cleared while a snapshot writes and trims
        self._appends_open.set()
        self._appends_in_flight = 0
        self._appends_drained = asyncio.Event()
        self._appends_drained.set()
        self._snapshot_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle
    async def load(self) -> None:
        """Replay the log from its start into groups and offsets."""
        started = time.perf_counter()
        live: dict[Key, Value] = {}
        open_txns: dict[int, set[TxnOffsetKey]] = {}  # pending offsets by producer id
        unmaterialised: set[TxnOffsetKey] = set()  # settled, no tombstone after the marker
        offset = self._log.log_start_offset
        count = 0
        while offset < self._log.high_watermark and not self._closed:
            result = await self._log.read(offset, 4 * 1024 * 1024)
            if not result.records:
                break
            data = result.records
            for header in iter_complete_headers(data):
                for rec_offset, raw_key, raw_value in iter_records(data, header):
                    if rec_offset < offset or raw_key is None:
                        continue
                    if header.is_control:  # a transaction's marker settles its offsets
                        commit = marker_is_commit(raw_key)
                        if commit is not None:
                            settled = open_txns.pop(header.producer_id, set())
                            _settle(live, settled, commit)
                            unmaterialised |= settled
                        continue
                    key = decode_key(raw_key)
                    value = decode_value(key, raw_value)
                    if isinstance(key, TxnOffsetKey):
                        if value is None:
                            unmaterialised.discard(key)
                        else:
                            open_txns.setdefault(key.producer_id, set()).add(key)
                    if value is None:
                        live.pop(key, None)
                    else:
                        live[key] = value
                    count += 1
                offset = header.last_offset + 1
        now = asyncio.get_running_loop().time()
        for key, value in live.items():
            if isinstance(key, OffsetKey) and isinstance(value, OffsetValue):
                self.offsets.setdefault(key.group, {})[(key.topic, key.partition)] = value
            elif isinstance(key, GroupKey) and isinstance(value, GroupValue):
                self.groups[key.group] = _group_from_value(key.group, value, now)
            elif isinstance(key, GroupKey) and isinstance(value, ConsumerGroupValue):
                self.consumer.load(key.group, value.document, now)
            elif isinstance(key, TxnOffsetKey) and isinstance(value, OffsetValue):
                self.pending.setdefault(key.producer_id, {})[key] = value
        self._durable = live
        self._records_since_snapshot = count
        # a coordinator stopped between a marker and the records that materialise it
        self._unmaterialised = unmaterialised
        await self._materialise()
        self.loaded.set()
        self._ticker = asyncio.create_task(self._tick(), name=f"groups tick {self.partition}")
        log.info(
            "%s-%d: loaded %d groups and %d offset groups from %d records in %.0f ms",
            OFFSETS_TOPIC,
            self.partition,
            len(self.groups),
            len(self.offsets),
            count,
            (time.perf_counter() - started) * 1000,
        )

    def close(self) -> None:
        """The partition left this broker: fail everyone waiting with NOT_COORDINATOR."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
        for group in self.groups.values():
            for member in group.members.values():
                _resolve_join(member, JoinResult(error=ErrorCode.not_coordinator))
                _resolve_sync(member, ErrorCode.not_coordinator, b"")

    # ------------------------------------------------------------------ join
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
                return JoinResult(error=ErrorCode.member_id_required, member_id=new_id)
            member_id = new_id
        elif member_id not in group.members and member_id not in group.pending_members:
            return JoinResult(error=ErrorCode.unknown_member_id, member_id=member_id)

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

    def _maybe_complete_join(self, group: Group, *, deadline_passed: bool = False) -> None:
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        now = self._now()
        if now < group.initial_delay_deadline and not deadline_passed:
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

    # ------------------------------------------------------------------ sync
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

    # ------------------------------------------------------------------ heartbeat / leave
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
        return codes

    def _remove_member(self, group: Group, member: Member, reason: str) -> None:
        group.members.pop(member.member_id, None)
        _resolve_join(member, JoinResult(error=ErrorCode.unknown_member_id))
        _resolve_sync(member, ErrorCode.unknown_member_id, b"")
        log.info("group %s: member %s %s", group.group_id, member.member_id, reason)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"{member.member_id} {reason}")
        self._maybe_complete_join(group)

    # ------------------------------------------------------------------ offsets
    async def commit(
        self,
        *,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: dict[tuple[str, int], CommittedOffset],
        topic_ids: Mapping[str, str] | None = None,
    ) -> dict[tuple[str, int], int]:
        """`topic_ids` (name -> id): lets a consumer-group member commit at an older epoch
        partitions it has held since (validate_offsets)."""
        if group_id in self.consumer.groups:
            held = (
                {(topic_ids[t], p) for t, p in offsets if t in topic_ids}
                if topic_ids is not None
                else None
            )
            code = self.consumer.validate_offsets(group_id, member_id, generation, held)
            if code != ErrorCode.none:
                return dict.fromkeys(offsets, code)
            return await self._write_offsets(group_id, offsets)
        group = self.groups.get(group_id)
        generic_commit = generation < 0 and not member_id
        if group is None:
            if not generic_commit:
                return dict.fromkeys(offsets, ErrorCode.illegal_generation)
            group = self.groups[group_id] = Group(group_id)
        elif generic_commit:
            if not group.is_empty():
                return dict.fromkeys(offsets, ErrorCode.unknown_member_id)
        else:
            if group.state is GroupState.COMPLETING_REBALANCE:
                return dict.fromkeys(offsets, ErrorCode.rebalance_in_progress)
            if member_id not in group.members:
                return dict.fromkeys(offsets, ErrorCode.unknown_member_id)
            if generation != group.generation:
                return dict.fromkeys(offsets, ErrorCode.illegal_generation)
            group.members[member_id].touch(self._now())
        return await self._write_offsets(group_id, offsets)

    async def _write_offsets(
        self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]
    ) -> dict[tuple[str, int], int]:
        results, to_write = self._offset_records(
            offsets, lambda topic, partition: OffsetKey(group_id, topic, partition)
        )
        if to_write:
            try:
                await self._append(to_write)
            except (StorageError, CoordinatorError) as exc:
                log.warning("group %s: offset commit failed: %s", group_id, exc)
                return dict.fromkeys(offsets, _storage_code(exc))
            table = self.offsets.setdefault(group_id, {})
            for key, value in to_write:
                assert isinstance(key, OffsetKey) and isinstance(value, OffsetValue)
                table[(key.topic, key.partition)] = value
        return results

    def _offset_records(
        self,
        offsets: dict[tuple[str, int], CommittedOffset],
        key_of: Callable[[str, int], Key],
    ) -> tuple[dict[tuple[str, int], int], list[tuple[Key, Value | None]]]:
        """The records of an offset commit (plain or transactional: `key_of` makes the key
        from the stored topic and partition), and each offset's error: metadata over the
        limit is refused, the rest is written."""
        results: dict[tuple[str, int], int] = {}
        to_write: list[tuple[Key, Value | None]] = []
        now_ms = _now_ms()
        for (topic, partition), committed in offsets.items():
            if (
                committed.metadata is not None
                and len(committed.metadata.encode()) > self._settings.max_metadata_bytes
            ):
                results[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            value = OffsetValue(
                committed.offset, committed.leader_epoch, committed.metadata, now_ms
            )
            to_write.append((key_of(*self._keys.commit_key(topic, partition)), value))
            results[(topic, partition)] = ErrorCode.none
        return results, to_write

    async def txn_commit(
        self,
        *,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: dict[tuple[str, int], CommittedOffset],
        verify: Verify | None = None,
    ) -> dict[tuple[str, int], int]:
        """TxnOffsetCommit: the offsets are stored pending, and become the group's committed
        offsets only when the transaction's commit marker reaches this partition (an abort
        drops them). As in Kafka they are written as a transactional batch of the producer, so
        the partition's markers, last stable offset and aborted index govern them, and the log
        cleaner keeps a commit marker while its offsets remain. KIP-447: a member id and
        generation, when given, must be the group's current ones, so a producer whose consumer
        lost its partitions is fenced.

        KIP-890 (`verify`, None when verification is off): unless the producer already has
        offsets pending in this partition's transaction, the transaction coordinator is asked
        first whether the producer's ongoing transaction at this epoch holds this partition
        (AddOffsetsToTxn added it); its refusal is answered for every offset as the
        coordinator's code (the caller maps it per version). The write then carries the
        partition's verification guard, so a marker of the transaction landing meanwhile
        makes it INVALID_TXN_STATE instead of opening a transaction no marker closes."""
        if verify is None:
            return await self._txn_commit(
                group_id, producer_id, producer_epoch, generation, member_id,
                group_instance_id, offsets, None,
            )  # fmt: skip
        if self._log.in_transaction(producer_id, producer_epoch):
            return await self._txn_commit(
                group_id, producer_id, producer_epoch, generation, member_id,
                group_instance_id, offsets, UNVERIFIED,  # refused too if its marker lands first
            )  # fmt: skip
        guard = self._log.start_verification(producer_id)
        try:
            tp = TopicPartition(OFFSETS_TOPIC, self.partition)
            code = await verify(tp, producer_id, producer_epoch)
            if code != ErrorCode.none:
                return dict.fromkeys(offsets, code)
            return await self._txn_commit(
                group_id, producer_id, producer_epoch, generation, member_id,
                group_instance_id, offsets, guard,
            )  # fmt: skip
        finally:
            self._log.end_verification(producer_id, guard)

    async def _txn_commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: dict[tuple[str, int], CommittedOffset],
        guard: VerificationGuard | None,
    ) -> dict[tuple[str, int], int]:
        group = self.groups.get(group_id)
        if group_id in self.consumer.groups and (generation >= 0 or member_id):
            code = self.consumer.validate_offsets(group_id, member_id, generation)
            if code != ErrorCode.none:
                return dict.fromkeys(offsets, code)
        elif generation >= 0 or member_id:
            if group is None or member_id not in group.members:
                return dict.fromkeys(offsets, ErrorCode.unknown_member_id)
            member = group.members[member_id]
            if group_instance_id is not None and member.group_instance_id != group_instance_id:
                return dict.fromkeys(offsets, ErrorCode.fenced_instance_id)
            if generation != group.generation:
                return dict.fromkeys(offsets, ErrorCode.illegal_generation)
        results, to_write = self._offset_records(
            offsets,
            lambda topic, partition: TxnOffsetKey(producer_id, group_id, topic, partition),
        )
        if to_write:
            try:
                await self._append(
                    to_write, producer=(producer_id, producer_epoch), verification=guard
                )
            except InvalidProducerEpoch as exc:  # Kafka's answer to an older epoch here
                log.info("group %s: transactional offset commit fenced: %s", group_id, exc)
                return dict.fromkeys(offsets, ErrorCode.invalid_producer_epoch)
            except InvalidTxnState as exc:
                log.info("group %s: transactional offset commit refused: %s", group_id, exc)
                return dict.fromkeys(offsets, ErrorCode.invalid_txn_state)
            except (StorageError, CoordinatorError) as exc:
                log.warning("group %s: transactional offset commit failed: %s", group_id, exc)
                return dict.fromkeys(offsets, _storage_code(exc))
            table = self.pending.setdefault(producer_id, {})
            for key, value in to_write:
                assert isinstance(key, TxnOffsetKey) and isinstance(value, OffsetValue)
                table[key] = value
        return results

    async def complete_txn(self, producer_id: int, commit: bool) -> None:
        """The transaction's marker is durable in this partition: its pending offsets become
        committed (or are dropped), in memory and in the durable state, as replay would; then
        that outcome is written as plain records (`_materialise`)."""
        keys = set(self.pending.pop(producer_id, {}))
        settled = _settle(self._durable, keys, commit)
        for key, value in settled:
            self.offsets.setdefault(key.group, {})[(key.topic, key.partition)] = value
        if keys:
            self._unmaterialised |= keys
            await self._materialise()

    async def _materialise(self) -> None:
        """Write what markers settled as plain records: each settled offset's current value
        under its OffsetKey and a tombstone for its TxnOffsetKey. Under compaction the pending
        record then goes, its marker with it, and the offset lives on under the key that a
        later commit or a group deletion supersedes; without this, a deleted group's offset
        comes back once its tombstones expire (docs/compaction.md, defect 3).

        Appends are held and drained first, as for a snapshot, so the values written are the
        log's latest: a deletion in flight cannot be overtaken by the offset it deletes. A
        failure keeps the keys for the next marker or the next load."""
        async with self._snapshot_lock:
            if self._closed or not self._unmaterialised:
                return
            self._appends_open.clear()
            try:
                await self._appends_drained.wait()
                keys, self._unmaterialised = self._unmaterialised, set()
                records = self._settled_records(keys)
                try:
                    if records and not self._closed:
                        batch = build_batch(
                            [(encode_key(k), encode_value(v)) for k, v in records],
                            timestamp_ms=_now_ms(),
                        )
                        await self._log.append(batch, acks=-1)
                        self._records_since_snapshot += len(records)
                except StorageError as exc:
                    self._unmaterialised |= keys
                    log.warning(
                        "%s-%d: writing %d settled transactional offsets failed: %s",
                        OFFSETS_TOPIC,
                        self.partition,
                        len(keys),
                        exc,
                    )
            finally:
                self._appends_open.set()

    def _settled_records(self, keys: set[TxnOffsetKey]) -> list[tuple[Key, Value | None]]:
        """The plain records of what markers settled for `keys`: a tombstone for each pending
        record (unless pending again: its next marker settles it) and the offset's current
        value under its OffsetKey."""
        records: list[tuple[Key, Value | None]] = []
        for key in sorted(keys, key=_txn_key_order):
            if key not in self._durable:
                records.append((key, None))
            committed = OffsetKey(key.group, key.topic, key.partition)
            value = self._durable.get(committed)
            if value is not None:
                records.append((committed, value))
        return records

    def has_pending(self, group_id: str, topic: str, partition: int) -> bool:
        """An open transaction holds an offset for it (OffsetFetch with require_stable)."""
        return any(
            key.group == group_id and (key.topic, key.partition) == (topic, partition)
            for table in self.pending.values()
            for key in table
        )

    def fetch_offsets(
        self, group_id: str, partitions: list[tuple[str, int]] | None
    ) -> dict[tuple[str, int], CommittedOffset]:
        table = self.offsets.get(group_id, {})
        out: dict[tuple[str, int], CommittedOffset] = {}
        if partitions is None:  # every partition the group has an offset for
            ranked: dict[tuple[str, int], tuple[int, OffsetValue]] = {}
            for key, value in table.items():
                found = self._keys.logical(*key)
                if found is not None and found[1] >= ranked.get(found[0], (-2, value))[0]:
                    ranked[found[0]] = (found[1], value)
            return {
                tp: CommittedOffset(v.offset, v.leader_epoch, v.metadata)
                for tp, (_, v) in sorted(ranked.items())
            }
        for tp in partitions:
            committed = next(
                (table[k] for k in self._keys.read_keys(*tp) if k in table), None
            )  # Double-Read-Check for static topics: the newest key that has one
            if committed is None:
                out[tp] = CommittedOffset(-1, -1, "")
            else:
                out[tp] = CommittedOffset(
                    committed.offset, committed.leader_epoch, committed.metadata
                )
        return out

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]]
    ) -> tuple[int, dict[tuple[str, int], int]]:
        group = self.groups.get(group_id)
        table = self.offsets.get(group_id)
        consumer_group = self.consumer.groups.get(group_id)
        if group is None and table is None and consumer_group is None:
            return ErrorCode.group_id_not_found, {}
        if consumer_group is not None and consumer_group.members:
            names = {n for m in consumer_group.members.values() for n in m.subscribed_topic_names}
            blocked = {
                tp: ErrorCode.group_subscribed_to_topic for tp in partitions if tp[0] in names
            }
        elif group is not None and group.state not in (GroupState.EMPTY, GroupState.DEAD):
            subscribed = _subscribed_topics(group)
            if subscribed is None:
                return ErrorCode.non_empty_group, {}
            blocked = {
                tp: ErrorCode.group_subscribed_to_topic for tp in partitions if tp[0] in subscribed
            }
        else:
            blocked = {}
        doomed = [
            key
            for tp in partitions
            if tp not in blocked and table
            for key in self._keys.read_keys(*tp)
            if key in table
        ]
        if doomed and table is not None:  # doomed keys are the table's
            try:
                await self._append([(OffsetKey(group_id, t, p), None) for t, p in doomed])
            except (StorageError, CoordinatorError) as exc:
                return _storage_code(exc), {}
            for key in doomed:
                table.pop(key, None)
        return ErrorCode.none, {tp: blocked.get(tp, ErrorCode.none) for tp in partitions}

    async def delete_group(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        table = self.offsets.get(group_id)
        consumer_group = self.consumer.groups.get(group_id)
        if group is None and table is None and consumer_group is None:
            return ErrorCode.group_id_not_found
        if (group is not None and not group.is_empty()) or (
            consumer_group is not None and consumer_group.members
        ):
            return ErrorCode.non_empty_group
        records: list[tuple[Key, Value | None]] = [(GroupKey(group_id), None)]
        records += [(OffsetKey(group_id, t, p), None) for (t, p) in (table or {})]
        try:
            await self._append(records)
        except (StorageError, CoordinatorError) as exc:
            return _storage_code(exc)
        self.groups.pop(group_id, None)
        self.consumer.forget(group_id)
        self.offsets.pop(group_id, None)
        return ErrorCode.none

    # ------------------------------------------------------------------ describe
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

    # ------------------------------------------------------------------ consumer groups
    async def consumer_heartbeat(
        self, request: Heartbeat, topics: dict[str, TopicInfo]
    ) -> HeartbeatResult:
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

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer.groups.get(group_id)

    def validate_offset_fetch(self, group_id: str, member_id: str | None, epoch: int) -> int:
        """OffsetFetch v9 from a member of a consumer group: a member at its epoch."""
        if group_id not in self.consumer.groups or (member_id is None and epoch < 0):
            return ErrorCode.none
        return self.consumer.validate_offsets(group_id, member_id or "", epoch)

    async def _store_consumer_group(self, group: ConsumerGroup) -> None:
        await self._append([(GroupKey(group.group_id), ConsumerGroupValue(group_document(group)))])

    # ------------------------------------------------------------------ persistence
    async def _persist_group(self, group: Group) -> None:
        await self._append([(GroupKey(group.group_id), _group_value(group))])

    def _spawn_persist(self, group: Group) -> None:
        async def persist() -> None:
            try:
                await self._persist_group(group)
            except (StorageError, CoordinatorError) as exc:
                log.warning("group %s: storing the empty group failed: %s", group.group_id, exc)

        self._spawn(persist())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _append(
        self,
        records: list[tuple[Key, Value | None]],
        *,
        producer: tuple[int, int] | None = None,
        verification: VerificationGuard | None = None,
    ) -> None:
        """Append `records` durably and record them in the durable state. Waits while a
        snapshot is being written (it must not trim a record it did not include).
        `producer` (id, epoch): write a transactional batch of that producer, behind its
        KIP-890 `verification` guard if given."""
        while not self._appends_open.is_set():
            await self._appends_open.wait()
        if self._closed:
            raise CoordinatorError(ErrorCode.not_coordinator)
        encoded: list[tuple[bytes | None, bytes | None]] = [
            (encode_key(k), encode_value(v)) for k, v in records
        ]
        if producer is None:
            batch = build_batch(encoded, timestamp_ms=_now_ms())
        else:
            # the sequence is read and used with no suspension in between, so concurrent
            # commits of one producer take consecutive sequences in the order they append
            producer_id, epoch = producer
            batch = build_batch(
                encoded,
                timestamp_ms=_now_ms(),
                producer_id=producer_id,
                producer_epoch=epoch,
                base_sequence=_next_sequence(self._log, producer_id, epoch),
                attributes=TRANSACTIONAL_FLAG,
            )
        self._appends_in_flight += 1
        self._appends_drained.clear()
        try:
            if verification is None:
                await self._log.append(batch, acks=-1)
            else:
                await self._log.append(batch, acks=-1, verification=verification)
            for key, value in records:
                if value is None:
                    self._durable.pop(key, None)
                else:
                    self._durable[key] = value
        finally:
            self._appends_in_flight -= 1
            if not self._appends_in_flight:
                self._appends_drained.set()
        self._records_since_snapshot += len(records)
        if (
            self._records_since_snapshot >= self._settings.snapshot_after_records
            and not self._log.config.compacted  # the log cleaner keeps a compacted log short
        ):
            self._records_since_snapshot = 0
            self._spawn(self._snapshot())

    async def _snapshot(self) -> None:
        """Write the durable state again, then trim the log before it: replay stays short.

        New appends wait meanwhile and appends in flight finish first, so every record below
        the trim point is either in the durable state written here or superseded by it. Groups
        mid-rebalance keep their last stored generation: it is the durable state that is
        written, not the groups in memory."""
        async with self._snapshot_lock:
            if self._closed:
                return
            self._appends_open.clear()
            try:
                await self._appends_drained.wait()
                if not self._closed:
                    await self._write_snapshot(list(self._durable.items()))
            finally:
                self._appends_open.set()

    async def _write_snapshot(self, live: list[tuple[Key, Value]]) -> None:
        try:
            start = self._log.high_watermark
            for i in range(0, len(live), 500):
                batch = build_batch(
                    [(encode_key(k), encode_value(v)) for k, v in live[i : i + 500]],
                    timestamp_ms=_now_ms(),
                )
                result = await self._log.append(batch, acks=-1)
                if i == 0:
                    start = result.base_offset
            # A marker that landed while the snapshot was written settled pending offsets the
            # snapshot still holds as pending, and the trim below may remove that marker:
            # write their outcome after the snapshot first, or a reload would keep them
            # pending for good (or let the producer's next marker settle them its own way).
            settled = {k for k, _ in live if isinstance(k, TxnOffsetKey) and k not in self._durable}
            if settled:
                records = self._settled_records(settled)
                await self._log.append(
                    build_batch(
                        [(encode_key(k), encode_value(v)) for k, v in records],
                        timestamp_ms=_now_ms(),
                    ),
                    acks=-1,
                )
            await self._log.delete_records_before(start)
            log.info(
                "%s-%d: snapshot of %d keys, log trimmed before %d",
                OFFSETS_TOPIC,
                self.partition,
                len(live),
                start,
            )
        except StorageError as exc:
            log.warning("%s-%d: snapshot failed: %s", OFFSETS_TOPIC, self.partition, exc)

    # ------------------------------------------------------------------ timers
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

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


class GroupCoordinator:
    """Routes group requests to the shard of the `__consumer_offsets` partition they hash to."""

    def __init__(self, settings: GroupSettings, offsets_partitions: Callable[[], int]) -> None:
        self._settings = settings
        self._offsets_partitions = offsets_partitions
        self._shards: dict[int, GroupShard] = {}
        self._loads: dict[int, asyncio.Task[None]] = {}
        self.offset_keys = OffsetKeys()

    def partition_for(self, group_id: str) -> int:
        n = self._offsets_partitions()
        if n <= 0:
            raise CoordinatorError(ErrorCode.coordinator_not_available)
        return partition_for_group(group_id, n)

    async def on_partition(self, tp: TopicPartition, plog: PartitionLog | None) -> None:
        """PartitionManager hook: load a shard when its partition opens, drop it on close."""
        if tp.topic != OFFSETS_TOPIC:
            return
        old = self._shards.pop(tp.partition, None)
        if old is not None:
            old.close()
        load = self._loads.pop(tp.partition, None)
        if load is not None:
            load.cancel()
        if plog is None:
            return
        shard = GroupShard(tp.partition, plog, self._settings, self.offset_keys)
        self._shards[tp.partition] = shard

        async def load_shard() -> None:
            try:
                await shard.load()
            except Exception:
                log.exception("%s: loading groups failed", tp)
                if self._shards.get(tp.partition) is shard:
                    self._shards.pop(tp.partition)

        self._loads[tp.partition] = asyncio.create_task(load_shard())

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
        return [s for s in self._shards.values() if s.loaded.is_set()]

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
        for task in self._loads.values():
            task.cancel()
        for shard in self._shards.values():
            shard.close()
        self._shards.clear()


# ---------------------------------------------------------------------- helpers
def _now_ms() -> int:
    return int(time.time() * 1000)


def _resolve(future: asyncio.Future[JoinResult], result: JoinResult) -> None:
    if not future.done():
        future.set_result(result)


def _resolve_join(member: Member, result: JoinResult) -> None:
    future, member.join_future = member.join_future, None
    if future is not None and not future.done():
        result.member_id = result.member_id or member.member_id
        future.set_result(result)


def _resolve_sync(member: Member, code: int, assignment: bytes) -> None:
    future, member.sync_future = member.sync_future, None
    if future is not None and not future.done():
        future.set_result((code, assignment))


def _settle(
    live: dict[Key, Value], keys: set[TxnOffsetKey], commit: bool
) -> list[tuple[OffsetKey, OffsetValue]]:
    """A marker of the producer whose pending offsets are `keys`: in `live` they become
    offsets (commit) or go (abort). Returns the offsets committed."""
    settled: list[tuple[OffsetKey, OffsetValue]] = []
    for key in keys:
        value = live.pop(key, None)
        if commit and isinstance(value, OffsetValue):
            committed = OffsetKey(key.group, key.topic, key.partition)
            live[committed] = value
            settled.append((committed, value))
    return settled


def _txn_key_order(key: TxnOffsetKey) -> tuple[str, str, int, int]:
    return key.group, key.topic, key.partition, key.producer_id


def _next_sequence(plog: PartitionLog, producer_id: int, epoch: int) -> int:
    """The sequence the partition expects next from the producer at `epoch` (0 when it knows
    none at that epoch). The coordinator writes a producer's transactional offsets itself, so
    it continues the producer's sequence on this partition as Kafka's coordinator appends do
    (which skip the check instead)."""
    entry_of = getattr(plog, "producer_entry", None)
    entry = entry_of(producer_id) if entry_of is not None else None
    if entry is None or entry.epoch != epoch or not entry.batches:
        return 0
    return int(entry.batches[-1].last_seq + 1) % (1 << 31)


def _storage_code(exc: Exception) -> int:
    if isinstance(exc, CoordinatorError):
        return exc.code
    return ErrorCode.coordinator_not_available


def _group_value(group: Group) -> GroupValue:
    return GroupValue(
        protocol_type=group.protocol_type,
        generation=group.generation,
        protocol_name=group.protocol_name,
        leader=group.leader,
        state_timestamp_ms=group.state_timestamp_ms,
        members=tuple(
            MemberValue(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.session_timeout_ms,
                m.rebalance_timeout_ms,
                m.metadata_for(group.protocol_name),
                m.assignment,
            )
            for m in group.members.values()
        ),
    )


def _group_from_value(group_id: str, value: GroupValue, now: float) -> Group:
    group = Group(
        group_id,
        state=GroupState.STABLE if value.members else GroupState.EMPTY,
        protocol_type=value.protocol_type,
        protocol_name=value.protocol_name,
        generation=value.generation,
        leader=value.leader,
        state_timestamp_ms=value.state_timestamp_ms,
    )
    for m in value.members:
        member = Member(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            session_timeout_ms=m.session_timeout_ms,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
            protocol_type=value.protocol_type or "",
            protocols=[(value.protocol_name or "", m.subscription)],
            assignment=m.assignment,
            is_new=False,
        )
        member.touch(now)  # members get a full session to find the new coordinator
        group.members[m.member_id] = member
    return group


def _subscribed_topics(group: Group) -> set[str] | None:
    """Topics a consumer group subscribes to, from its members' consumer-protocol metadata
    (version int16, then an array of topic names). None when not a consumer group."""
    if group.protocol_type != "consumer":
        return None
    topics: set[str] = set()
    for member in group.members.values():
        data = member.metadata_for(group.protocol_name)
        with contextlib.suppress(IndexError, UnicodeDecodeError):
            count = int.from_bytes(data[2:6], "big", signed=True)
            pos = 6
            for _ in range(max(count, 0)):
                n = int.from_bytes(data[pos : pos + 2], "big")
                topics.add(data[pos + 2 : pos + 2 + n].decode())
                pos += 2 + n
    return topics
