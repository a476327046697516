"""Consumer lag from committed offsets and partition ends (tidalmq_broker.consumer_lag)."""

from __future__ import annotations

from prometheus_client import REGISTRY
from tidalmq_broker import consumer_lag
from tidalmq_broker.consumer_lag import HISTORY_POINTS, ConsumerLag, EndHistory
from tidalmq_broker.protocol.records import CONTROL_FLAG, build_batch, count_records


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lag_of(
    committed: dict[str, dict[tuple[str, int], int]],
    ends: dict[tuple[str, int], int],
    clock: Clock,
    **kwargs: object,
) -> ConsumerLag:
    asked: list[set[tuple[str, int]]] = []

    def ends_of(wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        asked.append(set(wanted))
        return {tp: ends[tp] for tp in wanted if tp in ends}

    lag = ConsumerLag(lambda: committed, ends_of, clock=clock, **kwargs)  # type: ignore[arg-type]
    lag.asked = asked  # type: ignore[attr-defined]
    return lag


def test_lag_sums_per_group_and_topic_and_asks_only_committed_partitions() -> None:
    clock = Clock()
    committed = {
        "g1": {("orders", 0): 5, ("orders", 1): 10, ("audit", 0): 3},
        "g2": {("orders", 0): 0},
    }
    ends = {("orders", 0): 12, ("orders", 1): 10, ("audit", 0): 2, ("other", 0): 999}
    lag = lag_of(committed, ends, clock)
    report = lag.report()
    assert {k: v.records for k, v in report.topics.items()} == {
        ("g1", "orders"): 7,
        ("g1", "audit"): 0,  # committed past the (stale) end reads 0, never negative
        ("g2", "orders"): 12,
    }
    assert lag.asked == [{("orders", 0), ("orders", 1), ("audit", 0)}]  # type: ignore[attr-defined]
    assert report.partitions == []  # per-partition series are off by default


def test_lag_seconds_is_the_age_of_the_oldest_uncommitted_record() -> None:
    clock = Clock()
    committed = {"g": {("t", 0): 0, ("t", 1): 0}}
    ends = {("t", 0): 0, ("t", 1): 0}
    lag = lag_of(committed, ends, clock)
    assert lag.report().topics[("g", "t")].seconds == 0.0
    clock.now += 10
    ends[("t", 0)] = 10  # records 0..9 appended within these 10 s
    clock.now += 0
    report = lag.report()
    assert report.topics[("g", "t")].records == 10
    # record 0 appended in (1000, 1010]: interpolated at 1001, now 1010
    assert report.topics[("g", "t")].seconds == 9.0
    clock.now += 30
    ends[("t", 1)] = 4
    report = lag.report()
    assert report.topics[("g", "t")].seconds == 39.0  # the older of the two partitions
    committed["g"][("t", 0)] = 10  # caught up on partition 0
    report = lag.report()
    assert report.topics[("g", "t")].records == 4
    assert report.topics[("g", "t")].seconds == 30 * 3 / 4  # (1010, 1040]: record 0 at 1017.5
    committed["g"][("t", 1)] = 4
    assert lag.report().topics[("g", "t")].seconds == 0.0


def test_end_history_is_bounded_and_keeps_old_points_coarse() -> None:
    h = EndHistory()
    for i in range(1000):
        h.see(float(i), i * 10)
    assert len(h.points) <= HISTORY_POINTS
    assert h.points[0] == (0.0, 0) and h.points[-1] == (999.0, 9990)
    assert [e for _, e in h.points] == sorted(e for _, e in h.points)
    assert h.appended_at(9990) is None
    assert h.appended_at(9985) == 998.6  # 9980..9989 came in (998, 999]: spread evenly
    old = h.appended_at(15)
    assert old is not None and 0.0 < old < 50.0  # coarse, but in the right era
    h.see(1000.0, 5)  # the log was re-created: start over
    assert h.points == [(1000.0, 5)]


def test_per_partition_series_are_capped_and_the_rest_counted() -> None:
    clock = Clock()
    committed = {"g": {("t", p): 0 for p in range(5)}}
    ends = {("t", p): p for p in range(5)}
    lag = lag_of(committed, ends, clock, per_partition=True, max_partition_series=3)
    report = lag.report()
    assert len(report.partitions) == 3 and report.dropped == 2
    lag.report()
    assert lag.dropped_total == 4
    assert report.topics[("g", "t")].records == 10  # the sums count every partition


def test_the_collector_exports_watched_lags() -> None:
    clock = Clock()
    lag = lag_of({"exported": {("lagged", 0): 3}}, {("lagged", 0): 8}, clock, per_partition=True)
    consumer_lag.watch(lag)
    try:
        labels = {"group": "exported", "topic": "lagged"}
        assert REGISTRY.get_sample_value("tidalmq_consumer_group_lag_sum_records", labels) == 5
        assert (
            REGISTRY.get_sample_value(
                "tidalmq_consumer_group_lag_records", {**labels, "partition": "0"}
            )
            == 5
        )
        assert REGISTRY.get_sample_value("tidalmq_consumer_group_lag_seconds", labels) == 0.0
    finally:
        consumer_lag.unwatch(lag)
    assert REGISTRY.get_sample_value("tidalmq_consumer_group_lag_sum_records", labels) is None


def test_count_records_counts_data_batches_only() -> None:
    data = build_batch([(b"k", b"v")] * 3) + build_batch([(None, b"x")] * 2, base_offset=3)
    assert count_records(data) == 5
    assert count_records(data[:-1]) == 3  # a trailing partial batch is not counted
    assert count_records(b"") == 0
    marker = build_batch([(b"\x00\x00\x00\x01", b"m")], base_offset=5, attributes=CONTROL_FLAG)
    assert count_records(data + marker) == 5  # a transaction marker is no record for clients


def test_a_failing_lag_leaves_the_rest_of_the_scrape_alone() -> None:
    def broken() -> dict[str, dict[tuple[str, int], int]]:
        raise RuntimeError("shard gone")

    lag = ConsumerLag(broken, lambda wanted: {})
    consumer_lag.watch(lag)
    try:
        assert (
            REGISTRY.get_sample_value("tidalmq_consumer_group_lag_partition_series_dropped_total")
            == 0
        )
    finally:
        consumer_lag.unwatch(lag)
