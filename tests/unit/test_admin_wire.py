"""admin_wire, the hand-written encoding of the requests `tidalmq reassign` sends, against kio's
(the broker's codec): each request it writes is what the broker decodes, each response the
broker writes is what it reads, field by field ([L1] item 5)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from tidalmq_broker import admin_wire
from tidalmq_broker.protocol.codec import decode_request, encode_response

SERVED = {3: (12, 12), 45: (0, 0), 46: (0, 0), 17: (1, 1), 36: (2, 2)}


def broker_reads(frame: bytes) -> Any:
    """The request as the broker decodes it (its size prefix is the framing's)."""
    request = decode_request(frame, SERVED)
    assert (request.client_id, request.correlation_id) == ("tidalmq-cli", 7)
    return request.body


def client_reads(api: tuple[int, int], body: dict[str, Any]) -> Any:
    frame = encode_response(*api, 7, body)
    correlation_id, response = admin_wire.read_response(api, frame[4:])
    assert correlation_id == 7
    return response


@pytest.mark.parametrize("topics", [None, [], ["orders", "événements"]])
def test_metadata_request(topics: list[str] | None) -> None:
    body = broker_reads(admin_wire.metadata_request(topics, 7, "tidalmq-cli"))
    if topics is None:
        assert body.topics is None
    else:
        assert [t.name for t in body.topics] == topics
        assert all(t.topic_id is None or t.topic_id.int == 0 for t in body.topics)
    assert body.allow_auto_topic_creation is False
    assert body.include_topic_authorized_operations is False


def test_metadata_response() -> None:
    topic_id = uuid.uuid4()
    md = client_reads(
        admin_wire.METADATA,
        {
            "throttle_time": 5,
            "brokers": [
                {"node_id": 0, "host": "a", "port": 9092, "rack": None},
                {"node_id": 1, "host": "b" * 200, "port": 9093, "rack": "r1"},
            ],
            "cluster_id": "c",
            "controller_id": 1,
            "topics": [
                {
                    "error_code": 0,
                    "name": "orders",
                    "topic_id": topic_id,
                    "is_internal": False,
                    "partitions": [
                        {
                            "error_code": 0,
                            "partition_index": i,
                            "leader_id": i % 2,
                            "leader_epoch": 3,
                            "replica_nodes": [i % 2],
                            "isr_nodes": [i % 2],
                            "offline_replicas": [],
                        }
                        for i in range(200)  # more than one byte of varint count
                    ],
                    "topic_authorized_operations": -2147483648,
                },
                {
                    "error_code": 3,
                    "name": "gone",
                    "topic_id": uuid.UUID(int=0),
                    "is_internal": False,
                    "partitions": [],
                    "topic_authorized_operations": -2147483648,
                },
            ],
        },
    )
    assert [(b.node_id, b.host, b.port, b.rack) for b in md.brokers] == [
        (0, "a", 9092, None),
        (1, "b" * 200, 9093, "r1"),
    ]
    assert (md.cluster_id, md.controller_id, md.throttle_time_ms) == ("c", 1, 5)
    orders, gone = md.topics
    assert (orders.name, orders.error_code, orders.topic_id) == ("orders", 0, topic_id.bytes)
    assert len(orders.partitions) == 200
    p = orders.partitions[199]
    assert (p.partition_index, p.leader_id, p.leader_epoch, p.replica_nodes) == (199, 1, 3, [1])
    assert (gone.name, gone.error_code, gone.error_code.name) == (
        "gone",
        3,
        "unknown_topic_or_partition",
    )


def test_alter_reassignments_request() -> None:
    body = broker_reads(
        admin_wire.alter_reassignments_request(
            1500, {"orders": [(0, [2]), (1, None)], "logs": [(4, [0])]}, 7, "tidalmq-cli"
        )
    )
    assert body.timeout == timedelta(milliseconds=1500)
    got = {
        (t.name, p.partition_index): (None if p.replicas is None else list(p.replicas))
        for t in body.topics
        for p in t.partitions
    }
    assert got == {("orders", 0): [2], ("orders", 1): None, ("logs", 4): [0]}


def test_alter_reassignments_response() -> None:
    resp = client_reads(
        admin_wire.ALTER_PARTITION_REASSIGNMENTS,
        {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "responses": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": 0, "error_code": 0, "error_message": None},
                        {"partition_index": 1, "error_code": 85, "error_message": "no move"},
                    ],
                }
            ],
        },
    )
    assert resp.error_code == 0 and resp.error_message is None
    (topic,) = resp.responses
    assert topic.name == "orders"
    assert [(p.partition_index, int(p.error_code), p.error_message) for p in topic.partitions] == [
        (0, 0, None),
        (1, 85, "no move"),
    ]
    assert topic.partitions[1].error_code.name == "no_reassignment_in_progress"


def test_list_reassignments() -> None:
    body = broker_reads(admin_wire.list_reassignments_request(60000, 7, "tidalmq-cli"))
    assert (body.timeout, body.topics) == (timedelta(seconds=60), None)
    resp = client_reads(
        admin_wire.LIST_PARTITION_REASSIGNMENTS,
        {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": 2,
                            "replicas": [0, 1],
                            "adding_replicas": [1],
                            "removing_replicas": [0],
                        }
                    ],
                }
            ],
        },
    )
    (topic,) = resp.topics
    (p,) = topic.partitions
    assert (topic.name, p.partition_index, p.replicas, p.adding_replicas, p.removing_replicas) == (
        "orders",
        2,
        [0, 1],
        [1],
        [0],
    )


def test_sasl() -> None:
    handshake = broker_reads(admin_wire.sasl_handshake_request("SCRAM-SHA-256", 7, "tidalmq-cli"))
    assert handshake.mechanism == "SCRAM-SHA-256"
    token = bytes(range(256))
    assert broker_reads(
        admin_wire.sasl_authenticate_request(token, 7, "tidalmq-cli")
    ).auth_bytes == (token)
    offered = client_reads(
        admin_wire.SASL_HANDSHAKE, {"error_code": 33, "mechanisms": ["PLAIN", "SCRAM-SHA-512"]}
    )
    assert (offered.error_code, offered.mechanisms) == (33, ["PLAIN", "SCRAM-SHA-512"])
    answer = client_reads(
        admin_wire.SASL_AUTHENTICATE,
        {
            "error_code": 0,
            "error_message": None,
            "auth_bytes": b"v=proof",
            "session_lifetime": 3_600_000,
        },
    )
    assert (answer.error_code, answer.auth_bytes, answer.session_lifetime_ms) == (
        0,
        b"v=proof",
        3_600_000,
    )


def test_a_short_response_is_a_value_error() -> None:
    frame = encode_response(
        *admin_wire.LIST_PARTITION_REASSIGNMENTS,
        7,
        {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": "truncated here",
            "topics": [],
        },
    )
    with pytest.raises(ValueError, match="response ends after"):
        admin_wire.read_response(admin_wire.LIST_PARTITION_REASSIGNMENTS, frame[4:-8])


def test_tagged_fields_the_client_does_not_know_are_skipped() -> None:
    r = admin_wire.Reader(b"\x02\x00\x03abc\x81\x01\x01z\x07")  # two tags: 3 bytes, 1 byte
    r.tags()
    assert r.uvarint() == 7
