"""Kafka Streams exactly_once_v2 through kill -9 on Apache Kafka 4.3.1, with the very program and
checks that judge TidalMQ in tests/integration/compat/test_exactly_once.py
(tests/support/streams_exactly_once.py), so a check that passes only on TidalMQ shows up.

What differs from the TidalMQ run, and why: a cluster of its own, 2 KRaft brokers and a
controller (TidalMQ's: 3 brokers), where every topic has 2 replicas and min.insync.replicas is 1
(the input and output, Streams' changelog and repartition topics through
default.replication.factor, __transaction_state and __consumer_offsets): a Kafka partition
lives on its replicas' disks, so with one replica (as on TidalMQ, whose data is in object
storage) a killed broker's partitions would stop until it came back. The broker killed is the
input's partition 0's leader; the controller fences it after 3 s (broker.session.timeout.ms),
and its partitions and coordinators move to the other broker. Unlike on TidalMQ, the killed
broker is started again as soon as the application has been killed, while the third phase is
produced and the application starts again: it recovers its logs after the unclean shutdown,
catches up into the input's in-sync replicas, and a preferred leader election gives it back
the leadership of the input's partition 0 (as the restarted application reads, or about to);
the output is read once that is done.

Shown able to fail: with processing.guarantee=at_least_once the restarted application counts
its unfinished transaction's records again (two of the six words, 150 records each, counted
to 199 and 200). The
file costs 47-60 s at load 9-16 on the 2-core machine (the cluster's start 13-27 s, the test
28-38 s, of which the killed broker's restart 10-22 s, beside the application's), 72 s at
load 21-29 (33 s + 36 s).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.kafka.harness import KafkaCluster, KafkaDist
from tests.support.apache_kafka import killable_cluster
from tests.support.streams_exactly_once import (
    PARTITIONS,
    counts_survive_a_broker_and_an_app_kill_9,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

# As tests/integration/apache_kafka/test_transactions.py's cluster (tests/support/apache_kafka.py:
# few internal partitions, created inside the test's time; a transaction past its timeout aborted
# within half a second; a broker that stopped heartbeating fenced after 3 s, not 9), and every
# topic with 2 replicas
BROKER_CONFIG = {"min.insync.replicas": "1"}
# the controller creates the topics: Streams' (replication.factor -1) get its default
CONTROLLER_CONFIG = {"default.replication.factor": "2"}


@pytest.fixture(scope="module")
def kafka(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka_dist: KafkaDist
) -> Iterator[KafkaCluster]:
    with killable_cluster(
        tmp_path_factory.mktemp("kafka-streams-eos"),
        apache_kafka_dist,
        broker_config=BROKER_CONFIG,
        controller_config=CONTROLLER_CONFIG,
    ) as cluster:
        yield cluster


def leader(admin: AdminClient, topic: str, partition: int) -> tuple[int, list[int]]:
    """The partition's leader (-1: none) and in-sync replicas."""
    described = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition]
    return int(described.leader), list(described.isrs)


def test_exactly_once_v2_counts_survive_a_broker_and_an_app_kill_9(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    killed: list[int] = []
    topics: list[str] = []

    def kill_broker(topic: str) -> None:
        victim, isr = leader(admin, topic, 0)
        assert victim >= 0 and len(isr) == 2, (victim, isr)
        # every partition (Streams' changelog and repartition topics too) survives the kill
        one_replica = [
            (t.topic, p.id)
            for t in admin.list_topics(timeout=10).topics.values()
            for p in t.partitions.values()
            if len(p.replicas) != 2
        ]
        assert not one_replica, one_replica
        kafka.kill_node(victim)
        killed.append(victim)
        topics.append(topic)

    def restart_broker() -> None:
        (victim,), (topic,) = killed, topics
        assert not kafka.nodes[victim].running()
        t0 = time.monotonic()
        kafka.start_node(victim)  # once it logged "Kafka Server started" again
        print(f"broker {victim} started again in {time.monotonic() - t0:.1f} s")
        wait_for(
            f"broker {victim} back in the input's in-sync replicas",
            lambda: all(victim in leader(admin, topic, p)[1] for p in range(PARTITIONS)),
            timeout_s=60,
        )
        print(f"broker {victim} in sync after {time.monotonic() - t0:.1f} s")
        elected = admin.elect_leaders(
            ElectionType.PREFERRED, [TopicPartition(topic, p) for p in range(PARTITIONS)]
        )
        elected.result(30)  # an error: that partition's leader was its preferred one already
        wait_for(
            f"broker {victim} leading the input's partition 0 again",
            lambda: leader(admin, topic, 0)[0] == victim,
            timeout_s=60,
        )

    counts_survive_a_broker_and_an_app_kill_9(
        kafka.bootstrap,
        tmp_path,
        replication_factor=2,
        kill_broker=kill_broker,
        restart_broker=restart_broker,
    )
    assert kafka.nodes[killed[0]].running()
