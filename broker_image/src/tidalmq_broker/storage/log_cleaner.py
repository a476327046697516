"""The log cleaner's passes over the partitions of compacted topics (docs/compaction.md
section 3): read the dirty segments into a key map, rewrite the segments from the log start
to the map's end group by group with storage/cleaner.py's decisions, and swap each cleaned
group in with one checkpoint commit (`Partition.replace_cleaned`).

Run by the engine's compaction pass, after the WAL ranges were copied into segments, on the
partitions whose `cleanup.policy` includes `compact`; only the broker that has a partition open
cleans it (only it can commit its checkpoint). What is not built yet (docs/compaction.md,
"Status"): the first dirty offset lives in memory only (a new owner cleans from the log start
once), no dirty-ratio or max-lag scheduling (a partition is cleaned when new segments arrived
since its last pass), no metrics beyond one log line per pass. Parsing and filtering records run in a worker thread
(one at a time: the engine's compaction pass cleans one partition at a time).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tidalmq_broker.protocol.records import InvalidRecordBatch
from tidalmq_broker.storage import keys
from tidalmq_broker.storage.api import ObjectStoreUnavailable
from tidalmq_broker.storage.cleaner import (
    CleanRound,
    CleanStats,
    OffsetMap,
    ProducerLastBatch,
    TxnTracker,
    clean_group,
    cleanable_range,
    cleaned_entries,
    group_segments,
    map_batches,
)
from tidalmq_broker.storage.compaction import active_start, merge_max_age_ms, read_plan
from tidalmq_broker.storage.index import IndexEntry

if TYPE_CHECKING:
    from tidalmq_broker.storage.api import StorageConfig
    from tidalmq_broker.storage.objectstore.base import ObjectStore
    from tidalmq_broker.storage.partition import Partition


class CleanerHost(Protocol):
    """What the cleaner uses of the engine that runs it (storage/engine.py's
    ObjectStreamEngine): named here, so the cleaner does not import the engine."""

    config: StorageConfig
    store: ObjectStore

    async def delete_objects(self, object_keys: list[str], kind: str, path: str) -> None: ...


log = logging.getLogger(__name__)

# Keys one pass maps at most: 123 bytes per key measured (bench/cleaner_map.py), so about
# 59 MiB, within docs/compaction.md's 64 MiB budget; a bigger dirty range takes several passes.
DEFAULT_MAP_KEYS = 500_000


@dataclass(slots=True)
class CleanPass:
    """What one pass over a partition did."""

    start: int = -1  # the dirty range mapped: [start, end)
    end: int = -1
    map_full: bool = False
    groups_cleaned: int = 0
    groups_skipped: int = 0  # nothing in them changed: no PUT
    raced: bool = False  # the index moved on (or the partition left us): the pass stopped
    bytes_read: int = 0
    bytes_written: int = 0
    stats: CleanStats = field(default_factory=CleanStats)
    uncleanable: str | None = None  # why the partition's data cannot be cleaned


class LogCleaner:
    def __init__(self, engine: CleanerHost, map_keys: int = DEFAULT_MAP_KEYS) -> None:
        self._engine = engine
        self.map_keys = map_keys
        # where each open partition's next pass starts mapping (the checkpoint does not keep
        # it yet); the entry goes with the Partition object when it is closed
        self._first_dirty: weakref.WeakKeyDictionary[Partition, int] = weakref.WeakKeyDictionary()
        # partitions holding a batch the cleaner cannot parse: left alone until reopened
        # (Kafka's uncleanable partitions), not retried and logged on every pass
        self._uncleanable: weakref.WeakSet[Partition] = weakref.WeakSet()

    def wanted(self, p: Partition) -> bool:
        """A cheap test first: compacted, with segments at or past the first dirty offset."""
        if not p.config.compacted or p in self._uncleanable:
            return False
        i = len(p.index) - 1
        while i >= 0 and p.index[i].in_wal:
            i -= 1
        return i >= 0 and p.index[i].last_offset >= self._first_dirty.get(p, 0)

    async def clean(self, p: Partition, *, now_ms: int | None = None) -> CleanPass:
        """One pass over `p`, if anything is cleanable."""
        outcome = CleanPass()
        if not p.config.compacted or p in self._uncleanable:
            return outcome
        try:
            await self._pass(p, now_ms, outcome)
        except InvalidRecordBatch as exc:
            self._uncleanable.add(p)
            outcome.uncleanable = str(exc)
            log.warning("%s: cannot be cleaned until it is reopened: %s", p.tp, exc)
        return outcome

    async def _pass(self, p: Partition, now_ms: int | None, outcome: CleanPass) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        cfg = p.config
        entries = p.index.entries
        cleanable = cleanable_range(
            entries,
            first_dirty=self._first_dirty.get(p, 0),
            last_stable_offset=p.last_stable_offset,
            active_start=active_start(
                entries, cfg.segment_bytes, now_ms=now, merge_max_age_ms=merge_max_age_ms(cfg)
            ),
            min_compaction_lag_ms=cfg.min_compaction_lag_ms,
            now_ms=now,
        )
        if cleanable is None:
            return
        outcome.start, end = cleanable
        offset_map = OffsetMap(self.map_keys)
        dirty = [
            e for e in entries if e.last_offset >= outcome.start and e.base_offset < end
        ]  # segments only: the range ends at or before the first WAL range
        tracker = TxnTracker(p.aborted_txns.overlapping_entries(outcome.start, end - 1))
        for key, first, stop in read_plan(dirty):
            data = await self._engine.store.get(key, first, stop)
            outcome.bytes_read += len(data)
            # record parsing runs in a worker thread: the event loop (Produce, Fetch) keeps
            # its turn every GIL switch interval instead of waiting for a whole segment
            if await asyncio.to_thread(map_batches, data, offset_map, tracker, outcome.start, end):
                outcome.map_full = True
                break
        if offset_map.latest_offset < outcome.start:
            return  # nothing but control batches or aborted data to map yet
        outcome.end = offset_map.latest_offset + 1
        last_batches = {
            pid: ProducerLastBatch(epoch, last_data)
            for pid, (epoch, last_data) in p.producer_last_batches().items()
        }
        for group in group_segments(entries, outcome.end, cfg.segment_bytes):
            if not await self._clean_group(p, group, offset_map, last_batches, now, outcome):
                outcome.raced = True
                break
        if not outcome.raced:
            self._first_dirty[p] = outcome.end
        log.info(
            "%s: cleaned [%d, %d)%s: %d groups rewritten, %d unchanged; %d of %d records kept "
            "(%d superseded, %d expired tombstones, %d aborted, %d keyless, %d markers); "
            "%d bytes read, %d written; map %.0f%% full%s",
            p.tp,
            outcome.start,
            outcome.end,
            " (map full)" if outcome.map_full else "",
            outcome.groups_cleaned,
            outcome.groups_skipped,
            outcome.stats.records_kept,
            outcome.stats.records_read,
            outcome.stats.superseded,
            outcome.stats.tombstones_expired,
            outcome.stats.aborted,
            outcome.stats.keyless,
            outcome.stats.markers_removed,
            outcome.bytes_read,
            outcome.bytes_written,
            100 * offset_map.utilization,
            "; raced, stopped" if outcome.raced else "",
        )

    async def _clean_group(
        self,
        p: Partition,
        group: list[IndexEntry],
        offset_map: OffsetMap,
        last_batches: dict[int, ProducerLastBatch],
        now: int,
        outcome: CleanPass,
    ) -> bool:
        """Clean one group; False if it could not be swapped in (the pass stops there: the
        groups after it were judged on the assumption that this one's aborted data is gone)."""
        first, last = group[0].base_offset, group[-1].last_offset
        parts = [await self._engine.store.get(*plan) for plan in read_plan(group)]
        data = b"".join(parts)
        del parts
        outcome.bytes_read += len(data)
        tracker = TxnTracker(p.aborted_txns.overlapping_entries(first, last))
        rnd = CleanRound(offset_map, now, p.config.delete_retention_ms, last_batches, last)
        cleaned = await asyncio.to_thread(clean_group, data, tracker, rnd)
        _add(outcome.stats, cleaned.stats)
        if not cleaned.changed and not cleaned.emptied_aborts:
            outcome.groups_skipped += 1
            return True
        key = keys.segment_key(p.tp, p.topic_id, first)
        await self._engine.store.put(key, cleaned.batches, if_none_match=True)
        new = cleaned_entries(
            key, cleaned.batches, first, last, self._engine.config.index_granule_bytes
        )
        try:
            swapped = await p.replace_cleaned(group, new, cleaned.emptied_aborts)
        except BaseException:
            await self._delete_quietly(key)
            raise
        if not swapped:
            await self._delete_quietly(key)
            return False
        outcome.groups_cleaned += 1
        outcome.bytes_written += cleaned.size
        replaced = {e.key for e in group} - p.index.keys()
        if replaced:
            await self._engine.delete_objects(sorted(replaced), "segment", "cleaner")
        return True

    async def _delete_quietly(self, key: str) -> None:
        try:
            await self._engine.store.delete([key])
        except ObjectStoreUnavailable as exc:
            log.warning("could not delete %s (the sweep will): %s", key, exc)


def _add(total: CleanStats, more: CleanStats) -> None:
    for name in CleanStats.__slots__:
        setattr(total, name, getattr(total, name) + getattr(more, name))
