"""Spec parsing of the operator's resources (folder not named `operator`: that would shadow the
standard library module)."""

from __future__ import annotations

import pytest
from tidalmq_core.model import TopicPartition
from tidalmq_operator.models import ReassignmentSpec, SpecError, TopicSpec, parse


def test_topic_spec() -> None:
    spec = parse(TopicSpec, {"partitions": 3, "configs": {"retention.ms": 1000}})
    assert spec.kafka_name("orders") == "orders"
    assert spec.validated_configs() == {"retention.ms": "1000"}
    named = parse(TopicSpec, {"partitions": 1, "topicName": "Orders_v2"})
    assert named.kafka_name("orders-v2") == "Orders_v2"


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"partitions": 0}, "partitions"),
        ({}, "partitions"),
        ({"partitions": "many"}, "partitions"),
    ],
)
def test_bad_topic_specs(spec: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse(TopicSpec, spec)


def test_bad_topic_config_and_name() -> None:
    with pytest.raises(ValueError, match="Unknown topic config name: nope"):
        parse(TopicSpec, {"partitions": 1, "configs": {"nope": "1"}}).validated_configs()
    with pytest.raises(ValueError, match="characters"):
        parse(TopicSpec, {"partitions": 1, "topicName": "a b"}).kafka_name("x")


def test_reassignment_spec_entries() -> None:
    spec = parse(
        ReassignmentSpec, {"partitions": [{"topic": "t", "partition": 1, "replicas": [2]}]}
    )
    assert [(e.tp, e.target) for e in spec.entries()] == [(TopicPartition("t", 1), 2)]
    dup = parse(
        ReassignmentSpec,
        {
            "partitions": [
                {"topic": "t", "partition": 1, "replicas": [2]},
                {"topic": "t", "partition": 1, "replicas": [0]},
            ]
        },
    )
    with pytest.raises(SpecError, match="more than once"):
        dup.entries()
    with pytest.raises(SpecError, match="replicas"):
        parse(
            ReassignmentSpec, {"partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}
        )
