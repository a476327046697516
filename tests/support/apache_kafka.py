"""pytest fixtures: the real Apache Kafka (assembled from Maven Central) as a yardstick.

Registered in tests/conftest.py through ``pytest_plugins``. Both clusters are session-scoped and
started at most once per session, behind a lock; a missing Java or Maven, or a cluster that does
not start, fails the tests that use them (nothing is skipped).

- ``apache_kafka_dist``: the assembled release (bench/kafka/assemble.sh; cached).
- ``apache_kafka``: a 1-broker KRaft cluster (combined broker+controller, node id 1).
  Both clusters run the log cleaner every 0.2 s instead of 15 (``CLEANER``).
- ``apache_kafka_2``: a 2-broker KRaft cluster (controller 3000, brokers 1 and 2).

``killable_cluster`` builds (unstarted) the 2-broker cluster that the tests which kill a broker
run on a cluster of their own (tests/integration/apache_kafka/test_transactions.py and
test_exactly_once_streams.py), each with its own settings on top.

Use ``cluster.bootstrap`` with the bootstrap-agnostic helpers of ``bench.kafka.harness``
(``run_tool``, ``console_produce``, ``producer_perf_test``, ``java_produce``, ...), which work
unchanged against TidalMQ's bootstrap address.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

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


def _running(
    brokers: int, tmp_path_factory: pytest.TempPathFactory, dist: KafkaDist
) -> Iterator[KafkaCluster]:
    with _start_lock:
        directory = tmp_path_factory.mktemp(f"apache-kafka-{brokers}b")
        cluster = KafkaCluster(
            brokers=brokers, dir=directory, dist=dist, broker_config=CLEANER
        ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def apache_kafka(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka_dist: KafkaDist
) -> Iterator[KafkaCluster]:
    yield from _running(1, tmp_path_factory, apache_kafka_dist)


@pytest.fixture(scope="session")
def apache_kafka_2(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka_dist: KafkaDist
) -> Iterator[KafkaCluster]:
    yield from _running(2, tmp_path_factory, apache_kafka_dist)


# The clusters of the tests that kill a broker: few partitions for the internal topics (created
# on first use, inside the tests' time), transactions past their timeout aborted within half a
# second (as the TidalMQ run's cluster), and the controller fences a broker that stopped
# heartbeating after 3 s (default 9 s), so a killed broker's partitions and coordinators move
# within the test's time
KILLABLE_BROKER_CONFIG = {
    "transaction.state.log.num.partitions": "4",
    "offsets.topic.num.partitions": "4",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "broker.heartbeat.interval.ms": "500",
}
KILLABLE_CONTROLLER_CONFIG = {"broker.session.timeout.ms": "3000"}


def killable_cluster(
    directory: Path,
    dist: KafkaDist,
    *,
    broker_config: Mapping[str, str] | None = None,
    controller_config: Mapping[str, str] | None = None,
) -> KafkaCluster:
    """A 2-broker cluster (controller 3000, brokers 1 and 2; not started: use it as a context
    manager) with the KILLABLE_* settings, and `broker_config` / `controller_config` on top."""
    return KafkaCluster(
        brokers=2,
        dir=directory,
        dist=dist,
        broker_heap="512m",
        broker_config={**KILLABLE_BROKER_CONFIG, **(broker_config or {})},
        controller_config={**KILLABLE_CONTROLLER_CONFIG, **(controller_config or {})},
    )
