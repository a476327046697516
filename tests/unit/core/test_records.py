"""Metadata records (tidalmq_core.records): each constructor, applied to an image, changes what
it names and nothing else; the delta says what changed; records that no longer fit the image
(a topic deleted since) are skipped; values that only grow never go back."""

from __future__ import annotations

import copy

import pytest
from tidalmq_core.metadata import (
    NO_LEADER,
    BrokerInfo,
    ClusterMetadata,
    DataLoss,
    PartitionState,
    TopicInfo,
)
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import (
    MetadataDelta,
    Record,
    RecordError,
    apply_batch,
    apply_record,
    broker_configs_record,
    broker_record,
    broker_removed_record,
    broker_state_record,
    cluster_record,
    deletion_record,
    epoch_record,
    floors_record,
    marker_record,
    partition_diff,
    partition_record,
    partitions_added_record,
    producer_ids_record,
    static_topic_record,
    topic_configs_record,
    topic_record,
    topic_removed_record,
)
from tidalmq_core.static_mapping import initial_mapping

TP = TopicPartition("t", 1)


def plain_topic(name: str, brokers: list[int], topic_id: str = "id-1") -> TopicInfo:
    return TopicInfo(name, topic_id, [PartitionState(b, 0, [b]) for b in brokers])


def image_with_topic() -> ClusterMetadata:
    meta = ClusterMetadata(cluster_id="c")
    apply_record(meta, topic_record(plain_topic("t", [0, 1, 2])), MetadataDelta())
    return meta


def apply(meta: ClusterMetadata, *records: Record) -> MetadataDelta:
    delta = MetadataDelta()
    for rec in records:
        apply_record(meta, rec, delta)
    return delta


def test_a_new_topic_writes_only_its_brokers_and_applies_to_the_same_topic() -> None:
    topic = plain_topic("t", [0, 1, 2])
    topic.configs = {"retention.ms": "1000"}
    rec = topic_record(topic)
    assert rec["r"] == [0, 1, 2] and "parts" not in rec
    meta = ClusterMetadata(cluster_id="c")
    delta = apply(meta, rec)
    assert meta.topics["t"] == topic
    assert delta.topics == {"t"} and not delta.partitions and not delta.removed_topics


def test_a_topic_with_any_state_beyond_new_is_written_whole() -> None:
    topic = plain_topic("t", [0, 1])
    topic.partitions[1] = PartitionState(
        NO_LEADER,
        4,
        [1],
        original_replicas=[1],
        target_replicas=[0],
        move_started_ms=5,
        created=True,
        end_offset_floor=17,
        lost=DataLoss(10, 3, 7, 1, "checkpoint missing"),
        accepted_from=None,
    )
    topic.kind = "physical"
    topic.internal = True
    rec = topic_record(topic)
    assert "parts" in rec and "r" not in rec
    meta = ClusterMetadata(cluster_id="c")
    apply(meta, rec)
    assert meta.topics["t"] == topic


def test_replacing_a_topic_with_another_id_reports_the_old_one_removed() -> None:
    meta = image_with_topic()
    old = copy.deepcopy(meta.topics["t"])
    delta = apply(meta, topic_record(plain_topic("t", [5], topic_id="id-2")))
    assert meta.topics["t"].topic_id == "id-2" and len(meta.topics["t"].partitions) == 1
    assert delta.removed_topics == {"t": old} and delta.topics == {"t"}
    # the same id again (a replay) is not a removal
    assert not apply(meta, topic_record(plain_topic("t", [5], topic_id="id-2"))).removed_topics


def test_topic_removed() -> None:
    meta = image_with_topic()
    old = copy.deepcopy(meta.topics["t"])
    delta = apply(meta, topic_configs_record("t", {"a": "b"}), topic_removed_record("t"))
    assert "t" not in meta.topics
    assert delta.removed_topics["t"].topic_id == old.topic_id
    assert "t" not in delta.topics, "a removed topic is not also a changed one"
    assert delta.changed_partitions(meta) == {TopicPartition("t", i) for i in range(3)}
    assert not apply(meta, topic_removed_record("t")), "removing it again changes nothing"


def test_partition_record_sets_only_the_fields_it_names() -> None:
    meta = image_with_topic()
    before = copy.deepcopy(meta.topics["t"].partitions[1])
    rec = partition_record(TP, leader=NO_LEADER, target_replicas=(2,), move_started_ms=99)
    assert rec == {"t": "p", "n": "t", "p": 1, "l": NO_LEADER, "g": [2], "s": 99}
    delta = apply(meta, rec)
    after = meta.topics["t"].partitions[1]
    assert (after.leader, after.target_replicas, after.move_started_ms) == (NO_LEADER, [2], 99)
    assert (after.leader_epoch, after.replicas, after.original_replicas) == (
        before.leader_epoch,
        before.replicas,
        before.original_replicas,
    )
    assert delta.partitions == {TP} and not delta.topics
    assert meta.topics["t"].partitions[0] == PartitionState(0, 0, [0])


