"""Kafka Streams 4.3.1's WordCountDemo topology with its default, compacted changelog on the
real Apache Kafka: the same scenario as tests/integration/compat/test_streams.py runs on TidalMQ
(tests/support/streams_wordcount.py), so a check that only TidalMQ passes shows up here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kafka.harness import KafkaCluster, KafkaDist
from tests.support.streams_wordcount import word_count_restores_from_the_changelog

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def test_word_count_restores_its_counts_from_the_compacted_changelog(
    apache_kafka: KafkaCluster, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    word_count_restores_from_the_changelog(apache_kafka_dist, apache_kafka.bootstrap, tmp_path)
