from __future__ import annotations

import pytest
from tidalmq_core.placement import place_partitions
from tidalmq_core.topics import (
    InvalidConfig,
    InvalidPartitions,
    InvalidTopic,
    validate_configs,
    validate_partition_count,
    validate_topic_name,
)


def test_partition_i_on_broker_i_mod_n() -> None:
    assert place_partitions([3, 1, 2], 7) == [1, 2, 3, 1, 2, 3, 1]
    # growing a topic continues the round robin
    assert place_partitions([1, 2, 3], 2, first_partition=7) == [2, 3]


def test_no_brokers() -> None:
    with pytest.raises(ValueError):
        place_partitions([], 1)


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * 250, "ü"])
def test_bad_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopic):
        validate_topic_name(name)


def test_good_topic_name() -> None:
    validate_topic_name("orders.v1_EU-west")


def test_partition_counts() -> None:
    validate_partition_count(1)
    for bad in (0, -1, 10_001):
        with pytest.raises(InvalidPartitions):
            validate_partition_count(bad)


def test_configs() -> None:
    assert validate_configs({"retention.ms": "1000", "cleanup.policy": "delete"}) == {
        "retention.ms": "1000",
        "cleanup.policy": "delete",
    }
    assert validate_configs({"retention.ms": None}) == {}
    for bad in (
        {"nope": "1"},
        {"retention.ms": "soon"},
        {"retention.ms": "-5"},
        {"cleanup.policy": "compacted"},
        {"min.insync.replicas": "2"},
    ):
        with pytest.raises(InvalidConfig):
            validate_configs(bad)


@pytest.mark.parametrize(
    "configs",
    [
        {"cleanup.policy": "compact"},
        {"cleanup.policy": "compact,delete"},
        {"cleanup.policy": "delete, compact"},
        {"cleanup.policy": ""},  # Kafka 4.x: no policy, infinite retention
        {"min.cleanable.dirty.ratio": "0"},
        {"min.cleanable.dirty.ratio": "0.01"},
        {"min.cleanable.dirty.ratio": "1"},
        {"delete.retention.ms": "0"},
        {"min.compaction.lag.ms": "100", "max.compaction.lag.ms": "100"},
        {"max.compaction.lag.ms": str(2**63 - 1)},
        {"segment.ms": "1"},
    ],
)
def test_compaction_configs_kafka_accepts(configs: dict[str, str]) -> None:
    assert validate_configs(dict(configs)) == configs


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        (
            {"cleanup.policy": "compact,shred"},
            "Invalid value shred for configuration cleanup.policy: String must be one of: "
            "compact, delete",
        ),
        (
            {"min.cleanable.dirty.ratio": "1.5"},
            "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no "
            "more than 1",
        ),
        ({"min.cleanable.dirty.ratio": "-0.1"}, "Value must be at least 0"),
        ({"min.cleanable.dirty.ratio": "half"}, "Not a number of type DOUBLE"),
        ({"delete.retention.ms": "-1"}, "at least 0"),
        ({"min.compaction.lag.ms": "-1"}, "at least 0"),
        ({"max.compaction.lag.ms": "0"}, "at least 1"),
        ({"max.compaction.lag.ms": str(2**63)}, "Not a number of type LONG"),
        ({"segment.ms": "0"}, "at least 1"),
        (
            {"min.compaction.lag.ms": "200", "max.compaction.lag.ms": "100"},
            "conflict topic config setting min.compaction.lag.ms (200) > "
            "max.compaction.lag.ms (100)",
        ),
    ],
)
def test_compaction_configs_kafka_refuses(configs: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        validate_configs(dict(configs))
    assert message in str(refused.value)


def test_a_static_topic_is_never_compacted() -> None:
    assert validate_configs({"cleanup.policy": "delete"}, static=True)
    with pytest.raises(InvalidConfig, match="not offered for static topics"):
        validate_configs({"cleanup.policy": "delete,compact"}, static=True)


def test_compression_type_is_only_what_the_producer_sent() -> None:
    """Batches are never re-encoded, so a topic codec would be accepted and not applied."""
    assert validate_configs({"compression.type": "producer"}) == {"compression.type": "producer"}
    for codec in ("uncompressed", "gzip", "snappy", "lz4", "zstd"):
        with pytest.raises(InvalidConfig, match="never recompresses"):
            validate_configs({"compression.type": codec})
