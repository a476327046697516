"""KIP-467's per-record produce errors on TidalMQ, with Apache Kafka's Java producer: the cases
of tests/support/record_errors.py, which tests/integration/apache_kafka/test_record_errors.py runs
on Apache Kafka 4.3.1."""

from __future__ import annotations

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.record_errors import check_record_errors

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(150)]


def test_the_java_producer_is_told_which_records_were_refused(tidalmq: BrokerProcess) -> None:
    check_record_errors(tidalmq.bootstrap)
