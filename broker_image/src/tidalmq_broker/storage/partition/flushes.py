"""The outcome of a partition's WAL flushes: a completed flush indexes the batches,
advances the durable producer state and the high watermark, fills the tail cache and
acknowledges the appends (in WAL order, only under a valid lease); a failed one fails every
append of the partition in it and after it and rolls the partition back to its high watermark
(RECOVERING until a checkpoint beyond every object that may hold the failed batches is
committed; see state.py).

Called by the engine for this partition's share of each flush; must not assign offsets or read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tidalmq_broker.storage import metrics
from tidalmq_broker.storage.api import ObjectStoreUnavailable, PartitionClosing, PartitionFenced
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.partition.checkpoints import Checkpoints
from tidalmq_broker.storage.partition.state import State
from tidalmq_broker.storage.wal import WalEntry
from tidalmq_broker.storage.wal_writer import PendingAppend

log = logging.getLogger(__name__)


class Flushes(Checkpoints):
    """Completion and failure of the partition's WAL flushes, and the rollback after one."""

    __slots__ = ()

    def flush_completed(
        self,
        entry: WalEntry | None,
        key: str,
        views: list[tuple[PendingAppend[Any], memoryview]],
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
            cache = self._cache
            if cache.shared:  # the first chunk it caches: a cache of its own
                cache = self._cache = self._engine.cache.partition()
            for append, view in views:
                cache.add(append.base_offset, append.last_offset, view)
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

    def fail_appends(self, appends: list[PendingAppend[Any]], error: BaseException) -> None:
        self._inflight -= len(appends)
        for append in appends:
            _fail(append, error)
        if self._inflight == 0 and self._drained is not None:
            self._drained.set()

    async def _wait_drained(self) -> None:
        """Until every append enqueued has completed."""
        while self._inflight > 0:
            if self._drained is None or self._drained.is_set():
                self._drained = asyncio.Event()
            await self._drained.wait()

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
            self._appended_here = None  # its producers resend what failed, pipelined
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


def _fail(append: PendingAppend[Any], error: BaseException) -> None:
    fut = append.future
    if fut is not None and not fut.done():
        fut.set_exception(error)
