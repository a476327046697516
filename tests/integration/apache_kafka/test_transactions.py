"""Transactions against Apache Kafka with the very programs that check TidalMQ's, so a check
that passes only on TidalMQ shows up (docs/transactions.md "Tests").

On a 2-broker KRaft cluster of its own (every topic, __transaction_state and __consumer_offsets
with 2 replicas, min.insync.replicas 1, so one broker can die):

- Kafka's Java transactional producer (bench/kafka/java/TransactionsCheck.java) commits and
  aborts transactions with sendOffsetsToTransaction, judged as in
  tests/integration/compat/test_transactions_v2.py.
- The Jepsen-style checker and the consume-transform-produce copier of
  tests/support/txn_checker.py (the same run against TidalMQ in
  tests/integration/compat/test_exactly_once.py), and beside them the same copy by Kafka's Java
  clients (bench/kafka/java/TransactionalCopier.java: consume-transform-produce with
  sendOffsetsToTransaction), while partition 0 of the checked topic and of the Java copier's
  output get a new leader through kafka-reassign-partitions and a preferred election, the Java
  copier's producer is fenced by another incarnation of its transactional id (it goes on with
  a new producer), and then that leader of the checked topic is killed with kill -9."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka.harness import (
    HERE,
    KafkaCluster,
    KafkaDist,
    reassign_execute,
    reassignment_plan,
    run_java_client,
)
from tests.support.apache_kafka import killable_cluster
from tests.support.txn_checker import (
    TransactionsWorkload,
    java_transactions_problems,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

BEFORE_MOVE_S = 3.0
BEFORE_KILL_S = 2.0  # after the move
AFTER_KILL_S = 7.0
JAVA_TRANSACTIONS = 9  # 2, 5 and 8 are aborted


# its own cluster, so the broker it kills is no other test's (the settings that move a killed
# broker's partitions and coordinators within the test's time: tests/support/apache_kafka.py)
@pytest.fixture(scope="module")
def kafka(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka_dist: KafkaDist
) -> Iterator[KafkaCluster]:
    directory = tmp_path_factory.mktemp("kafka-transactions")
    with killable_cluster(directory, apache_kafka_dist) as cluster:
        yield cluster


def create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, partitions, 2) for t in topics]).values():
        f.result(30)


def test_java_transactional_producer(kafka: KafkaCluster) -> None:
    b = kafka.bootstrap
    topic, tid, group = unique("java-txn"), unique("java-tx"), unique("java-txn-group")
    create_topics(b, [topic], 2)
    report = run_java_client(
        b,
        topic,
        tid,
        str(JAVA_TRANSACTIONS),
        group,
        source=HERE / "java" / "TransactionsCheck.java",
        timeout=120,
    )
    assert not java_transactions_problems(report, JAVA_TRANSACTIONS, 2), report


def partition_leader(bootstrap: str, topic: str, partition: int) -> int:
    """The partition's leader, once it has one and both replicas in sync (a broker that has
    not yet learned of a topic just created answers it without partitions)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        described = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(partition)
        if described is not None and described.leader >= 0 and len(described.isrs) == 2:
            return int(described.leader)
        assert time.monotonic() < deadline, described
        time.sleep(0.2)


def move_leaders(bootstrap: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Moves each partition's leadership to its other replica: kafka-reassign-partitions puts
    that replica first (both brokers hold every partition, so a reassignment can only reorder
    them), then a preferred leader election. Returns the new leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    orders = {}
    for topic, partition in partitions:
        leader = partition_leader(bootstrap, topic, partition)
        described = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition]
        orders[topic, partition] = [r for r in described.replicas if r != leader] + [leader]
    reassign_execute(bootstrap, reassignment_plan(orders))
    deadline = time.monotonic() + 30
    for (topic, partition), order in orders.items():
        while True:  # the controller took the new order (no data to copy: done at once)
            described = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition]
            if list(described.replicas) == order:
                break
            assert time.monotonic() < deadline, described
            time.sleep(0.2)
    elected = admin.elect_leaders(
        ElectionType.PREFERRED, [TopicPartition(t, p) for t, p in partitions]
    )
    assert all(e is None for e in elected.result(30).values()), elected.result()
    for (topic, partition), order in orders.items():
        while (now := partition_leader(bootstrap, topic, partition)) != order[0]:
            assert time.monotonic() < deadline + 30, now
            time.sleep(0.2)
    return {tp: order[0] for tp, order in orders.items()}


def test_transactions_checker_under_a_move_and_a_broker_kill_9(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {what}")

    w = TransactionsWorkload(kafka.bootstrap, java_copier_log=tmp_path / "java-copier.log")
    create_topics(kafka.bootstrap, w.topics, w.partitions)
    partition_leader(kafka.bootstrap, w.topic, 0)  # both replicas in sync before it starts
    partition_leader(kafka.bootstrap, w.java_sink, 0)
    w.start()
    mark("started")
    time.sleep(BEFORE_MOVE_S)
    w.wait_java_copying()
    mark("the Java copier copies")
    at_move = len(w.history.committed)
    # partition 0's leadership moves in the middle of transactions, and that of the Java
    # copier's output partition 0 while it writes there ...
    moved = move_leaders(kafka.bootstrap, [(w.topic, 0), (w.java_sink, 0)])
    victim = moved[w.topic, 0]
    mark(f"partition 0 moved to broker {victim}")
    w.fence_java_copier()  # ... the Java copier's producer is fenced: it makes a new one ...
    mark("the Java copier fenced")
    time.sleep(BEFORE_KILL_S)
    # ... and its new leader is killed with kill -9: it moves back to the other broker, which
    # holds every partition's second replica, with the coordinators the victim held
    kafka.kill_node(victim)
    at_kill = len(w.history.committed)
    mark(f"broker {victim} killed")
    time.sleep(AFTER_KILL_S)
    w.stop(kafka.status)
    mark("clients stopped")
    w.check()
    mark("checked")
    # the faults did happen, mid-run: transactions were committed before, between and after
    assert not kafka.nodes[victim].running()
    assert 0 < at_move < at_kill < len(w.history.committed), (at_move, at_kill, w.history)
