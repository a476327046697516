"""Topic config validation on the real Apache Kafka: the cases of
tests/support/topic_config_validation.py that tests/integration/broker/
test_topic_config_validation.py runs on TidalMQ, so an expectation only TidalMQ meets shows up
here (TIDALMQ_NARROWS: Kafka must accept them)."""

from __future__ import annotations

import pytest

from bench.kafka.harness import KafkaCluster
from tests.support.topic_config_validation import (
    check_alter_configs,
    check_create_topics,
    check_described_defaults,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


def test_create_topics_validates_configs(apache_kafka: KafkaCluster) -> None:
    check_create_topics(apache_kafka.bootstrap, tidalmq=False)


def test_alter_configs_validate(apache_kafka: KafkaCluster) -> None:
    check_alter_configs(apache_kafka.bootstrap)


def test_kafkas_defaults_are_described(apache_kafka: KafkaCluster) -> None:
    check_described_defaults(apache_kafka.bootstrap)
