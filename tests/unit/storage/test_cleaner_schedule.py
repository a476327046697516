"""Which compacted partitions a cleaner round picks (storage/cleaner.py's `assess`, Kafka's
cleaner manager): the dirty ratio against min.cleanable.dirty.ratio, max.compaction.lag.ms and
due delete horizons; the merge age that bounds a compacted log's active part; the cleaner's
progress in the partition checkpoint; when the cleaner looks at a partition again if nothing
changes in it (LogCleaner.next_due)."""

from __future__ import annotations

from typing import Any

from tidalmq_broker.protocol import records as rb
from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.cleaner import Cleanability, assess, earliest_horizon
from tidalmq_broker.storage.compaction import merge_max_age_ms, roll_jitter_ms
from tidalmq_broker.storage.index import IndexEntry, OffsetIndex
from tidalmq_broker.storage.log_cleaner import LogCleaner
from tidalmq_core.model import TopicPartition

T0 = 1_700_000_000_000
DAY = 86_400_000

# a cleaned head of 300 bytes, then 100 dirty bytes, then a segment still active, then the WAL
LOG = [
    IndexEntry(0, 9, "s0", 0, 300, T0),
    IndexEntry(10, 19, "s1", 0, 100, T0 + 1000),
    IndexEntry(20, 29, "s2", 0, 500, T0 + 2000),
    IndexEntry(30, 39, "wal/1/1/5", 0, 900, T0 + 3000),
]


def _assess(cleanable: tuple[int, int] | None, **kw: int | None) -> Cleanability:
    args: dict[str, int | None] = {
        "first_dirty": 10,
        "max_compaction_lag_ms": 2**63 - 1,
        "horizon_ms": None,
        "now_ms": T0 + 5000,
    }
    args.update(kw)
    return assess(LOG, cleanable, **args)  # type: ignore[arg-type]


def test_the_ratio_counts_cleanable_segment_bytes_only() -> None:
    c = _assess((10, 20))  # s2 is active and the WAL never counts
    assert c.ratio == 100 / 400 and not c.overdue
    assert not c.chosen(0.5) and c.chosen(0.2)
    assert c.chosen(0.0)
    # never cleaned: everything cleanable is dirty
    fresh = _assess((0, 20), first_dirty=0)
    assert fresh.ratio == 1.0 and fresh.chosen(0.5)
    assert not fresh.chosen(1.0)  # Kafka compares strictly: 1 never cleans by ratio


def test_nothing_cleanable_is_never_chosen_by_ratio() -> None:
    c = _assess(None)
    assert c.ratio == 0.0 and not c.overdue and not c.chosen(0.0)


def test_max_compaction_lag_makes_a_partition_overdue_whatever_its_ratio() -> None:
    # s1's records are at most 4000 ms old at T0 + 5000
    assert not _assess((10, 20), max_compaction_lag_ms=4000).overdue
    late = _assess((10, 20), max_compaction_lag_ms=3999)
    assert late.overdue and late.chosen(0.99)
    # overdue partitions go first, then the dirtiest
    ranked = sorted(
        [_assess((0, 20), first_dirty=0), late, _assess((10, 20))], key=lambda c: c.priority
    )
    assert ranked[0] is late and ranked[1].ratio == 1.0


def test_a_passed_delete_horizon_makes_a_clean_head_due() -> None:
    assert not _assess(None, horizon_ms=T0 + 5001).chosen(0.5)
    assert _assess(None, horizon_ms=T0 + 5000).chosen(0.5)
    # nothing clean yet: nothing a horizon could concern
    assert not _assess(None, first_dirty=0, horizon_ms=T0).overdue


def test_the_earliest_horizon_ahead_of_the_cleaned_batches() -> None:
    plain = rb.build_batch([(b"k", b"v")], timestamp_ms=T0)
    tomb = rb.build_batch([(b"k", None)], timestamp_ms=T0)
    header = rb.read_header(tomb)
    soon = rb.rebuild_batch(
        header, list(rb.iter_record_slices(tomb, header)), delete_horizon_ms=T0 + 10
    )
    later = rb.rebuild_batch(
        header, list(rb.iter_record_slices(tomb, header)), delete_horizon_ms=T0 + 20
    )
    assert earliest_horizon([plain, later, soon], T0) == T0 + 10
    assert earliest_horizon([plain, later, soon], T0 + 10) == T0 + 20  # passed ones do not count
    assert earliest_horizon([plain, tomb], T0) is None


def test_the_merge_age_bounds_a_compacted_logs_active_part() -> None:
    assert merge_max_age_ms(PartitionConfig()) == 7 * DAY // 2  # half of retention.ms
    assert merge_max_age_ms(PartitionConfig(retention_ms=-1)) == 7 * DAY  # segment.ms
    assert merge_max_age_ms(PartitionConfig(retention_ms=-1, segment_ms=1000)) == 1000
    compact = frozenset({"compact"})
    # no retention for compact alone: segment.ms, or max.compaction.lag.ms if lower
    assert merge_max_age_ms(PartitionConfig(cleanup_policy=compact, retention_ms=1000)) == 7 * DAY
    assert (
        merge_max_age_ms(PartitionConfig(cleanup_policy=compact, max_compaction_lag_ms=60_000))
        == 60_000
    )
    both = frozenset({"compact", "delete"})
    assert merge_max_age_ms(PartitionConfig(cleanup_policy=both, retention_ms=1000)) == 500


