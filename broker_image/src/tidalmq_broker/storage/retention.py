"""Retention planning: which whole segments to drop from the head of a partition.

Only compacted segments are ever dropped (WAL ranges wait for compaction), always from the
oldest, and a segment goes only as a whole: by time when its newest batch is older than
retention.ms, by size while the partition minus that segment is still at least retention.bytes.
"""

from __future__ import annotations

from tidalmq_broker.storage.index import IndexEntry


def segments_in_order(entries: list[IndexEntry]) -> list[list[IndexEntry]]:
    """Leading segment objects, each as its run of index entries, oldest first."""
    out: list[list[IndexEntry]] = []
    for e in entries:
        if e.in_wal:
            break
        if out and out[-1][0].key == e.key:
            out[-1].append(e)
        else:
            out.append([e])
    return out


def retention_log_start(
    entries: list[IndexEntry],
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
) -> int | None:
    """The new log start offset after dropping expired segments, or None to keep all."""
    total = sum(e.size for e in entries)
    new_start: int | None = None
    for segment in segments_in_order(entries):
        size = sum(e.size for e in segment)
        max_ts = max(e.max_timestamp for e in segment)
        by_time = retention_ms >= 0 and max_ts < now_ms - retention_ms
        by_size = retention_bytes >= 0 and total - size >= retention_bytes
        if not (by_time or by_size):
            break
        total -= size
        new_start = segment[-1].last_offset + 1
    return new_start


def oldest_segment_expiry_ms(entries: list[IndexEntry], retention_ms: int) -> int | None:
    """When the oldest segment expires by time (the first millisecond its newest batch is older
    than retention.ms), or None: no segment, or no time limit. Retention drops segments from the
    oldest only, so nothing expires by time before this. O(the oldest segment's entries)."""
    if retention_ms < 0 or not entries or entries[0].in_wal:
        return None
    key = entries[0].key
    newest = -1
    for e in entries:
        if e.in_wal or e.key != key:
            break
        newest = max(newest, e.max_timestamp)
    return newest + retention_ms + 1
