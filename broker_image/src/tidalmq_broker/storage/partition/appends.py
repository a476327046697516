"""Appends to a partition: validation of the record batches (CRC, size, control and
transactional flags), idempotent-producer and transaction sequence checks (undone on refusal),
offset assignment by patching the headers in place, and the place in the WAL writer's queue, all
without suspending so that appends are checked and written in the order they start; the
acknowledgement is awaited after. Transaction markers take the same path. Also what the static
topics and the transaction coordinator ask of the in-flight producer state.

Must not change the high watermark or the durable producer state: they follow the flush
(flushes.py).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Iterable

from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import (
    Acknowledgement,
    AppendResult,
    CorruptRecord,
    InvalidRecord,
    InvalidTxnState,
    ObjectStoreUnavailable,
    OutOfOrderSequence,
    PartitionFenced,
    ProducerCatchingUp,
    RecordTooLarge,
    StorageError,
    UnsupportedMessageFormat,
    VerificationGuard,
)
from tidalmq_broker.storage.batch_bytes import set_create_time, set_log_append_time
from tidalmq_broker.storage.partition.state import PartitionState, State
from tidalmq_broker.storage.producer_state import (
    ABORT_MARKER,
    COMMIT_MARKER,
    TRANSACTIONAL,
    BatchMeta,
    ProducerEntry,
)
from tidalmq_broker.storage.wal import ProducerBatch
from tidalmq_broker.storage.wal_writer import PendingAppend

_SEQUENCE_MOD = 1 << 31  # sequences wrap at 2^31 (BatchHeader.last_sequence)


def _check_parsed(buf: bytearray | memoryview, headers: list[records.BatchHeader]) -> None:
    """That `headers` (records.read_headers of these bytes, by the caller) cover `buf` from its
    first byte to its last, and each batch's CRC: what read_headers(verify_crc=True) would
    have checked on top of the caller's parse."""
    if not headers or headers[0].position != 0:
        raise records.InvalidRecordBatch("the parsed headers do not start the record set")
    last = headers[-1]
    if last.position + last.size != len(buf):
        raise records.InvalidRecordBatch("the parsed headers do not cover the record set")
    for h in headers:
        if not records.crc_matches(buf, h):
            raise records.InvalidRecordBatch(
                f"record batch at byte {h.position} fails its CRC-32C check"
            )


