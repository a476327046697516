"""Compaction planning: which WAL ranges of a partition go into which new segment.

A partition is compacted once it has `compaction_min_ranges` WAL ranges or
`compaction_min_bytes` in them, or its oldest WAL range has waited `idle_s` (so an idle
partition's last few ranges still leave the WAL and the WAL objects can be deleted). Each run of
consecutive WAL ranges is cut into segments of at most `segment_bytes`, and inside a segment the
index is coarsened into granules of about `granule_bytes` (fewer index entries in the checkpoint;
a read that lands inside a granule skips at most one granule's bytes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_broker.storage.index import IndexEntry

DEFAULT_GRANULE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    min_ranges: int
    min_bytes: int
    idle_s: float
    segment_bytes: int
    granule_bytes: int = DEFAULT_GRANULE_BYTES


def should_compact(
    entries: list[IndexEntry], oldest_wal_age_s: float, policy: CompactionPolicy
) -> bool:
    wal = [e for e in entries if e.in_wal]
    if not wal:
        return False
    return (
        len(wal) >= policy.min_ranges
        or sum(e.size for e in wal) >= policy.min_bytes
        or oldest_wal_age_s >= policy.idle_s
    )


def plan_segments(
    entries: list[IndexEntry],
    segment_bytes: int,
    *,
    now_ms: int = 0,
    merge_max_age_ms: int = -1,
    jitter_bound_ms: int = 0,
) -> list[list[IndexEntry]]:
    """Groups of consecutive entries, each group one new segment: every WAL entry, cut at
    `segment_bytes`. A segment smaller than half of `segment_bytes` directly before a WAL run
    is rewritten together with it, so a partition with little traffic does not collect one tiny
    segment per compaction (its object count and checkpoint stay bounded) - unless its oldest
    batch is older than `merge_max_age_ms` (>= 0) less the segment's `roll_jitter_ms`, so
    merging never keeps data from retention for long (the engine passes half of retention.ms),
    or it is larger than both an eighth of
    `segment_bytes` and the WAL run itself: a busy partition would otherwise rewrite its
    growing last segment on every pass (8 MB passes towards a 32 MB segment copy 80 MB and
    read most of it back from the store), while an idle one still ends with few segments."""
    plans: list[list[IndexEntry]] = []
    current: list[IndexEntry] = []
    size = 0
    segment: list[IndexEntry] = []  # the segment run just before, if any
    segment_size = 0
    run_after: list[int] = [0] * (len(entries) + 1)  # bytes of the WAL run starting at i
    for i in range(len(entries) - 1, -1, -1):
        run_after[i] = entries[i].size + run_after[i + 1] if entries[i].in_wal else 0
    for i, e in enumerate(entries):
        if not e.in_wal:
            if current:
                plans.append(current)
                current, size = [], 0
            if segment and segment[-1].key != e.key:
                segment, segment_size = [], 0
            segment.append(e)
            segment_size += e.size
            continue
        if (
            not current
            and segment
            and may_merge(
                segment, segment_size, segment_bytes, now_ms, merge_max_age_ms, jitter_bound_ms
            )
            and segment_size + e.size <= segment_bytes
            and segment_size <= max(run_after[i], segment_bytes // 8)
        ):
            current, size = list(segment), segment_size
        segment, segment_size = [], 0
        if current and size + e.size > segment_bytes:
            plans.append(current)
            current, size = [], 0
        current.append(e)
        size += e.size
    if current:
        plans.append(current)
    return plans


def merge_max_age_ms(config: PartitionConfig) -> int:
    """The age past which a segment is no longer merged with new WAL ranges (-1: no limit):
    `segment.ms` (Kafka rolls its active segment at that age), half of retention.ms under a
    `delete` policy, so merging never keeps data from retention for long, and for a compacted
    topic `max.compaction.lag.ms`, so no record stays out of the cleaner's reach for longer
    (Kafka rolls a compacted log's active segment at min(segment.ms, max.compaction.lag.ms))."""
    bounds = [config.segment_ms]
    if "delete" in config.cleanup_policy and config.retention_ms >= 0:
        bounds.append(config.retention_ms // 2)
    if config.compacted:
        bounds.append(config.max_compaction_lag_ms)
    return min(bounds)


def roll_jitter_bound_ms(config: PartitionConfig) -> int:
    """The bound of the jitter taken off a segment's merge age: Kafka's
    LogConfig.randomSegmentJitter draws it below min(segment.jitter.ms, segment.ms)."""
    return min(config.segment_jitter_ms, config.segment_ms)


def roll_jitter_ms(segment_key: str, jitter_bound_ms: int) -> int:
    """The jitter of one segment, in [0, jitter_bound_ms): Kafka's segment.jitter.ms, drawn
    per segment so the partitions of a topic do not all roll at once. Kafka draws it at
    random when it creates the segment and keeps it with the segment; here a roll is decided
    again by every WAL pass and log cleaner pass, on any broker, so the draw is a hash of the
    segment's object key: spread like a random draw over segments, the same for every pass
    (the WAL pass and the cleaner agree, a segment once rolled stays rolled)."""
    if jitter_bound_ms <= 0:
        return 0
    digest = hashlib.blake2b(segment_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter_bound_ms


def segment_merge_age_ms(merge_max_age_ms: int, segment_key: str, jitter_bound_ms: int) -> int:
    """The age past which this segment takes no more merges (its time-based roll, Kafka's
    `maxSegmentMs - rollJitterMs`): `merge_max_age_ms` less the segment's jitter, never below 0
    (-1: no limit, as given)."""
    if merge_max_age_ms < 0 or jitter_bound_ms <= 0:
        return merge_max_age_ms
    return max(0, merge_max_age_ms - roll_jitter_ms(segment_key, jitter_bound_ms))


def may_merge(
    segment: list[IndexEntry],
    segment_size: int,
    segment_bytes: int,
    now_ms: int,
    merge_max_age_ms: int,
    jitter_bound_ms: int = 0,
) -> bool:
    """Whether a segment directly before a WAL run is small and young enough for the next
    WAL pass to rewrite it together with that run (plan_segments' rule, which active_start
    shares so the log cleaner and the WAL pass never disagree about what is still active)."""
    if segment_size >= segment_bytes // 2:
        return False
    age = segment_merge_age_ms(merge_max_age_ms, segment[0].key, jitter_bound_ms)
    return age < 0 or segment[0].max_timestamp >= now_ms - age


def active_start(
    entries: list[IndexEntry],
    segment_bytes: int,
    *,
    now_ms: int,
    merge_max_age_ms: int,
    jitter_bound_ms: int = 0,
) -> int | None:
    """The first offset of a partition's active part, which the log cleaner never touches
    (Kafka's active segment): its first WAL range, or the segment just before it (the last
    segment if no range is in the WAL) while a WAL pass may still merge new ranges into it.
    None for an empty index."""
    if not entries:
        return None
    first_wal = next((i for i, e in enumerate(entries) if e.in_wal), len(entries))
    if first_wal == 0:
        return entries[0].base_offset
    start = first_wal - 1
    while start > 0 and entries[start - 1].key == entries[first_wal - 1].key:
        start -= 1
    segment = entries[start:first_wal]
    size = sum(e.size for e in segment)
    if may_merge(segment, size, segment_bytes, now_ms, merge_max_age_ms, jitter_bound_ms):
        return segment[0].base_offset
    if first_wal < len(entries):
        return entries[first_wal].base_offset
    return entries[-1].last_offset + 1


def segment_entries(key: str, sources: list[IndexEntry], granule_bytes: int) -> list[IndexEntry]:
    """The index entries of a segment made of `sources` laid out back to back."""
    out: list[IndexEntry] = []
    position = 0
    start = position
    first: IndexEntry | None = None
    last: IndexEntry | None = None
    max_ts = -1
    for e in sources:
        if first is not None and position - start + e.size > granule_bytes:
            # last is set whenever first is
            out.append(
                IndexEntry(
                    first.base_offset,
                    last.last_offset,  # type: ignore[union-attr]
                    key,
                    start,
                    position - start,
                    max_ts,
                )
            )
            first, start, max_ts = None, position, -1
        if first is None:
            first = e
        last = e
        max_ts = max(max_ts, e.max_timestamp)
        position += e.size
    if first is not None:
        out.append(
            IndexEntry(
                first.base_offset,
                last.last_offset,  # type: ignore[union-attr]  # set whenever first is
                key,
                start,
                position - start,
                max_ts,
            )
        )
    return out


def read_plan(sources: list[IndexEntry]) -> list[tuple[str, int, int]]:
    """Ranged GETs (key, start, end) that fetch `sources`, merging byte-adjacent ranges."""
    out: list[tuple[str, int, int]] = []
    for e in sources:
        if out and out[-1][0] == e.key and out[-1][2] == e.position:
            out[-1] = (e.key, out[-1][1], e.end_position)
        else:
            out.append((e.key, e.position, e.end_position))
    return out
