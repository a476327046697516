"""Partitions that no broker has open: sealing them, compacting them, reading them.

Static topics stop writing a physical queue for good when a logic queue is remapped:
its partition is *sealed*. Its data stays where it is in object storage and is read from there
by whichever broker leads the logic queue now (a remote read). Three operations, none of which
needs the partition open anywhere:

- `seal_partition`: the final checkpoint. If the owner closed it cleanly, it is taken as is;
  if the owner died, the owner's WAL objects after its checkpoint are replayed (as an unclean
  open would) first. The sealed checkpoint carries a higher leader epoch (fencing the previous
  owner for good) and a pseudo-owner, so it pins no WAL object beyond the ranges it indexes.
  Only call it once the owner can no longer acknowledge a write to the partition: after it
  closed the partition, or after its lease certainly expired.
- `compact_sealed`: copy the WAL ranges of a sealed partition into segments (as the engine's
  compaction does for open partitions), so remote reads are a few large ranged GETs and the
  WAL objects can be collected.
- `ClosedPartitionReader`: a read-only view over a checkpoint: whole batches by offset with
  read-ahead, timestamp lookups, the final producer state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tidalmq_core.model import TopicPartition

from tidalmq_broker.protocol import records
from tidalmq_broker.storage import keys
from tidalmq_broker.storage.api import OffsetOutOfRange, StorageError, TimestampLookup
from tidalmq_broker.storage.batch_bytes import slice_batches
from tidalmq_broker.storage.checkpoint import Checkpoint, CheckpointStore
from tidalmq_broker.storage.compaction import (
    DEFAULT_GRANULE_BYTES,
    plan_segments,
    read_plan,
    segment_entries,
)
from tidalmq_broker.storage.index import IndexEntry, OffsetIndex
from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore
from tidalmq_broker.storage.producer_state import ProducerStateTable
from tidalmq_broker.storage.recovery import recover_tail
from tidalmq_broker.storage.timestamps import first_record_at, max_timestamp_record

log = logging.getLogger(__name__)

SEALED_OWNER = "sealed"  # owner broker and incarnation of a sealed checkpoint
_PARALLEL_GETS = 8


def is_sealed(cp: Checkpoint) -> bool:
    return cp.owner_broker == SEALED_OWNER and cp.clean_shutdown


@dataclass(frozen=True, slots=True)
class SealResult:
    checkpoint: Checkpoint
    recovered: bool  # the owner had not closed it cleanly: its WAL tail was replayed

    @property
    def end_offset(self) -> int:
        return self.checkpoint.next_offset

    @property
    def time_of_end(self) -> int:
        return max((e.max_timestamp for e in self.checkpoint.index), default=-1)


async def seal_partition(
    store: ObjectStore, tp: TopicPartition, topic_id: str, *, min_epoch: int = 0
) -> SealResult:
    """Write the final checkpoint of a partition nobody may write any more (see the module
    docstring for when that is). Idempotent: sealing a sealed partition returns it."""
    cps = CheckpointStore(store)
    key = keys.checkpoint_key(tp, topic_id)
    loaded = await cps.load(key)
    if loaded is None:
        # never opened (the switch came before its broker created it): an empty sealed log
        empty = Checkpoint(
            tp.topic,
            topic_id,
            tp.partition,
            min_epoch,
            SEALED_OWNER,
            SEALED_OWNER,
            -1,
            clean_shutdown=True,
        )
        try:
            await cps.commit(key, empty, None)
            return SealResult(empty, False)
        except StorageError:
            loaded = await cps.load(key)  # created meanwhile: seal that one
            if loaded is None:
                raise
    cp, etag = loaded
    if is_sealed(cp):
        return SealResult(cp, False)
    index, next_offset = list(cp.index), cp.next_offset
    producers = ProducerStateTable.from_json(cp.producers)  # type: ignore[arg-type]
    recovered = not cp.clean_shutdown
    if recovered:
        tail = await recover_tail(store, cp)
        now_ms = int(time.time() * 1000)
        for batch in tail.producers:
            producers.apply_tuple(batch, now_ms)
        index.extend(tail.entries)
        next_offset = tail.next_offset
        log.info(
            "%s: sealing after an unclean stop of broker %s: recovered offsets %d-%d from %d "
            "WAL objects",
            tp,
            cp.owner_broker,
            cp.next_offset,
            next_offset - 1,
            tail.objects_scanned,
        )
    sealed = Checkpoint(
        topic=tp.topic,
        topic_id=topic_id,
        partition=tp.partition,
        leader_epoch=max(cp.leader_epoch + 1, min_epoch),
        owner_broker=SEALED_OWNER,
        owner_incarnation=SEALED_OWNER,
        wal_position=-1,
        log_start_offset=cp.log_start_offset,
        next_offset=next_offset,
        clean_shutdown=True,
        index=index,
        producers=producers.to_json(),
    )
    await cps.commit(key, sealed, etag)  # PartitionFenced if anyone else committed meanwhile
    return SealResult(sealed, recovered)


async def compact_sealed(
    store: ObjectStore,
    tp: TopicPartition,
    topic_id: str,
    *,
    segment_bytes: int = 64 * 1024 * 1024,
    granule_bytes: int = DEFAULT_GRANULE_BYTES,
) -> int:
    """Move a sealed partition's WAL ranges into segments; returns segments written."""
    cps = CheckpointStore(store)
    key = keys.checkpoint_key(tp, topic_id)
    loaded = await cps.load(key)
    if loaded is None or not is_sealed(loaded[0]):
        return 0
    cp, etag = loaded
    index = OffsetIndex(cp.index)
    written: list[str] = []
    semaphore = asyncio.Semaphore(_PARALLEL_GETS)

    async def get(k: str, start: int, end: int) -> bytes:
        async with semaphore:
            return await store.get(k, start, end)

    for sources in plan_segments(index.entries, segment_bytes):
        if not any(e.in_wal for e in sources):
            continue
        parts = await asyncio.gather(*(get(k, s, e) for k, s, e in read_plan(sources)))
        segment = keys.segment_key(tp, topic_id, sources[0].base_offset)
        await store.put(segment, parts, if_none_match=True)  # stored one after the other
        written.append(segment)
        if not index.replace(sources, segment_entries(segment, sources, granule_bytes)):
            raise StorageError(f"{tp}: index changed while compacting a sealed partition")
    if not written:
        return 0
    cp.index = index.entries
    try:
        await cps.commit(key, cp, etag)
    except BaseException:
        await store.delete(written)
        raise
    return len(written)


