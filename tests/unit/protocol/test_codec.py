"""Framing and (de)serialisation through kio's generated schemas."""

from __future__ import annotations

import uuid

import pytest
from tidalmq_broker.protocol.codec import (
    MalformedRequest,
    UnsupportedApi,
    UnsupportedVersion,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    peek_header,
)
from tidalmq_broker.protocol.entities import build

SUPPORTED = {0: (3, 11), 3: (0, 12), 18: (0, 3)}


def test_request_round_trip_keeps_records_as_bytes() -> None:
    body = {
        "acks": -1,
        "timeout": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 2, "records": b"\x01\x02"}]}],
    }
    frame = encode_request(0, 9, 77, body, client_id="c1")
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    req = decode_request(frame[4:], SUPPORTED)
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (0, 9, 77, "c1")
    part = req.body.topic_data[0].partition_data[0]
    assert part.index == 2 and bytes(part.records) == b"\x01\x02"


def test_unknown_api_and_unsupported_version() -> None:
    frame = encode_request(
        3, 12, 1, {"topics": None, "include_topic_authorized_operations": False}
    )[4:]
    with pytest.raises(UnsupportedApi):
        decode_request(frame, {18: (0, 3)})
    with pytest.raises(UnsupportedVersion) as info:
        decode_request(frame, {3: (0, 11)})
    assert info.value.correlation_id == 1


@pytest.mark.parametrize("frame", [b"", b"\x00\x03", b"\x00\x03\x00\x0c\x00\x00\x00\x01\xff"])
def test_garbage_is_malformed(frame: bytes) -> None:
    with pytest.raises(MalformedRequest):
        decode_request(frame, SUPPORTED)


def test_trailing_bytes_are_ignored_like_kafka_does() -> None:
    frame = encode_request(18, 0, 5, {})[4:] + b"junk"
    assert decode_request(frame, SUPPORTED).correlation_id == 5


def test_response_built_from_dicts_for_old_and_new_versions() -> None:
    topic_id = uuid.uuid4()
    body = {
        "throttle_time": 0,
        "brokers": [{"node_id": 1, "host": "h", "port": 9, "rack": None}],
        "cluster_id": "c",
        "controller_id": 1,
        "topics": [
            {
                "error_code": 0,
                "name": "t",
                "topic_id": topic_id,
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": 0,
                        "partition_index": 0,
                        "leader_id": 1,
                        "leader_epoch": 3,
                        "replica_nodes": [1],
                        "isr_nodes": [1],
                        "offline_replicas": [],
                    }
                ],
            },
        ],
    }
    for version in (0, 1, 5, 9, 12):
        frame = encode_response(3, version, 42, body)
        corr, decoded = decode_response(3, version, frame[4:])
        assert corr == 42
        assert decoded.topics[0].name == "t"
        assert decoded.topics[0].partitions[0].leader_id == 1
        if version >= 10:
            assert decoded.topics[0].topic_id == topic_id


def test_build_reports_missing_required_fields() -> None:
    from kio.index import load_response_schema

    with pytest.raises(KeyError, match="error_code"):
        build(load_response_schema(12, 4), {"throttle_time": 0})


def test_peek_header() -> None:
    frame = encode_request(18, 3, 99, {"client_software_name": "x", "client_software_version": "1"})
    assert peek_header(frame[4:]) == (18, 3, 99)
