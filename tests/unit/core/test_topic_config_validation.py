"""TidalMQ's topic config table against the cases Apache Kafka 4.3.1 answers
(tests/support/topic_config_validation.py, which the integration tests also run on a TidalMQ
broker and on the real Kafka)."""

from __future__ import annotations

import pytest
from tidalmq_broker.partitions import partition_config
from tidalmq_core.metadata import TopicInfo
from tidalmq_core.topics import (
    TOPIC_CONFIG_DEFAULTS,
    TOPIC_CONFIG_DEFS,
    TOPIC_CONFIGS,
    InvalidConfig,
    effective_segment_bytes,
    validate_configs,
)

from tests.support.topic_config_validation import KAFKA_ACCEPTS, KAFKA_REFUSES, TIDALMQ_NARROWS


@pytest.mark.parametrize("configs", KAFKA_ACCEPTS, ids=str)
def test_what_kafka_accepts_is_accepted_and_stored_as_sent(configs: dict[str, str]) -> None:
    booleans = {n for n in configs if TOPIC_CONFIGS[n].type == "BOOLEAN"}
    stored = validate_configs(dict(configs))
    assert {n: v for n, v in stored.items() if n not in booleans} == {
        n: v for n, v in configs.items() if n not in booleans
    }
    # Kafka describes a BOOLEAN as it parsed it
    assert {n: stored[n] for n in booleans} == {n: configs[n].strip().lower() for n in booleans}


# Apache Kafka 4.3.1's LogConfig.configKeys(), in its order (read from the kafka-storage jar;
# docs/topic-configs.md): TidalMQ knows every one of them, in the same order, which is the
# order the values are checked in
KAFKA_LOG_CONFIGS = [
    "segment.bytes",
    "segment.ms",
    "segment.jitter.ms",
    "segment.index.bytes",
    "flush.messages",
    "flush.ms",
    "retention.bytes",
    "retention.ms",
    "max.message.bytes",
    "index.interval.bytes",
    "delete.retention.ms",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "file.delete.delay.ms",
    "min.cleanable.dirty.ratio",
    "cleanup.policy",
    "unclean.leader.election.enable",
    "min.insync.replicas",
    "compression.type",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.zstd.level",
    "preallocate",
    "message.timestamp.type",
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
    "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas",
    "remote.storage.enable",
    "local.retention.ms",
    "local.retention.bytes",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
    "internal.segment.bytes",
]


def test_every_kafka_topic_config_is_known_in_kafkas_order() -> None:
    assert [d.name for d in TOPIC_CONFIG_DEFS] == list(KAFKA_LOG_CONFIGS)


def test_a_boolean_is_stored_as_kafka_describes_it() -> None:
    assert validate_configs({"preallocate": " TRUE ", "remote.storage.enable": "False"}) == {
        "preallocate": "true",
        "remote.storage.enable": "false",
    }


@pytest.mark.parametrize(("configs", "message"), KAFKA_REFUSES, ids=str)
def test_what_kafka_refuses_is_refused_with_its_message(
    configs: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidConfig) as refused:
        validate_configs(dict(configs))
    assert str(refused.value) == message


@pytest.mark.parametrize(("configs", "why"), TIDALMQ_NARROWS, ids=str)
def test_what_tidalmq_narrows_says_why(configs: dict[str, str], why: str) -> None:
    with pytest.raises(InvalidConfig, match=why):
        validate_configs(dict(configs))


def test_every_config_but_the_internal_ones_has_a_default_and_every_default_a_definition() -> None:
    public = {d.name for d in TOPIC_CONFIG_DEFS if not d.internal}
    assert public == set(TOPIC_CONFIG_DEFAULTS)
    assert validate_configs(dict(TOPIC_CONFIG_DEFAULTS)) == TOPIC_CONFIG_DEFAULTS


def test_a_deleted_config_is_dropped_and_checks_nothing() -> None:
    assert validate_configs({"segment.bytes": None, "retention.ms": "1000"}) == {
        "retention.ms": "1000"
    }


def test_the_internal_segment_size_wins_over_segment_bytes() -> None:
    defaults = dict(TOPIC_CONFIG_DEFAULTS)
    assert effective_segment_bytes(defaults) == 64 * 1024 * 1024
    assert effective_segment_bytes({**defaults, "segment.bytes": " +2097152 "}) == 2 * 1024 * 1024
    assert effective_segment_bytes({**defaults, "internal.segment.bytes": "4096"}) == 4096
    # Kafka rolls on every append at a size below 1: one batch per segment, as at 1
    assert effective_segment_bytes({**defaults, "internal.segment.bytes": "-5"}) == 1


def test_a_partition_is_cut_at_the_internal_segment_size() -> None:
    topic = TopicInfo("t", "id", [], {"internal.segment.bytes": "4096", "retention.ms": " 1000 "})
    config = partition_config(topic)
    assert (config.segment_bytes, config.retention_ms) == (4096, 1000)
    assert partition_config(TopicInfo("t", "id", [], {})).segment_bytes == 64 * 1024 * 1024
