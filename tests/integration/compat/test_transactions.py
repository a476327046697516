"""Transactions end to end on the 3-broker local cluster, with real clients: librdkafka's
transactional producer (confluent-kafka) commits a transaction over two topics whose partitions
are led by all three brokers, with consumer offsets (send_offsets_to_transaction), and aborts
another; the coordinator's `__transaction_state` partition moves to another broker in the middle
of a transaction, which still commits; a second producer with the same transactional.id fences the first (whose open
transaction is aborted); a transaction left open past its timeout is aborted by the coordinator;
a read_committed consumer sees exactly the committed records, the
group's offsets are those of the committed transaction, and `kafka-transactions list/describe`
show the transactional ids."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tidalmq_broker.transactions.records import partition_for_transactional_id
from tidalmq_core.metadata import TXN_STATE_TOPIC

from tests.integration.compat.conftest import name, tool
from tests.support.local_cluster import LocalClusterProcess

pytestmark = pytest.mark.integration

PARTITIONS = 3  # one per broker, so every transaction writes to partitions on all three


def producer(bootstrap: str, transactional_id: str, timeout_ms: int = 60_000) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": timeout_ms,
            "linger.ms": 5,
        }
    )


def produce_all(p: Producer, topics: list[str], tag: str) -> list[tuple[str, int, bytes]]:
    sent = []
    for topic in topics:
        for partition in range(PARTITIONS):
            value = f"{tag}-{topic}-{partition}".encode()
            p.produce(topic, value, partition=partition)
            sent.append((topic, partition, value))
    p.flush(10)
    return sent


def read_committed(
    bootstrap: str, topics: list[str], expected: int
) -> list[tuple[str, int, bytes]]:
    """Everything a read_committed consumer gets from the start: until `expected` records
    arrived, then one more second in which nothing else may arrive."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": name("reader"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(t, p, 0) for t in topics for p in range(PARTITIONS)])
    got: list[tuple[str, int, bytes]] = []
    deadline = time.monotonic() + 30
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.topic(), m.partition(), m.value()))
            if len(got) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + 1.0
            if quiet_until is not None and time.monotonic() > quiet_until:
                break
    finally:
        c.close()
    return sorted(got)


def test_transactions_commit_abort_fence_and_read_committed(
    tidalmq_cluster: LocalClusterProcess,
) -> None:
    bootstrap = tidalmq_cluster.bootstrap
    topics = [name("txn-a"), name("txn-b")]
    # one admin call (no JVM start per topic: kafka-topics is checked in its own tests)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        f.result(30)
    group, tid = name("txn-group"), name("txn-id")
    source = Consumer({"bootstrap.servers": bootstrap, "group.id": group})

    # left open past its 2 s timeout (the compat cluster checks every 0.5 s): aborted for it
    late_tid = name("txn-late")
    late = producer(bootstrap, late_tid, timeout_ms=2000)
    late.init_transactions(30)
    late.begin_transaction()
    produce_all(late, topics, "timed-out")
    late_started = time.monotonic()

    p1 = producer(bootstrap, tid)
    p1.init_transactions(30)
    p1.begin_transaction()
    committed = produce_all(p1, topics, "committed")
    p1.send_offsets_to_transaction(
        [TopicPartition(topics[0], 0, 42)], source.consumer_group_metadata(), 10
    )
    p1.commit_transaction(30)

    # the coordinator moves mid-transaction: the new one replays the state and commits
    cluster = tidalmq_cluster
    p1.begin_transaction()
    committed += produce_all(p1, topics, "moved")
    leaders = cluster.leaders(TXN_STATE_TOPIC)
    state_partition = partition_for_transactional_id(tid, len(leaders))
    target = (leaders[state_partition] + 1) % 3
    cluster.reassign({(TXN_STATE_TOPIC, state_partition): target})
    cluster.wait_settled()
    assert cluster.leaders(TXN_STATE_TOPIC)[state_partition] == target
    p1.commit_transaction(30)

    p1.begin_transaction()
    produce_all(p1, topics, "aborted")
    p1.abort_transaction(30)

    p1.begin_transaction()
    produce_all(p1, topics, "zombie")  # left open: the next incarnation aborts it
    p2 = producer(bootstrap, tid)
    p2.init_transactions(30)
    with pytest.raises(KafkaException) as fenced:
        p1.commit_transaction(10)
    assert fenced.value.args[0].fatal() or "fenced" in str(fenced.value).lower(), fenced.value

    time.sleep(max(0.0, late_started + 3.0 - time.monotonic()))
    with pytest.raises(KafkaException):  # its epoch was bumped by the abort: fenced
        late.commit_transaction(10)

    assert read_committed(bootstrap, topics, len(committed)) == sorted(committed)
    (offset,) = source.committed([TopicPartition(topics[0], 0)], timeout=10)
    assert offset.offset == 42
    source.close()

    listed = tool("kafka-transactions", "list", bootstrap=bootstrap)
    assert tid in listed, listed
    (late_row,) = [line.split() for line in listed.splitlines() if late_tid in line]
    assert late_row[-1] == "CompleteAbort", listed
    described = tool(
        "kafka-transactions", "describe", "--transactional-id", tid, bootstrap=bootstrap
    )
    assert "CompleteAbort" in described or "Empty" in described, described
    p2.flush(5)
