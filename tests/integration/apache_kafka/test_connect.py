"""Kafka Connect 4.3.1 in distributed mode with the FileStream connectors on the real Apache
Kafka: the same scenario as tests/integration/compat/test_connect.py runs on TidalMQ
(tests/support/connect_worker.py), so a check that only TidalMQ passes shows up here."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kafka.harness import KafkaCluster, KafkaDist
from tests.support.connect_worker import file_round_trip_with_restart

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def test_connect_distributed_round_trips_a_file_and_resumes_after_a_restart(
    apache_kafka: KafkaCluster, apache_kafka_dist: KafkaDist, tmp_path: Path
) -> None:
    file_round_trip_with_restart(apache_kafka_dist, apache_kafka.bootstrap, tmp_path)
