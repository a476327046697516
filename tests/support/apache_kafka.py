"""pytest fixtures: the real Apache Kafka (assembled from Maven Central) as a yardstick.

Registered in tests/conftest.py through ``pytest_plugins``. Both clusters are session-scoped and
started at most once per session, behind a lock; a missing Java or Maven, or a cluster that does
not start, fails the tests that use them (nothing is skipped).

- ``apache_kafka_dist``: the assembled release (bench/kafka/assemble.sh; cached).
- ``apache_kafka``: a 1-broker KRaft cluster (combined broker+controller, node id 1).
  Both clusters run the log cleaner every 0.2 s instead of 15 (``CLEANER``).
- ``apache_kafka_2``: a 2-broker KRaft cluster (controller 3000, brokers 1 and 2).

Use ``cluster.bootstrap`` with the bootstrap-agnostic helpers of ``bench.kafka.harness``
(``run_tool``, ``console_produce``, ``producer_perf_test``, ``java_produce``, ...), which work
unchanged against TidalMQ's bootstrap address.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from bench.kafka.harness import KafkaCluster, KafkaDist, assemble

_start_lock = threading.Lock()


@pytest.fixture(scope="session")
def apache_kafka_dist() -> KafkaDist:
    with _start_lock:
        return assemble()


# Kafka's log cleaner looks for a dirty compacted log every 15 s when it found none: every
# 0.2 s here, so tests/integration/apache_kafka/test_compacted_topics.py sees its cleans within
# a test's time (topics that are not compacted are untouched by it)
CLEANER = {"log.cleaner.backoff.ms": "200"}


def _start(brokers: int, tmp_path_factory: pytest.TempPathFactory, dist: KafkaDist) -> KafkaCluster:
    with _start_lock:
        directory = tmp_path_factory.mktemp(f"apache-kafka-{brokers}b")
        return KafkaCluster(
            brokers=brokers, dir=directory, dist=dist, broker_config=CLEANER
        ).start()


@pytest.fixture(scope="session")
def apache_kafka(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka_dist: KafkaDist
) -> Iterator[KafkaCluster]:
    cluster = _start(1, tmp_path_factory, apache_kafka_dist)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def apache_kafka_2(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka_dist: KafkaDist
) -> Iterator[KafkaCluster]:
    cluster = _start(2, tmp_path_factory, apache_kafka_dist)
    try:
        yield cluster
    finally:
        cluster.stop()
