"""Kafka Connect 4.3.1 in distributed mode with the FileStream connectors on TidalMQ: the worker
starts on its compacted internal topics, a file goes through a topic byte for byte, and a
restarted worker resumes from its stored offsets (tests/support/connect_worker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kafka.harness import KafkaDist
from tests.support.broker_process import BrokerProcess
from tests.support.connect_worker import file_round_trip_with_restart

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def test_connect_distributed_round_trips_a_file_and_resumes_after_a_restart(
    tidalmq: BrokerProcess, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    file_round_trip_with_restart(apache_kafka_dist, tidalmq.bootstrap, tmp_path)
