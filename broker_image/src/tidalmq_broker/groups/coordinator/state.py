"""A group shard's state: the groups (classic and consumer) and committed offsets of one
`__consumer_offsets` partition, the offsets of open transactions, what its log holds (the
durable state a snapshot writes) and the gates of its appends. The parts of the shard each change
their share of it; this module also holds the settings, the errors, the answers and the helpers
every part uses, and must not import any other part of the package."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from tidalmq_core.model import TopicPartition

from tidalmq_broker.groups.consumer_groups import (
    ConsumerGroups,
    ConsumerGroupSettings,
)
from tidalmq_broker.groups.coordinator.deadlines import GroupDeadlines
from tidalmq_broker.groups.group import Group, JoinResult, Member
from tidalmq_broker.groups.records import (
    Key,
    OffsetKey,
    OffsetValue,
    TxnOffsetKey,
    Value,
)
from tidalmq_broker.storage.api import PartitionLog

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


class ShardState:
    """The groups of one `__consumer_offsets` partition led by this broker: the fields every
    part of the shard shares, and the primitives they all use."""

    # groups of the consumer group protocol (KIP-848); a group id names one kind or the other.
    # Made by ShardPersistence (persistence.py): it stores them.
    consumer: ConsumerGroups

    def __init__(
        self,
        partition: int,
        plog: PartitionLog,
        settings: GroupSettings,
        keys: OffsetKeys | None = None,
        deadlines: GroupDeadlines | None = None,
    ) -> None:
        self.partition = partition
        self._keys = keys or OffsetKeys()
        self._log = plog
        self._settings = settings
        self.groups: dict[str, Group] = {}  # classic groups
        self.offsets: dict[str, dict[tuple[str, int], OffsetValue]] = {}
        # offsets of open transactions (TxnOffsetCommit), by producer id, until their marker
        self.pending: dict[int, dict[TxnOffsetKey, OffsetValue]] = {}
        # settled by a marker, their outcome not yet written as plain records (_materialise)
        self._unmaterialised: set[TxnOffsetKey] = set()
        self.loaded = asyncio.Event()
        self._closed = False
        self._records_since_snapshot = 0
        # the broker's one timer for group timeouts (the coordinator's; a shard of its own else)
        self._deadlines = deadlines if deadlines is not None else GroupDeadlines()
        self._watched: set[str] = set()  # ids of the groups queued in it
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

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _watch(self, group_id: str, now: float | None = None) -> None:
        """Queue the group's next timeout in the broker's timer (deadlines.py), to be checked
        by deadline_passed (timers.py). Called wherever a deadline of the group may have moved
        earlier; one that moved later needs no call (the check at the earlier time finds
        nothing due and queues the group again). `now`: the time of the check that calls it
        (the clock's, read again, when None)."""
        if self._closed:
            return
        times: list[float] = []
        group = self.groups.get(group_id)
        if group is not None:
            at = group.next_deadline(self._now() if now is None else now)
            if at is not None:
                times.append(at)
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None and (at := self.consumer.next_deadline(consumer_group)):
            times.append(at)
        if times:
            self._check_by(group_id, min(times))
        elif group_id in self._watched:
            self._watched.discard(group_id)
            self._deadlines.cancel(self, group_id)

    def _check_by(self, group_id: str, at: float) -> None:
        """Have the broker's timer check the group at `at` at the latest."""
        if self._closed:
            return
        self._watched.add(group_id)
        self._deadlines.check_by(self, group_id, at)

    def _unwatch_all(self) -> None:
        for group_id in self._watched:
            self._deadlines.cancel(self, group_id)
        self._watched.clear()

    def deadline_passed(self, group_id: str, now: float) -> None:
        """A timeout of the group may have passed (timers.py checks)."""
        raise NotImplementedError


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


def _storage_code(exc: Exception) -> int:
    if isinstance(exc, CoordinatorError):
        return exc.code
    return ErrorCode.coordinator_not_available
