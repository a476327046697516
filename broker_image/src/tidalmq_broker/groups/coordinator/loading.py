"""A shard's life: the replay of its partition's log when it opens on this broker (groups,
offsets, offsets pending in open transactions, the outcome of markers not yet written as plain
records), and its close, which answers every waiting member NOT_COORDINATOR."""

from __future__ import annotations

import asyncio
import logging
import time

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import OFFSETS_TOPIC

from tidalmq_broker.groups.coordinator.state import (
    _resolve_join,
    _resolve_sync,
    _settle,
)
from tidalmq_broker.groups.coordinator.timers import Timers
from tidalmq_broker.groups.group import Group, GroupState, JoinResult, Member
from tidalmq_broker.groups.records import (
    ConsumerGroupValue,
    GroupKey,
    GroupValue,
    Key,
    OffsetKey,
    OffsetValue,
    TxnOffsetKey,
    Value,
    decode_key,
    decode_value,
    marker_is_commit,
)
from tidalmq_broker.internal_shards import replay

log = logging.getLogger(__name__)


class Loading(Timers):
    """Replay on open, NOT_COORDINATOR on close."""

    async def load(self) -> None:
        """Replay the log from its start into groups and offsets."""
        started = time.perf_counter()
        live: dict[Key, Value] = {}
        open_txns: dict[int, set[TxnOffsetKey]] = {}  # pending offsets by producer id
        unmaterialised: set[TxnOffsetKey] = set()  # settled, no tombstone after the marker
        count = 0
        async for record in replay(self._log, lambda: self._closed):
            header = record.header
            if header.is_control:  # a transaction's marker settles its offsets
                commit = marker_is_commit(record.key)
                if commit is not None:
                    settled = open_txns.pop(header.producer_id, set())
                    _settle(live, settled, commit)
                    unmaterialised |= settled
                continue
            key = decode_key(record.key)
            value = decode_value(key, record.value)
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
        for group_id in [*self.groups, *self.consumer.groups]:  # loaded members' sessions
            self._watch(group_id)
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
        self._unwatch_all()
        for group in self.groups.values():
            for member in group.members.values():
                _resolve_join(member, JoinResult(error=ErrorCode.not_coordinator))
                _resolve_sync(member, ErrorCode.not_coordinator, b"")


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
