"""KIP-937's timestamp bounds on Apache Kafka 4.3.1: the cases of
tests/support/timestamp_bounds.py that tests/integration/broker/test_timestamp_bounds.py runs on
TidalMQ, so an expectation only TidalMQ meets shows up here."""

from __future__ import annotations

import pytest

from bench.kafka.harness import KafkaCluster
from tests.support.timestamp_bounds import check_timestamp_bounds

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(90)]


def test_records_out_of_the_topics_timestamp_bounds_are_refused(
    apache_kafka: KafkaCluster,
) -> None:
    check_timestamp_bounds(apache_kafka.bootstrap)
