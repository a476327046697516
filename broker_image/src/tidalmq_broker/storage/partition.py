"""One open partition: validation and offset assignment, acknowledgements, reads, checkpoints.

State that matters for correctness:

* `_next_offset` - the next offset to assign (appends in the WAL buffer or in flight are below).
* `_hwm` - the high watermark: every offset below is in a durable WAL object or segment, is
  indexed, and has been acknowledged in order. Reads never go beyond it.
* `_producers` - idempotent-producer state including appends not yet durable (so a retry of an
  in-flight batch is recognised); `_durable_producers` only up to the high watermark, which is
  what checkpoints persist and what a rollback returns to. Both include the ongoing transaction
  of each producer id; the last stable offset and the aborted-transactions index (`_aborted`)
  follow the durable state only (docs/transactions.md).

If a WAL flush fails, every append of this partition in it and after it fails, the partition
stops taking appends, waits for its in-flight flushes, rolls `_next_offset` and the producer
state back to the high watermark and commits a checkpoint whose WAL position lies beyond every
object that may hold the failed batches. Only then does it take appends again, so no offset is
ever acknowledged twice with different data, not even after a crash and a replay of the WAL.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from tidalmq_core.model import TopicPartition

from tidalmq_broker.protocol import records
from tidalmq_broker.storage import metrics
from tidalmq_broker.storage.aborted_txns import AbortedTxn, AbortedTxns
from tidalmq_broker.storage.api import (
    ActiveProducer,
    AppendResult,
    CorruptRecord,
    InvalidRecord,
    InvalidTxnState,
    ObjectStoreUnavailable,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PartitionClosing,
    PartitionConfig,
    PartitionFenced,
    PartitionStats,
    ProducerCatchingUp,
    ReadResult,
    RecordTooLarge,
    StorageError,
    StoreLost,
    TimestampLookup,
    UnsupportedMessageFormat,
    VerificationGuard,
)
from tidalmq_broker.storage.batch_bytes import batches_below, set_log_append_time, slice_batches
from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.index import IndexEntry, OffsetIndex
from tidalmq_broker.storage.objectstore.base import ObjectNotFound
from tidalmq_broker.storage.producer_state import (
    ABORT_MARKER,
    COMMIT_MARKER,
    TRANSACTIONAL,
    BatchMeta,
    ProducerEntry,
    ProducerStateTable,
)
from tidalmq_broker.storage.timestamps import first_record_at, max_timestamp_record
from tidalmq_broker.storage.wal import ProducerBatch, WalEntry
from tidalmq_broker.storage.wal_writer import PendingAppend

if TYPE_CHECKING:
    from tidalmq_broker.storage.api import StorageConfig
    from tidalmq_broker.storage.cache import TailCache
    from tidalmq_broker.storage.checkpoint import CheckpointStore
    from tidalmq_broker.storage.health import WriteHealth
    from tidalmq_broker.storage.metrics import BrokerMetrics
    from tidalmq_broker.storage.objectstore.base import ObjectStore
    from tidalmq_broker.storage.wal_writer import WalWriter


class PartitionHost(Protocol):
    """What a partition uses of the engine that holds it (storage/engine.py's
    ObjectStreamEngine is the one): named here, so the partition does not import the engine."""

    broker_label: str
    incarnation: str
    config: StorageConfig
    m: BrokerMetrics
    store: ObjectStore
    checkpoints: CheckpointStore
    cache: TailCache
    writer: WalWriter[Partition]
    write_health: WriteHealth
    store_problem: str | None

    @property
    def write_problem(self) -> str | None: ...
    def checkpoint_key(self, tp: TopicPartition, topic_id: str) -> str: ...
    def lease_ok(self) -> bool: ...
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...
    def high_watermark_advanced(self, tp: TopicPartition) -> None: ...
    def partition_changed(self, p: Partition) -> None: ...
    def partition_fenced(self, p: Partition) -> None: ...
    def first_stored(self, p: Partition) -> None: ...
    def checkpoint_committed(self, p: Partition, cp: Checkpoint) -> None: ...
    async def delete_objects(self, object_keys: list[str], kind: str, path: str) -> None: ...


log = logging.getLogger(__name__)


class State(enum.Enum):
    OPEN = "open"
    RECOVERING = "recovering"  # a flush failed; rolling back before taking appends again
    CLOSING = "closing"
    CLOSED = "closed"
    FENCED = "fenced"


class Partition:
    """Implements api.PartitionLog."""

    def __init__(
        self,
        engine: PartitionHost,
        tp: TopicPartition,
        topic_id: str,
        leader_epoch: int,
        config: PartitionConfig,
        checkpoint: Checkpoint,
        etag: str | None,
        *,
        epoch_stored: bool = True,
    ) -> None:
        """`etag` None: a new partition whose checkpoint is not stored yet (see `unstored`).
        `epoch_stored` False: opened from a clean checkpoint (`etag`) of an earlier leader,
        ours not stored yet (also written before our first data, with If-Match on `etag`)."""
        self._engine = engine
        self._tp = tp
        self.topic_id = topic_id
        self._epoch = leader_epoch
        self._config = config
        self._key = engine.checkpoint_key(tp, topic_id)
        self.tracker_key = self._key
        self._etag = etag
        self._epoch_stored = epoch_stored
        self._index = OffsetIndex(checkpoint.index)
        self._log_start = checkpoint.log_start_offset
        self._hwm = checkpoint.next_offset
        self._next_offset = checkpoint.next_offset
        self._durable_producers = ProducerStateTable.from_json(checkpoint.producers)  # type: ignore[arg-type]
        self._durable_producers.load_txn_json(checkpoint.transactions)
        self._producers = self._durable_producers.copy()
        # producer ids with a batch appended (or answered as a duplicate) since this open
        self._appended_here: set[int] = set()
        # KIP-890: producer id -> the guard of its verification under way (start_verification)
        self._verifications: dict[int, VerificationGuard] = {}
        self._aborted = AbortedTxns.from_json(checkpoint.aborted_txns)
        self._cleaner_state = dict(checkpoint.cleaner)  # the log cleaner's progress
        # first offset of the oldest durable ongoing transaction (None: the LSO is the HWM)
        self._first_unstable = self._durable_producers.first_unstable_offset()
        self._cache = engine.cache.partition()
        self._state = State.OPEN
        self._failure: BaseException | None = None
        self._inflight = 0  # appends enqueued and not yet completed
        # made when first needed: opening thousands of partitions at once makes none of them
        self._drained: asyncio.Event | None = None  # set when _inflight drops to 0
        self._data_event: asyncio.Event | None = None  # set (and dropped) on new data
        self._checkpoint_lock: asyncio.Lock | None = None
        self._version = 0  # bumped on every change a checkpoint must carry
        self._committed_version = 0
        self._committed_position = checkpoint.wal_position
        self._wal_since: float | None = time.monotonic() if self._index.wal_ranges() else None
        self._readahead: tuple[str, int, bytes] | None = None
        self._cold_next = -1  # where the last cold read ended (sequential readers get read-ahead)
        self._recovery_task: asyncio.Task[None] | None = None
        self._closing = False

    # ---------------------------------------------------------------- PartitionLog properties
    @property
    def tp(self) -> TopicPartition:
        return self._tp

    @property
    def leader_epoch(self) -> int:
        return self._epoch

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def high_watermark(self) -> int:
        return self._hwm

    @property
    def log_end_offset(self) -> int:
        return self._next_offset

    @property
    def last_stable_offset(self) -> int:
        first = self._first_unstable
        if first is None or first >= self._hwm:
            return self._hwm
        # a transaction whose start retention or DeleteRecords removed: as Kafka
        # (UnifiedLog.updateFirstUnstableOffset), never below the log start
        return max(first, self._log_start)

    @property
    def aborted_txns(self) -> AbortedTxns:
        return self._aborted

    @property
    def config(self) -> PartitionConfig:
        return self._config

    @config.setter
    def config(self, config: PartitionConfig) -> None:
        self._config = config

    @property
    def state(self) -> State:
        return self._state

    @property
    def index(self) -> OffsetIndex:
        return self._index

    def stats(self) -> PartitionStats:
        return PartitionStats(
            log_start_offset=self._log_start,
            high_watermark=self._hwm,
            size_bytes=self._index.size_bytes,
            wal_ranges=self._index.wal_ranges(),
            segments=len(self._index.keys()) - len(self._index.wal_keys()),
            extra={
                "cache_bytes": float(self._cache.bytes),
                "inflight_appends": float(self._inflight),
            },
        )

    def active_producers(self) -> list[ActiveProducer]:
        return [ActiveProducer(*row) for row in self._durable_producers.describe()]

    # ---------------------------------------------------------------- append
    def _check_writable(self) -> None:
        problem = self._engine.store_problem
        if problem is not None:
            raise StoreLost(f"{self._tp}: {problem}")
        if self._state is State.OPEN:
            unwritable = self._engine.write_problem
            if unwritable is not None:
                # fail now (KAFKA_STORAGE_ERROR, retriable) instead of queueing an append for
                # a flush that cannot succeed; the store's health probe notices its return
                raise ObjectStoreUnavailable(f"{self._tp} not appended: {unwritable}")
            return
        if self._state is State.RECOVERING:
            raise ObjectStoreUnavailable(
                f"{self._tp} is recovering from a failed WAL flush: {self._failure}"
            )
        if self._state is State.CLOSING:
            raise PartitionClosing(f"{self._tp} is closing")
        if self._state is State.FENCED:
            if isinstance(self._failure, StoreLost):
                raise self._failure
            raise PartitionFenced(f"{self._tp} was taken over by another owner")
        raise PartitionClosing(f"{self._tp} is closed")

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
    ) -> Awaitable[AppendResult]:
        """`append` in two steps: everything that decides the outcome (validation, producer
        sequence checks, offsets, the place in the WAL) happens now, without suspending, so
        appends started in some order are checked and written in that order; the returned
        awaitable waits for the acknowledgement. Raises the StorageError of a refused append."""
        self._check_writable()
        if len(records_) == 0:
            raise CorruptRecord("empty record set")
        buf: bytearray | memoryview
        if owned and isinstance(records_, memoryview) and not records_.readonly:
            buf = records_  # the caller's own buffer: offsets are patched in place, no copy
        else:
            buf = bytearray(records_)
        try:
            headers = list(records.iter_headers(buf, verify_crc=True))
        except records.UnsupportedMagic as exc:
            raise UnsupportedMessageFormat(str(exc)) from exc
        except records.InvalidRecordBatch as exc:
            raise CorruptRecord(str(exc)) from exc
        max_bytes = self._config.max_message_bytes
        for h in headers:
            if h.size > max_bytes:
                raise RecordTooLarge(
                    f"batch of {h.size} bytes exceeds max.message.bytes {max_bytes}"
                )
            if h.is_control:
                raise InvalidRecord("control batches are written by the broker only")
            if h.is_transactional and (
                not h.has_producer_id or h.base_sequence == records.NO_SEQUENCE
            ):
                raise InvalidRecord("a transactional batch needs a producer id and sequence")
            if h.record_count != h.last_offset_delta + 1:
                raise CorruptRecord(
                    f"batch declares {h.record_count} records but last offset delta {h.last_offset_delta}"
                )

        # idempotent producers: check (and tentatively apply) every batch, undo on failure
        offset = self._next_offset
        undo: dict[int, ProducerEntry | None] = {}
        producers: list[ProducerBatch] = []
        duplicate: BatchMeta | None = None
        try:
            for h in headers:
                if h.has_producer_id and h.base_sequence != records.NO_SEQUENCE:
                    pid = h.producer_id
                    found = self._producers.check(
                        pid,
                        h.producer_epoch,
                        h.base_sequence,
                        h.last_sequence,
                        h.is_transactional,
                    )
                    if found is not None:
                        duplicate = found
                        break
                    if h.is_transactional and verification is not None:
                        self._check_verified(pid, verification)
                    if pid not in undo:
                        entry = self._producers.producers.get(pid)
                        undo[pid] = None if entry is None else entry.clone()
                    last = offset + h.last_offset_delta
                    self._producers.apply(
                        pid,
                        h.producer_epoch,
                        BatchMeta(h.base_sequence, h.last_sequence, offset, last),
                        transactional=h.is_transactional,
                    )
                    row: ProducerBatch = (
                        pid,
                        h.producer_epoch,
                        h.base_sequence,
                        h.last_sequence,
                        offset,
                        last,
                    )
                    producers.append((*row, TRANSACTIONAL) if h.is_transactional else row)
                offset += h.last_offset_delta + 1
        except OutOfOrderSequence as exc:
            self._undo_producers(undo)
            self._catching_up(h, exc)
            raise
        except StorageError:
            self._undo_producers(undo)
            raise
        self._appended_here.update(p[0] for p in producers)
        if duplicate is None:
            for h in headers:
                if h.is_transactional:  # its transaction is going on here: the guard is done
                    self._verifications.pop(h.producer_id, None)
        if duplicate is not None:
            self._undo_producers(undo)
            self._appended_here.add(h.producer_id)
            self._engine.m.duplicate_batches.inc()
            return self._duplicate(duplicate)

        # assign offsets by patching the headers in place
        base = self._next_offset
        offset = base
        max_ts = -1
        log_append_time = self._config.message_timestamp_type == "LogAppendTime"
        now_ms = int(time.time() * 1000)
        for h in headers:
            records.patch_base_offset(buf, h, offset)
            records.patch_leader_epoch(buf, h, self._epoch)
            if log_append_time:
                set_log_append_time(buf, h, now_ms)
                max_ts = now_ms
            elif h.max_timestamp > max_ts:
                max_ts = h.max_timestamp
            offset += h.last_offset_delta + 1
        future = self._enqueue(buf, base, offset - 1, max_ts, producers, acks)
        result = AppendResult(base, offset - 1, now_ms if log_append_time else -1, self._log_start)
        return self._acknowledged(result, future)

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
        if h.producer_id in self._appended_here:
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
        self._engine.writer.enqueue(pending)
        self._engine.m.append_bytes.inc(len(buf))
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
        return await self._acknowledged(AppendResult(offset, offset, -1, self._log_start), future)

    async def _acknowledged(
        self, result: AppendResult, future: asyncio.Future[None] | None
    ) -> AppendResult:
        if future is not None:
            await future
        return result

    async def _duplicate(self, original: BatchMeta) -> AppendResult:
        await self._wait_durable(original.last_offset)
        return AppendResult(original.base_offset, original.last_offset, -1, self._log_start, True)

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

    # ---------------------------------------------------------------- flush completion
    def flush_completed(
        self,
        entry: WalEntry | None,
        key: str,
        views: list[tuple[PendingAppend, memoryview]],
        error: BaseException | None,
    ) -> None:
        """Called by the engine, in WAL order, for this partition's share of one flush."""
        self._inflight -= len(views)
        ok = (
            error is None
            and entry is not None
            and self._state in (State.OPEN, State.CLOSING)
            and entry.base_offset == self._hwm
        )
        if ok:
            assert entry is not None
            self._index.append(
                IndexEntry(
                    entry.base_offset,
                    entry.last_offset,
                    key,
                    entry.position,
                    entry.size,
                    entry.max_timestamp,
                )
            )
            if self._wal_since is None:
                self._wal_since = time.monotonic()
            now_ms = int(time.time() * 1000)
            txn_changed = False
            for batch in entry.producers:
                done = self._durable_producers.apply_tuple(batch, now_ms)
                if len(batch) > 6:
                    txn_changed = True
                if done is not None and done.aborted:
                    self._aborted.add(done.producer_id, done.first_offset, done.last_offset)
            if txn_changed:
                self._first_unstable = self._durable_producers.first_unstable_offset()
            for append, view in views:
                self._cache.add(append.base_offset, append.last_offset, view)
            self._hwm = entry.last_offset + 1
            self._bump_version()
            self._engine.high_watermark_advanced(self._tp)
            self._notify()
            lease_ok = self._engine.lease_ok()
            for append, _ in views:
                fut = append.future
                if fut is None or fut.done():
                    continue
                if lease_ok:
                    fut.set_result(None)
                else:
                    fut.set_exception(
                        PartitionFenced(f"lease of this broker lapsed; {self._tp} not acknowledged")
                    )
        else:
            failure = error or self._failure or PartitionClosing(f"{self._tp} stopped")
            if self._state is State.OPEN:
                self._begin_rollback(failure)
            for append, _ in views:
                _fail(append, failure)
        if self._inflight == 0:
            if self._drained is not None:
                self._drained.set()
            if self._state is State.RECOVERING and self._recovery_task is None:
                self._recovery_task = self._engine.spawn(self._roll_back(), f"rollback {self._tp}")

    def fail_appends(self, appends: list[PendingAppend], error: BaseException) -> None:
        self._inflight -= len(appends)
        for append in appends:
            _fail(append, error)
        if self._inflight == 0 and self._drained is not None:
            self._drained.set()

    def _begin_rollback(self, error: BaseException) -> None:
        log.warning(
            "%s: WAL flush failed, rolling back to offset %d: %s", self._tp, self._hwm, error
        )
        metrics.APPEND_FAILURES.labels(self._engine.broker_label, "flush_failed").inc()
        self._state = State.RECOVERING
        self._failure = error
        removed = self._engine.writer.remove_pending(self)
        self.fail_appends(removed, error)
        self._notify()

    async def _roll_back(self) -> None:
        try:
            self._next_offset = self._hwm
            self._producers = self._durable_producers.copy()
            self._appended_here.clear()  # its producers resend what failed, pipelined
            delay = 0.1
            committed = False
            while self._state is State.RECOVERING:
                try:
                    await self.commit_checkpoint(force=True)
                    committed = True
                    break
                except ObjectStoreUnavailable as exc:
                    if self._closing:
                        # close() tries once more and otherwise leaves it to the next owner's
                        # recovery: nothing after the high watermark was acknowledged
                        break
                    log.warning("%s: rollback checkpoint failed, retrying: %s", self._tp, exc)
                    # sooner once the store takes writes again (its health probe sees it)
                    if await self._engine.write_health.wait_recovered(delay):
                        await asyncio.sleep(0.05)  # it takes writes (again): never a busy loop
                    delay = min(delay * 2, 5.0)
            if committed and self._state is State.RECOVERING:
                log.info("%s: rolled back to offset %d", self._tp, self._hwm)
                self._state = State.CLOSING if self._closing else State.OPEN
                self._failure = None
        except PartitionFenced:
            pass  # commit_checkpoint already handed the partition back
        finally:
            self._recovery_task = None
            self._notify()

    def _notify(self) -> None:
        event, self._data_event = self._data_event, None
        if event is not None:
            event.set()

    def _data_waiter(self) -> asyncio.Event:
        """The event the next new data (or a close) sets."""
        if self._data_event is None:
            self._data_event = asyncio.Event()
        return self._data_event

    @property
    def _cp_lock(self) -> asyncio.Lock:
        if self._checkpoint_lock is None:
            self._checkpoint_lock = asyncio.Lock()
        return self._checkpoint_lock

    async def _wait_drained(self) -> None:
        """Until every append enqueued has completed."""
        while self._inflight > 0:
            if self._drained is None or self._drained.is_set():
                self._drained = asyncio.Event()
            await self._drained.wait()

    # ---------------------------------------------------------------- reads
    async def read(self, offset: int, max_bytes: int, *, committed: bool = False) -> ReadResult:
        if self._state in (State.CLOSED, State.FENCED) or self._engine.store_problem is not None:
            self._check_writable()
        hwm, start, stable = self._hwm, self._log_start, self.last_stable_offset
        if offset < start or offset > self._next_offset:
            raise OffsetOutOfRange(
                f"{self._tp}: offset {offset} is outside [{start}, {self._next_offset}]"
            )
        if offset >= (stable if committed else hwm):
            return ReadResult(b"", hwm, start, stable, [] if committed else None)
        max_bytes = max(max_bytes, 1)
        views = self._cache.lookup(offset, max_bytes)
        if views is not None:
            first = slice_batches(views[0], offset, max_bytes)
            data = bytes(first) if len(views) == 1 else b"".join([first, *views[1:]])
            self._engine.m.cache_hit_bytes.inc(len(data))
        else:
            data = await self._read_cold(offset, max_bytes)
        if not committed:
            return ReadResult(data, hwm, self._log_start, stable)
        # read_committed (librdkafka's default): nothing at or past the LSO (an ongoing
        # transaction starts at a batch) and the aborted transactions the returned offsets
        # overlap. Without either, the batches are not even looked at.
        aborted: list[tuple[int, int]] = []
        if stable < hwm or len(self._aborted):
            data, last = batches_below(data, stable)
            if len(self._aborted):
                aborted = self._aborted.overlapping(offset, last)
        return ReadResult(data, hwm, self._log_start, stable, aborted)

    async def _read_cold(self, offset: int, max_bytes: int) -> bytes:
        missing = ""
        for _attempt in range(3):
            i = self._index.find(offset)
            if i is None:
                if offset < self._log_start:
                    raise OffsetOutOfRange(f"{self._tp}: offset {offset} was deleted")
                raise StorageError(f"{self._tp}: offset {offset} is not indexed")
            entries = self._index.slice(i, i + 64)
            first = entries[0]
            # the byte-contiguous run of entries in the same object, up to what we want to read
            # a reader continuing where its last cold read ended gets read-ahead; a random
            # read fetches only what it needs
            sequential = offset == self._cold_next
            want = max(max_bytes, self._engine.config.read_ahead_bytes) if sequential else max_bytes
            end = first.end_position
            for e in entries[1:]:
                if e.key != first.key or e.position != end or end - first.position >= want:
                    break
                end = e.end_position
            need_end = first.position
            for e in entries:
                if e.key != first.key or e.position != need_end:
                    break
                need_end = e.end_position
                if need_end - first.position >= max_bytes:
                    break
            ra = self._readahead
            if (
                ra is not None
                and ra[0] == first.key
                and ra[1] <= first.position
                and need_end <= ra[1] + len(ra[2])
            ):
                blob_start, blob = ra[1], ra[2]
                self._engine.m.cache_hit_bytes.inc(need_end - first.position)
            else:
                try:
                    blob = await self._engine.store.get(
                        first.key, first.position, max(end, need_end)
                    )
                except ObjectNotFound:
                    missing = first.key
                    continue  # retention or compaction replaced the object meanwhile; look again
                blob_start = first.position
                self._engine.m.cache_miss_bytes.inc(len(blob))
                self._readahead = (first.key, blob_start, blob)
            view = memoryview(blob)[first.position - blob_start : need_end - blob_start]
            out = slice_batches(view, offset, max_bytes)
            last = None
            for last in records.iter_headers(out):  # noqa: B007 - only the last one matters
                pass
            self._cold_next = last.last_offset + 1 if last is not None else -1
            return bytes(out)
        # the index still names an object the store does not have: the data is gone (a wiped
        # or damaged store), never an empty read
        log.warning(
            "%s: object %s holding offset %d is missing from the store", self._tp, missing, offset
        )
        raise ObjectStoreUnavailable(
            f"{self._tp}: the object holding offset {offset} ({missing}) is missing from the store"
        )

    async def read_entry(self, entry: IndexEntry) -> memoryview:
        """The bytes of one index entry, from the cache when possible (timestamp lookups)."""
        parts = await self.read_entry_parts(entry)
        return memoryview(b"".join(parts)) if len(parts) > 1 else parts[0]

    async def read_entry_parts(self, entry: IndexEntry) -> list[memoryview]:
        """The bytes of one index entry as pieces to concatenate: the cached chunks covering it
        (views, not copies) or one ranged GET (compaction)."""
        cached = self._cache.exact(entry.base_offset, entry.last_offset)
        if cached is not None:
            return cached
        data = await self._engine.store.get(entry.key, entry.position, entry.end_position)
        self._engine.m.cache_miss_bytes.inc(len(data))
        return [memoryview(data)]

    async def wait_for_data(
        self, offset: int, timeout_s: float, *, committed: bool = False
    ) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (self.last_stable_offset if committed else self._hwm) <= offset and self._state in (
            State.OPEN,
            State.RECOVERING,
        ):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._data_waiter().wait(), remaining)
            except TimeoutError:
                return

    async def offset_for_timestamp(self, timestamp_ms: int) -> TimestampLookup | None:
        i = self._index.find_timestamp(timestamp_ms)
        while i is not None and i < len(self._index):
            data = await self.read_entry(self._index[i])
            found = first_record_at(data, timestamp_ms, self._log_start, self._tp)
            if found is not None:
                return found
            i += 1
        return None

    async def offset_of_max_timestamp(self) -> TimestampLookup | None:
        return await max_timestamp_record(
            self._index.entries, self._log_start, self.read_entry, self._tp
        )

    # ---------------------------------------------------------------- checkpoints
    def _bump_version(self) -> None:
        """Something the next checkpoint must carry changed: the engine's upkeep passes look
        at this partition next time (storage/upkeep.py), none walks every open partition."""
        self._version += 1
        self._engine.partition_changed(self)

    @property
    def dirty(self) -> bool:
        return self._version != self._committed_version

    def snapshot(self, *, clean: bool = False) -> Checkpoint:
        return Checkpoint(
            topic=self._tp.topic,
            topic_id=self.topic_id,
            partition=self._tp.partition,
            leader_epoch=self._epoch,
            owner_broker=self._engine.broker_label,
            owner_incarnation=self._engine.incarnation,
            wal_position=self._engine.writer.completed_seq,
            log_start_offset=self._log_start,
            next_offset=self._hwm,
            clean_shutdown=clean,
            index=self._index.entries,
            producers=self._durable_producers.to_json(),
            transactions=self._durable_producers.txn_to_json(),
            aborted_txns=self._aborted.to_json(),
            cleaner=dict(self._cleaner_state),
        )

    @property
    def unstored(self) -> bool:
        """New, or opened from an earlier leader's clean checkpoint, and our checkpoint not
        written yet (it is written before our first data)."""
        return (self._etag is None or not self._epoch_stored) and self._state in (
            State.OPEN,
            State.CLOSING,
        )

    async def store_first(self) -> None:
        """Write our first checkpoint (if nobody did meanwhile): a new partition's, or ours at
        our epoch over the earlier leader's (If-Match: fenced if someone else wrote since)."""
        async with self._cp_lock:
            if self._etag is None or not self._epoch_stored:
                await self._commit_locked(force=True)

    async def commit_checkpoint(self, *, clean: bool = False, force: bool = False) -> None:
        async with self._cp_lock:
            await self._commit_locked(clean=clean, force=force)

    async def _commit_locked(self, *, clean: bool = False, force: bool = False) -> None:
        if not (force or clean or self.dirty):
            return
        if self._state is State.FENCED:
            if isinstance(self._failure, StoreLost):
                raise self._failure
            raise PartitionFenced(f"{self._tp} was taken over by another owner")
        if self._engine.store_problem is not None:  # never write into a wiped or foreign store
            raise StoreLost(f"{self._tp}: {self._engine.store_problem}")
        version = self._version
        self._durable_producers.expire(int(time.time() * 1000))
        cp = self.snapshot(clean=clean)
        first = self._etag is None
        try:
            self._etag = await self._engine.checkpoints.commit(self._key, cp, self._etag)
        except PartitionFenced:
            metrics.CHECKPOINTS.labels(self._engine.broker_label, "fenced").inc()
            self._engine.partition_fenced(self)
            raise
        except ObjectStoreUnavailable:
            metrics.CHECKPOINTS.labels(self._engine.broker_label, "failed").inc()
            raise
        metrics.CHECKPOINTS.labels(self._engine.broker_label, "ok").inc()
        self._epoch_stored = True
        self._committed_version = version
        self._committed_position = cp.wal_position
        self._engine.checkpoint_committed(self, cp)
        if first:
            self._engine.first_stored(self)

    # ---------------------------------------------------------------- compaction and retention
    def wal_age_s(self) -> float:
        return 0.0 if self._wal_since is None else time.monotonic() - self._wal_since

    async def swap_index(self, old: list[IndexEntry], new: list[IndexEntry]) -> bool:
        """Replace compacted WAL ranges by segment ranges and commit; False if the index moved
        on meanwhile, or the partition is no longer open here under a valid lease (a pass that
        outlived close() must not commit over the clean checkpoint the next owner opened:
        that fenced the next owner's first write). The caller deletes its segment."""
        async with self._cp_lock:
            if self._state is not State.OPEN or not self._engine.lease_ok():
                return False
            if not self._index.replace(old, new):
                return False
            self._bump_version()
            try:
                await self._commit_locked(force=True)
            except ObjectStoreUnavailable:
                self._index.replace(new, old)
                raise
            if not self._index.wal_ranges():
                self._wal_since = None
            return True

    def producer_last_batches(self) -> dict[int, tuple[int, int | None]]:
        """(epoch, last data offset or None) of each durable producer: the batches the log
        cleaner keeps so their sequences survive (docs/compaction.md)."""
        return {
            pid: (e.epoch, e.batches[-1].last_offset if e.batches else None)
            for pid, e in self._durable_producers.producers.items()
        }

    @property
    def cleaner_state(self) -> dict[str, int]:
        """The log cleaner's progress as the checkpoint keeps it (Checkpoint.cleaner)."""
        return self._cleaner_state

    def set_cleaner_state(self, state: dict[str, int]) -> None:
        """Record the log cleaner's progress; the next checkpoint carries it (a new owner
        then starts its first pass there instead of at the log start)."""
        if state != self._cleaner_state:
            self._cleaner_state = dict(state)
            self._version += 1

    async def replace_cleaned(
        self, old: list[IndexEntry], new: list[IndexEntry], emptied_aborts: list[AbortedTxn]
    ) -> bool:
        """Swap a group of segments for the log cleaner's cleaned copy, forget the aborted
        transactions it left no data of, and commit both in one checkpoint PUT. False, with
        nothing changed, unless the partition is still open here under a valid lease and the
        run is unchanged (the caller deletes its segment)."""
        async with self._cp_lock:
            if self._state is not State.OPEN or not self._engine.lease_ok():
                return False
            if not self._index.replace(old, new):
                return False
            aborted = self._aborted.copy()
            self._aborted.remove(emptied_aborts)
            self._cache.drop_before(new[-1].last_offset + 1)  # never serve or copy pre-clean bytes
            self._bump_version()
            try:
                await self._commit_locked(force=True)
            except ObjectStoreUnavailable:
                self._index.replace(new, old)
                self._aborted = aborted
                raise
            return True

    async def advance_log_start(self, offset: int) -> list[str]:
        """Move the log start forward, commit, and return object keys no longer referenced."""
        async with self._cp_lock:
            if offset <= self._log_start:
                return []
            before = self._index.keys()
            self._log_start = offset
            dropped = self._index.drop_before(offset)
            self._cache.drop_before(offset)
            self._aborted.drop_before(offset)
            self._bump_version()
            await self._commit_locked(force=True)
            still = self._index.keys()
            gone = {e.key for e in dropped} - still
            return sorted(k for k in gone & before if not k.startswith("wal/"))

    async def delete_records_before(self, offset: int) -> int:
        if offset == -1:  # DeleteRecords' "up to the high watermark"
            offset = self._hwm
        if offset < 0 or offset > self._hwm:
            raise OffsetOutOfRange(
                f"{self._tp}: cannot delete before {offset}, high watermark is {self._hwm}"
            )
        keys = await self.advance_log_start(offset)
        if keys:
            await self._engine.delete_objects(keys, "segment", "retention")
        return self._log_start

    # ---------------------------------------------------------------- close
    async def close(self) -> None:
        """The close of a move (steps 3-4): stop appending, drain, force the flush, clean checkpoint."""
        if self._state in (State.CLOSED, State.FENCED):
            return
        self._closing = True
        if self._state is State.OPEN:
            self._state = State.CLOSING
        self._notify()
        self._engine.writer.flush_now()
        await self._wait_drained()
        while self._recovery_task is not None:
            await asyncio.shield(self._recovery_task)
        if self._state is State.FENCED:
            return
        self._state = State.CLOSING
        if self._etag is None and self._hwm == self._log_start and not self.dirty:
            self._release()  # new and never written: nothing to keep, the next owner starts it
            return
        if not self._epoch_stored and not self.dirty:
            # opened from a clean checkpoint and nothing changed since: it stays what the next
            # owner opens (a partition moved twice without a write costs no store write here)
            self._release()
            return
        try:
            for attempt in range(3):
                try:
                    await self.commit_checkpoint(clean=True)
                    break
                except ObjectStoreUnavailable as exc:
                    if attempt == 2:
                        log.warning(
                            "%s: clean checkpoint failed (%s); the next owner recovers from the WAL",
                            self._tp,
                            exc,
                        )
                    else:
                        await asyncio.sleep(0.2 * (attempt + 1))
        except PartitionFenced:
            return
        except StoreLost as exc:
            log.warning("%s: closed without a checkpoint: %s", self._tp, exc)
        finally:
            self._release()

    def _release(self) -> None:
        if self._state is not State.FENCED:
            self._state = State.CLOSED
        self._cache.clear()
        self._readahead = None
        self._notify()

    def fence(self, error: StorageError | None = None) -> None:
        """Another owner took over (or the store was lost: `error`): fail everything pending
        and stop, writing nothing more."""
        self._state = State.FENCED
        self._failure = error or PartitionFenced(f"{self._tp} was taken over by another owner")
        removed = self._engine.writer.remove_pending(self)
        self.fail_appends(removed, self._failure)
        self._cache.clear()
        self._readahead = None
        self._notify()

    def abandon(self) -> None:
        self._state = State.CLOSED
        self._failure = PartitionClosing(f"{self._tp} was abandoned")
        self._cache.clear()
        self._notify()


def _fail(append: PendingAppend, error: BaseException) -> None:
    fut = append.future
    if fut is not None and not fut.done():
        fut.set_exception(error)
