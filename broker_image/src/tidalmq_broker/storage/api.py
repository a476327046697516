"""The storage engine's contract with the rest of the broker.

Everything above `storage/` (the Kafka API handlers, the group coordinator, the controller's
open/close commands) uses only the names defined here. The engine behind them keeps the
invariants of `shared/notes/stream-storage.md`: an append is acknowledged only once the WAL object
holding it is durable; the partition checkpoint (the "meta stream") is replaced with If-Match so
two owners never both commit; recovery after an unclean stop replays the owner's WAL objects
written after its last checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidalmq_core.model import TopicPartition


# --------------------------------------------------------------------------------------------
# Errors. Each maps to exactly one Kafka error code in one place (apis/errors.py).
# --------------------------------------------------------------------------------------------
class StorageError(Exception):
    """Base of every storage failure (KAFKA_STORAGE_ERROR unless a subclass says otherwise)."""


class ObjectStoreUnavailable(StorageError):
    """The object store failed or timed out; the request may be retried (KAFKA_STORAGE_ERROR)."""


class PartitionDataLost(StorageError):
    """The store no longer holds data this partition acknowledged: its checkpoint is missing
    although the partition was created, or it ends below the partition's durable end-offset
    floor (KAFKA_STORAGE_ERROR). Never served as an empty or shorter log: the partition stays
    unavailable until an operator accepts the loss (`tidalmq recover --accept-data-loss`)."""

    def __init__(
        self, tp: TopicPartition, *, expected_end: int, found_end: int, reason: str
    ) -> None:
        super().__init__(
            f"{tp}: data lost ({reason}): acknowledged up to offset {expected_end}, the object "
            f"store holds up to {found_end}"
        )
        self.tp = tp
        self.expected_end = expected_end
        self.found_end = found_end
        self.reason = reason


class StoreLost(StorageError):
    """The object store's identity marker is missing (the store was emptied or replaced) or
    names another cluster: nothing is read from or written into it (KAFKA_STORAGE_ERROR)."""


class PartitionFenced(StorageError):
    """Another owner (a higher leader epoch) has taken this partition, or this broker's lease
    lapsed: stop serving it (NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH)."""


class PartitionClosing(StorageError):
    """The partition is being closed for a move; clients should refresh metadata
    (NOT_LEADER_OR_FOLLOWER)."""


class OffsetOutOfRange(StorageError):
    """Fetch offset below the log start or above the log end (OFFSET_OUT_OF_RANGE)."""


class CorruptRecord(StorageError):
    """Malformed batch or CRC mismatch (CORRUPT_MESSAGE)."""


class UnsupportedMessageFormat(StorageError):
    """Batch magic below 2 (UNSUPPORTED_FOR_MESSAGE_FORMAT)."""


class RecordTooLarge(StorageError):
    """A batch larger than the partition's max.message.bytes (MESSAGE_TOO_LARGE)."""


class InvalidRecord(StorageError):
    """A batch the broker refuses for its content, e.g. transactional (INVALID_RECORD)."""


class OutOfOrderSequence(StorageError):
    """Idempotent producer sequence gap (OUT_OF_ORDER_SEQUENCE_NUMBER)."""


class ProducerCatchingUp(StorageError):
    """A batch ahead of the next sequence from a producer that has not appended to this
    partition since it was opened here: its earlier batches are on their way (answered
    NOT_LEADER_OR_FOLLOWER, retriable: the client retries them in order). See
    Partition.start_append."""


class InvalidProducerEpoch(StorageError):
    """A producer epoch older than the one the partition knows (INVALID_PRODUCER_EPOCH)."""


class UnknownProducerId(StorageError):
    """A non-zero sequence from a producer the partition does not know (UNKNOWN_PRODUCER_ID)."""


class InvalidTxnState(StorageError):
    """A non-transactional batch from a producer in the middle of a transaction
    (INVALID_TXN_STATE)."""


