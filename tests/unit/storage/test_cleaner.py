"""The log cleaner's decisions (storage/cleaner.py), pass by pass, on logs written the way
producers write them (kafka-python's batch encoder; markers as the broker writes them), read
back with kafka-python's decoder. The cases follow the rules of Kafka's LogCleaner: latest value
per key, tombstones kept until their delete horizon, aborted data dropped, markers kept while
their data remains, active producers' last batches kept empty, offsets never renumbered."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from tidalmq_broker.protocol import records as rb
from tidalmq_broker.storage.aborted_txns import AbortedTxn, AbortedTxns
from tidalmq_broker.storage.cleaner import (
    CleanedGroup,
    CleanRound,
    OffsetMap,
    ProducerLastBatch,
    TxnTracker,
    clean_group,
    cleanable_range,
    cleaned_entries,
    group_segments,
    map_batches,
)
from tidalmq_broker.storage.compaction import active_start
from tidalmq_broker.storage.index import IndexEntry, OffsetIndex

T0 = 1_700_000_000_000
DAY = 86_400_000

Record = tuple[bytes | None, bytes | None]


@dataclass
class Log:
    """A partition's batches as producers and the transaction coordinator append them."""

    batches: list[bytes] = field(default_factory=list)
    next_offset: int = 0
    aborted: list[AbortedTxn] = field(default_factory=list)
    _txn_first: dict[int, int] = field(default_factory=dict)

    def data(
        self,
        records: list[Record],
        *,
        producer_id: int = -1,
        epoch: int = -1,
        sequence: int = -1,
        transactional: bool = False,
        codec: int = 0,
        ts: int = T0,
    ) -> int:
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=codec,
            is_transactional=transactional,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
            batch_size=1 << 20,
        )
        for i, (key, value) in enumerate(records):
            builder.append(i, timestamp=ts + i, key=key, value=value, headers=[])
        return self._append(bytearray(builder.build()), transactional, producer_id)

    def marker(self, kind: int, producer_id: int, epoch: int = 0) -> int:
        key = (0).to_bytes(2, "big") + kind.to_bytes(2, "big")
        batch = rb.build_batch(
            [(key, b"\0\0\0\0\0\x01")],
            timestamp_ms=T0,
            producer_id=producer_id,
            producer_epoch=epoch,
            attributes=rb.CONTROL_FLAG | rb.TRANSACTIONAL_FLAG,
        )
        offset = self._append(bytearray(batch), False, producer_id)
        first = self._txn_first.pop(producer_id, None)
        if kind == rb.CONTROL_ABORT and first is not None:
            self.aborted.append(AbortedTxn(offset, producer_id, first))
        return offset

    def _append(self, batch: bytearray, transactional: bool, producer_id: int) -> int:
        header = rb.read_header(batch)
        rb.patch_base_offset(batch, header, self.next_offset)
        if transactional:
            self._txn_first.setdefault(producer_id, self.next_offset)
        self.batches.append(bytes(batch))
        base = self.next_offset
        self.next_offset += header.last_offset_delta + 1
        return base

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1

    def buf(self) -> bytes:
        return b"".join(self.batches)


def clean(
    buf: bytes,
    aborted: list[AbortedTxn],
    *,
    now: int = T0,
    retention: int = DAY,
    active: dict[int, ProducerLastBatch] | None = None,
    capacity: int = 10_000,
    start: int = 0,
) -> tuple[CleanedGroup, OffsetMap, bool]:
    """One pass over a log that is one group: map the dirty part, then filter every batch."""
    offset_map = OffsetMap(capacity)
    full = map_batches(buf, offset_map, TxnTracker(aborted), start)
    last = list(rb.iter_headers(buf))[-1].last_offset
    rnd = CleanRound(offset_map, now, retention, active or {}, last)
    return clean_group(buf, TxnTracker(aborted), rnd), offset_map, full