def test_partition_record_carries_a_loss_and_clears_it() -> None:
    meta = image_with_topic()
    loss = DataLoss(100, 40, 123, 1, "checkpoint missing")
    rec = partition_record(TP, lost=loss)
    assert rec["x"] == loss.to_json(), "a record is plain JSON"
    apply(meta, rec)
    assert meta.topics["t"].partitions[1].lost == loss
    apply(meta, partition_record(TP, lost=None, accepted_from=100))
    part = meta.topics["t"].partitions[1]
    assert part.lost is None and part.accepted_from == 100


def test_partition_record_refuses_an_unknown_field() -> None:
    with pytest.raises(RecordError):
        partition_record(TP, leeder=1)


def test_partition_diff_turns_old_into_new() -> None:
    old = PartitionState(0, 3, [0], created=True, end_offset_floor=5)
    assert partition_diff(TP, old, copy.deepcopy(old)) is None
    new = PartitionState(
        NO_LEADER, 3, [0], original_replicas=[0], target_replicas=[2], move_started_ms=7
    )
    new.created = True
    new.end_offset_floor = 9
    rec = partition_diff(TP, old, new)
    assert rec is not None
    assert set(rec) == {"t", "n", "p", "l", "o", "g", "s", "f"}, "only what changed"
    meta = ClusterMetadata(cluster_id="c")
    meta.topics["t"] = TopicInfo("t", "id", [PartitionState(5, 0, [5]), copy.deepcopy(old)])
    apply(meta, rec)
    assert meta.topics["t"].partitions[1] == new


def test_records_of_a_topic_that_is_gone_are_skipped() -> None:
    """A snapshot replayed with batches it already holds meets records of topics deleted
    later, and partitions beyond a topic's end: they change nothing and do not fail."""
    meta = image_with_topic()
    before = meta.to_json()
    delta = apply(
        meta,
        partition_record(TopicPartition("gone", 0), leader=3),
        partition_record(TopicPartition("t", 7), leader=3),
        partitions_added_record("gone", [1], at=0),
        topic_configs_record("gone", {"a": "b"}),
        floors_record("gone", "x", {0: 5}),
        floors_record("t", "another-id", {0: 5}),
        broker_state_record(42, "dead"),
        broker_removed_record(42),
    )
    assert meta.to_json() == before
    assert not delta, delta


def test_grow_adds_new_partitions_one_broker_each_at_epoch_zero() -> None:
    meta = image_with_topic()
    delta = apply(meta, partitions_added_record("t", [4, 5], at=3))
    assert meta.topics["t"].partitions[3:] == [PartitionState(4, 0, [4]), PartitionState(5, 0, [5])]
    assert delta.topics == {"t"}
    assert TopicPartition("t", 4) in delta.changed_partitions(meta)


def test_a_grow_applied_again_sets_the_same_partitions() -> None:
    """A replay from before a snapshot applies grows the snapshot already holds: they set the
    partitions from where they start, never add more."""
    meta = image_with_topic()
    grow = partitions_added_record("t", [4, 5], at=3)
    later = partitions_added_record("t", [6], at=5)
    moved = partition_record(TopicPartition("t", 4), leader=1, leader_epoch=2, replicas=[1])
    apply(meta, grow, moved, later)
    expected = copy.deepcopy(meta)
    apply(meta, grow, moved, later)  # the replay
    assert meta == expected and len(meta.topics["t"].partitions) == 6
    # starting beyond the end: a grow of a topic since replaced by a smaller one of the same
    # name (a replay applies the replacing topic record next): skipped
    assert not apply(meta, partitions_added_record("t", [9], at=8)) and meta == expected


def test_a_grow_written_before_it_said_where_adds() -> None:
    meta = image_with_topic()
    apply(meta, {"t": "grow", "name": "t", "r": [4]})
    assert meta.topics["t"].partitions[3:] == [PartitionState(4, 0, [4])]


def test_configs_replace_the_overrides() -> None:
    meta = image_with_topic()
    apply(meta, topic_configs_record("t", {"retention.ms": "5"}))
    apply(meta, topic_configs_record("t", {"cleanup.policy": "compact"}))
    assert meta.topics["t"].configs == {"cleanup.policy": "compact"}