class ClosedPartitionReader:
    """Reads a partition from its checkpoint in object storage (no broker has to have it open).

    The checkpoint is loaded once; `refresh()` reloads it (a partition still being sealed
    grows until then). Sequential readers get read-ahead: the ranges of the entries after the
    one asked for, up to `read_ahead_bytes`, fetched in parallel with it."""

    def __init__(
        self,
        store: ObjectStore,
        tp: TopicPartition,
        topic_id: str,
        *,
        read_ahead_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.store = store
        self.tp = tp
        self.topic_id = topic_id
        self.read_ahead_bytes = read_ahead_bytes
        self._cp: Checkpoint | None = None
        self._index = OffsetIndex()
        self._lock = asyncio.Lock()
        self._ahead: dict[int, bytes] = {}  # entry base offset -> its bytes, read ahead
        self._next = -1  # where the last read ended (sequential readers get read-ahead)
        self.loaded_at = 0.0

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self._cp

    @property
    def sealed(self) -> bool:
        return self._cp is not None and is_sealed(self._cp)

    @property
    def next_offset(self) -> int:
        return self._cp.next_offset if self._cp is not None else 0

    @property
    def log_start_offset(self) -> int:
        return self._cp.log_start_offset if self._cp is not None else 0

    async def load(self) -> Checkpoint | None:
        if self._cp is None:
            await self.refresh()
        return self._cp

    async def refresh(self) -> None:
        async with self._lock:
            loaded = await CheckpointStore(self.store).load(
                keys.checkpoint_key(self.tp, self.topic_id)
            )
            self.loaded_at = time.monotonic()
            if loaded is None:
                return
            self._cp = loaded[0]
            self._index = OffsetIndex(self._cp.index)
            self._ahead.clear()

    def producers(self) -> ProducerStateTable:
        cp = self._cp
        return ProducerStateTable.from_json(cp.producers if cp else {})  # type: ignore[arg-type]

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding `offset`, up to about max_bytes (at least one
        batch); empty at the end of what the checkpoint indexes."""
        await self.load()
        if offset < self.log_start_offset:
            raise OffsetOutOfRange(f"{self.tp}: offset {offset} is below {self.log_start_offset}")
        if offset >= self.next_offset:
            return b""
        for _attempt in range(3):
            i = self._index.find(offset)
            if i is None:
                raise StorageError(f"{self.tp}: offset {offset} is not indexed")
            want = max(max_bytes, 1)
            ahead = self.read_ahead_bytes if offset == self._next else 0
            needed: list[IndexEntry] = []
            extra: list[IndexEntry] = []
            size = 0
            for e in self._index.slice(i, len(self._index)):
                if needed and size >= want + ahead:
                    break
                (needed if not needed or size < want else extra).append(e)
                size += e.size
            try:
                blobs = await self._fetch(needed + extra)
            except ObjectNotFound:
                await self.refresh()  # compacted meanwhile: the index moved to segments
                continue
            data = memoryview(b"".join(blobs[e.base_offset] for e in needed))
            out = bytes(slice_batches(data, offset, want))
            last = None
            for last in records.iter_headers(out):  # noqa: B007 - only the last one matters
                pass
            self._next = last.last_offset + 1 if last is not None else -1
            # keep what was fetched and not returned: the next sequential read starts there
            for e in needed + extra:
                if e.last_offset >= self._next >= 0:
                    self._ahead[e.base_offset] = blobs[e.base_offset]
            return out
        raise StorageError(f"{self.tp}: the objects holding offset {offset} keep disappearing")

    async def _fetch(self, entries: list[IndexEntry]) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        missing = []
        for e in entries:
            cached = self._ahead.pop(e.base_offset, None)
            if cached is not None:
                out[e.base_offset] = cached
            else:
                missing.append(e)
        self._ahead.clear()  # only the run right after the last read is worth keeping
        semaphore = asyncio.Semaphore(_PARALLEL_GETS)

        async def get(k: str, start: int, end: int) -> tuple[int, bytes]:
            async with semaphore:
                return start, await self.store.get(k, start, end)

        plan = read_plan(missing)  # byte-adjacent entries of one object: one GET
        blobs = await asyncio.gather(*(get(k, s, e) for k, s, e in plan))
        j = 0
        for (key, start, end), (_, blob) in zip(plan, blobs, strict=True):
            while j < len(missing) and missing[j].key == key and missing[j].end_position <= end:
                e = missing[j]
                out[e.base_offset] = blob[e.position - start : e.end_position - start]
                j += 1
        return out

    async def offset_of_max_timestamp(self) -> TimestampLookup | None:
        await self.load()

        async def read(entry: IndexEntry) -> bytes | memoryview:
            return (await self._fetch([entry]))[entry.base_offset]

        return await max_timestamp_record(self._index.entries, self.log_start_offset, read, self.tp)

    async def offset_for_timestamp(self, timestamp_ms: int) -> TimestampLookup | None:
        await self.load()
        i = self._index.find_timestamp(timestamp_ms)
        while i is not None and i < len(self._index):
            entry = self._index[i]
            blobs = await self._fetch([entry])
            found = first_record_at(
                blobs[entry.base_offset], timestamp_ms, self.log_start_offset, self.tp
            )
            if found is not None:
                return found
            i += 1
        return None
