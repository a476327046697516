"""KIP-951 on a real two-broker local cluster: after a partition moves, a Produce v10+ sent to its
old leader is answered NOT_LEADER_OR_FOLLOWER with the partition's current leader (id and epoch)
and that leader's endpoint, the same ones a Metadata request advertises, so a producer re-routes
without asking Metadata first. A Produce v9 has no place for them and gets the bare error."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.codec import decode_response, encode_request
from tidalmq_broker.protocol.records import build_batch

from tests.support.local_cluster import LocalClusterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

TOPIC = "orders"
PRODUCE, METADATA = 0, 3


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


def metadata(address: tuple[str, int]) -> Any:
    body = {
        "topics": [{"name": TOPIC, "topic_id": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }
    return call(address, METADATA, 12, body)


def test_produce_to_the_old_leader_names_the_new_one(cluster: LocalClusterProcess) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    cluster.wait_settled()
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    brokers = {b.node_id: b for b in metadata((host, int(port))).brokers}
    assert len(brokers) == 2, brokers
    old = cluster.leaders(TOPIC)[0]
    old_address = (brokers[old].host, brokers[old].port)
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
