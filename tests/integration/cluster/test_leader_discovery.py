"""KIP-951 on a real two-broker local cluster: after a partition moves, a Produce v10+ or a Fetch
v16+ sent to its old leader is answered NOT_LEADER_OR_FOLLOWER with the partition's current leader
(id and epoch) and that leader's endpoint, the same ones a Metadata request advertises, so a
producer or consumer re-routes without asking Metadata first; a Fetch to the new leader with the
old leader epoch is answered FENCED_LEADER_EPOCH with the same hints. A Produce v9 or a Fetch v15
has no place for them and gets the bare error. A producer writing through moves is held through
each handover and sent to the new leader by the answer (handover.py)."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.codec import decode_response, encode_request
from tidalmq_broker.protocol.records import build_batch

from tests.support.client_log import captured_client_log
from tests.support.fetch_requests import fetch_body
from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

TOPIC = "orders"
PRODUCE, FETCH, METADATA = 0, 1, 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalClusterProcess]:
    c = LocalClusterProcess(tmp_path / "cluster", brokers=2)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def call(address: tuple[str, int], api_key: int, version: int, body: dict[str, Any]) -> Any:
    """One request on a connection of its own, answered by the broker at `address`."""
    with socket.create_connection(address, timeout=15) as sock:
        sock.sendall(encode_request(api_key, version, 7, body, client_id="kip-951"))
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        correlation_id, response = decode_response(api_key, version, _recv_exact(sock, size))
    assert correlation_id == 7
    return response


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return buf


def produce(address: tuple[str, int], version: int) -> Any:
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 10_000,
        "topic_data": [
            {
                "name": TOPIC,
                "partition_data": [{"index": 0, "records": build_batch([(b"k", b"v")])}],
            }
        ],
    }
    return call(address, PRODUCE, version, body)


def fetch(address: tuple[str, int], version: int, topic_id: uuid.UUID, leader_epoch: int) -> Any:
    """A consumer's Fetch (v13+: the topic by id) of partition 0 from offset 0, as a client that
    knows `leader_epoch` (-1: none) sends it."""
    return call(address, FETCH, version, fetch_body(version, topic_id, leader_epoch=leader_epoch))


def hints(answer: Any) -> tuple[int, tuple[int, int], list[tuple[int, str, int, str | None]]]:
    """A Fetch answer's (error, current leader, node endpoints) for its one partition."""
    part = answer.responses[0].partitions[0]
    leader = (part.current_leader.leader_id, part.current_leader.leader_epoch)
    endpoints = [
        (e.node_id, e.host, e.port, e.rack) for e in getattr(answer, "node_endpoints", ())
    ]  # no such field before v16
    return part.error_code, leader, endpoints


