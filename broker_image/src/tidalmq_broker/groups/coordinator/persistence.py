"""The shard's writes to its `__consumer_offsets` partition: every change is appended and
acknowledged before the durable state records it (`_append`), a transactional offset commit as a
batch of its producer. Past `snapshot_after_records` records the live keys are written again and
the log before them trimmed, so a replay stays short; that and the writing of what markers settled
(`_materialise`) hold new appends and wait for those in flight, so nothing below the trim point is
lost. Also the stored forms of classic groups (GroupValue) and consumer groups."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import OFFSETS_TOPIC

from tidalmq_broker.groups.consumer_group import ConsumerGroup
from tidalmq_broker.groups.consumer_groups import (
    ConsumerGroups,
    group_document,
)
from tidalmq_broker.groups.coordinator.deadlines import GroupDeadlines
from tidalmq_broker.groups.coordinator.state import (
    CoordinatorError,
    GroupSettings,
    OffsetKeys,
    ShardState,
    _now_ms,
)
from tidalmq_broker.groups.group import Group
from tidalmq_broker.groups.records import (
    ConsumerGroupValue,
    GroupKey,
    GroupValue,
    Key,
    MemberValue,
    OffsetKey,
    TxnOffsetKey,
    Value,
    encode_key,
    encode_value,
)
from tidalmq_broker.protocol.records import (
    TRANSACTIONAL_FLAG,
    build_batch,
)
from tidalmq_broker.storage.api import (
    PartitionLog,
    StorageError,
    VerificationGuard,
)

log = logging.getLogger(__name__)


class ShardPersistence(ShardState):
    """The shard's writes to its log."""

    def __init__(
        self,
        partition: int,
        plog: PartitionLog,
        settings: GroupSettings,
        keys: OffsetKeys | None = None,
        deadlines: GroupDeadlines | None = None,
    ) -> None:
        super().__init__(partition, plog, settings, keys, deadlines)
        # groups of the consumer group protocol (KIP-848); a group id names one kind or the other
        self.consumer = ConsumerGroups(settings.consumer, self._store_consumer_group)

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

    async def _persist_group(self, group: Group) -> None:
        await self._append([(GroupKey(group.group_id), _group_value(group))])

    def _spawn_persist(self, group: Group) -> None:
        async def persist() -> None:
            try:
                await self._persist_group(group)
            except (StorageError, CoordinatorError) as exc:
                log.warning("group %s: storing the empty group failed: %s", group.group_id, exc)

        self._spawn(persist())

    async def _store_consumer_group(self, group: ConsumerGroup) -> None:
        await self._append([(GroupKey(group.group_id), ConsumerGroupValue(group_document(group)))])


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