class Appends(PartitionState):
    """Validation, producer checks and offset assignment of appends and transaction markers."""

    __slots__ = ()

    async def append(
        self,
        records_: bytes | memoryview,
        *,
        acks: int = -1,
        owned: bool = False,
        verification: VerificationGuard | None = None,
    ) -> AppendResult:
        return await self.start_append(records_, acks=acks, owned=owned, verification=verification)

    def start_append(
        self,
        records_: bytes | memoryview,
        *,
        acks: int = -1,
        owned: bool = False,
        verification: VerificationGuard | None = None,
        headers: list[records.BatchHeader] | None = None,
    ) -> Awaitable[AppendResult]:
        """`append` in two steps: everything that decides the outcome (validation, producer
        sequence checks, offsets, the place in the WAL) happens now, without suspending, so
        appends started in some order are checked and written in that order; the returned
        awaitable waits for the acknowledgement. Raises the StorageError of a refused append.

        `headers`: the batches' headers as records.read_headers parsed them from these same
        bytes (the Produce handler parses them once for its own checks and hands them on);
        their CRCs are checked here, and every other check of the headers made again."""
        self._check_writable()
        if len(records_) == 0:
            raise CorruptRecord("empty record set")
        buf: bytearray | memoryview
        if owned and isinstance(records_, memoryview) and not records_.readonly:
            buf = records_  # the caller's own buffer: offsets are patched in place, no copy
        else:
            buf = bytearray(records_)  # the same bytes at the same positions
        try:
            if headers is None:
                headers = records.read_headers(buf, verify_crc=True)
            else:
                _check_parsed(buf, headers)
        except records.UnsupportedMagic as exc:
            raise UnsupportedMessageFormat(str(exc)) from exc
        except records.InvalidRecordBatch as exc:
            raise CorruptRecord(str(exc)) from exc
        # the attribute bits read here rather than through BatchHeader's properties: each a
        # Python call, several per batch on every append
        max_bytes = self._config.max_message_bytes
        for h in headers:
            if h.size > max_bytes:
                raise RecordTooLarge(
                    f"batch of {h.size} bytes exceeds max.message.bytes {max_bytes}"
                )
            attributes = h.attributes
            if attributes & records.CONTROL_FLAG:
                raise InvalidRecord("control batches are written by the broker only")
            if attributes & records.TRANSACTIONAL_FLAG and (
                h.producer_id == records.NO_PRODUCER_ID or h.base_sequence == records.NO_SEQUENCE
            ):
                raise InvalidRecord("a transactional batch needs a producer id and sequence")
            if h.record_count != h.last_offset_delta + 1:
                raise CorruptRecord(
                    f"batch declares {h.record_count} records but last offset delta {h.last_offset_delta}"
                )

        # idempotent producers: check (and tentatively apply) every batch, undo on failure.
        # A producer's entry is saved for the undo only before a batch that is not the last:
        # nothing can refuse the append after the last batch's apply (a Java producer's
        # append is one batch, so usually nothing is copied)
        offset = self._next_offset
        table = self._producers
        undo: dict[int, ProducerEntry | None] = {}
        producers: list[ProducerBatch] = []
        transactional_ids: list[int] | None = None
        duplicate: BatchMeta | None = None
        last_index = len(headers) - 1
        try:
            for index, h in enumerate(headers):
                pid, first_seq = h.producer_id, h.base_sequence
                if pid != records.NO_PRODUCER_ID and first_seq != records.NO_SEQUENCE:
                    epoch = h.producer_epoch
                    transactional = bool(h.attributes & records.TRANSACTIONAL_FLAG)
                    last_seq = (first_seq + h.last_offset_delta) % _SEQUENCE_MOD
                    found = table.check(pid, epoch, first_seq, last_seq, transactional)
                    if found is not None:
                        duplicate = found
                        break
                    if transactional:
                        if verification is not None:
                            self._check_verified(pid, verification)
                        if transactional_ids is None:
                            transactional_ids = []
                        transactional_ids.append(pid)
                    if index != last_index and pid not in undo:
                        entry = table.producers.get(pid)
                        undo[pid] = None if entry is None else entry.clone()
                    last = offset + h.last_offset_delta
                    table.apply(
                        pid,
                        epoch,
                        BatchMeta(first_seq, last_seq, offset, last),
                        transactional=transactional,
                    )
                    row: ProducerBatch = (pid, epoch, first_seq, last_seq, offset, last)
                    producers.append((*row, TRANSACTIONAL) if transactional else row)
                offset += h.last_offset_delta + 1
        except OutOfOrderSequence as exc:
            self._undo_producers(undo)
            self._catching_up(h, exc)
            raise
        except StorageError:
            self._undo_producers(undo)
            raise
        if duplicate is not None:
            self._undo_producers(undo)
            if producers:
                self._note_appended([p[0] for p in producers])
            self._note_appended((h.producer_id,))
            self._engine.m.duplicate_batches.inc()
            return self._duplicate(duplicate)
        if producers:
            self._note_appended([p[0] for p in producers])
        if transactional_ids is not None:
            for pid in transactional_ids:  # its transaction is going on here: the guard is done
                self._verifications.pop(pid, None)

        # assign offsets by patching the headers in place
        base = self._next_offset
        offset = base
        max_ts = -1
        epoch = self._epoch
        log_append_time = self._config.message_timestamp_type == "LogAppendTime"
        now_ms = int(time.time() * 1000) if log_append_time else -1
        for h in headers:
            records.patch_offset_and_epoch(buf, h, offset, epoch)
            if log_append_time:
                set_log_append_time(buf, h, now_ms)
                max_ts = now_ms
            else:
                # a batch its producer marked LogAppendTime becomes CreateTime here, as on
                # Kafka (Produce checked its max timestamp against the topic's bounds)
                if h.attributes & records.TIMESTAMP_TYPE_MASK:
                    set_create_time(buf, h)
                if h.max_timestamp > max_ts:
                    max_ts = h.max_timestamp
            offset += h.last_offset_delta + 1
        future = self._enqueue(buf, base, offset - 1, max_ts, producers, acks)
        result = AppendResult(base, offset - 1, now_ms, self._log_start)
        return Acknowledgement(result, future)

    def _note_appended(self, producer_ids: Iterable[int]) -> None:
        if self._appended_here is None:
            self._appended_here = set()
        self._appended_here.update(producer_ids)

    def _check_verified(self, producer_id: int, guard: VerificationGuard) -> None:
        """KIP-890's guard (Kafka's UnifiedLog): a transactional batch that would open its
        producer's transaction here needs the guard of a verification that no transactional
        batch or marker of the producer has ended since (the coordinator's answer may predate
        the marker of the very transaction it verified)."""
        entry = self._producers.producers.get(producer_id)
        if entry is not None and entry.txn_first_offset >= 0:
            return
        if self._verifications.get(producer_id) is not guard:
            raise InvalidTxnState(
                f"{self._tp}: record of producer {producer_id} was not part of an ongoing "
                "transaction (not verified, or its transaction ended since)"
            )

    def start_verification(self, producer_id: int) -> VerificationGuard:
        guard = self._verifications.get(producer_id)
        if guard is None:
            guard = self._verifications[producer_id] = VerificationGuard()
        guard.holders += 1
        return guard

    def end_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        guard.holders -= 1
        if guard.holders <= 0 and self._verifications.get(producer_id) is guard:
            del self._verifications[producer_id]

    def _catching_up(self, h: records.BatchHeader, exc: OutOfOrderSequence) -> None:
        """Raise ProducerCatchingUp instead of `exc` for a batch ahead of the next sequence
        from a producer with nothing appended here since this open. After a failover a client
        sends its unacknowledged batches to the new owner pipelined; the first ones are
        refused while the partition still opens (LEADER_NOT_AVAILABLE), and a later one that
        arrives once it is open is ahead of the log. OUT_OF_ORDER_SEQUENCE_NUMBER then makes
        librdkafka bump its epoch and send every unacknowledged batch again as new records,
        writing twice one that the old owner had made durable. A retriable answer makes it
        retry them in order instead. Only until the producer's first batch is appended (or
        answered as a duplicate) here: a gap after that is a gap."""
        appended = self._appended_here
        if appended is not None and h.producer_id in appended:
            return
        expected = self._producers.next_sequence_if_ahead(
            h.producer_id, h.producer_epoch, h.base_sequence
        )
        if expected is not None:
            raise ProducerCatchingUp(
                f"{self._tp}: producer {h.producer_id} sent sequence {h.base_sequence}, "
                f"{expected} is next (its earlier batches are on their way)"
            ) from exc

    def _enqueue(
        self,
        buf: bytearray | memoryview,
        base: int,
        last: int,
        max_ts: int,
        producers: list[ProducerBatch],
        acks: int,
    ) -> asyncio.Future[None] | None:
        self._next_offset = last + 1
        future = asyncio.get_running_loop().create_future() if acks != 0 else None
        pending = PendingAppend(self, buf, base, last, max_ts, producers, future)
        self._inflight += 1
        self._engine.writer.enqueue(pending)  # which counts its bytes when it flushes them
        return future

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int
    ) -> AppendResult:
        """A commit/abort marker: a control batch through the WAL like any append, durable
        before this returns. It ends the producer's ongoing transaction here at once (so a
        later batch of the next transaction is checked against the ended one); the durable
        state, the LSO and the aborted index follow when the flush completes."""
        self._check_writable()
        self._producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        offset = self._next_offset
        now_ms = int(time.time() * 1000)
        key = struct.pack(">hh", 0, 1 if commit else 0)
        value = struct.pack(">hi", 0, coordinator_epoch)
        buf = bytearray(
            records.build_batch(
                [(key, value)],
                base_offset=offset,
                timestamp_ms=now_ms,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                attributes=records.TRANSACTIONAL_FLAG | records.CONTROL_FLAG,
            )
        )
        records.patch_leader_epoch(buf, records.read_header(buf, 0), self._epoch)
        self._producers.complete(
            producer_id, producer_epoch, commit, coordinator_epoch, offset, now_ms
        )
        self._verifications.pop(producer_id, None)  # a verification begun before it is void
        kind = COMMIT_MARKER if commit else ABORT_MARKER
        row = (producer_id, producer_epoch, -1, -1, offset, offset, kind, coordinator_epoch)
        future = self._enqueue(buf, offset, offset, now_ms, [row], -1)
        return await Acknowledgement(AppendResult(offset, offset, -1, self._log_start), future)

    async def _duplicate(self, original: BatchMeta) -> AppendResult:
        await self._wait_durable(original.last_offset)
        if not self._engine.lease_ok():
            # as for the original's own acknowledgement (flushes.py): past our lease another
            # owner may have opened the partition without the object that holds it
            raise PartitionFenced(
                f"lease of this broker lapsed; the retried batch on {self._tp} not acknowledged"
            )
        return AppendResult(original.base_offset, original.last_offset, -1, self._log_start, True)

    async def _wait_durable(self, last_offset: int) -> None:
        """A retried batch whose original is still in flight: answer once the original is
        durable, fail if it failed."""
        while self._hwm <= last_offset:
            if self._next_offset <= last_offset or self._state is State.RECOVERING:
                raise ObjectStoreUnavailable(
                    f"the original of a retried batch on {self._tp} failed"
                )
            self._check_writable()
            await self._data_waiter().wait()

    def producer_entry(self, producer_id: int) -> ProducerEntry | None:
        """What this partition knows of an idempotent producer (including appends in flight)."""
        return self._producers.producers.get(producer_id)

    def in_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        entry = self._producers.producers.get(producer_id)
        return entry is not None and entry.epoch == producer_epoch and entry.txn_first_offset >= 0

    def adopt_producer(self, producer_id: int, entry: ProducerEntry) -> bool:
        """Double-Read-Check of idempotent-producer state (static topics): a producer
        unknown here continues from the state the previous physical queue of its logic queue
        kept (`entry`, its batches translated into this partition's offsets: a retry of a batch
        written there is then answered as a duplicate instead of written twice). Nothing is
        copied at the remap; this runs on the producer's first batch here. False if this
        partition knows the producer already."""
        if producer_id in self._producers.producers:
            return False
        self._producers.producers[producer_id] = entry.clone()
        self._durable_producers.producers[producer_id] = entry.clone()
        self._bump_version()
        return True

    def _undo_producers(self, undo: dict[int, ProducerEntry | None]) -> None:
        for pid, entry in undo.items():
            if entry is None:
                self._producers.producers.pop(pid, None)
            else:
                self._producers.producers[pid] = entry
