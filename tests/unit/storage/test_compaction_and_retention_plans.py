from __future__ import annotations

from tidalmq_broker.partitions import partition_config
from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_broker.storage.compaction import (
    CompactionPolicy,
    active_start,
    plan_segments,
    read_plan,
    roll_jitter_bound_ms,
    roll_jitter_ms,
    segment_entries,
    should_compact,
)
from tidalmq_broker.storage.index import IndexEntry
from tidalmq_broker.storage.retention import retention_log_start, segments_in_order
from tidalmq_core.metadata import TopicInfo


def wal(base: int, last: int, seq: int, pos: int = 10, size: int = 100, ts: int = 0) -> IndexEntry:
    return IndexEntry(base, last, f"wal/1/inc/{seq:012d}", pos, size, ts)


def seg(base: int, last: int, key: str, pos: int, size: int, ts: int) -> IndexEntry:
    return IndexEntry(base, last, f"partitions/t/id/0/segments/{key}", pos, size, ts)


POLICY = CompactionPolicy(
    min_ranges=4, min_bytes=1000, idle_s=60, segment_bytes=250, granule_bytes=150
)


def test_should_compact_by_count_bytes_or_age() -> None:
    few = [wal(i, i, i) for i in range(3)]
    assert not should_compact(few, 0, POLICY)
    assert should_compact([*few, wal(3, 3, 3)], 0, POLICY)
    assert should_compact([wal(0, 0, 0, size=1000)], 0, POLICY)
    assert should_compact(few, 61, POLICY)
    assert not should_compact([seg(0, 0, "a", 0, 10, 0)], 999, POLICY)


def test_plan_cuts_runs_into_segments_of_bounded_size() -> None:
    entries = [seg(0, 9, "a", 0, 130, 0), *[wal(10 + i, 10 + i, i) for i in range(5)]]
    plans = plan_segments(entries, 250)
    assert [[e.base_offset for e in p] for p in plans] == [[10, 11], [12, 13], [14]]


def test_plan_rewrites_a_small_last_segment_with_the_wal_run_after_it() -> None:
    entries = [
        seg(0, 4, "big", 0, 200, 0),
        seg(5, 6, "small", 0, 50, 0),
        seg(7, 9, "small", 50, 50, 0),
        *[wal(10 + i, 10 + i, i) for i in range(3)],
    ]
    plans = plan_segments(entries, 250)
    assert [[e.base_offset for e in p] for p in plans] == [[5, 7, 10], [11, 12]]


def test_segment_entries_are_granules_laid_back_to_back() -> None:
    sources = [wal(i, i, i, ts=i * 10) for i in range(5)]
    out = segment_entries("partitions/t/id/0/segments/x", sources, 250)
    assert [(e.base_offset, e.last_offset, e.position, e.size, e.max_timestamp) for e in out] == [
        (0, 1, 0, 200, 10),
        (2, 3, 200, 200, 30),
        (4, 4, 400, 100, 40),
    ]


def test_read_plan_merges_adjacent_ranges_of_one_object() -> None:
    a = IndexEntry(0, 0, "wal/1/i/000000000001", 10, 5, 0)
    b = IndexEntry(1, 1, "wal/1/i/000000000001", 15, 5, 0)
    c = IndexEntry(2, 2, "wal/1/i/000000000002", 10, 5, 0)
    assert read_plan([a, b, c]) == [
        ("wal/1/i/000000000001", 10, 20),
        ("wal/1/i/000000000002", 10, 15),
    ]


def test_retention_by_time_drops_leading_expired_segments_only() -> None:
    entries = [
        seg(0, 4, "a", 0, 100, ts=100),
        seg(5, 9, "a", 100, 100, ts=150),
        seg(10, 14, "b", 0, 100, ts=900),
        seg(15, 19, "c", 0, 100, ts=100),  # old, but behind a young segment: kept
        wal(20, 24, 1, ts=0),
    ]
    assert [len(s) for s in segments_in_order(entries)] == [2, 1, 1]
    assert retention_log_start(entries, now_ms=1000, retention_ms=500, retention_bytes=-1) == 10
    assert retention_log_start(entries, now_ms=1000, retention_ms=-1, retention_bytes=-1) is None