class VerificationGuard:
    """KIP-890's verification guard, compared by identity: a partition hands one out
    (`PartitionLog.start_verification`) when a producer with no transaction going on there
    asks to write transactionally, before the transaction coordinator is asked whether the
    partition is in that producer's transaction. The partition forgets it as soon as a
    transactional batch or a marker of that producer is appended, so an append carrying it
    after a marker ended the transaction meanwhile is refused (INVALID_TXN_STATE) instead of
    opening a transaction no marker will close. Kafka's VerificationGuard. `holders`: the
    requests that took it and have not yet given it back (`end_verification`)."""

    __slots__ = ("holders",)

    def __init__(self) -> None:
        self.holders = 0


# Kafka's VerificationGuard.SENTINEL: an append that required verification but asked no
# question (its producer had a transaction going on here): accepted only while it still has.
UNVERIFIED = VerificationGuard()


class TransactionCoordinatorFenced(StorageError):
    """A marker from a coordinator older than the last one seen for the producer id
    (TRANSACTION_COORDINATOR_FENCED)."""


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """The topic configs the storage engine honours (Kafka names in comments)."""

    retention_ms: int = 7 * 24 * 3600 * 1000  # retention.ms, -1 = unlimited
    retention_bytes: int = -1  # retention.bytes, -1 = unlimited
    max_message_bytes: int = 1024 * 1024 + 12  # max.message.bytes (one batch)
    segment_bytes: int = 64 * 1024 * 1024  # segment.bytes: target size of compacted segments
    message_timestamp_type: str = "CreateTime"  # message.timestamp.type
    segment_ms: int = 7 * 24 * 3600 * 1000  # segment.ms: bounds the last segment's merge age
    segment_jitter_ms: int = 0  # segment.jitter.ms: taken off that age, per segment
    # the log cleaner's (docs/compaction.md)
    cleanup_policy: frozenset[str] = frozenset({"delete"})  # cleanup.policy
    delete_retention_ms: int = 24 * 3600 * 1000  # delete.retention.ms: tombstones and markers
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = 2**63 - 1  # max.compaction.lag.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Engine settings. Each field is a broker setting of the same name, so a flag
    (`--read-ahead-bytes`) and an environment variable (`TIDALMQ_READ_AHEAD_BYTES`);
    BrokerSettings.storage_config() builds this from them."""

    flush_interval_ms: float = 10.0  # W: oldest pending append waits at most this long
    flush_bytes: int = 4 * 1024 * 1024  # B: flush as soon as this much is pending
    max_inflight_flushes: int = 4  # WAL PUTs in flight at once (acks still complete in order)
    checkpoint_interval_s: float = 5.0  # how often a dirty partition checkpoint is written
    cache_bytes: int = 256 * 1024 * 1024  # tail cache (recent batches of all partitions)
    read_ahead_bytes: int = 4 * 1024 * 1024  # ranged GET size for sequential cold reads
    compaction_interval_s: float = 10.0
    compaction_min_ranges: int = 32  # compact a partition once it has this many WAL ranges...
    compaction_min_bytes: int = 8 * 1024 * 1024  # ...or this many bytes in WAL ranges
    retention_check_interval_s: float = 30.0
    garbage_grace_s: float = 60.0  # unreferenced WAL objects younger than this are kept
    # Added by the storage engine (defaults keep every older caller working):
    compaction_idle_s: float = 60.0  # ...or once its oldest WAL range is this old
    index_granule_bytes: int = 256 * 1024  # index entry size inside compacted segments
    garbage_sweep_interval_s: float = 300.0  # full sweep (lists every checkpoint) this often
    identity_check_interval_ms: float = 5000.0  # how often the store's identity marker is read
    # A WAL flush not durable this long after it started fails (its producers get
    # KAFKA_STORAGE_ERROR, retriable, well within a 30 s request timeout) instead of waiting
    # for a store that hangs; it also bounds the health probe's PUT (storage/health.py).
    flush_timeout_ms: float = 5000.0
    # without a successful PUT for this long, a few bytes are written to see that the store
    # still takes writes (readiness); every second while it does not
    store_probe_interval_ms: float = 5000.0
    # the log cleaner of compacted topics (docs/compaction.md): a round every this often
    # (Kafka's log.cleaner.backoff.ms), each with at most this many passes at a time
    # (log.cleaner.threads); 0 threads turns the cleaner off (log.cleaner.enable=false)
    cleaner_backoff_ms: float = 15000.0
    cleaner_threads: int = 1


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int  # offset of the first record of the first batch
    last_offset: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    duplicate: bool = False  # an idempotent retry; offsets are the original ones


class Acknowledgement:
    """An append a partition has taken (Partition.start_append): its offsets, known at once,
    and `durable`, the future its WAL flush completes (None with acks=0). Awaiting it waits for
    that and returns the offsets; the Produce handler instead waits for the futures of all of
    a request's partitions together, without a task or a coroutine per partition."""

    __slots__ = ("durable", "result")

    def __init__(self, result: AppendResult, durable: asyncio.Future[None] | None) -> None:
        self.result = result
        self.durable = durable

    def __await__(self) -> Generator[Any, None, AppendResult]:
        if self.durable is not None:
            yield from self.durable
        return self.result


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes  # whole v2 batches, base offsets already final; may be empty
    high_watermark: int  # first offset not yet durable (consumers never see beyond it)
    log_start_offset: int
    last_stable_offset: int = -1  # first offset of the oldest ongoing transaction, else the HWM
    # read_committed only: (producer id, first offset) of the aborted transactions overlapping
    # the records returned, by first offset; None for read_uncommitted
    aborted: list[tuple[int, int]] | None = None


