"""The log cleaner's passes over the partitions of compacted topics (docs/compaction.md
section 3): read the dirty segments into a key map, rewrite the segments from the log start
to the map's end group by group with storage/cleaner.py's decisions, and swap each cleaned
group in with one checkpoint commit (`Partition.replace_cleaned`).

Run by the engine's cleaner loop (every `cleaner_backoff_ms`) on the partitions whose
`cleanup.policy` includes `compact`, chosen as Kafka's cleaner manager chooses: those overdue
(a record older than `max.compaction.lag.ms` is still dirty, or a kept tombstone's or marker's
delete horizon passed) first, then those whose cleanable ratio exceeds
`min.cleanable.dirty.ratio`, dirtiest first; at most `cleaner_threads` passes at a time and one
per partition per round. Only the broker that has a partition open cleans it (only it can
commit its checkpoint). The pass's progress (the first dirty offset, the earliest delete
horizon ahead) goes into the partition checkpoint, so a new owner goes on where this one
stopped. Parsing and filtering records run in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tidalmq_broker.protocol.records import InvalidRecordBatch
from tidalmq_broker.storage import keys, metrics
from tidalmq_broker.storage.api import ObjectStoreUnavailable
from tidalmq_broker.storage.cleaner import (
    Cleanability,
    CleanRound,
    CleanStats,
    OffsetMap,
    ProducerLastBatch,
    TxnTracker,
    assess,
    clean_group,
    cleanable_range,
    cleaned_entries,
    earliest_horizon,
    group_segments,
    map_batches,
)
from tidalmq_broker.storage.compaction import (
    active_start,
    merge_max_age_ms,
    read_plan,
    roll_jitter_bound_ms,
    segment_merge_age_ms,
)
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
    broker_label: str

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
    horizon: int | None = None  # the earliest delete horizon ahead in what the pass read
    raced: bool = False  # the index moved on (or the partition left us): the pass stopped
    bytes_read: int = 0
    bytes_written: int = 0
    stats: CleanStats = field(default_factory=CleanStats)
    uncleanable: str | None = None  # why the partition's data cannot be cleaned


class LogCleaner:
    def __init__(self, engine: CleanerHost, map_keys: int = DEFAULT_MAP_KEYS) -> None:
        self._engine = engine
        self.map_keys = map_keys
        # partitions holding a batch the cleaner cannot parse: left alone until reopened
        # (Kafka's uncleanable partitions), not retried and logged on every pass
        self._uncleanable: weakref.WeakSet[Partition] = weakref.WeakSet()

    def wanted(self, p: Partition) -> bool:
        """A cheap test first: compacted, cleanable, with segments."""
        return (
            p.config.compacted
            and p not in self._uncleanable
            and len(p.index) > 0
            and not p.index[0].in_wal
        )

    def cleanability(self, p: Partition, now_ms: int) -> Cleanability:
        """How much `p` needs a pass now (its dirty ratio; overdue or not)."""
        cfg = p.config
        entries = p.index.entries
        state = p.cleaner_state
        cleanable = self._cleanable(p, now_ms)
        return assess(
            entries,
            cleanable,
            first_dirty=max(state.get("first_dirty", 0), p.log_start_offset),
            max_compaction_lag_ms=cfg.max_compaction_lag_ms,
            horizon_ms=state.get("horizon"),
            now_ms=now_ms,
        )

    def choose(self, partitions: Iterable[Partition], now_ms: int) -> list[Partition]:
        """The partitions a round cleans, in order (Kafka's grabFilthiestCompactedLog, for
        every cleaner thread at once): overdue first, then by dirty ratio."""
        ranked: list[tuple[tuple[bool, float], int, Partition]] = []
        max_ratio = 0.0
        for i, p in enumerate(partitions):
            if not self.wanted(p):
                continue
            c = self.cleanability(p, now_ms)
            max_ratio = max(max_ratio, c.ratio)
            if c.chosen(p.config.min_cleanable_dirty_ratio):
                ranked.append((c.priority, i, p))
        ranked.sort(key=lambda row: row[:2])
        broker = self._engine.broker_label
        metrics.CLEANER_MAX_DIRTY_RATIO.labels(broker).set(max_ratio)
        metrics.CLEANER_CLEANABLE_PARTITIONS.labels(broker).set(len(ranked))
        metrics.CLEANER_UNCLEANABLE_PARTITIONS.labels(broker).set(len(self._uncleanable))
        return [p for _, _, p in ranked]

    def next_due(self, p: Partition, now_ms: int) -> int | None:
        """When the cleaner looks at `p` again without a change (ms; None: only on a change):
        at once if a pass is wanted now (the map filled, a race); else when time alone can
        make it cleanable: a kept tombstone's delete horizon, max.compaction.lag.ms of its
        first dirty entry, min.compaction.lag.ms, or its last segment leaving the active part
        (merge age). A change (a new segment, a config, an open) brings it back sooner."""
        if not self.wanted(p):
            return None
        cfg = p.config
        if self.cleanability(p, now_ms).chosen(cfg.min_cleanable_dirty_ratio):
            return now_ms
        state = p.cleaner_state
        times: list[int] = []
        if "horizon" in state:
            times.append(state["horizon"])
        entries = p.index.entries
        first_dirty = max(state.get("first_dirty", 0), p.log_start_offset)
        dirty = next((e for e in entries if not e.in_wal and e.last_offset >= first_dirty), None)
        # the first millisecond each makes a difference: `assess` and `may_merge` compare
        # strictly (overdue once older than max.compaction.lag.ms; merged up to the merge age)
        if dirty is not None and dirty.max_timestamp >= 0:
            times.append(_add_ms(dirty.max_timestamp, cfg.max_compaction_lag_ms, 1))
            if cfg.min_compaction_lag_ms > 0:
                times.append(_add_ms(now_ms, cfg.min_compaction_lag_ms))
        segments = [e for e in entries if not e.in_wal]
        if segments:
            last_key = segments[-1].key
            first_of_last = next(e for e in segments if e.key == last_key)
            age = segment_merge_age_ms(merge_max_age_ms(cfg), last_key, roll_jitter_bound_ms(cfg))
            times.append(_add_ms(first_of_last.max_timestamp, age, 1))
        ahead = [t for t in times if t > now_ms]
        return min(ahead) if ahead else None

    def _cleanable(self, p: Partition, now: int) -> tuple[int, int] | None:
        cfg = p.config
        entries = p.index.entries
        return cleanable_range(
            entries,
            first_dirty=p.cleaner_state.get("first_dirty", 0),
            last_stable_offset=p.last_stable_offset,
            active_start=active_start(
                entries,
                cfg.segment_bytes,
                now_ms=now,
                merge_max_age_ms=merge_max_age_ms(cfg),
                jitter_bound_ms=roll_jitter_bound_ms(cfg),
            ),
            min_compaction_lag_ms=cfg.min_compaction_lag_ms,
            now_ms=now,
        )

    async def clean(self, p: Partition, *, now_ms: int | None = None) -> CleanPass:
        """One pass over `p`, if anything is cleanable."""
        outcome = CleanPass()
        if not p.config.compacted or p in self._uncleanable:
            return outcome
        broker = self._engine.broker_label
        started = time.monotonic()
        result = "failed"
        try:
            await self._pass(p, now_ms, outcome)
            result = (
                "raced"
                if outcome.raced
                else "partial"
                if outcome.map_full
                else "ok"
                if outcome.groups_cleaned
                else "idle"
            )
        except InvalidRecordBatch as exc:
            self._uncleanable.add(p)
            outcome.uncleanable = str(exc)
            result = "uncleanable"
            log.warning("%s: cannot be cleaned until it is reopened: %s", p.tp, exc)
        finally:
            metrics.CLEANER_PASSES.labels(broker, result).inc()
            metrics.CLEANER_PASS_SECONDS.labels(broker).observe(time.monotonic() - started)
            metrics.CLEANER_BYTES.labels(broker, "read").inc(outcome.bytes_read)
            metrics.CLEANER_BYTES.labels(broker, "written").inc(outcome.bytes_written)
            metrics.CLEANER_GROUPS_SKIPPED.labels(broker).inc(outcome.groups_skipped)
            s = outcome.stats
            for action, count in (
                ("kept", s.records_kept),
                ("superseded", s.superseded),
                ("tombstone_expired", s.tombstones_expired),
                ("aborted", s.aborted),
                ("keyless", s.keyless),
                ("marker_removed", s.markers_removed),
            ):
                metrics.CLEANER_RECORDS.labels(broker, action).inc(count)
        return outcome

    async def _pass(self, p: Partition, now_ms: int | None, outcome: CleanPass) -> None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        cfg = p.config
        entries = p.index.entries
        state = p.cleaner_state
        cleanable = self._cleanable(p, now)
        offset_map = OffsetMap(self.map_keys)
        if cleanable is not None:
            outcome.start, end = cleanable
            dirty = [
                e for e in entries if e.last_offset >= outcome.start and e.base_offset < end
            ]  # segments only: the range ends at or before the first WAL range
            tracker = TxnTracker(p.aborted_txns.overlapping_entries(outcome.start, end - 1))
            for key, first, stop in read_plan(dirty):
                data = await self._engine.store.get(key, first, stop)
                outcome.bytes_read += len(data)
                # record parsing runs in a worker thread: the event loop (Produce, Fetch) keeps
                # its turn every GIL switch interval instead of waiting for a whole segment
                if await asyncio.to_thread(
                    map_batches, data, offset_map, tracker, outcome.start, end
                ):
                    outcome.map_full = True
                    break
        horizon = state.get("horizon")
        if offset_map.latest_offset < max(outcome.start, 0):
            # nothing new mapped: a pass only for the clean head's tombstones and markers
            # whose delete horizon passed (KIP-534), with an empty map up to the first dirty
            # offset (the clean head holds one record per key already)
            first_dirty = state.get("first_dirty", 0)
            if horizon is None or now < horizon or first_dirty <= p.log_start_offset:
                return
            outcome.start = first_dirty
            offset_map.update_latest_offset(first_dirty - 1)
        outcome.end = offset_map.latest_offset + 1
        outcome.horizon = None
        last_batches = {
            pid: ProducerLastBatch(epoch, last_data)
            for pid, (epoch, last_data) in p.producer_last_batches().items()
        }
        for group in group_segments(entries, outcome.end, cfg.segment_bytes):
            if not await self._clean_group(p, group, offset_map, last_batches, now, outcome):
                outcome.raced = True
                break
        if not outcome.raced:
            progress = {"first_dirty": outcome.end}
            if outcome.horizon is not None:
                progress["horizon"] = outcome.horizon
            p.set_cleaner_state(progress)
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
        ahead = earliest_horizon(cleaned.batches, now)
        if ahead is not None:
            outcome.horizon = ahead if outcome.horizon is None else min(outcome.horizon, ahead)
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


def _add_ms(at: int, delay: int, extra: int = 0) -> int:
    """`at` + `delay` (+ `extra`) ms, capped (delays such as max.compaction.lag.ms go up to
    2^63 - 1)."""
    return min(at + delay + extra, 2**62)


def _add(total: CleanStats, more: CleanStats) -> None:
    for name in CleanStats.__slots__:
        setattr(total, name, getattr(total, name) + getattr(more, name))
