"""Compacted topics on the real Apache Kafka: the same scenario as
tests/integration/broker/test_compacted_topics.py runs on TidalMQ
(tests/support/compacted_topic.py), so a check that only TidalMQ passes shows up here. Kafka's
cleaner runs every log.cleaner.backoff.ms (200 ms in tests/support/apache_kafka.py) and cleans
closed segments only (4 KiB ones in the first test, SMALL_SEGMENTS); the assertions are on what a
consumer reads, not on when. Also cleanup.policy=compact,delete: retention deletes old segments, the cleaner compacts the rest."""

from __future__ import annotations

import uuid

import pytest

from bench.kafka.harness import KafkaCluster
from tests.support.compacted_topic import (
    COMPACT_DELETE_CONFIGS,
    SMALL_SEGMENTS,
    TOPIC_CONFIGS,
    an_update_after_the_clean_is_the_latest,
    compact_and_delete,
    create_compacted_topic,
    latest_value_per_key,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_consumer_from_the_start_reads_the_latest_value_per_key(
    apache_kafka: KafkaCluster,
) -> None:
    b = apache_kafka.bootstrap
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    create_compacted_topic(b, topic, {**TOPIC_CONFIGS, **SMALL_SEGMENTS})
    end, cleaned = latest_value_per_key(b, topic, drops_tombstones_without_new_data=False)
    an_update_after_the_clean_is_the_latest(b, topic, end, cleaned)


def test_compact_delete_retention_drops_old_segments_and_the_cleaner_the_rest(
    apache_kafka: KafkaCluster,
) -> None:
    topic = f"compact-delete-{uuid.uuid4().hex[:8]}"
    # Kafka's default segment size here: with 4 KiB segments its cleaner sometimes (1 run in 3
    # on a loaded machine) merged the old segments' survivors into a segment with recent
    # timestamps before retention deleted them, and the log start stayed 0
    create_compacted_topic(apache_kafka.bootstrap, topic, COMPACT_DELETE_CONFIGS)
    compact_and_delete(apache_kafka.bootstrap, topic)
