"""The log cleaner of compacted topics (`cleanup.policy=compact`): its pure part.

What a cleaning pass keeps, as Kafka's log cleaner decides it (LogCleaner.scala, KIP-58,
KIP-354, KIP-534; docs/compaction.md sections 1 and 3), on the byte ranges of a partition's
segment objects. No I/O here: the engine reads segments, calls these, writes and commits.

1. `cleanable_range`: [first dirty, first uncleanable). Never the active part
   (`compaction.active_start`), nothing at or past the last stable offset, nothing younger
   than `min.compaction.lag.ms`.
2. `map_batches` over the dirty range: key -> latest offset in a bounded `OffsetMap`,
   skipping control batches and aborted transactions' batches (`TxnTracker`). A full map ends
   the pass early at the last batch it mapped whole; the next pass goes on from there.
3. `group_segments`: the segments from the log start to the map's end, in groups of at most
   `segment.bytes` of input; each group becomes one new segment.
4. `clean_group` (`filter_batch` per batch): a record stays if it is past the map's end, or
   the latest for its key and either has a value or is a tombstone inside its batch's delete
   horizon. Keyless records go. Aborted data goes. Markers go once their transaction has no
   data left and their horizon passed. A batch that loses every record is dropped, except
   the last batch of an active producer and the group's last batch, kept as an empty header
   (so sequences and the group's offset range survive). Offsets never change: the log gets
   gaps. A batch that changes nothing is copied byte for byte.
5. `cleaned_entries`: the index entries of the new segment, tiling the same offsets as the
   group they replace (a dropped prefix or gap is covered by the next kept batch's entry).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidalmq_broker.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchHeader,
    RecordSlice,
    control_type,
    empty_batch,
    iter_headers,
    iter_record_keys,
    iter_record_slices,
    read_header,
    rebuild_batch,
)
from tidalmq_broker.storage.aborted_txns import AbortedTxn
from tidalmq_broker.storage.index import IndexEntry

DIGEST_BYTES = 16  # Kafka keeps an MD5 of each key; we keep a 128-bit BLAKE2b


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=DIGEST_BYTES).digest()


class OffsetMap:
    """Key digest -> latest offset of that key in the dirty range (Kafka's SkimpyOffsetMap),
    holding at most `capacity` keys. `latest_offset` is the last offset of the last batch
    mapped whole: records past it are kept by the pass whatever their key."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an offset map holds at least one key, not {capacity}")
        self.capacity = capacity
        self.latest_offset = -1
        self._offsets: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def utilization(self) -> float:
        return len(self._offsets) / self.capacity

    def put_batch(self, records: list[tuple[bytes, int]]) -> bool:
        """Map the (key, offset) records of one batch, all or none: False if its new keys do
        not fit. An empty map takes any batch, so a pass always moves on."""
        digests = [(key_digest(key), offset) for key, offset in records]
        new = {digest for digest, _ in digests if digest not in self._offsets}
        if self._offsets and len(self._offsets) + len(new) > self.capacity:
            return False
        self._offsets.update(digests)
        return True

    def get(self, key: bytes) -> int:
        """The latest offset mapped for `key`, or -1."""
        return self._offsets.get(key_digest(key), -1)

    def update_latest_offset(self, offset: int) -> None:
        self.latest_offset = max(self.latest_offset, offset)


