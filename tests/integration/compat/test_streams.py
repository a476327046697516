"""Kafka Streams 4.3.1 on TidalMQ with its default, compacted changelog topic: WordCountDemo's
topology counts words, and an instance restarted with its local state wiped restores the
counts from the changelog (which Streams creates with cleanup.policy=compact) and goes on. The
scenario is tests/support/streams_wordcount.py, which
tests/integration/apache_kafka/test_streams.py also runs on the real Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kafka.harness import KafkaDist
from tests.support.broker_process import BrokerProcess
from tests.support.streams_wordcount import word_count_restores_from_the_changelog

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def test_word_count_restores_its_counts_from_the_compacted_changelog(
    tidalmq: BrokerProcess, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    word_count_restores_from_the_changelog(apache_kafka_dist, tidalmq.bootstrap, tmp_path)