def test_the_cleaners_progress_rides_in_the_checkpoint() -> None:
    cp = Checkpoint("t", "id", 0, 1, "1", "inc", -1)
    assert b'"cleaner"' not in cp.encode()  # never cleaned: the checkpoint is as before
    cp.cleaner = {"first_dirty": 120, "horizon": T0}
    assert Checkpoint.decode(cp.encode()).cleaner == {"first_dirty": 120, "horizon": T0}


# LogCleaner.next_due: when the engine looks at a partition again if nothing changes in it


class _Partition:
    """What next_due reads of a partition (storage/partition.py's Partition)."""

    def __init__(self, config: PartitionConfig, entries: list[IndexEntry], **state: int) -> None:
        self.tp = TopicPartition("t", 0)
        self.config = config
        self.index = OffsetIndex(entries)
        self.cleaner_state = dict(state)
        self.log_start_offset = entries[0].base_offset if entries else 0
        self.last_stable_offset = entries[-1].last_offset + 1 if entries else 0


COMPACT = frozenset({"compact"})
MERGE_AGE = 7 * DAY  # segment.ms: a compact topic has no retention bound


def _next_due(now: int, entries: list[IndexEntry] = LOG, **kw: Any) -> int | None:
    state = {k: kw.pop(k) for k in ("first_dirty", "horizon") if k in kw}
    state.setdefault("first_dirty", 10)
    kw.setdefault("cleanup_policy", COMPACT)
    p = _Partition(PartitionConfig(**kw), entries, **state)
    return LogCleaner(None).next_due(p, now)  # type: ignore[arg-type]  # host unused here


def test_next_due_only_on_a_change_for_what_the_cleaner_never_takes() -> None:
    assert _next_due(T0, cleanup_policy=frozenset({"delete"})) is None
    assert _next_due(T0, entries=[]) is None
    assert _next_due(T0, entries=LOG[3:]) is None  # all in the WAL: nothing to clean yet


def test_next_due_is_now_when_a_pass_is_wanted() -> None:
    assert _next_due(T0 + 5000, min_cleanable_dirty_ratio=0.2) == T0 + 5000
    assert _next_due(T0 + 5000, first_dirty=0) == T0 + 5000  # never cleaned: all dirty


def test_next_due_when_the_last_segment_leaves_the_active_part() -> None:
    # s1 (100 dirty bytes of 400) is below the ratio; s2 becomes cleanable once the WAL pass
    # no longer merges into it (may_merge: still merged at exactly the merge age)
    due = _next_due(T0 + 5000)
    assert due == T0 + 2000 + MERGE_AGE + 1
    assert _next_due(due - 1) == due  # still active a millisecond before: the same time
    assert _next_due(due) == due  # then 600 dirty bytes of 900: a pass at once


def test_next_due_when_the_last_segment_rolls_earlier_by_its_jitter() -> None:
    # segment.jitter.ms: s2 leaves the active part its own jitter earlier (as may_merge says)
    jitter = roll_jitter_ms("s2", DAY)
    assert 0 < jitter < DAY
    due = _next_due(T0 + 5000, segment_jitter_ms=DAY)
    assert due == T0 + 2000 + MERGE_AGE - jitter + 1
    assert _next_due(due - 1, segment_jitter_ms=DAY) == due  # still active a ms before
    assert _next_due(due, segment_jitter_ms=DAY) == due  # then cleanable: a pass at once


def test_next_due_when_max_compaction_lag_makes_it_overdue() -> None:
    # s1's newest record is T0 + 1000: overdue once strictly older than the lag
    due = _next_due(T0 + 5000, max_compaction_lag_ms=60_000)
    assert due == T0 + 1000 + 60_000 + 1
    assert _next_due(due - 1, max_compaction_lag_ms=60_000) == due
    assert _next_due(due, max_compaction_lag_ms=60_000) == due


def test_next_due_at_a_kept_tombstones_delete_horizon() -> None:
    assert _next_due(T0 + 5000, horizon=T0 + 9000) == T0 + 9000
    assert _next_due(T0 + 9000, horizon=T0 + 9000) == T0 + 9000  # due: a pass now
    # a horizon later than the merge age is not the next time
    assert _next_due(T0 + 5000, horizon=T0 + 30 * DAY) == T0 + 2000 + MERGE_AGE + 1


def test_next_due_waits_out_min_compaction_lag() -> None:
    # everything dirty but too young: looked at again when the lag has passed from now
    young = _next_due(T0 + 5000, first_dirty=0, min_compaction_lag_ms=DAY)
    assert young == T0 + 5000 + DAY
