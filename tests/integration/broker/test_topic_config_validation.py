"""Topic config validation on a TidalMQ broker, through a real AdminClient: the cases of
tests/support/topic_config_validation.py, which
tests/integration/apache_kafka/test_topic_config_validation.py runs on the real Kafka 4.3 with
the same expectations (CreateTopics, IncrementalAlterConfigs and AlterConfigs answer
INVALID_CONFIG with Kafka's messages)."""

from __future__ import annotations

import pytest

from tests.support.broker_process import BrokerProcess
from tests.support.topic_config_validation import (
    check_alter_configs,
    check_create_topics,
    check_described_defaults,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_create_topics_validates_configs_as_kafka(local_broker: BrokerProcess) -> None:
    check_create_topics(local_broker.bootstrap, tidalmq=True)


def test_alter_configs_validate_as_kafka(local_broker: BrokerProcess) -> None:
    check_alter_configs(local_broker.bootstrap)


def test_kafkas_defaults_are_described(local_broker: BrokerProcess) -> None:
    check_described_defaults(local_broker.bootstrap)
