"""Consumer lag from committed offsets and partition ends (tidalmq_broker.consumer_lag)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import REGISTRY
from tidalmq_broker import consumer_lag
from tidalmq_broker.consumer_lag import HISTORY_POINTS, ConsumerLag, EndHistory
from tidalmq_broker.protocol.records import CONTROL_FLAG, build_batch, count_records
from tidalmq_broker.static_topics.service import LogicQueueLog, StaticTopicService
from tidalmq_core.metadata import ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.static_mapping import MappingItem, StaticTopicState, distribute


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


# ------------------------------------------------------------------ static topics' logic queues
def static_topic_metadata() -> ClusterMetadata:
    """Static topic `ledger` with three logic queues: 0 remapped (physical queue 0 on broker 0
    sealed at 40, then physical queue 3 on broker 1 from logic offset 40), 1 on physical queue 1
    (broker 0), 2 on physical queue 2 (broker 1, its floor at 9)."""
    queues = {
        0: [MappingItem(0, 0, 0, 0, 0, 40, time_of_end=1), MappingItem(3, 1, 1, 40, 0)],
        1: [MappingItem(1, 0, 0, 0, 0)],
        2: [MappingItem(2, 1, 0, 0, 0)],
    }
    state = StaticTopicState("ledger", 3, None)
    state.copies = distribute(queues, 3, 1, (0, 1))
    meta = ClusterMetadata("c", version=5, static_topics={"ledger": state})
    meta.topics["ledger"] = TopicInfo(
        "ledger", "view-id", [PartitionState(b, 1, [b]) for b in (1, 0, 1)], kind="static"
    )
    floors = {0: 40, 1: 2, 2: 9, 3: 6}
    meta.topics["__sq.ledger"] = TopicInfo(
        "__sq.ledger",
        "phys-id",
        [PartitionState(0 if q < 2 else 1, 0, [0], end_offset_floor=floors[q]) for q in range(4)],
        internal=True,
        kind="physical",
    )
    return meta


class OpenHere:
    """The high watermarks of the physical queues open on this broker (PartitionManager's)."""

    def __init__(self, hwms: dict[TopicPartition, int]) -> None:
        self.hwms = hwms
        self.asked: list[TopicPartition] = []

    def high_watermarks(
        self, wanted: object, only: list[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        self.asked += only
        return {tp: self.hwms.get(tp) for tp in only}


def test_logic_queue_ends_translate_the_leaders_physical_end() -> None:
    meta = static_topic_metadata()
    # broker 1 coordinates: physical queue 3 (logic queue 0's leader) is open here at 25
    here = OpenHere({TopicPartition("__sq.ledger", 3): 25})
    service = StaticTopicService(1, lambda: meta, here, None)  # type: ignore[arg-type]
    ends = service.lag_ends([("ledger", 0), ("ledger", 1), ("ledger", 2), ("orders", 0)])
    # 0: live 25 past logic offset 40; 1 and 2: led elsewhere, their floors; orders: not static
    assert ends == {("ledger", 0): 65, ("ledger", 1): 2, ("ledger", 2): 9}
    # the live end is what Fetch and ListOffsets answer on the logic queue
    items = service.view(meta, "ledger").items(0)
    plog = SimpleNamespace(high_watermark=25)
    log = LogicQueueLog(service, TopicPartition("ledger", 0), 1, items, plog, "phys-id")  # type: ignore[arg-type]
    assert log.high_watermark == ends[("ledger", 0)]
    # only the leader physical queues of the logic queues asked about are looked at
    assert sorted(tp.partition for tp in here.asked) == [1, 2, 3]


def test_a_remapped_logic_queue_led_elsewhere_ends_at_least_where_its_old_queue_ended() -> None:
    meta = static_topic_metadata()
    meta.topics["__sq.ledger"].partitions[3].end_offset_floor = 0  # the new queue's floor
    service = StaticTopicService(0, lambda: meta, OpenHere({}), None)  # type: ignore[arg-type]
    assert service.lag_ends([("ledger", 0)]) == {("ledger", 0): 40}
    meta.topics["__sq.ledger"].partitions[3].end_offset_floor = 6
    assert service.lag_ends([("ledger", 0)]) == {("ledger", 0): 46}
    # a sealed leader (a remap under way) ends where it was sealed, whatever its floor says
    queues = service.view(meta, "ledger").queues
    queues[1] = [MappingItem(1, 0, 0, 0, 0, 5, time_of_end=1)]
    meta.static_topics["ledger"].copies = distribute(queues, 3, 2, (0, 1))
    meta.version += 1
    assert service.lag_ends([("ledger", 1)]) == {("ledger", 1): 5}


def test_lag_of_a_static_topic_counts_committed_logic_offsets_against_logic_ends() -> None:
    meta = static_topic_metadata()
    service = StaticTopicService(1, lambda: meta, OpenHere({}), None)  # type: ignore[arg-type]
    committed = {"g": {("ledger", 0): 30, ("ledger", 1): 2, ("ledger", 2): 4}}
    lag = ConsumerLag(lambda: committed, service.lag_ends, clock=Clock())
    report = lag.report()
    assert report.topics[("g", "ledger")].records == (46 - 30) + 0 + (9 - 4)
