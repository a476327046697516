"""Bad input gets a clear Kafka error or a closed connection, and the broker keeps serving."""

from __future__ import annotations

import socket
import struct

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.codec import decode_response, encode_request
from tidalmq_broker.protocol.records import build_batch

from tests.integration.broker.clients import consume_all, create_topic, producer
from tests.integration.broker.conftest import topic_name
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration


class RawClient:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.correlation = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        head = self._recv_exact(4)
        (size,) = struct.unpack(">i", head)
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by broker")
            buf += chunk
        return buf

    def call(self, api_key: int, version: int, body: dict) -> object:
        self.correlation += 1
        self.send_raw(encode_request(api_key, version, self.correlation, body))
        corr, resp = decode_response(api_key, version, self.recv_frame())
        assert corr == self.correlation
        return resp

    def is_closed_by_broker(self) -> bool:
        try:
            self.sock.settimeout(10)
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def assert_still_serving(broker: BrokerProcess) -> None:
    topic = topic_name()
    create_topic(broker.bootstrap, topic, 1)
    p = producer(broker.bootstrap)
    p.produce(topic, value=b"alive")
    assert p.flush(20) == 0
    assert [m.value() for m in consume_all(broker.bootstrap, topic, 1, timeout_s=20)] == [b"alive"]


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(struct.pack(">i", -5), id="negative-size"),
        pytest.param(struct.pack(">i", 2_000_000_000), id="oversize"),
        pytest.param(struct.pack(">i", 12) + b"\x00\x00\x00\x09garbage!", id="garbage-frame"),
        pytest.param(struct.pack(">i", 8) + struct.pack(">hhi", 9999, 0, 1), id="unknown-api"),
        pytest.param(
            struct.pack(">i", 8) + struct.pack(">hhi", 0, 99, 1), id="unsupported-version"
        ),
        pytest.param(struct.pack(">i", 2) + b"\x00\x00", id="short-header"),
    ],
)
def test_bad_frames_close_only_that_connection(local_broker: BrokerProcess, payload: bytes) -> None:
    bystander = RawClient(local_broker.bootstrap)
    bad = RawClient(local_broker.bootstrap)
    bad.send_raw(payload)
    assert bad.is_closed_by_broker()
    bad.close()
    resp = bystander.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert resp.error_code == ErrorCode.none  # type: ignore[attr-defined]
    bystander.close()
    assert_still_serving(local_broker)


def test_half_a_frame_then_disconnect(local_broker: BrokerProcess) -> None:
    c = RawClient(local_broker.bootstrap)
    c.send_raw(struct.pack(">i", 1000) + b"\x00" * 100)
    c.close()
    assert_still_serving(local_broker)


def test_unsupported_api_versions_version_is_answered_in_v0(local_broker: BrokerProcess) -> None:
    c = RawClient(local_broker.bootstrap)
    c.send_raw(struct.pack(">i", 10) + struct.pack(">hhi", 18, 99, 7) + b"\xff\xff")
    corr, resp = decode_response(18, 0, c.recv_frame())
    assert corr == 7
    assert resp.error_code == ErrorCode.unsupported_version
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert keys[18] == (0, 4) and 0 in keys and 1 in keys
    c.close()


def test_api_versions_advertises_every_served_api(local_broker: BrokerProcess) -> None:
    c = RawClient(local_broker.bootstrap)
    resp = c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    served = {k.api_key for k in resp.api_keys}  # type: ignore[attr-defined]
    required = {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 32, 37}
    assert required <= served
    c.close()


def test_corrupt_and_old_format_batches_get_error_codes(local_broker: BrokerProcess) -> None:
    topic = topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    good = build_batch([(b"k", b"v")])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    old = bytearray(good)
    old[16] = 1  # magic v1
    c = RawClient(local_broker.bootstrap)
    for records, code in [
        (bytes(corrupt), ErrorCode.corrupt_message),
        (bytes(old), ErrorCode.unsupported_for_message_format),
        (good[:40], ErrorCode.corrupt_message),
        (good, ErrorCode.none),
    ]:
        resp = c.call(
            0,
            9,
            {
                "acks": -1,
                "timeout": 5000,
                "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": records}]}
                ],
            },
        )
        part = resp.responses[0].partition_responses[0]  # type: ignore[attr-defined]
        assert part.error_code == code, (code, part)
    # unknown partition and unknown topic
    resp = c.call(
        0,
        9,
        {
            "acks": -1,
            "timeout": 5000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": 7, "records": good}]},
                {"name": "nope-" + topic, "partition_data": [{"index": 0, "records": good}]},
            ],
        },
    )
    codes = [t.partition_responses[0].error_code for t in resp.responses]  # type: ignore[attr-defined]
    assert codes == [ErrorCode.unknown_topic_or_partition] * 2
    # invalid acks
    resp = c.call(
        0,
        9,
        {
            "acks": 2,
            "timeout": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": good}]}],
        },
    )
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.invalid_required_acks  # type: ignore[attr-defined]
    # fetch out of range
    resp = c.call(
        1,
        12,
        {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "replica_id": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 99, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    assert resp.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range  # type: ignore[attr-defined]
    c.close()
    assert_still_serving(local_broker)


def metadata_request(topics: list[dict[str, object]]) -> dict[str, object]:
    return {
        "topics": topics,
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
        "include_cluster_authorized_operations": False,  # v8-v10
    }


def test_a_metadata_topic_without_name_or_id_is_an_unknown_topic_id(
    local_broker: BrokerProcess,
) -> None:
    """Metadata v10+ with a null name and the zero id (which kio reads as None) raised ValueError
    in the handler and closed the connection."""
    c = RawClient(local_broker.bootstrap)
    for version in (10, 12, 13):
        resp = c.call(3, version, metadata_request([{"name": None, "topic_id": None}]))
        (topic,) = resp.topics  # type: ignore[attr-defined]
        assert topic.error_code == ErrorCode.unknown_topic_id, version
    c.close()


def test_a_topic_named_twice_in_delete_topics_is_refused_not_deleted(
    local_broker: BrokerProcess,
) -> None:
    """The controller deleted a twice-named topic twice over (KeyError in its commit); Kafka
    answers INVALID_REQUEST for each entry of a duplicated name and deletes nothing of it."""
    topic, other = topic_name(), topic_name()
    create_topic(local_broker.bootstrap, topic, 1)
    create_topic(local_broker.bootstrap, other, 1)
    c = RawClient(local_broker.bootstrap)
    named = [{"name": topic, "topic_id": None}] * 2 + [{"name": other, "topic_id": None}]
    resp = c.call(20, 6, {"topics": named, "timeout": 10_000})
    codes = [(r.name, r.error_code) for r in resp.responses]  # type: ignore[attr-defined]
    assert codes == [
        (topic, ErrorCode.invalid_request),
        (topic, ErrorCode.invalid_request),
        (other, ErrorCode.none),
    ]
    resp = c.call(20, 4, {"topic_names": [topic, topic], "timeout": 10_000})
    codes = {r.error_code for r in resp.responses}  # type: ignore[attr-defined]
    assert codes == {ErrorCode.invalid_request}
    metadata = c.call(3, 12, metadata_request([{"name": topic, "topic_id": None}]))
    assert metadata.topics[0].error_code == ErrorCode.none  # type: ignore[attr-defined]
    c.close()