@dataclass(frozen=True, slots=True)
class TimestampLookup:
    offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """An idempotent producer a partition remembers (DescribeProducers)."""

    producer_id: int
    epoch: int
    last_sequence: int  # of its last durable batch; -1 if none is remembered
    last_timestamp_ms: int  # when that batch became durable; -1 if unknown
    coordinator_epoch: int = -1  # of the last transaction marker written for it
    current_txn_start_offset: int = -1  # first offset of its ongoing transaction, -1 if none


@dataclass(slots=True)
class PartitionStats:
    """Numbers the metrics endpoint and the controller read (cheap, no I/O)."""

    log_start_offset: int = 0
    high_watermark: int = 0
    size_bytes: int = 0
    wal_ranges: int = 0
    segments: int = 0
    extra: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Interfaces
# --------------------------------------------------------------------------------------------
class PartitionLog(Protocol):
    """One open partition on this broker. Only the owner (current leader epoch) has one."""

    @property
    def tp(self) -> TopicPartition: ...

    @property
    def leader_epoch(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int:
        """First offset not yet durable; Fetch and ListOffsets(latest) use this."""
        ...

    @property
    def config(self) -> PartitionConfig: ...

    async def append(
        self,
        records: bytes | memoryview,
        *,
        acks: int = -1,
        owned: bool = False,
        verification: VerificationGuard | None = None,
    ) -> AppendResult:
        """Validate (sizes, CRC, magic, producer sequence), assign offsets by patching base
        offsets, enqueue into the next WAL flush. With acks != 0 returns only after the WAL
        object holding the batches is durable (and the lease check passed at that moment).
        A failed PUT fails the append and rolls the partition back so no offset is reused
        with other data. Raises the StorageError subclasses above. `owned`: `records` is a
        writable view the caller gives up (a request's own buffer); it is patched in place
        instead of copied. `verification` (KIP-890, None when verification is off): a
        transactional batch of a producer with no transaction going on here is appended only
        if this is the guard `start_verification` gave and still holds (InvalidTxnState
        otherwise)."""
        ...

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest ongoing transaction (durable state), else the high
        watermark: read_committed consumers read below it."""
        ...

    async def read(self, offset: int, max_bytes: int, *, committed: bool = False) -> ReadResult:
        """Whole batches from `offset` (the batch containing it) up to about max_bytes, at
        least one batch if any is available even when larger than max_bytes. Returns empty
        records at the high watermark (`committed`: at the last stable offset, and the aborted
        transactions overlapping what it returns). Raises OffsetOutOfRange."""
        ...

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int
    ) -> AppendResult:
        """Append a commit or abort marker (a control batch) for the producer id and return
        once it is durable; it ends the producer's ongoing transaction (docs/transactions.md).
        Raises InvalidProducerEpoch, TransactionCoordinatorFenced and the append errors."""
        ...

    async def wait_for_data(
        self, offset: int, timeout_s: float, *, committed: bool = False
    ) -> None:
        """Return as soon as the high watermark (`committed`: the last stable offset) is above
        `offset` or after timeout_s (fetch long polling). Returns early too if the partition
        is closed."""
        ...

    async def offset_for_timestamp(self, timestamp_ms: int) -> TimestampLookup | None:
        """The first record (from the log start) whose timestamp is >= timestamp_ms, with that
        record's timestamp, as Kafka answers ListOffsets by timestamp; None if there is none."""
        ...

    async def offset_of_max_timestamp(self) -> TimestampLookup | None:
        """The first record (from the log start) with the greatest timestamp of the log, as
        Kafka answers ListOffsets MAX_TIMESTAMP (-3); None if the log holds no record."""
        ...

    async def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset (DeleteRecords; used by the group coordinator after a
        snapshot). Returns the new log start offset."""
        ...

    def stats(self) -> PartitionStats: ...

    def active_producers(self) -> list[ActiveProducer]:
        """The idempotent producers whose state the partition keeps, as of the high
        watermark (what a checkpoint persists and a new owner recovers)."""
        ...

    def in_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether the producer has a transaction going on here at this epoch (appends in
        flight included): its batches need no verification with the coordinator (KIP-890)."""
        ...

    def start_verification(self, producer_id: int) -> VerificationGuard:
        """The producer's verification guard (a new one unless a verification is already
        under way), to take before asking the coordinator and to pass to `append`. Every
        taker gives it back with `end_verification` once its append has started (or will
        not happen)."""
        ...

    def end_verification(self, producer_id: int, guard: VerificationGuard) -> None:
        """Give `guard` back: the partition forgets it when no request holds it any more
        (if an append or marker has not already voided it)."""
        ...


class StreamEngine(Protocol):
    """All partitions a broker owns, their shared WAL, cache, compaction and retention."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Stop accepting appends, flush, close every partition cleanly (clean-shutdown flag)."""
        ...

    async def open_partition(
        self,
        tp: TopicPartition,
        topic_id: str,
        leader_epoch: int,
        config: PartitionConfig,
        *,
        created: bool = False,
        end_offset_floor: int = 0,
        accepted_from: int | None = None,
    ) -> PartitionLog:
        """Take ownership: read the checkpoint, refuse (PartitionFenced) if it carries a higher
        epoch, commit a checkpoint with `leader_epoch` and this broker as owner (If-Match; this
        fences the previous owner), recover from the previous owner's WAL objects if its close
        was not clean, then serve. Creates the partition when no checkpoint exists, unless it
        was `created` before (the metadata says so): then its data is lost and this raises
        PartitionDataLost, as it does when the recovered log ends below `end_offset_floor`.
        `accepted_from` (an operator accepted the loss): continue from that offset instead (a
        fresh checkpoint, or a short one advanced to it). `topic_id` (a UUID string) is part of
        every object key, so a deleted and re-created topic of the same name never sees the
        old data."""
        ...

    async def update_config(self, tp: TopicPartition, config: PartitionConfig) -> None:
        """Apply changed topic configs (retention etc.) to an open partition."""
        ...

    async def close_partition(self, tp: TopicPartition) -> None:
        """The close of a move (steps 3-4): stop appending, wait for in-flight appends, force the flush,
        write the checkpoint with the clean-shutdown flag, forget the partition."""
        ...

    async def delete_partition(self, tp: TopicPartition, topic_id: str) -> None:
        """Close if open, then delete the checkpoint and the partition's segments."""
        ...

    def get(self, tp: TopicPartition) -> PartitionLog | None: ...

    def partitions(self) -> list[TopicPartition]: ...

    def has_topic(self, name: str) -> bool:
        """Whether any partition of topic `name` is open here (O(1))."""
        ...

    def take_changed(self) -> set[TopicPartition]:
        """Partitions opened, closed or whose high watermark advanced since the last call."""
        ...


LeaseCheck = Callable[[], bool]
"""Called at the moment of acknowledgement; False means this broker may no longer acknowledge
(its controller lease lapsed). The engine then fails the appends with PartitionFenced."""

OnFenced = Callable[[TopicPartition], Coroutine[Any, Any, None]]
"""Called when the engine learns it lost a partition (a failed If-Match on its checkpoint)."""
