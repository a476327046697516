"""message.timestamp.type on Apache Kafka 4.3.1: the cases of tests/support/log_append_time.py
that tests/integration/broker/test_log_append_time.py runs on TidalMQ, so an expectation only
TidalMQ meets shows up here."""

from __future__ import annotations

import pytest

from bench.kafka.harness import KafkaCluster
from tests.support.log_append_time import check_log_append_time

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(90)]


def test_timestamp_types_as_kafka_sets_them(apache_kafka: KafkaCluster) -> None:
    check_log_append_time(apache_kafka.bootstrap)
