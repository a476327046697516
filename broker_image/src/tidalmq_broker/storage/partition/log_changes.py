"""Changes to a partition's stored log made by the engine's background work:
compaction's swap of WAL ranges for segments, the log cleaner's swap of segments for cleaned
copies (with its progress and the aborted transactions it emptied), and retention's or
DeleteRecords' move of the log start. Each is committed in one checkpoint under the checkpoint
lock, and only while the partition is open here under a valid lease (a pass that outlived
close() must not commit over the next owner's checkpoint).

The callers (engine.py, compaction.py, log_cleaner.py, retention.py) own the objects and
delete them; this part changes only the index, the log start and what the checkpoint carries.
"""

from __future__ import annotations

import time

from tidalmq_broker.storage.aborted_txns import AbortedTxn
from tidalmq_broker.storage.api import ObjectStoreUnavailable, OffsetOutOfRange
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.partition.checkpoints import Checkpoints
from tidalmq_broker.storage.partition.state import State


class LogChanges(Checkpoints):
    """Index swaps of compaction and the log cleaner, and moves of the log start."""

    __slots__ = ()

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