class TxnTracker:
    """Which batches belong to aborted transactions and which markers may go (a port of
    Kafka's CleanedTransactionMetadata), fed in offset order with the partition's aborted
    transactions that overlap the batches it will see."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = [(txn.first_offset, txn.last_offset, txn) for txn in aborted]
        heapq.heapify(self._pending)
        self._ongoing_aborted: dict[int, AbortedTxn] = {}
        self._aborted_with_data: set[int] = set()  # producer ids seen in an aborted txn
        self._ongoing_committed: set[int] = set()
        self.kept_aborts: list[AbortedTxn] = []  # markers kept: their data is still there
        self.emptied_aborts: list[AbortedTxn] = []  # markers with no data left

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0][0] <= offset:
            txn = heapq.heappop(self._pending)[2]
            self._ongoing_aborted.setdefault(txn.producer_id, txn)

    def on_data(self, header: BatchHeader) -> bool:
        """True if the data batch belongs to an aborted transaction (it may go)."""
        self._consume_up_to(header.last_offset)
        if not header.is_transactional:
            return False
        if header.producer_id in self._ongoing_aborted:
            self._aborted_with_data.add(header.producer_id)
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def on_control(self, header: BatchHeader, kind: int | None) -> bool:
        """True if the marker's transaction has no data left in what was read, so the marker
        may go once its delete horizon passed. An emptied control batch may always go."""
        self._consume_up_to(header.last_offset)
        if kind == CONTROL_ABORT:
            txn = self._ongoing_aborted.pop(header.producer_id, None)
            had_data = header.producer_id in self._aborted_with_data
            self._aborted_with_data.discard(header.producer_id)
            if txn is not None and had_data:
                self.kept_aborts.append(txn)
                return False
            if txn is not None:
                self.emptied_aborts.append(txn)
            return True
        if kind == CONTROL_COMMIT:
            had_data = header.producer_id in self._ongoing_committed
            self._ongoing_committed.discard(header.producer_id)
            return not had_data
        return header.record_count == 0


def map_batches(
    buf: bytes | bytearray | memoryview,
    offset_map: OffsetMap,
    tracker: TxnTracker,
    start: int,
    end: int | None = None,
) -> bool:
    """Map the keys of the batches in `buf` (consecutive batches of the dirty range) at or past
    `start` and wholly below `end` (the first uncleanable offset, a batch boundary). Returns
    True when the map is full: it then ends at the last batch mapped whole, and the caller
    stops reading."""
    for header in iter_headers(buf):
        if end is not None and header.last_offset >= end:
            return False
        if header.is_control:
            tracker.on_control(header, control_type(buf, header))
        elif not tracker.on_data(header):
            keyed = [
                (key, offset)
                for offset, key in iter_record_keys(buf, header)
                if key is not None and offset >= start
            ]
            if not offset_map.put_batch(keyed):
                return True
        if header.last_offset >= start:
            offset_map.update_latest_offset(header.last_offset)
    return False


@dataclass(frozen=True, slots=True)
class ProducerLastBatch:
    """What the cleaner must keep of a producer id that has not expired (Kafka's LastRecord):
    the batch holding its last data offset, or, if it has none, its marker at its epoch."""

    epoch: int
    last_data_offset: int | None


@dataclass(frozen=True, slots=True)
class CleanRound:
    offset_map: OffsetMap
    now_ms: int
    delete_retention_ms: int
    active_producers: Mapping[int, ProducerLastBatch]
    last_offset: int  # of the group: its batch stays, so the output covers the same offsets


@dataclass(slots=True)
class CleanStats:
    records_read: int = 0
    records_kept: int = 0
    superseded: int = 0
    tombstones_expired: int = 0
    aborted: int = 0
    keyless: int = 0
    markers_removed: int = 0
    batches_dropped: int = 0


@dataclass(slots=True)
class CleanedGroup:
    batches: list[bytes]
    changed: bool  # False: every batch is copied as it was, the group needs no rewrite
    kept_aborts: list[AbortedTxn]
    emptied_aborts: list[AbortedTxn]  # to remove from the partition's AbortedTxns
    stats: CleanStats = field(default_factory=CleanStats)

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.batches)


def clean_group(
    buf: bytes | bytearray | memoryview, tracker: TxnTracker, rnd: CleanRound
) -> CleanedGroup:
    """Filter the batches of one group (its segments' bytes back to back)."""
    stats = CleanStats()
    out: list[bytes] = []
    changed = False
    for header in iter_headers(buf):
        batch, batch_changed = filter_batch(buf, header, tracker, rnd, stats)
        changed = changed or batch_changed
        if batch is None:
            stats.batches_dropped += 1
        else:
            out.append(batch)
    return CleanedGroup(out, changed, tracker.kept_aborts, tracker.emptied_aborts, stats)


def filter_batch(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    tracker: TxnTracker,
    rnd: CleanRound,
    stats: CleanStats,
) -> tuple[bytes | None, bool]:
    """The batch as the cleaned segment holds it (None: dropped), and whether it changed."""
    original = bytes(memoryview(buf)[header.position : header.position + header.size])
    horizon = header.delete_horizon_ms
    if header.is_control:
        discardable = tracker.on_control(header, control_type(buf, header))
        drop_records = discardable and horizon is not None and horizon <= rnd.now_ms
    else:
        discardable = tracker.on_data(header)
        drop_records = discardable
        superseded = None if discardable else _superseded(buf, header, rnd.offset_map)
        if superseded is not None:  # the usual batch of a dirty log: no record to parse whole
            stats.records_read += superseded
            stats.superseded += superseded
            return _emptied(original, header, rnd)
    records = list(iter_record_slices(buf, header))
    stats.records_read += len(records)
    kept: list[RecordSlice] = []
    tombstones = False
    for record in records:
        if drop_records:
            if header.is_control:
                stats.markers_removed += 1
            else:
                stats.aborted += 1
        elif header.is_control or _retain(record, header, rnd, stats):
            kept.append(record)
            tombstones = tombstones or not record.has_value
    stats.records_kept += len(kept)
    set_horizon = horizon is None and (tombstones or (discardable and header.is_control))
    if kept:
        if len(kept) == len(records) and not set_horizon:
            return original, False
        if set_horizon:
            horizon = rnd.now_ms + rnd.delete_retention_ms
        return rebuild_batch(header, kept, delete_horizon_ms=horizon), True
    return _emptied(original, header, rnd)


def _superseded(
    buf: bytes | bytearray | memoryview, header: BatchHeader, offset_map: OffsetMap
) -> int | None:
    """How many records a data batch holds if a later record of the same key supersedes every
    one of them, else None. Reads only keys and offsets (`iter_record_keys`): most batches of
    a dirty log are wholly superseded, and parsing each of their records whole was half of a
    pass's time (docs/compaction.md, benchmark). The bounds of their values are then not
    checked: the records go."""
    if header.last_offset > offset_map.latest_offset:
        return None
    count = 0
    for offset, key in iter_record_keys(buf, header):
        if key is None or offset >= offset_map.get(key):
            return None
        count += 1
    return count


def _emptied(original: bytes, header: BatchHeader, rnd: CleanRound) -> tuple[bytes | None, bool]:
    """A batch that lost all its records: kept as an empty header if it must stay."""
    if _retain_empty(header, rnd):
        if header.record_count == 0:
            return original, False
        return empty_batch(header), True
    return None, True


def _retain(record: RecordSlice, header: BatchHeader, rnd: CleanRound, stats: CleanStats) -> bool:
    if record.offset > rnd.offset_map.latest_offset:
        return True
    if record.key is None:
        stats.keyless += 1
        return False
    if record.offset < rnd.offset_map.get(record.key):
        stats.superseded += 1
        return False
    if record.has_value:
        return True
    horizon = header.delete_horizon_ms
    if horizon is None or rnd.now_ms < horizon:
        return True
    stats.tombstones_expired += 1
    return False


def _retain_empty(header: BatchHeader, rnd: CleanRound) -> bool:
    if header.last_offset == rnd.last_offset:
        return True
    producer = rnd.active_producers.get(header.producer_id) if header.has_producer_id else None
    if producer is None:
        return False
    if producer.last_data_offset is not None:
        return header.last_offset == producer.last_data_offset
    return header.is_control and header.producer_epoch == producer.epoch


def cleanable_range(
    entries: list[IndexEntry],
    *,
    first_dirty: int,
    last_stable_offset: int,
    active_start: int | None,
    min_compaction_lag_ms: int,
    now_ms: int,
) -> tuple[int, int] | None:
    """[first dirty, first uncleanable) of a partition whose index is `entries`, or None when
    nothing is cleanable. The first dirty offset is raised to the log start; the first
    uncleanable one is the least of the last stable offset, the active part's start and the
    first dirty segment holding a record younger than `min.compaction.lag.ms`."""
    if not entries or active_start is None:
        return None
    start = max(first_dirty, entries[0].base_offset)
    end = min(last_stable_offset, active_start)
    if min_compaction_lag_ms > 0:
        for segment in _segments(entries):
            if segment[-1].last_offset < start:
                continue
            if max(e.max_timestamp for e in segment) > now_ms - min_compaction_lag_ms:
                end = min(end, segment[0].base_offset)
                break
    return (start, end) if start < end else None


def group_segments(
    entries: list[IndexEntry], end_offset: int, segment_bytes: int
) -> list[list[IndexEntry]]:
    """The segments from the log start to the one holding `end_offset - 1` (the map's end),
    in runs of consecutive segments whose input bytes stay within `segment_bytes` (Kafka's
    groupSegmentsBySize). A segment larger than that is a group of its own."""
    groups: list[list[IndexEntry]] = []
    size = 0
    for segment in _segments(entries):
        if segment[0].base_offset >= end_offset:
            break
        segment_size = sum(e.size for e in segment)
        if groups and size + segment_size <= segment_bytes:
            groups[-1].extend(segment)
            size += segment_size
        else:
            groups.append(list(segment))
            size = segment_size
    return groups


def _segments(entries: list[IndexEntry]) -> list[list[IndexEntry]]:
    """The index's segment objects in offset order, up to its first WAL range."""
    out: list[list[IndexEntry]] = []
    for e in entries:
        if e.in_wal:
            break
        if out and out[-1][-1].key == e.key:
            out[-1].append(e)
        else:
            out.append([e])
    return out


def cleaned_entries(
    key: str, batches: list[bytes], first_offset: int, last_offset: int, granule_bytes: int
) -> list[IndexEntry]:
    """The index entries of a cleaned segment made of `batches` back to back, covering
    [first_offset, last_offset] with no hole: each entry starts where the previous one ended,
    over any offsets the cleaner removed. Max timestamps are those of the batches kept."""
    out: list[IndexEntry] = []
    position = start = 0
    base = first_offset
    last: int | None = None
    max_ts = -1
    for data in batches:
        header = read_header(data)
        if last is not None and position - start + header.size > granule_bytes:
            out.append(IndexEntry(base, last, key, start, position - start, max_ts))
            base, start, last, max_ts = last + 1, position, None, -1
        last = header.last_offset
        max_ts = max(max_ts, header.max_timestamp)
        position += header.size
    if last is None or last != last_offset:
        raise ValueError(
            f"a cleaned group must end at its last offset {last_offset}, not {last} "
            "(its last batch is always kept)"
        )
    out.append(IndexEntry(base, last, key, start, position - start, max_ts))
    return out


@dataclass(frozen=True, slots=True)
class Cleanability:
    """How much a partition needs a pass (Kafka's LogToClean and the cleaner manager's
    choice): its cleanable ratio, and whether it is overdue whatever that ratio."""

    ratio: float  # cleanable dirty bytes / (clean bytes + cleanable dirty bytes)
    overdue: bool  # a record waited past max.compaction.lag.ms, or a delete horizon passed

    def chosen(self, min_ratio: float) -> bool:
        return self.overdue or self.ratio > min_ratio  # Kafka's strict comparison

    @property
    def priority(self) -> tuple[bool, float]:
        """Sort key, lowest first: overdue partitions, then the dirtiest."""
        return (not self.overdue, -self.ratio)


def assess(
    entries: list[IndexEntry],
    cleanable: tuple[int, int] | None,
    *,
    first_dirty: int,
    max_compaction_lag_ms: int,
    horizon_ms: int | None,
    now_ms: int,
) -> Cleanability:
    """The cleanability of a partition whose index is `entries` and whose cleanable range is
    `cleanable` (cleanable_range's answer). Only segments count: WAL ranges are never cleaned.
    Overdue by max.compaction.lag.ms when the first dirty segment entry's newest record is
    older than that (an upper bound of its first record's age: late by at most one index
    granule's time span)."""
    clean = dirty = 0
    start, end = cleanable if cleanable is not None else (first_dirty, first_dirty)
    first_dirty_ts: int | None = None
    for e in entries:
        if e.in_wal:
            break
        if e.last_offset < start:
            clean += e.size
        elif e.base_offset < end:
            dirty += e.size
            if first_dirty_ts is None:
                first_dirty_ts = e.max_timestamp
    ratio = dirty / (clean + dirty) if dirty else 0.0
    lagging = (
        dirty > 0
        and first_dirty_ts is not None
        and first_dirty_ts >= 0
        and now_ms - first_dirty_ts > max_compaction_lag_ms
    )
    horizon_due = horizon_ms is not None and now_ms >= horizon_ms and clean > 0
    return Cleanability(ratio, lagging or horizon_due)


def earliest_horizon(batches: list[bytes], now_ms: int) -> int | None:
    """The earliest delete horizon still ahead among cleaned batches (those holding a
    tombstone or a marker): when a pass over the clean head can next drop something."""
    ahead = [
        h.delete_horizon_ms
        for h in map(read_header, batches)
        if h.delete_horizon_ms is not None and h.delete_horizon_ms > now_ms
    ]
    return min(ahead, default=None)
