"""KIP-937's timestamp bounds on a TidalMQ broker, with a real producer: the cases of
tests/support/timestamp_bounds.py, which tests/integration/apache_kafka/test_timestamp_bounds.py
runs on Apache Kafka 4.3.1."""

from __future__ import annotations

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.timestamp_bounds import check_timestamp_bounds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_records_out_of_the_topics_timestamp_bounds_are_refused(
    local_broker: BrokerProcess,
) -> None:
    check_timestamp_bounds(local_broker.bootstrap)
