from __future__ import annotations

import json

import pytest
from tidalmq_core.metadata import NO_LEADER, BrokerInfo, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import (
    InvalidPlan,
    NoReassignmentInProgress,
    PlanEntry,
    adding_removing,
    cancel_changes,
    closing,
    closing_changes,
    elect_changes,
    format_plan,
    parse_plan,
    queue_changes,
    validate_plan,
)
from tidalmq_core.records import apply_batch, partition_record


def cluster() -> ClusterMetadata:
    meta = ClusterMetadata(cluster_id="c")
    for b in (1, 2, 3):
        meta.brokers[b] = BrokerInfo(b, "h", 9000 + b)
    meta.topics["t"] = TopicInfo("t", "id", [PartitionState(1, 0, [1]), PartitionState(2, 4, [2])])
    return meta


def test_parse_kafka_plan() -> None:
    text = json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": "t", "partition": 0, "replicas": [2], "log_dirs": ["any"]},
                {"topic": "t", "partition": 1, "replicas": None},
            ],
        }
    )
    assert parse_plan(text) == [
        PlanEntry(TopicPartition("t", 0), 2),
        PlanEntry(TopicPartition("t", 1), None),
    ]


@pytest.mark.parametrize(
    "doc, message",
    [
        ("{", "not valid JSON"),
        ({"version": 1}, "partitions"),
        ({"version": 2, "partitions": []}, "version"),
        ({"partitions": [{"partition": 0, "replicas": [1]}]}, "topic"),
        ({"partitions": [{"topic": "t", "partition": -1, "replicas": [1]}]}, "partition"),
        (
            {
                "partitions": [
                    {"topic": "t", "partition": 0, "replicas": [1]},
                    {"topic": "t", "partition": 0, "replicas": [2]},
                ]
            },
            "more than once",
        ),
        ({"partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}, "exactly one"),
        ({"partitions": [{"topic": "t", "partition": 0, "replicas": ["x"]}]}, "broker ids"),
        # [U1]: a number here was a raw TypeError (iterating it)
        (
            {"partitions": [{"topic": "t", "partition": 0, "replicas": [1], "log_dirs": 5}]},
            "log_dirs must be a list",
        ),
        (
            {"partitions": [{"topic": "t", "partition": 0, "replicas": [1], "log_dirs": ["/d"]}]},
            "meaningless",
        ),
        ({"partitions": ["t-0"]}, "is not an object"),
    ],
)
def test_bad_plans(doc: object, message: str) -> None:
    with pytest.raises(InvalidPlan, match=message):
        parse_plan(doc if isinstance(doc, str) else json.dumps(doc))


def test_validate_against_cluster() -> None:
    meta = cluster()
    validate_plan([PlanEntry(TopicPartition("t", 0), 3)], meta)
    with pytest.raises(InvalidPlan, match="unknown broker 9"):
        validate_plan([PlanEntry(TopicPartition("t", 0), 9)], meta)
    with pytest.raises(InvalidPlan, match="unknown partition"):
        validate_plan([PlanEntry(TopicPartition("t", 5), 1)], meta)
    for negative in (-1, -5, -(2**31)):  # a list index from the wire must not wrap around
        with pytest.raises(InvalidPlan, match="unknown partition"):
            validate_plan([PlanEntry(TopicPartition("t", negative), 1)], meta)
    with pytest.raises(InvalidPlan, match="unknown topic"):
        validate_plan([PlanEntry(TopicPartition("u", 0), 1)], meta)


TP = TopicPartition("t", 0)


def one_partition(leader: int, epoch: int) -> tuple[ClusterMetadata, PartitionState]:
    """A cluster whose topic "t" has one partition, led by `leader` at `epoch`."""
    meta = ClusterMetadata(cluster_id="c")
    part = PartitionState(leader, epoch, [leader])
    meta.topics["t"] = TopicInfo("t", "id", [part])
    return meta, part


def commit(meta: ClusterMetadata, changes: dict[str, object] | None) -> None:
    """Apply a transition's changes the way the controller does: as a partition record."""
    assert changes is not None
    apply_batch(meta, [partition_record(TP, **changes)], meta.version + 1)


def start_move(meta: ClusterMetadata, part: PartitionState, target: int, now_ms: int) -> None:
    """Queue a move and start it in the same record, as `Leadership.queue` does when the
    brokers have room."""
    changes = queue_changes(part, target)
    assert changes is not None
    commit(meta, {**changes, **closing_changes(now_ms)})


def test_move_records_target_without_electing_then_elects_with_higher_epoch() -> None:
    meta, part = one_partition(1, 7)
    commit(meta, queue_changes(part, 3))
    # queued: the target is recorded, the source still leads at its epoch
    assert (part.leader, part.leader_epoch, part.replicas) == (1, 7, [1])
    assert part.original_replicas == [1] and part.target_replicas == [3]
    assert part.moving and not closing(part)
    assert adding_removing(part) == ([3, 1], [3], [1])
    commit(meta, closing_changes(now_ms=100))
    assert part.leader == NO_LEADER and part.leader_epoch == 7 and closing(part)
    assert part.move_started_ms == 100
    commit(meta, elect_changes(part))
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (3, 8, [3], False)
    assert part.original_replicas is None and part.move_started_ms is None


def test_election_may_go_to_another_broker_than_the_target() -> None:
    # the controller hands a move whose target and source both went away to a third broker
    meta, part = one_partition(1, 7)
    start_move(meta, part, 3, now_ms=100)
    commit(meta, elect_changes(part, 2))
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (2, 8, [2], False)


def test_cancel_of_a_closing_move_rolls_back_to_the_original_with_higher_epoch() -> None:
    meta, part = one_partition(1, 7)
    start_move(meta, part, 3, now_ms=100)
    commit(meta, cancel_changes(part))
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (1, 8, [1], False)
    assert part.move_started_ms is None
    with pytest.raises(NoReassignmentInProgress):
        cancel_changes(part)
    with pytest.raises(NoReassignmentInProgress):
        elect_changes(part)


def test_cancel_of_a_queued_move_keeps_the_leader_and_its_epoch() -> None:
    # Kafka's semantics: a cancelled reassignment bumps the leader epoch only when leadership
    # changed. A queued move never took the partition from its source, so the source keeps
    # serving at the epoch its clients and its open partition already use; a closing move did
    # close (or fence) the source, which reopens at a higher epoch (the test above).
    meta, part = one_partition(1, 7)
    commit(meta, queue_changes(part, 3))
    commit(meta, cancel_changes(part))
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (1, 7, [1], False)
    assert part.original_replicas is None and part.move_started_ms is None


def test_noop_and_retarget() -> None:
    meta, part = one_partition(1, 0)
    assert queue_changes(part, 1) is None  # already there
    start_move(meta, part, 2, now_ms=0)
    assert queue_changes(part, 2) is None  # already going there
    commit(meta, queue_changes(part, 3))
    # a new target replaces the old one; the original replicas stay the original (KIP-236)
    assert part.original_replicas == [1] and part.target_replicas == [3] and closing(part)
    commit(meta, queue_changes(part, 1))  # back to the original: a cancel
    assert not part.moving and part.leader == 1 and part.leader_epoch == 1


def test_queued_move_sent_back_to_its_original_broker_keeps_its_epoch() -> None:
    meta, part = one_partition(1, 4)
    commit(meta, queue_changes(part, 2))
    commit(meta, queue_changes(part, 1))
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (1, 4, [1], False)


def test_format_plan_round_trips() -> None:
    assignment = {TopicPartition("t", 1): 2, TopicPartition("t", 0): 3}
    assert parse_plan(format_plan(assignment)) == [
        PlanEntry(TopicPartition("t", 0), 3),
        PlanEntry(TopicPartition("t", 1), 2),
    ]
