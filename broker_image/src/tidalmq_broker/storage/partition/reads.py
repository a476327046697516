"""Reads from a partition: whole batches from an offset up to the high watermark (or
the last stable offset for read_committed, with the aborted transactions they overlap), from
the tail cache or a ranged GET of the object the index names (with read-ahead for sequential
readers); waiting for new data; timestamp lookups.

Reads change nothing but the read-ahead buffer and never go beyond the high watermark.
"""

from __future__ import annotations

import asyncio
import logging

from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import (
    ObjectStoreUnavailable,
    OffsetOutOfRange,
    ReadResult,
    StorageError,
    TimestampLookup,
)
from tidalmq_broker.storage.batch_bytes import batches_below, slice_batches
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.objectstore.base import ObjectNotFound
from tidalmq_broker.storage.partition.state import PartitionState, State
from tidalmq_broker.storage.timestamps import first_record_at, max_timestamp_record

log = logging.getLogger(__name__)


class Reads(PartitionState):
    """Reads by offset and by timestamp, and waits for new data."""

    __slots__ = ()

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
