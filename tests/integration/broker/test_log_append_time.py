"""message.timestamp.type on a TidalMQ broker, read back with a real consumer: the cases of
tests/support/log_append_time.py, which tests/integration/apache_kafka/test_log_append_time.py
runs on Apache Kafka 4.3.1."""

from __future__ import annotations

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.log_append_time import check_log_append_time

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_timestamp_types_as_kafka_sets_them(local_broker: BrokerProcess) -> None:
    check_log_append_time(local_broker.bootstrap)
