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
        {"cleanup.policy": "compact"},
        {"min.insync.replicas": "2"},
    ):
        with pytest.raises(InvalidConfig):
            validate_configs(bad)


def test_compression_type_is_only_what_the_producer_sent() -> None:
    """Batches are never re-encoded, so a topic codec would be accepted and not applied."""
    assert validate_configs({"compression.type": "producer"}) == {"compression.type": "producer"}
    for codec in ("uncompressed", "gzip", "snappy", "lz4", "zstd"):
        with pytest.raises(InvalidConfig, match="never recompresses"):
            validate_configs({"compression.type": codec})
