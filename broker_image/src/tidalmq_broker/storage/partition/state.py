"""A partition's state and the invariants that tie it together; the parts of
storage/partition/ (appends, flushes, reads, checkpoints, log changes, closing) each change
their share of it, none keeps state of its own.

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
object that may hold the failed batches (flushes.py). Only then does it take appends again, so
no offset is ever acknowledged twice with different data, not even after a crash and a replay of
the WAL.

This module owns the fields, their read-only views (the PartitionLog properties), the state
machine's names (State), what a partition uses of its engine (PartitionHost) and the few
primitives every part uses (the writable check, the new-data event, the checkpoint lock, the
change counter). It must not import any other part of the package.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tidalmq_core.model import TopicPartition

from tidalmq_broker.storage.aborted_txns import AbortedTxns
from tidalmq_broker.storage.api import (
    ActiveProducer,
    ObjectStoreUnavailable,
    PartitionClosing,
    PartitionConfig,
    PartitionFenced,
    PartitionStats,
    StoreLost,
    VerificationGuard,
)
from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.index import OffsetIndex
from tidalmq_broker.storage.producer_state import ProducerStateTable
from tidalmq_broker.storage.wal_writer import WalSource

if TYPE_CHECKING:
    from tidalmq_broker.storage.api import StorageConfig
    from tidalmq_broker.storage.cache import TailCache
    from tidalmq_broker.storage.checkpoint import CheckpointStore
    from tidalmq_broker.storage.health import WriteHealth
    from tidalmq_broker.storage.metrics import BrokerMetrics
    from tidalmq_broker.storage.objectstore.base import ObjectStore
    from tidalmq_broker.storage.wal_writer import WalWriter

P = TypeVar("P", bound=WalSource)


class PartitionHost(Protocol[P]):
    """What a partition uses of the engine that holds it (storage/engine.py's
    ObjectStreamEngine is the one, a PartitionHost[Partition]): named here, so the partition does
    not import the engine. Generic over the partition type the engine is handed back (P), so the
    parts of the partition need not name the Partition class that composes them."""

    broker_label: str
    incarnation: str
    config: StorageConfig
    m: BrokerMetrics
    store: ObjectStore
    checkpoints: CheckpointStore
    cache: TailCache
    writer: WalWriter[P]
    write_health: WriteHealth
    store_problem: str | None

    @property
    def write_problem(self) -> str | None: ...
    def checkpoint_key(self, tp: TopicPartition, topic_id: str) -> str: ...
    def lease_ok(self) -> bool: ...
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]: ...
    def high_watermark_advanced(self, tp: TopicPartition) -> None: ...
    def partition_changed(self, p: P) -> None: ...
    def partition_fenced(self, p: P) -> None: ...
    def first_stored(self, p: P) -> None: ...
    def checkpoint_committed(self, p: P, cp: Checkpoint) -> None: ...
    async def delete_objects(self, object_keys: list[str], kind: str, path: str) -> None: ...


class State(enum.Enum):
    OPEN = "open"
    RECOVERING = "recovering"  # a flush failed; rolling back before taking appends again
    CLOSING = "closing"
    CLOSED = "closed"
    FENCED = "fenced"


class PartitionState:
    """The fields of one open partition (see the module docstring) and what every part uses.

    Slotted, as is every part (`__slots__ = ()`): a creation opens thousands of partitions at
    once and an instance dict was one more object each for the garbage collector to track
    (docs/control-plane.md). The containers a partition may never use (the producer ids
    appended since this open, its tail cache, the events, the checkpoint lock) are made when
    first needed."""

    __slots__ = (
        "__weakref__",  # the log cleaner's WeakSet of partitions it cannot clean
        "_aborted",
        "_appended_here",
        "_cache",
        "_checkpoint_lock",
        "_cleaner_state",
        "_closing",
        "_cold_next",
        "_committed_position",
        "_committed_version",
        "_config",
        "_data_event",
        "_drained",
        "_durable_producers",
        "_engine",
        "_epoch",
        "_epoch_stored",
        "_etag",
        "_failure",
        "_first_unstable",
        "_hwm",
        "_index",
        "_inflight",
        "_key",
        "_log_start",
        "_next_offset",
        "_producers",
        "_readahead",
        "_recovery_task",
        "_state",
        "_tp",
        "_verifications",
        "_version",
        "_wal_since",
        "topic_id",
        "tracker_key",
    )

    def __init__(
        self,
        engine: PartitionHost[Any],
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
        # producer ids with a batch appended (or answered as a duplicate) since this open;
        # None until the first
        self._appended_here: set[int] | None = None
        # KIP-890: producer id -> the guard of its verification under way (start_verification)
        self._verifications: dict[int, VerificationGuard] = {}
        self._aborted = AbortedTxns.from_json(checkpoint.aborted_txns)
        self._cleaner_state = dict(checkpoint.cleaner)  # the log cleaner's progress
        # first offset of the oldest durable ongoing transaction (None: the LSO is the HWM)
        self._first_unstable = self._durable_producers.first_unstable_offset()
        self._cache = engine.cache.empty  # its own with its first cached chunk (flushes.py)
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

    def _bump_version(self) -> None:
        """Something the next checkpoint must carry changed: the engine's upkeep passes look
        at this partition next time (storage/upkeep.py), none walks every open partition."""
        self._version += 1
        self._engine.partition_changed(self)

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