def test_retention_by_bytes_keeps_at_least_the_limit() -> None:
    entries = [seg(i * 10, i * 10 + 9, f"s{i}", 0, 100, ts=10**12) for i in range(5)]
    assert retention_log_start(entries, now_ms=0, retention_ms=-1, retention_bytes=250) == 20
    assert retention_log_start(entries, now_ms=0, retention_ms=-1, retention_bytes=500) is None


def test_plan_does_not_merge_a_segment_whose_data_retention_will_soon_want() -> None:
    entries = [seg(0, 4, "small", 0, 50, ts=1000), wal(5, 5, 1, ts=9000)]
    assert len(plan_segments(entries, 250, now_ms=9000, merge_max_age_ms=10_000)[0]) == 2
    assert len(plan_segments(entries, 250, now_ms=9000, merge_max_age_ms=5_000)[0]) == 1


def test_plan_does_not_rewrite_a_last_segment_larger_than_the_new_run() -> None:
    small = [seg(0, 4, "s", 0, 100, 0), *[wal(5 + i, 5 + i, i, size=40) for i in range(2)]]
    assert [[e.base_offset for e in p] for p in plan_segments(small, 250)] == [[5, 6]]
    even = [seg(0, 4, "s", 0, 80, 0), *[wal(5 + i, 5 + i, i, size=40) for i in range(2)]]
    assert [[e.base_offset for e in p] for p in plan_segments(even, 250)] == [[0, 5, 6]]
    # below an eighth of segment_bytes a segment is always merged (idle partitions stay few)
    tiny = [seg(0, 4, "s", 0, 30, 0), wal(5, 5, 1, size=10)]
    assert [[e.base_offset for e in p] for p in plan_segments(tiny, 250)] == [[0, 5]]


def test_segment_jitter_rolls_each_segment_earlier_by_its_own_amount() -> None:
    """segment.jitter.ms as Kafka applies it (LogSegment.shouldRoll: rolled once older than
    maxSegmentMs - rollJitterMs, the jitter drawn per segment below min(segment.jitter.ms,
    segment.ms)): a segment stops taking merges that much earlier, never later."""
    age, bound = 10_000, 4_000
    topic = TopicInfo("t", "id", [], {"segment.ms": str(age), "segment.jitter.ms": " 4000 "})
    assert roll_jitter_bound_ms(partition_config(topic)) == bound
    assert roll_jitter_bound_ms(PartitionConfig(segment_ms=age, segment_jitter_ms=bound)) == bound
    assert roll_jitter_bound_ms(PartitionConfig(segment_ms=age, segment_jitter_ms=10**9)) == age
    jitters = {roll_jitter_ms(f"partitions/t/id/{p}/segments/s", bound) for p in range(200)}
    assert all(0 <= j < bound for j in jitters)
    assert len(jitters) > 150  # drawn per segment: partitions do not all roll at once
    assert roll_jitter_ms("partitions/t/id/0/segments/s", 0) == 0  # Kafka's default: none
    for p in range(20):
        key = f"p{p}"
        jitter = roll_jitter_ms(f"partitions/t/id/0/segments/{key}", bound)
        assert jitter == roll_jitter_ms(f"partitions/t/id/0/segments/{key}", bound)  # stable
        entries = [seg(0, 4, key, 0, 50, ts=0), wal(5, 5, 1, ts=age)]

        def merged(now: int, jitter_bound: int = bound, e: list[IndexEntry] = entries) -> bool:
            plan = plan_segments(
                e, 250, now_ms=now, merge_max_age_ms=age, jitter_bound_ms=jitter_bound
            )
            # the log cleaner's view of what is still active agrees with the WAL pass
            still_active = active_start(
                e, 250, now_ms=now, merge_max_age_ms=age, jitter_bound_ms=jitter_bound
            )
            assert (still_active == 0) == (len(plan[0]) == 2)
            return len(plan[0]) == 2

        assert merged(age - jitter)  # still merged at exactly its rolling age
        assert not merged(age - jitter + 1)  # rolled: earlier than segment.ms by its jitter
        assert not merged(age + 1)  # never later than segment.ms
        assert merged(age, jitter_bound=0)  # without jitter: at segment.ms, as before
        assert not merged(age + 1, jitter_bound=0)
