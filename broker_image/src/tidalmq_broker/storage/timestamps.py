"""ListOffsets by timestamp inside stored batches: Kafka's answer is the first record (at or
after the log start) whose timestamp is at least the target, with that record's timestamp; for
the max-timestamp query (-3, ListOffsets v7) it is the first record with the log's greatest
timestamp. Only a batch whose max timestamp can be the answer is looked into, and its records
are only walked (decompressed if they must be), never re-encoded."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from tidalmq_broker.protocol import records
from tidalmq_broker.storage.api import TimestampLookup
from tidalmq_broker.storage.index import IndexEntry

log = logging.getLogger(__name__)


def first_record_at(
    data: bytes | memoryview, timestamp_ms: int, log_start: int, where: object
) -> TimestampLookup | None:
    """The first record of the whole batches in `data` at or after `log_start` with a
    timestamp >= `timestamp_ms`; None if they hold none. `where` names the log in warnings."""
    for h in records.iter_headers(data):
        if h.max_timestamp < timestamp_ms or h.last_offset < log_start:
            continue
        try:
            for offset, timestamp in records.iter_record_timestamps(data, h):
                if offset >= log_start and timestamp >= timestamp_ms:
                    return TimestampLookup(offset, timestamp)
        except records.InvalidRecordBatch as exc:
            return _whole_batch(h, log_start, where, exc)
    return None


async def max_timestamp_record(
    entries: Sequence[IndexEntry],
    log_start: int,
    read: Callable[[IndexEntry], Awaitable[bytes | memoryview]],
    where: object,
) -> TimestampLookup | None:
    """The first record at or after `log_start` with the greatest timestamp of the indexed
    `entries` (Kafka's MAX_TIMESTAMP answer), or None if they hold no record from there on.
    Entries are read greatest max timestamp first, and only while one could still hold the
    answer: normally just one (more only when records before `log_start` or equal maxima
    make it necessary)."""
    live = [e for e in entries if e.last_offset >= log_start]
    best: TimestampLookup | None = None
    for entry in sorted(live, key=lambda e: -e.max_timestamp):  # stable: offset order on ties
        if best is not None and entry.max_timestamp < best.timestamp:
            break
        best = first_of_greatest(best, _max_record(await read(entry), log_start, where))
    return best


def first_of_greatest(
    a: TimestampLookup | None, b: TimestampLookup | None
) -> TimestampLookup | None:
    """Of two MAX_TIMESTAMP candidates, the one Kafka answers: the greater timestamp, or on a
    tie the earlier offset (the first occurrence in the log)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b, key=lambda x: (-x.timestamp, x.offset))


def _max_record(data: bytes | memoryview, log_start: int, where: object) -> TimestampLookup | None:
    best: TimestampLookup | None = None
    for h in records.iter_headers(data):
        if h.last_offset < log_start or (best is not None and h.max_timestamp <= best.timestamp):
            continue
        try:
            for offset, timestamp in records.iter_record_timestamps(data, h):
                if offset >= log_start and (best is None or timestamp > best.timestamp):
                    best = TimestampLookup(offset, timestamp)
        except records.InvalidRecordBatch as exc:
            best = _whole_batch(h, log_start, where, exc)
    return best


def _whole_batch(
    h: records.BatchHeader, log_start: int, where: object, exc: records.InvalidRecordBatch
) -> TimestampLookup:
    """The answer for a batch whose records cannot be read: the batch itself (its first offset
    at or after the log start, its max timestamp), with a warning."""
    log.warning(
        "%s: cannot read the records of the batch at %d (%s); answering with the batch",
        where,
        h.base_offset,
        exc,
    )
    return TimestampLookup(max(h.base_offset, log_start), h.max_timestamp)
