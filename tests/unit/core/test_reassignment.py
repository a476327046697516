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
    begin_move,
    cancel_move,
    elect_target,
    format_plan,
    parse_plan,
    validate_plan,
)


def cluster() -> ClusterMetadata:
    meta = ClusterMetadata(cluster_id="c")
    for b in (1, 2, 3):
        meta.brokers[b] = BrokerInfo(b, "h", 9000 + b)
    meta.topics["t"] = TopicInfo("t", "id", [PartitionState(1, 0, [1]), PartitionState(2, 4, [2])])
    return meta


def test_parse_kafka_plan() -> None:
    text = json.dumps({"version": 1, "partitions": [
        {"topic": "t", "partition": 0, "replicas": [2], "log_dirs": ["any"]},
        {"topic": "t", "partition": 1, "replicas": None},
    ]})  # fmt: skip
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


def test_move_records_target_without_electing_then_elects_with_higher_epoch() -> None:
    part = PartitionState(1, 7, [1])
    assert begin_move(part, 3, now_ms=100)
    assert part.leader == NO_LEADER and part.leader_epoch == 7
    assert part.original_replicas == [1] and part.target_replicas == [3]
    assert adding_removing(part) == ([3, 1], [3], [1])
    assert elect_target(part) == 3
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (3, 8, [3], False)


def test_cancel_rolls_back_to_the_original_with_higher_epoch() -> None:
    part = PartitionState(1, 7, [1])
    begin_move(part, 3, now_ms=100)
    assert cancel_move(part) == 1
    assert (part.leader, part.leader_epoch, part.replicas, part.moving) == (1, 8, [1], False)
    with pytest.raises(NoReassignmentInProgress):
        cancel_move(part)


def test_noop_and_retarget() -> None:
    part = PartitionState(1, 0, [1])
    assert not begin_move(part, 1, now_ms=0)
    begin_move(part, 2, now_ms=0)
    assert not begin_move(part, 2, now_ms=0)
    assert begin_move(part, 3, now_ms=0)
    assert part.original_replicas == [1] and part.target_replicas == [3]
    assert begin_move(part, 1, now_ms=0)  # back to the original: a cancel
    assert not part.moving and part.leader == 1


def test_format_plan_round_trips() -> None:
    assignment = {TopicPartition("t", 1): 2, TopicPartition("t", 0): 3}
    assert parse_plan(format_plan(assignment)) == [
        PlanEntry(TopicPartition("t", 0), 3),
        PlanEntry(TopicPartition("t", 1), 2),
    ]
