"""KIP-467's per-record produce errors on Apache Kafka 4.3.1: the cases of
tests/support/record_errors.py that tests/integration/compat/test_record_errors.py runs on
TidalMQ, so an expectation only TidalMQ meets shows up here."""

from __future__ import annotations

import pytest

from bench.kafka.harness import KafkaCluster
from tests.support.record_errors import check_record_errors

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(150)]


def test_the_java_producer_is_told_which_records_were_refused(apache_kafka: KafkaCluster) -> None:
    check_record_errors(apache_kafka.bootstrap)
