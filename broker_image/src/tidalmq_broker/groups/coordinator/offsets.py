"""Committed offsets: OffsetCommit (checked against the classic group's generation or the
consumer-group member's epoch), TxnOffsetCommit (offsets pending in the producer's transaction
until its marker settles them; KIP-447 fencing, KIP-890 verification), OffsetFetch (Double-Read-
Check for static topics through OffsetKeys), OffsetDelete and DeleteGroups."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import OFFSETS_TOPIC
from tidalmq_core.model import TopicPartition

from tidalmq_broker.groups.coordinator.persistence import ShardPersistence
from tidalmq_broker.groups.coordinator.state import (
    CommittedOffset,
    CoordinatorError,
    Verify,
    _now_ms,
    _settle,
    _storage_code,
)
from tidalmq_broker.groups.group import Group, GroupState
from tidalmq_broker.groups.records import (
    GroupKey,
    Key,
    OffsetKey,
    OffsetValue,
    TxnOffsetKey,
    Value,
)
from tidalmq_broker.storage.api import (
    UNVERIFIED,
    InvalidProducerEpoch,
    InvalidTxnState,
    StorageError,
    VerificationGuard,
)

log = logging.getLogger(__name__)


class Offsets(ShardPersistence):
    """Committed offsets, plain and transactional; group deletion."""

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
