"""DescribeConfigs' IncludeDocumentation on TidalMQ, through Apache Kafka's Java AdminClient: the
checks of tests/support/config_documentation.py, which
tests/integration/apache_kafka/test_config_documentation.py runs on Apache Kafka 4.3.1, and here
that the text is TidalMQ's own: the topic configs' from their table (TOPIC_CONFIG_DEFS, which
the CRDs' descriptions come from too), every broker config's from BROKER_CONFIG_DOCS."""

from __future__ import annotations

import pytest
from tidalmq_broker.apis.broker_config_docs import BROKER_CONFIG_DOCS
from tidalmq_core.topics import TOPIC_CONFIGS, documentation

from tests.support.broker_process import BrokerProcess
from tests.support.config_documentation import check_config_documentation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_the_java_admin_client_gets_documentation_only_when_it_asks(
    tidalmq: BrokerProcess,
) -> None:
    report = check_config_documentation(tidalmq.bootstrap, 0)
    topic_docs = report["topic"]["with"]
    assert topic_docs == {name: documentation(TOPIC_CONFIGS[name]) for name in topic_docs}
    # e.g. a config taken and ignored says so
    assert "no effect" in topic_docs["flush.ms"]
    broker_docs = report["broker"]["with"]
    assert broker_docs == {name: BROKER_CONFIG_DOCS[name] for name in broker_docs}
