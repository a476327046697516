"""DescribeConfigs' IncludeDocumentation on Apache Kafka 4.3.1, through its Java AdminClient:
the checks of tests/support/config_documentation.py that
tests/integration/compat/test_config_documentation.py runs on TidalMQ, so an expectation only
TidalMQ meets shows up here."""

from __future__ import annotations

import pytest

from bench.kafka.harness import KafkaCluster
from tests.support.config_documentation import check_config_documentation

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(150)]


def test_the_java_admin_client_gets_documentation_only_when_it_asks(
    apache_kafka: KafkaCluster,
) -> None:
    check_config_documentation(apache_kafka.bootstrap, 1)  # its one node: id 1
