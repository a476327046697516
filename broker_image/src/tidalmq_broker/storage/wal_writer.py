"""Gathers the appends of all partitions into WAL objects and completes them in order.

One flush is one object. A flush starts once `flush_interval_ms` (W) have passed since the
previous flush started (so an append waits at most W, and an idle writer flushes a lone append
on the next loop turn) or as soon as `flush_bytes` are pending, as long as fewer than
`max_inflight_flushes` PUTs are running (otherwise the pending appends wait for a slot and go out
together). Flush starts by time are thus at most 1000/W per second. PUTs may finish in any
order, but flushes are *completed* strictly in sequence order, so acknowledgements and high
watermarks only ever advance over a prefix of durable objects.

A flush is stored from the appends' own buffers (ObjectStore.put takes the header and index and
then one part per append), never joined into one blob; the tail cache then keeps a read-only
view of each append's buffer, the only reference to its bytes once the flush is complete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from tidalmq_core.model import TopicPartition

from tidalmq_broker.storage import metrics
from tidalmq_broker.storage.api import ObjectStoreUnavailable, StorageConfig
from tidalmq_broker.storage.keys import wal_key
from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore, PreconditionFailed
from tidalmq_broker.storage.wal import ProducerBatch, WalEntry, WalGroup, encode_wal_object

log = logging.getLogger(__name__)

_PUT_ATTEMPTS = 3
_PUT_BACKOFF_S = (0.05, 0.25)


class WalSource(Protocol):
    """What the writer reads of a partition whose appends it gathers (storage/partition.py's
    Partition is one). The writer hands the partitions back as it got them (`Flush.groups`,
    typed by P), so it never names the Partition class: partition.py imports this module, and
    this module does not import it (docs/import-graph.md)."""

    @property
    def tp(self) -> TopicPartition: ...

    @property
    def topic_id(self) -> str: ...

    @property
    def leader_epoch(self) -> int: ...


P = TypeVar("P", bound=WalSource)


@dataclass(slots=True, eq=False)
class PendingAppend(Generic[P]):
    partition: P
    # the batches with final offsets (a view: the request's own); emptied when a flush takes
    # a read-only view of them, from then on the one reference to the bytes
    data: bytearray | memoryview
    base_offset: int
    last_offset: int
    max_timestamp: int
    producers: list[ProducerBatch]
    future: asyncio.Future[None] | None


@dataclass(slots=True, eq=False)
class Flush(Generic[P]):
    seq: int
    key: str
    appends: list[PendingAppend[P]]
    started: float
    size: int = 0
    done: bool = False
    error: BaseException | None = None
    # what the PUT stores, concatenated: header and index, then each append's view, in order
    parts: list[bytes | bytearray | memoryview] = field(default_factory=list)
    entries: list[WalEntry] = field(default_factory=list)
    # per partition: (its WalEntry, [(append, read-only view of its bytes)])
    groups: list[tuple[P, WalEntry | None, list[tuple[PendingAppend[P], memoryview]]]] = field(
        default_factory=list
    )


class WalWriter(Generic[P]):
    def __init__(
        self,
        store: ObjectStore,
        broker: str,
        incarnation: str,
        config: StorageConfig,
        on_complete: Callable[[Flush[P]], None],
    ) -> None:
        self._store = store
        self._broker = broker
        self._incarnation = incarnation
        self._config = config
        self._on_complete = on_complete
        self._pending: list[PendingAppend[P]] = []
        self._pending_bytes = 0
        # tidalmq_storage_append_bytes_total, counted per flush from the pending bytes (one
        # increment per flush, not one per append: a Prometheus increment takes a lock)
        self._append_bytes = metrics.APPEND_BYTES.labels(broker)
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._inflight: deque[Flush[P]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_seq = 0
        self.completed_seq = -1  # every flush up to here has been completed (ok or failed)
        self._closed = False
        self._last_flush_started = float("-inf")
        self._idle = asyncio.Event()
        self._idle.set()
        # awaited before each flush's PUT (the engine stores new partitions' first checkpoints)
        self.before_put: Callable[[Flush[P]], Awaitable[None]] | None = None
        # told when a flush ran out of time (the store's write health, storage/health.py)
        self.on_timeout: Callable[[BaseException], None] | None = None

    # ---------------------------------------------------------------- appends
    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def enqueue(self, append: PendingAppend[P]) -> None:
        if self._closed:
            raise ObjectStoreUnavailable("the WAL writer is stopped")
        self._pending.append(append)
        self._pending_bytes += len(append.data)
        self._idle.clear()
        if self._pending_bytes >= self._config.flush_bytes:
            self._start_flushes()
        elif self._timer is None:
            # Wait until W after the previous flush started (at most W for this append): an
            # idle writer flushes on the next loop turn, a busy one every W, so PUTs stay
            # under 1000/W per second (plus size-triggered flushes) whatever the load.
            loop = asyncio.get_running_loop()
            delay = self._last_flush_started + self._config.flush_interval_ms / 1000 - loop.time()
            if delay <= 0:
                self._timer = loop.call_soon(self._on_timer)
            else:
                self._timer = loop.call_later(delay, self._on_timer)

    def remove_pending(self, partition: P) -> list[PendingAppend[P]]:
        """Take a partition's not-yet-flushed appends out (it is rolling back)."""
        removed = [a for a in self._pending if a.partition is partition]
        if removed:
            self._pending = [a for a in self._pending if a.partition is not partition]
            self._pending_bytes -= sum(len(a.data) for a in removed)
            self._check_idle()
        return removed

    def flush_now(self) -> None:
        """Start flushing whatever is pending without waiting for the timer (close, stop)."""
        self._start_flushes()

    async def wait_idle(self) -> None:
        """Until nothing is pending or in flight."""
        self._start_flushes()
        await self._idle.wait()

    def _on_timer(self) -> None:
        self._timer = None
        self._start_flushes()

    def _check_idle(self) -> None:
        if not self._pending and not self._inflight:
            self._idle.set()

    def _start_flushes(self) -> None:
        while self._pending and len(self._inflight) < self._config.max_inflight_flushes:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._append_bytes.inc(self._pending_bytes)
            appends, self._pending, self._pending_bytes = self._pending, [], 0
            self._last_flush_started = asyncio.get_running_loop().time()
            seq = self._next_seq
            self._next_seq += 1
            flush = Flush(
                seq, wal_key(self._broker, self._incarnation, seq), appends, time.perf_counter()
            )
            self._inflight.append(flush)
            task = asyncio.get_running_loop().create_task(
                self._write(flush), name=f"wal-flush-{seq}"
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._pending and self._timer is None and not self._inflight:
            self._timer = asyncio.get_running_loop().call_later(
                self._config.flush_interval_ms / 1000, self._on_timer
            )

    # ---------------------------------------------------------------- one flush
    def _encode(self, flush: Flush[P]) -> None:
        by_partition: dict[int, list[PendingAppend[P]]] = {}
        for a in flush.appends:
            by_partition.setdefault(id(a.partition), []).append(a)
        groups: list[WalGroup] = []
        views_by_group: list[list[tuple[PendingAppend[P], memoryview]]] = []
        for appends in by_partition.values():
            p = appends[0].partition
            producers: list[ProducerBatch] = []
            views = []
            for a in appends:
                producers.extend(a.producers)
                # read-only: the bytes are durable once the PUT returns and never change again
                views.append((a, memoryview(a.data).toreadonly()))
                a.data = bytearray()  # the view holds the bytes now: one reference to them
            groups.append(
                WalGroup(
                    p.tp.topic,
                    p.topic_id,
                    p.tp.partition,
                    p.leader_epoch,
                    appends[0].base_offset,
                    appends[-1].last_offset,
                    max(a.max_timestamp for a in appends),
                    [v for _, v in views],
                    producers,
                )
            )
            views_by_group.append(views)
        parts, entries = encode_wal_object(groups)
        flush.parts, flush.entries, flush.size = parts, entries, sum(len(b) for b in parts)
        for views, entry in zip(views_by_group, entries, strict=True):
            flush.groups.append((views[0][0].partition, entry, views))

    async def _write(self, flush: Flush[P]) -> None:
        timeout_s = self._config.flush_timeout_ms / 1000
        try:
            self._encode(flush)
            try:
                async with asyncio.timeout(timeout_s if timeout_s > 0 else None):
                    if self.before_put is not None:
                        await self.before_put(flush)
                    await self._put_with_retries(flush)
            except TimeoutError:
                # the store hangs: fail the appends now (KAFKA_STORAGE_ERROR) rather than at
                # the producers' request timeout; a PUT that lands later is beyond the
                # rollback checkpoint's WAL position (partition.py), so never replayed
                exc = ObjectStoreUnavailable(
                    f"WAL flush {flush.key} not durable within {timeout_s:g}s "
                    "(flush_timeout_ms): the object store does not answer"
                )
                if self.on_timeout is not None:
                    self.on_timeout(exc)
                raise exc from None
            metrics.WAL_FLUSHES.labels(self._broker, "ok").inc()
            metrics.WAL_FLUSH_BYTES.labels(self._broker).observe(flush.size)
            metrics.WAL_FLUSH_SECONDS.labels(self._broker).observe(
                time.perf_counter() - flush.started
            )
        except asyncio.CancelledError:
            flush.error = ObjectStoreUnavailable(f"WAL flush {flush.key} was cancelled")
            raise
        except Exception as exc:
            log.warning("WAL flush %s of %d bytes failed: %s", flush.key, flush.size, exc)
            metrics.WAL_FLUSHES.labels(self._broker, "failed").inc()
            flush.error = (
                exc
                if isinstance(exc, ObjectStoreUnavailable)
                else ObjectStoreUnavailable(f"WAL flush {flush.key} failed: {exc}")
            )
            if flush.error is not exc:
                flush.error.__cause__ = exc
        finally:
            flush.done = True
            if not self._closed:
                self._complete_in_order()

    async def _put_with_retries(self, flush: Flush[P]) -> None:
        for attempt in range(_PUT_ATTEMPTS):
            try:
                await self._store.put(flush.key, flush.parts, if_none_match=True)
                return
            except PreconditionFailed:
                # Only this incarnation writes under its prefix: an earlier attempt that timed
                # out on our side landed. Make sure it is the same object.
                try:
                    info = await self._store.head(flush.key)
                except ObjectNotFound:
                    info = None
                if info is not None and info.size == flush.size:
                    return
                raise
            except ObjectStoreUnavailable:
                if attempt == _PUT_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(_PUT_BACKOFF_S[min(attempt, len(_PUT_BACKOFF_S) - 1)])

    def _complete_in_order(self) -> None:
        while self._inflight and self._inflight[0].done:
            flush = self._inflight.popleft()
            self.completed_seq = flush.seq
            try:
                self._on_complete(flush)
            except Exception:
                log.exception("completing WAL flush %s failed", flush.key)
            flush.parts = []  # the cache keeps views of what it needs
        self._start_due_flushes()
        self._check_idle()

    def _start_due_flushes(self) -> None:
        """After a completion: flush what is pending only if it is due (flush_bytes pending,
        or W passed since the previous flush started, as for appends that waited for a slot);
        else leave it to the timer, at W after that start. Starting a flush at every
        completion made the flushes follow each other as fast as the store answered whenever
        a PUT took less than W (a quiet local store: a flush per request or two under a Java
        producer), not at most 1000/W a second (docs/architecture/decisions.md)."""
        if not self._pending:
            return
        loop = asyncio.get_running_loop()
        due = self._last_flush_started + self._config.flush_interval_ms / 1000
        if self._pending_bytes >= self._config.flush_bytes or loop.time() >= due:
            self._start_flushes()
        elif self._timer is None:
            self._timer = loop.call_at(due, self._on_timer)

    # ---------------------------------------------------------------- shutdown
    def abandon(self, error: BaseException) -> list[PendingAppend[P]]:
        """Stop at once: cancel PUTs, return every append not completed (the caller fails
        them). Used by stop() after draining and by crash simulation."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks:
            task.cancel()
        left = list(self._pending)
        for flush in self._inflight:
            left.extend(flush.appends)
        self._pending, self._pending_bytes = [], 0
        self._inflight.clear()
        self._idle.set()
        return left