def test_floors_only_raise() -> None:
    meta = image_with_topic()
    delta = apply(meta, floors_record("t", "id-1", {0: 10, 2: 4, 9: 1}))
    assert [p.end_offset_floor for p in meta.topics["t"].partitions] == [10, 0, 4]
    assert delta.partitions == {TopicPartition("t", 0), TopicPartition("t", 2)}
    delta = apply(meta, floors_record("t", "id-1", {0: 3, 2: 4}))
    assert [p.end_offset_floor for p in meta.topics["t"].partitions] == [10, 0, 4]
    assert not delta.partitions, "nothing raised: nothing changed"


def test_brokers_register_change_state_and_go() -> None:
    meta = ClusterMetadata(cluster_id="c")
    info = BrokerInfo(3, "h", 9093, rack="r1", control_url="http://h:1", incarnation="x")
    delta = apply(meta, broker_record(info))
    assert meta.brokers[3] == info and delta.brokers == {3}
    apply(meta, broker_state_record(3, "draining"))
    assert meta.brokers[3].state == "draining"
    assert info.state == "alive", "the image does not share objects with the record's source"
    delta = apply(meta, broker_removed_record(3))
    assert 3 not in meta.brokers and delta.brokers == {3}


def test_producer_ids_and_epochs_never_go_back() -> None:
    meta = ClusterMetadata(cluster_id="c")
    apply(meta, producer_ids_record(5000), producer_ids_record(3000))
    assert meta.next_producer_id == 5000
    apply(meta, epoch_record(4), epoch_record(2))
    assert meta.controller_epoch == 4


def test_deletions_are_a_set_in_order() -> None:
    meta = ClusterMetadata(cluster_id="c")
    apply(
        meta,
        deletion_record("a", "1", pending=True),
        deletion_record("b", "2", pending=True),
        deletion_record("a", "1", pending=True),
    )
    assert meta.pending_deletions == [("a", "1"), ("b", "2")]
    delta = apply(meta, deletion_record("a", "1", pending=False))
    assert meta.pending_deletions == [("b", "2")] and delta.other
    apply(meta, deletion_record("a", "1", pending=False))
    assert meta.pending_deletions == [("b", "2")]


def test_broker_configs_set_and_empty_removes_the_scope() -> None:
    meta = ClusterMetadata(cluster_id="c")
    apply(meta, broker_configs_record("", {"x": "1"}), broker_configs_record("3", {"y": "2"}))
    assert meta.broker_configs == {"": {"x": "1"}, "3": {"y": "2"}}
    apply(meta, broker_configs_record("3", {}))
    assert meta.broker_configs == {"": {"x": "1"}}


def test_static_topics_marker_cluster() -> None:
    meta = ClusterMetadata(cluster_id="")
    state = initial_mapping("s", 2, [0, 1], brokers=None, now_ms=1)
    delta = apply(meta, static_topic_record("s", state), marker_record(True), cluster_record("x"))
    assert meta.static_topics["s"].to_json() == state.to_json()
    assert meta.static_topics["s"] is not state
    assert meta.store_marker and meta.cluster_id == "x"
    assert delta.static_topics == {"s"} and delta.other
    apply(meta, static_topic_record("s", None))
    assert "s" not in meta.static_topics


def test_apply_batch_sets_the_version_and_refuses_unknown_records() -> None:
    meta = image_with_topic()
    delta = apply_batch(meta, [partition_record(TP, leader=2)], 17)
    assert meta.version == 17 and delta.partitions == {TP}
    with pytest.raises(RecordError):
        apply_batch(meta, [{"t": "nonsense"}], 18)


def test_delta_merge_and_truth() -> None:
    assert not MetadataDelta()
    a = MetadataDelta(partitions={TP}, removed_topics={"x": plain_topic("x", [0], "1")})
    b = MetadataDelta(brokers={1}, removed_topics={"x": plain_topic("x", [0, 1], "2")}, other=True)
    a.merge(b)
    assert a.partitions == {TP} and a.brokers == {1} and a.other
    assert a.removed_topics["x"].topic_id == "1", "the first removal is the one as it was"


def test_changed_partitions_covers_changed_and_removed_topics() -> None:
    meta = image_with_topic()
    delta = MetadataDelta(
        partitions={TopicPartition("u", 0)},
        topics={"t", "missing"},
        removed_topics={"old": plain_topic("old", [0, 0], "9")},
    )
    assert delta.changed_partitions(meta) == {
        TopicPartition("u", 0),
        *(TopicPartition("t", i) for i in range(3)),
        TopicPartition("old", 0),
        TopicPartition("old", 1),
    }
