"""Which compacted partitions a cleaner round picks (storage/cleaner.py's `assess`, Kafka's
cleaner manager): the dirty ratio against min.cleanable.dirty.ratio, max.compaction.lag.ms and
due delete horizons; the merge age that bounds a compacted log's active part; the cleaner's
progress in the partition checkpoint."""

from __future__ import annotations

from tidalmq_broker.protocol import records as rb
from tidalmq_broker.storage.api import PartitionConfig
from tidalmq_broker.storage.checkpoint import Checkpoint
from tidalmq_broker.storage.cleaner import Cleanability, assess, earliest_horizon
from tidalmq_broker.storage.compaction import merge_max_age_ms
from tidalmq_broker.storage.index import IndexEntry

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
    ranked = sorted([_assess((0, 20), first_dirty=0), late, _assess((10, 20))],
                    key=lambda c: c.priority)  # fmt: skip
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
    soon = rb.rebuild_batch(header, list(rb.iter_record_slices(tomb, header)),
                            delete_horizon_ms=T0 + 10)  # fmt: skip
    later = rb.rebuild_batch(header, list(rb.iter_record_slices(tomb, header)),
                             delete_horizon_ms=T0 + 20)  # fmt: skip
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
    assert merge_max_age_ms(
        PartitionConfig(cleanup_policy=compact, max_compaction_lag_ms=60_000)
    ) == 60_000  # fmt: skip
    both = frozenset({"compact", "delete"})
    assert merge_max_age_ms(PartitionConfig(cleanup_policy=both, retention_ms=1000)) == 500


def test_the_cleaners_progress_rides_in_the_checkpoint() -> None:
    cp = Checkpoint("t", "id", 0, 1, "1", "inc", -1)
    assert b'"cleaner"' not in cp.encode()  # never cleaned: the checkpoint is as before
    cp.cleaner = {"first_dirty": 120, "horizon": T0}
    assert Checkpoint.decode(cp.encode()).cleaner == {"first_dirty": 120, "horizon": T0}