def read(batches: list[bytes]) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of the data records, as a client decodes them."""
    out = []
    for data in batches:
        batch = DefaultRecordBatch(data)
        assert batch.validate_crc()
        if not batch.is_control_batch:
            out.extend((r.offset, r.key, r.value) for r in batch)
    return out


def headers(batches: list[bytes]) -> list[rb.BatchHeader]:
    return [rb.read_header(b) for b in batches]


def batch_at(batches: list[bytes], base_offset: int) -> rb.BatchHeader:
    return next(h for h in headers(batches) if h.base_offset == base_offset)


@pytest.mark.parametrize("codec", [0, 1, 4])
def test_many_updates_per_key_keep_the_latest_at_its_offset(codec: int) -> None:
    rng = random.Random(7)
    log = Log()
    latest: dict[bytes, tuple[int, bytes]] = {}
    for _ in range(40):
        records = [(b"key-%d" % rng.randrange(12), b"v%d" % rng.randrange(10**6)) for _ in range(5)]
        base = log.data(records, codec=codec)  # type: ignore[arg-type]
        for i, (key, value) in enumerate(records):
            latest[key] = (base + i, value)  # type: ignore[index,assignment]
    out, offset_map, full = clean(log.buf(), [])
    assert not full and offset_map.latest_offset == log.last_offset
    expected = sorted((offset, key, value) for key, (offset, value) in latest.items())
    kept = read(out.batches)
    assert kept == expected  # one record per key, the latest, at its original offset
    assert out.changed and out.stats.superseded == 200 - len(latest)
    codecs = {h.base_offset: h.compression for h in headers(log.batches)}
    assert codec == 0 or any(codecs.values())  # kafka-python compresses when it pays
    assert all(
        h.compression == codecs[h.base_offset] for h in headers(out.batches) if h.record_count
    )
    assert headers(out.batches)[-1].last_offset == log.last_offset  # the log's end survives
    again, _, _ = clean(b"".join(out.batches), [])
    assert not again.changed and again.batches == out.batches  # a clean log stays as it is


def test_wholly_superseded_batches_are_counted_as_those_parsed_whole() -> None:
    # the first batch is superseded record by record (it goes by its keys alone); the second
    # also holds a keyless record, so it is parsed whole; the last two are kept
    log = Log()
    log.data([(b"a", b"1"), (b"b", b"1"), (b"c", b"1")])
    log.data([(b"a", b"2"), (None, b"keyless"), (b"b", b"2")])
    log.data([(b"c", b"3"), (b"b", b"3")])
    log.data([(b"a", b"4"), (b"d", b"4")])
    out, _, _ = clean(log.buf(), [])
    assert read(out.batches) == [(6, b"c", b"3"), (7, b"b", b"3"), (8, b"a", b"4"), (9, b"d", b"4")]
    s = out.stats
    assert (s.records_read, s.records_kept, s.superseded, s.keyless) == (10, 4, 5, 1)
    assert s.batches_dropped == 2 and out.changed
    # the same superseded batch as the group's last stays as an empty header
    first = log.batches[0]
    rnd = CleanRound(OffsetMap(10), T0, DAY, {}, rb.read_header(first).last_offset)
    mapped = rnd.offset_map
    map_batches(log.buf(), mapped, TxnTracker([]), 0)
    alone = clean_group(first, TxnTracker([]), rnd)
    assert [(h.base_offset, h.last_offset, h.record_count) for h in headers(alone.batches)] == [
        (0, 2, 0)
    ]
    assert (alone.stats.records_read, alone.stats.superseded, alone.changed) == (3, 3, True)


def test_records_past_the_map_end_are_kept_and_a_full_map_ends_the_pass() -> None:
    log = Log()
    log.data([(b"a", b"1"), (b"b", b"1")])
    log.data([(b"c", b"1"), (b"d", b"1")])  # two new keys: past a map of 3
    log.data([(b"a", b"3"), (b"c", b"3")])
    out, offset_map, full = clean(log.buf(), [], capacity=3)
    assert full and offset_map.latest_offset == 1 and len(offset_map) == 2
    # a@0 and b@1 are the latest the map knows; everything after offset 1 stays for the next pass
    assert read(out.batches) == [
        (0, b"a", b"1"),
        (1, b"b", b"1"),
        (2, b"c", b"1"),
        (3, b"d", b"1"),
        (4, b"a", b"3"),
        (5, b"c", b"3"),
    ]
    assert not out.changed
    # the next pass maps from the first one's end (updates of known keys take no room) and
    # cleans from the log start: b@1 is below the map's range and unknown to it, so it stays
    out2, offset_map2, full2 = clean(b"".join(out.batches), [], capacity=3, start=2)
    assert not full2 and offset_map2.latest_offset == 5 and len(offset_map2) == 3
    assert read(out2.batches) == [
        (1, b"b", b"1"),
        (3, b"d", b"1"),
        (4, b"a", b"3"),
        (5, b"c", b"3"),
    ]


def test_the_map_stops_at_the_first_uncleanable_offset() -> None:
    log = Log()
    log.data([(b"a", b"1")])
    log.data([(b"a", b"2")], producer_id=3, epoch=0, sequence=0, transactional=True)  # open
    offset_map = OffsetMap(100)
    assert not map_batches(log.buf(), offset_map, TxnTracker([]), 0, end=1)
    assert offset_map.latest_offset == 0 and offset_map.get(b"a") == 0


def test_an_empty_map_takes_a_batch_larger_than_its_capacity() -> None:
    log = Log()
    log.data([(b"k%d" % i, b"v") for i in range(5)])
    log.data([(b"k0", b"w")])
    out, offset_map, full = clean(log.buf(), [], capacity=2)
    assert full and offset_map.latest_offset == 4 and len(offset_map) == 5
    assert read(out.batches)[-1] == (5, b"k0", b"w")


def test_tombstones_stay_until_their_horizon_then_go() -> None:
    log = Log()
    log.data([(b"a", b"1"), (b"b", b"1")])
    log.data([(b"a", None)])  # delete a
    log.data([(b"c", b"1")])
    first, _, _ = clean(log.buf(), [], now=T0, retention=DAY)
    assert read(first.batches) == [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1")]
    tomb = batch_at(first.batches, 2)
    assert tomb.delete_horizon_ms == T0 + DAY  # set once, on the first pass that kept it
    assert all(h.delete_horizon_ms is None for h in headers(first.batches) if h.base_offset != 2)

    before, _, _ = clean(b"".join(first.batches), [], now=T0 + DAY - 1)
    assert not before.changed  # horizon not reached: kept, and the horizon does not move
    after, _, _ = clean(b"".join(first.batches), [], now=T0 + DAY)
    assert read(after.batches) == [(1, b"b", b"1"), (3, b"c", b"1")]
    assert after.stats.tombstones_expired == 1


def test_a_tombstone_as_the_last_batch_leaves_an_empty_header() -> None:
    log = Log()
    log.data([(b"a", b"1")])
    log.data([(b"a", None)])
    first, _, _ = clean(log.buf(), [], now=T0)
    after, _, _ = clean(b"".join(first.batches), [], now=T0 + 2 * DAY)
    assert read(after.batches) == []  # everything is gone...
    (last,) = headers(after.batches)  # ...but the group's last offset is still there
    assert (last.base_offset, last.last_offset, last.record_count) == (1, 1, 0)
    entries = cleaned_entries("seg", after.batches, 0, 1, 1 << 20)
    assert [(e.base_offset, e.last_offset) for e in entries] == [(0, 1)]


def test_keyless_records_are_dropped() -> None:
    log = Log()
    log.data([(None, b"x"), (b"a", b"1"), (None, b"y")])
    log.data([(b"b", b"1")])
    out, _, _ = clean(log.buf(), [])
    assert read(out.batches) == [(1, b"a", b"1"), (3, b"b", b"1")]
    assert out.stats.keyless == 2


def test_aborted_data_goes_and_its_marker_stays_until_no_data_is_left() -> None:
    log = Log()
    log.data([(b"a", b"committed")], producer_id=6, epoch=0, sequence=0, transactional=True)
    log.data([(b"a", b"aborted")], producer_id=5, epoch=0, sequence=0, transactional=True)
    log.data([(b"b", b"aborted")], producer_id=5, epoch=0, sequence=1, transactional=True)
    commit = log.marker(rb.CONTROL_COMMIT, 6)
    abort = log.marker(rb.CONTROL_ABORT, 5)
    log.data([(b"z", b"1")])
    (txn,) = log.aborted

    first, offset_map, _ = clean(log.buf(), log.aborted)
    # the aborted records never entered the map: a@0 is still the latest a
    assert offset_map.get(b"a") == 0 and offset_map.get(b"b") == -1
    assert read(first.batches) == [(0, b"a", b"committed"), (5, b"z", b"1")]
    assert first.stats.aborted == 2
    assert [h.base_offset for h in headers(first.batches) if h.is_control] == [commit, abort]
    assert first.kept_aborts == [txn] and first.emptied_aborts == []  # its data was there

    second, _, _ = clean(b"".join(first.batches), log.aborted, now=T0 + 10)
    # no data of the aborted transaction left: its marker gets a horizon, its index entry goes
    assert second.emptied_aborts == [txn] and second.kept_aborts == []
    marker = batch_at(second.batches, abort)
    assert marker.delete_horizon_ms == T0 + 10 + DAY
    # the commit marker's transaction still has data (a@0): it stays, with no horizon
    assert batch_at(second.batches, commit).delete_horizon_ms is None

    third, _, _ = clean(b"".join(second.batches), [], now=T0 + 10 + DAY)
    assert [h.base_offset for h in headers(third.batches) if h.is_control] == [commit]
    assert third.stats.markers_removed == 1


def test_a_commit_marker_with_no_data_left_goes_after_its_horizon() -> None:
    log = Log()
    log.data([(b"a", b"1")], producer_id=6, epoch=0, sequence=0, transactional=True)
    commit = log.marker(rb.CONTROL_COMMIT, 6)
    log.data([(b"a", b"2")])
    first, _, _ = clean(log.buf(), [])
    assert read(first.batches) == [(2, b"a", b"2")]
    # the data batch went in this pass, so the marker still counted as having data
    assert [h.delete_horizon_ms for h in headers(first.batches) if h.is_control] == [None]
    second, _, _ = clean(b"".join(first.batches), [], now=T0 + 5)
    assert [h.delete_horizon_ms for h in headers(second.batches) if h.is_control] == [T0 + 5 + DAY]
    third, _, _ = clean(b"".join(second.batches), [], now=T0 + 5 + DAY)
    assert all(h.base_offset != commit for h in headers(third.batches))


def test_the_last_batch_of_an_active_producer_stays_as_an_empty_header() -> None:
    log = Log()
    log.data([(b"a", b"1")], producer_id=7, epoch=2, sequence=0)
    last = log.data([(b"a", b"2"), (b"b", b"2")], producer_id=7, epoch=2, sequence=1)
    log.data([(b"a", b"3"), (b"b", b"3")])
    active = {7: ProducerLastBatch(epoch=2, last_data_offset=last + 1)}
    out, _, _ = clean(log.buf(), [], active=active)
    assert read(out.batches) == [(3, b"a", b"3"), (4, b"b", b"3")]
    empty = headers(out.batches)[0]
    assert (empty.base_offset, empty.last_offset, empty.record_count) == (1, 2, 0)
    assert (empty.producer_id, empty.producer_epoch, empty.last_sequence) == (7, 2, 2)
    # a producer that expired keeps nothing
    gone, _, _ = clean(log.buf(), [])
    assert [h.base_offset for h in headers(gone.batches)] == [3]


def test_a_producer_with_no_data_left_keeps_its_marker_at_its_epoch() -> None:
    log = Log()
    log.data([(b"a", b"1")], producer_id=8, epoch=1, sequence=0, transactional=True)
    marker = log.marker(rb.CONTROL_COMMIT, 8, epoch=1)
    log.data([(b"a", b"2")])
    active = {8: ProducerLastBatch(epoch=1, last_data_offset=None)}
    first, _, _ = clean(log.buf(), [], active=active)
    second, _, _ = clean(b"".join(first.batches), [], active=active, now=T0 + 2 * DAY)
    third, _, _ = clean(b"".join(second.batches), [], active=active, now=T0 + 4 * DAY)
    kept = [h for h in headers(third.batches) if h.is_control]
    assert [(h.base_offset, h.record_count) for h in kept] == [(marker, 0)]  # emptied, kept


def test_cleanable_range_bounds() -> None:
    seg = [
        IndexEntry(0, 9, "s0", 0, 100, T0),
        IndexEntry(10, 19, "s1", 0, 100, T0 + 1000),
        IndexEntry(20, 29, "s2", 0, 100, T0 + 2000),
        IndexEntry(30, 39, "wal/1/1/5", 0, 100, T0 + 3000),
    ]
    common = {"last_stable_offset": 40, "active_start": 30, "now_ms": T0 + 5000}
    assert cleanable_range(seg, first_dirty=0, min_compaction_lag_ms=0, **common) == (0, 30)  # type: ignore[arg-type]
    # the last stable offset bounds it (an open transaction at 15)
    assert cleanable_range(
        seg, first_dirty=0, min_compaction_lag_ms=0, **{**common, "last_stable_offset": 15}
    ) == (0, 15)  # type: ignore[arg-type]
    # min.compaction.lag.ms: s1's newest record is 4000 ms old, s2's 3000 ms
    assert cleanable_range(seg, first_dirty=0, min_compaction_lag_ms=3500, **common) == (0, 20)  # type: ignore[arg-type]
    assert cleanable_range(seg, first_dirty=0, min_compaction_lag_ms=4500, **common) == (0, 10)  # type: ignore[arg-type]
    assert cleanable_range(seg, first_dirty=10, min_compaction_lag_ms=4500, **common) is None  # type: ignore[arg-type]
    # a first dirty offset below the log start (retention moved it) is raised to it
    assert cleanable_range(seg[1:], first_dirty=0, min_compaction_lag_ms=0, **common) == (10, 30)  # type: ignore[arg-type]
    assert cleanable_range(seg, first_dirty=30, min_compaction_lag_ms=0, **common) is None  # type: ignore[arg-type]
    assert cleanable_range([], first_dirty=0, min_compaction_lag_ms=0, **common) is None  # type: ignore[arg-type]


def test_active_start_is_the_wal_or_a_segment_the_wal_pass_may_still_grow() -> None:
    old = [IndexEntry(0, 9, "s0", 0, 600, T0), IndexEntry(10, 19, "s0", 600, 600, T0 + 10)]
    wal = [IndexEntry(20, 29, "wal/1/1/1", 0, 50, T0 + 20)]
    kw = {"now_ms": T0 + 100, "merge_max_age_ms": 1000}
    assert active_start(old + wal, 1000, **kw) == 20  # s0 is 1200 bytes: no merge
    assert active_start(old + wal, 4000, **kw) == 0  # s0 is small and young: still active
    assert active_start(old + wal, 4000, now_ms=T0 + 5000, merge_max_age_ms=1000) == 20
    assert active_start(old, 1000, **kw) == 20  # no WAL, a full segment: all cleanable
    assert active_start(old, 4000, **kw) == 0
    assert active_start(wal, 4000, **kw) == 20
    assert active_start([], 4000, **kw) is None


def test_groups_are_whole_segments_within_segment_bytes_up_to_the_map_end() -> None:
    entries = [
        IndexEntry(0, 4, "s0", 0, 300, T0),
        IndexEntry(5, 9, "s0", 300, 300, T0),
        IndexEntry(10, 19, "s1", 0, 300, T0),
        IndexEntry(20, 29, "s2", 0, 900, T0),
        IndexEntry(30, 39, "s3", 0, 100, T0),
        IndexEntry(40, 49, "wal/1/1/1", 0, 100, T0),
    ]
    groups = group_segments(entries, 50, 1000)
    assert [[e.key for e in g] for g in groups] == [["s0", "s0", "s1"], ["s2", "s3"]]
    assert [[e.key for e in g] for g in group_segments(entries, 25, 1000)] == [
        ["s0", "s0", "s1"],
        ["s2"],
    ]
    assert [[e.key for e in g] for g in group_segments(entries, 50, 500)] == [
        ["s0", "s0"],
        ["s1"],
        ["s2"],
        ["s3"],
    ]


def test_cleaned_entries_tile_the_group_over_the_gaps() -> None:
    log = Log()
    for i in range(6):
        log.data([(b"k%d" % (i % 3), b"x" * 200)], ts=T0 + 100 * i)
    out, _, _ = clean(log.buf(), [])
    assert [h.base_offset for h in headers(out.batches)] == [3, 4, 5]
    entries = cleaned_entries("s", out.batches, 0, 5, granule_bytes=600)
    assert [(e.base_offset, e.last_offset) for e in entries] == [(0, 4), (5, 5)]
    assert [e.max_timestamp for e in entries] == [T0 + 400, T0 + 500]  # of what was kept
    assert sum(e.size for e in entries) == out.size and entries[1].position == entries[0].size
    old = [IndexEntry(0, 5, "old", 0, len(log.buf()), T0 + 500)]
    index = OffsetIndex(old)
    assert index.replace(old, entries)  # the same offsets: the swap is accepted
    assert index.find(1) == 0 and index.find(5) == 1  # an offset in a gap finds its entry
    with pytest.raises(ValueError, match="last offset"):
        cleaned_entries("s", out.batches[:-1], 0, 5, granule_bytes=600)


def test_aborted_txns_entries_are_removed_when_their_marker_has_no_data() -> None:
    txns = AbortedTxns()
    txns.add(5, 10, 20)
    txns.add(6, 12, 30)
    txns.add(7, 40, 50)
    assert txns.overlapping_entries(25, 45) == [AbortedTxn(30, 6, 12), AbortedTxn(50, 7, 40)]
    assert txns.remove([AbortedTxn(30, 6, 12), AbortedTxn(99, 1, 1)]) == 1
    assert txns.overlapping(0, 100) == [(5, 10), (7, 40)]