def metadata(address: tuple[str, int]) -> Any:
    body = {
        "topics": [{"name": TOPIC, "topic_id": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }
    return call(address, METADATA, 12, body)


def test_produce_and_fetch_to_the_old_leader_name_the_new_one(
    cluster: LocalClusterProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    brokers = {b.node_id: b for b in metadata((host, int(port))).brokers}
    assert len(brokers) == 2, brokers
    old = cluster.leaders(TOPIC)[0]
    old_address = (brokers[old].host, brokers[old].port)
    before = metadata(old_address).topics[0]
    topic_id, old_epoch = before.topic_id, before.partitions[0].leader_epoch
    first = produce(old_address, 11).responses[0].partition_responses[0]
    assert first.error_code == ErrorCode.none, first  # the leader takes it: no hint
    assert (first.current_leader.leader_id, first.current_leader.leader_epoch) == (-1, -1)

    new = next(b for b in brokers if b != old)
    cluster.reassign({(TOPIC, 0): new})
    cluster.wait_settled()
    assert cluster.leaders(TOPIC) == [new]

    # the old leader answers from its metadata image, which follows the controller's within a
    # heartbeat or so: wait until it names the new leader (it may name none just before)
    deadline = time.monotonic() + 30
    while True:
        answer = produce(old_address, 11)
        part = answer.responses[0].partition_responses[0]
        if part.current_leader.leader_id == new or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert part.error_code == ErrorCode.not_leader_or_follower, part
    advertised = metadata((brokers[new].host, brokers[new].port))
    partition = advertised.topics[0].partitions[0]
    assert partition.leader_id == new
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (
        new,
        partition.leader_epoch,
    )
    leader = next(b for b in advertised.brokers if b.node_id == new)
    assert [(e.node_id, e.host, e.port, e.rack) for e in answer.node_endpoints] == [
        (new, leader.host, leader.port, leader.rack)
    ]

    # the redirect works: the named endpoint takes the produce
    redirected = produce((answer.node_endpoints[0].host, answer.node_endpoints[0].port), 11)
    assert redirected.responses[0].partition_responses[0].error_code == ErrorCode.none

    # Produce v9 has no tagged fields for it: the bare error, as before KIP-951
    old_version = produce(old_address, 9)
    part = old_version.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.not_leader_or_follower

    # a consumer's Fetch v16 to the old leader: the same hints, for the same partition
    expected_endpoint = [(new, leader.host, leader.port, leader.rack)]
    assert hints(fetch(old_address, 16, topic_id, old_epoch)) == (
        ErrorCode.not_leader_or_follower,
        (new, partition.leader_epoch),
        expected_endpoint,
    )
    # and to the new leader with the epoch it knew: fenced, told the current epoch
    new_address = (answer.node_endpoints[0].host, answer.node_endpoints[0].port)
    assert partition.leader_epoch > old_epoch
    assert hints(fetch(new_address, 17, topic_id, old_epoch)) == (
        ErrorCode.fenced_leader_epoch,
        (new, partition.leader_epoch),
        expected_endpoint,
    )
    # the named leader and epoch take the fetch: both records, no hints
    read = fetch(new_address, 17, topic_id, partition.leader_epoch)
    assert hints(read) == (ErrorCode.none, (-1, -1), [])
    assert read.responses[0].partitions[0].high_watermark == 2
    # Fetch v15 has the partition's tagged field but, as in Kafka, no hints: the bare error
    assert hints(fetch(old_address, 15, topic_id, old_epoch)) == (
        ErrorCode.not_leader_or_follower,
        (-1, -1),
        [],
    )


def leader_hints_sent(cluster: LocalClusterProcess) -> dict[tuple[int, str], float]:
    """Each broker's `tidalmq_leader_hints_total` by API, from its /metrics."""
    return {
        (broker, labels["api"]): value
        for broker, labels, value in cluster.metric_samples("tidalmq_leader_hints_total")
    }


def logged_producer(
    cluster: LocalClusterProcess, name: str, *, linger_ms: int
) -> tuple[Producer, list[str]]:
    """An idempotent librdkafka producer (acks=all) whose metadata debug lines are captured
    (where its "updated with leader" line shows a KIP-951 hint taken), with no periodic
    metadata refresh: its metadata stays what it was before a move."""
    logger, client_log = captured_client_log(name)
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "debug": "metadata",
            "topic.metadata.refresh.interval.ms": 600_000,
        },
        logger=logger,
    )
    return producer, client_log


def test_a_producer_moves_to_the_leader_the_old_one_names(
    cluster: LocalClusterProcess,
) -> None:
    """librdkafka (2.5+, Produce v10+) whose metadata predates a move, as a producer's does when
    it was idle during the move (no periodic refresh here): its next batch goes to the old
    leader, which answers NOT_LEADER_OR_FOLLOWER naming the new leader (counted in
    tidalmq_leader_hints_total); the producer takes the leader from that answer (its
    METADATAUPDATE line "updated with leader", written for KIP-951 hints only: a Metadata
    answer is logged as "Topic orders [0] Leader ...") and every record is delivered once, in
    order. Without the hints the producer learns the leader from a Metadata request only."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    old = cluster.leaders(TOPIC)[0]
    addresses = {b.node_id: (b.host, b.port) for b in metadata(_bootstrap(cluster)).brokers}
    new = next(b for b in addresses if b != old)
    producer, client_log = logged_producer(cluster, "kip-951-producer", linger_ms=5)
    delivered: list[int] = []  # offsets
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered.append(msg.offset())

    def produce_some(n: int) -> None:
        for i in range(n):
            producer.produce(TOPIC, value=b"%d" % i, partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0

    produce_some(20)
    cluster.reassign({(TOPIC, 0): new})
    cluster.wait_settled()
    assert cluster.leaders(TOPIC) == [new]
    # the old leader answers from its metadata image, a heartbeat or so behind the controller's
    deadline = time.monotonic() + 30
    while metadata(addresses[old]).topics[0].partitions[0].leader_id != new:
        assert time.monotonic() < deadline, "the old leader's image never named the new one"
        time.sleep(0.2)
    before = leader_hints_sent(cluster)
    moved = f"updated with leader {new} "
    assert not any(moved in line for line in client_log)

    produce_some(20)
    assert failed == []
    assert any(moved in line for line in client_log), "\n".join(client_log[-40:])
    after = leader_hints_sent(cluster)
    assert after.get((old, "produce"), 0) > before.get((old, "produce"), 0), (before, after)
    assert delivered == list(range(40))  # every record once, in order, on both leaders


HANDOVER_MOVES = 6


@pytest.mark.timeout(180, func_only=True)
def test_a_producer_writing_through_moves_is_held_and_redirected_not_refused(
    cluster: LocalClusterProcess,
) -> None:
    """A producer writing through moves on a real two-broker local cluster ([L1] item 4,
    handover.py): its requests for the partition in a handover are held instead of answered at once.
    The source holds them while the partition is leaderless and then answers
    NOT_LEADER_OR_FOLLOWER naming the elected target (KIP-951), so librdkafka goes there from the
    answer; the target holds them while it opens the partition and appends them then, in order. No
    partition is ever answered LEADER_NOT_AVAILABLE, and every record is acknowledged once, in
    order. With `produce_handover_wait_ms` 0 (the behaviour before) the source names no leader, the
    producer asks Metadata and backs off, and may meet the target still opening."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    producer, client_log = logged_producer(cluster, "handover-producer", linger_ms=1)
    delivered: list[tuple[int, bytes]] = []  # (offset, value) in acknowledgement order
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered.append((msg.offset(), msg.value()))

    stop = threading.Event()
    sent = 0

    def write() -> None:  # a record every ~2 ms, throughout the moves
        nonlocal sent
        while not stop.is_set():
            producer.produce(TOPIC, value=b"%d" % sent, partition=0, on_delivery=on_delivery)
            sent += 1
            producer.poll(0.002)

    before = cluster.metric_totals("tidalmq_produce_handover_holds_total", "outcome")
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        for _ in range(HANDOVER_MOVES):
            time.sleep(0.3)
            source = cluster.leaders(TOPIC)[0]
            target = next(b["broker"] for b in cluster.status()["brokers"] if b["broker"] != source)
            cluster.reassign({(TOPIC, 0): target})
            cluster.wait_settled()
            assert cluster.leaders(TOPIC) == [target]
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join(10)
    assert producer.flush(30) == 0
    assert failed == []
    held = cluster.metric_totals("tidalmq_produce_handover_holds_total", "outcome") - before
    refused = cluster.metric_totals("tidalmq_produce_errors_total", "error")

    # every record acknowledged once, at consecutive offsets, in the order it was sent
    assert [value for _, value in sorted(delivered)] == [b"%d" % i for i in range(sent)]
    assert [offset for offset, _ in sorted(delivered)] == list(range(sent))
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "handover-check",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(read) < sent and time.monotonic() < deadline:
        for msg in consumer.consume(500, timeout=1):
            assert msg.error() is None, msg.error()
            read.append(msg.value())
    consumer.close()
    assert read == [b"%d" % i for i in range(sent)]

    # the source held the producer's requests while the partition had no leader and answered
    # them naming the target; nothing was refused as LEADER_NOT_AVAILABLE (the target held
    # what came while it opened), and librdkafka took the leader from the answers
    print(f"held through {HANDOVER_MOVES} moves: {dict(held)}; refused: {dict(refused)}")
    assert held["redirected"] >= HANDOVER_MOVES // 2, (held, refused)
    assert held["timed_out"] == 0 and held["failed"] == 0, held
    assert refused["leader_not_available"] == 0, refused
    assert any(" updated with leader " in line for line in client_log), "\n".join(client_log[-40:])


def _bootstrap(cluster: LocalClusterProcess) -> tuple[str, int]:
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)
