"""The hand-written Produce and Fetch response encoders write exactly what kio writes for the same
response, in every version the broker serves, and kio's decoder reads them back; the hand-written
Produce request decoder reads what kio's encoder writes, leaving record sets in the frame."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.codec import (
    MalformedRequest,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    encode_response_parts,
)
from tidalmq_broker.protocol.fastpath import (
    decode_produce_request,
    encode_fetch_response,
    encode_produce_response,
)
from tidalmq_broker.protocol.records import build_batch

PRODUCE_VERSIONS = range(3, 13)
FETCH_VERSIONS = range(4, 18)
EVENTS_ID = uuid.UUID("5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b")  # Fetch v13+ names topics by id


def _topic(version: int, name: str, topic_id: uuid.UUID) -> dict[str, object]:
    """A FetchResponse topic as kio's schema has it: by name up to v12, by id from v13."""
    return {"topic": name} if version < 13 else {"topic_id": topic_id}


def _join(parts: bytes | list[bytes | memoryview]) -> bytes:
    return parts if isinstance(parts, bytes) else b"".join(parts)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_matches_kio(version: int) -> None:
    partitions = [
        (0, 0, 1234, -1, 0, None),
        (7, ErrorCode.not_leader_or_follower.value, -1, -1, -1, "led élsewhere"),
        (2, 0, 1 << 40, 1795306022811, 17, None),
    ]
    fast = encode_produce_response(version, [("topic-a", partitions[:2]), ("b", partitions[2:])])
    frame = _join(encode_response_parts(0, version, 99, fast))

    def as_dict(p: tuple[int, int, int, int, int, str | None]) -> dict[str, object]:
        index, error, base, append_time, log_start, message = p
        return {
            "index": index,
            "error_code": ErrorCode(error),
            "base_offset": base,
            "log_append_time": append_time if append_time >= 0 else None,
            "log_start_offset": log_start,
            "record_errors": [],
            "error_message": message,
        }

    reference = encode_response(
        0,
        version,
        99,
        {
            "responses": [
                {"name": "topic-a", "partition_responses": [as_dict(p) for p in partitions[:2]]},
                {"name": "b", "partition_responses": [as_dict(partitions[2])]},
            ],
            "throttle_time": 0,
        },
    )
    assert frame == reference
    correlation_id, body = decode_response(0, version, frame[4:])
    assert correlation_id == 99
    second = body.responses[0].partition_responses[1]
    assert second.error_code == ErrorCode.not_leader_or_follower
    if version >= 8:
        assert second.error_message == "led élsewhere"
    assert body.responses[1].partition_responses[0].base_offset == 1 << 40


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_tells_the_current_leader_as_kio_does(version: int) -> None:
    """KIP-951: from v10 a partition answered NOT_LEADER_OR_FOLLOWER carries its current leader
    (a tagged field) and the response the leaders' endpoints (another); a leader of (-1, -1) is
    Kafka's default and not written. Older versions have no place for either."""
    not_leader = ErrorCode.not_leader_or_follower.value
    partitions = [
        (0, 0, 5, -1, 0, None),
        (1, not_leader, -1, -1, -1, None),
        (2, not_leader, -1, -1, -1, "led élsewhere"),
        (3, not_leader, -1, -1, -1, None),
    ]
    leaders = {("orders", 1): (2, 7), ("orders", 2): (3, 1 << 30), ("orders", 3): (-1, -1)}
    endpoints = [(2, "broker-2.tidalmq.svc", 9092, "eu-west-1a"), (3, "10.0.0.3", 19092, None)]
    fast = encode_produce_response(
        version, [("orders", partitions)], current_leaders=leaders, node_endpoints=endpoints
    )
    frame = _join(encode_response_parts(0, version, 8, fast))
    hints = version >= 10

    def as_dict(p: tuple[int, int, int, int, int, str | None]) -> dict[str, object]:
        index, error, base, _, log_start, message = p
        out: dict[str, object] = {
            "index": index,
            "error_code": ErrorCode(error),
            "base_offset": base,
            "log_append_time": None,
            "log_start_offset": log_start,
            "record_errors": [],
            "error_message": message,
        }
        leader = leaders.get(("orders", index))
        if hints and leader is not None:
            out["current_leader"] = {"leader_id": leader[0], "leader_epoch": leader[1]}
        return out

    body: dict[str, object] = {
        "responses": [{"name": "orders", "partition_responses": [as_dict(p) for p in partitions]}],
        "throttle_time": 0,
    }
    if hints:
        body["node_endpoints"] = [
            {"node_id": n, "host": h, "port": port, "rack": rack} for n, h, port, rack in endpoints
        ]
    assert frame == encode_response(0, version, 8, body)
    _, decoded = decode_response(0, version, frame[4:])
    answered = decoded.responses[0].partition_responses
    if not hints:
        assert frame == _join(
            encode_response_parts(
                0, version, 8, encode_produce_response(version, [("orders", partitions)])
            )
        )
        return
    assert [(p.current_leader.leader_id, p.current_leader.leader_epoch) for p in answered] == [
        (-1, -1),
        (2, 7),
        (3, 1 << 30),
        (-1, -1),
    ]
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == endpoints


def test_produce_response_without_leaders_has_no_tagged_fields() -> None:
    """The common answer (no partition misdirected) is byte for byte what it was before KIP-951."""
    partitions = [(0, 0, 5, -1, 0, None)]
    plain = encode_produce_response(11, [("t", partitions)])
    hinted = encode_produce_response(11, [("t", partitions)], current_leaders={}, node_endpoints=())
    assert plain.parts == hinted.parts
    assert plain.parts[0].endswith(b"\x00\x00\x00\x00\x00\x00")  # throttle 0, no tags


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_carries_record_errors_as_kio_does(version: int) -> None:
    """KIP-467: from v8 a partition whose batch was refused for some of its records names them
    (batch index, message or null) next to its error message; the other partitions' record
    errors stay empty. Older versions have no place for them."""
    invalid_record = ErrorCode.invalid_record.value
    partitions = [
        (0, 0, 5, -1, 0, None),
        (1, invalid_record, -1, -1, -1, "One or more records have been rejected"),
        (2, ErrorCode.invalid_timestamp.value, -1, -1, -1, None),
    ]
    refused = {
        ("logs", 1): [(0, "Compacted topic cannot accept message without key"), (7, "ünïcode")],
        ("logs", 2): [(1 << 20, None)],
    }
    fast = encode_produce_response(version, [("logs", partitions)], record_errors=refused)
    frame = _join(encode_response_parts(0, version, 3, fast))

    def as_dict(p: tuple[int, int, int, int, int, str | None]) -> dict[str, object]:
        index, error, base, _, log_start, message = p
        errors = refused.get(("logs", index), []) if version >= 8 else []
        return {
            "index": index,
            "error_code": ErrorCode(error),
            "base_offset": base,
            "log_append_time": None,
            "log_start_offset": log_start,
            "record_errors": [
                {"batch_index": i, "batch_index_error_message": m} for i, m in errors
            ],
            "error_message": message,
        }

    body = {
        "responses": [{"name": "logs", "partition_responses": [as_dict(p) for p in partitions]}],
        "throttle_time": 0,
    }
    assert frame == encode_response(0, version, 3, body)
    _, decoded = decode_response(0, version, frame[4:])
    answered = decoded.responses[0].partition_responses
    if version < 8:
        plain = encode_produce_response(version, [("logs", partitions)])
        assert fast.parts == plain.parts
        return
    named = [
        [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] for p in answered
    ]
    assert named == [[], *refused.values()]
    assert answered[1].error_message == "One or more records have been rejected"


def test_produce_response_without_record_errors_is_unchanged() -> None:
    """No partition refused for its records: the bytes are those of a response without them."""
    partitions = [(0, 0, 5, -1, 0, None)]
    for version in PRODUCE_VERSIONS:
        plain = encode_produce_response(version, [("t", partitions)])
        empty = encode_produce_response(version, [("t", partitions)], record_errors={})
        assert plain.parts == empty.parts


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_response_matches_kio(version: int) -> None:
    batch = build_batch([(b"k", b"v" * 300), (None, b"w")], base_offset=40)
    partitions = [
        (0, 0, 42, 42, 3, (), memoryview(batch)),
        (1, 0, 10, 7, 0, [(1 << 40, 2), (9, 5)], b""),  # read_committed: aborted transactions
        (5, ErrorCode.offset_out_of_range.value, -1, -1, -1, None, b""),
        (6, ErrorCode.not_leader_or_follower.value, -1, -1, -1, None, None),
    ]
    key = "events" if version < 13 else EVENTS_ID
    fast = encode_fetch_response(version, [(key, partitions)], session_id=0)
    parts = encode_response_parts(1, version, 5, fast)
    assert isinstance(parts, list)
    assert any(p is partitions[0][6] for p in parts), "records are written without a copy"
    frame = _join(parts)

    def as_dict(p: tuple) -> dict[str, object]:  # type: ignore[type-arg]
        index, error, hw, lso, log_start, aborted, records = p
        return {
            "partition_index": index,
            "error_code": ErrorCode(error),
            "high_watermark": hw,
            "last_stable_offset": lso,
            "log_start_offset": log_start,
            "aborted_transactions": None
            if aborted is None
            else [{"producer_id": pid, "first_offset": first} for pid, first in aborted],
            "records": None if records is None else bytes(records),
        }

    reference = encode_response(
        1,
        version,
        5,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "session_id": 0,
            "responses": [
                {
                    **_topic(version, "events", EVENTS_ID),
                    "partitions": [as_dict(p) for p in partitions],
                }
            ],
        },
    )
    assert frame == reference
    _, body = decode_response(1, version, frame[4:])
    if version >= 13:
        assert body.responses[0].topic_id == EVENTS_ID
    first = body.responses[0].partitions[0]
    assert bytes(first.records) == batch and first.high_watermark == 42
    second = body.responses[0].partitions[1]
    assert [(a.producer_id, a.first_offset) for a in second.aborted_transactions] == [
        (1 << 40, 2),
        (9, 5),
    ]


@pytest.mark.parametrize("version", [4, 7, 12, 13, 15, 17])
def test_fetch_error_response(version: int) -> None:
    code = ErrorCode.not_leader_or_follower
    key = "t" if version < 13 else EVENTS_ID
    fast = encode_fetch_response(
        version, [(key, [(3, code.value, -1, -1, -1, None, None)])], error_code=code.value
    )
    _, body = decode_response(1, version, _join(encode_response_parts(1, version, 1, fast))[4:])
    part = body.responses[0].partitions[0]
    assert part.error_code == code and part.records is None
    if version >= 7:
        assert body.error_code == code


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_response_tells_the_current_leader_as_kio_does(version: int) -> None:
    """KIP-951 for consumers: from v16 a partition answered NOT_LEADER_OR_FOLLOWER or
    FENCED_LEADER_EPOCH carries its current leader (the partition's tagged field 1) and the
    response the leaders' endpoints (its tagged field 0); (-1, -1) is the default and not
    written. Before v16 they are left out, as Kafka leaves them (v12-v15 have the partition's
    field but Kafka fills it only from v16)."""
    not_leader = ErrorCode.not_leader_or_follower.value
    fenced = ErrorCode.fenced_leader_epoch.value
    other_id = uuid.UUID(int=(1 << 127) | 12345)
    key_a = "events" if version < 13 else EVENTS_ID
    key_b = "audit" if version < 13 else other_id
    batch = build_batch([(None, b"x" * 64)], base_offset=3)
    topics = [
        (
            key_a,
            [
                (0, 0, 4, 4, 0, (), memoryview(batch)),
                (1, not_leader, -1, -1, -1, None, b""),
                (2, fenced, -1, -1, -1, None, b""),
            ],
        ),
        (key_b, [(1, not_leader, -1, -1, -1, None, b""), (4, not_leader, -1, -1, -1, None, b"")]),
    ]
    leaders = {
        (key_a, 1): (2, 7),
        (key_a, 2): (3, 1 << 30),
        (key_b, 1): (2, 9),
        (key_b, 4): (-1, -1),
    }
    endpoints = [(2, "broker-2.tidalmq.svc", 9092, "eu-west-1a"), (3, "10.0.0.3", 19092, None)]
    fast = encode_fetch_response(
        version, topics, session_id=0, current_leaders=leaders, node_endpoints=endpoints
    )
    frame = _join(encode_response_parts(1, version, 8, fast))
    hints = version >= 16

    def as_dict(key: object, p: tuple) -> dict[str, object]:  # type: ignore[type-arg]
        index, error, hw, lso, log_start, aborted, records = p
        out: dict[str, object] = {
            "partition_index": index,
            "error_code": ErrorCode(error),
            "high_watermark": hw,
            "last_stable_offset": lso,
            "log_start_offset": log_start,
            "aborted_transactions": None if aborted is None else [],
            "records": bytes(records),
        }
        leader = leaders.get((key, index))  # type: ignore[call-overload]
        if hints and leader is not None:
            out["current_leader"] = {"leader_id": leader[0], "leader_epoch": leader[1]}
        return out

    body: dict[str, object] = {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": [
            {**_topic(version, name, tid), "partitions": [as_dict(key, p) for p in parts]}
            for (key, parts), name, tid in zip(
                topics, ["events", "audit"], [EVENTS_ID, other_id], strict=True
            )
        ],
    }
    if hints:
        body["node_endpoints"] = [
            {"node_id": n, "host": h, "port": port, "rack": rack} for n, h, port, rack in endpoints
        ]
    assert frame == encode_response(1, version, 8, body)
    _, decoded = decode_response(1, version, frame[4:])
    if not hints:
        plain = encode_fetch_response(version, topics, session_id=0)
        assert frame == _join(encode_response_parts(1, version, 8, plain))
        return
    answered = [
        (p.partition_index, p.current_leader.leader_id, p.current_leader.leader_epoch)
        for t in decoded.responses
        for p in t.partitions
    ]
    assert answered == [(0, -1, -1), (1, 2, 7), (2, 3, 1 << 30), (1, 2, 9), (4, -1, -1)]
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == endpoints
    assert bytes(decoded.responses[0].partitions[0].records) == batch


def test_fetch_response_without_leaders_is_unchanged() -> None:
    """The common answer (no partition misdirected) is byte for byte what it was before KIP-951:
    a v16 response differs from a v15 one in nothing."""
    partitions = [(0, 0, 5, 5, 0, (), b"")]
    plain = encode_fetch_response(16, [(EVENTS_ID, partitions)])
    hinted = encode_fetch_response(
        16, [(EVENTS_ID, partitions)], current_leaders={}, node_endpoints=()
    )
    assert plain.parts == hinted.parts == encode_fetch_response(15, [(EVENTS_ID, partitions)]).parts
    assert plain.parts[-1].endswith(b"\x00\x00\x00")  # partition, topic, response: no tags


def test_fetch_response_names_topics_as_its_version_does() -> None:
    """A topic name in a v13+ response, or an id before v13, is a bug of the caller, not a
    response to send."""
    with pytest.raises(TypeError):
        encode_fetch_response(13, [("events", [])])
    with pytest.raises(TypeError):
        encode_fetch_response(12, [(EVENTS_ID, [])])


def test_versions_outside_the_fast_path_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_produce_response(2, [])
    with pytest.raises(ValueError):
        encode_fetch_response(18, [])


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_request_parses_like_kio(version: int) -> None:
    batch = build_batch([(b"k", b"v" * 100)])
    body = {
        "transactional_id": "tx-é" if version >= 3 else None,
        "acks": -1,
        "timeout": 1500,
        "topic_data": [
            {"name": "a", "partition_data": [{"index": 0, "records": batch}]},
            {
                "name": "bé",
                "partition_data": [{"index": 3, "records": None}, {"index": 9, "records": b""}],
            },
        ],
    }
    frame = bytearray(encode_request(0, version, 17, body, client_id="cli")[4:])
    client_id, fast = decode_produce_request(memoryview(frame), version)
    reference = decode_request(bytes(frame), {0: (3, 12)})
    assert client_id == reference.client_id == "cli"
    ref = reference.body
    assert (fast.transactional_id, fast.acks, fast.timeout) == (
        ref.transactional_id,
        ref.acks,
        ref.timeout,
    )
    for topic, ref_topic in zip(fast.topic_data, ref.topic_data, strict=True):
        assert topic.name == ref_topic.name
        for part, ref_part in zip(topic.partition_data, ref_topic.partition_data, strict=True):
            assert part.index == ref_part.index
            if ref_part.records is None:
                assert part.records is None
            else:
                assert part.records is not None and bytes(part.records) == bytes(ref_part.records)
    records = fast.topic_data[0].partition_data[0].records
    assert records is not None and not records.readonly, "a view of the frame, not a copy"
    records[0:8] = b"\x00" * 7 + b"\x05"
    assert frame.find(b"\x00" * 7 + b"\x05") >= 0


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_truncated_produce_requests_are_malformed(version: int) -> None:
    frame = encode_request(
        0,
        version,
        1,
        {
            "transactional_id": None,
            "acks": 1,
            "timeout": 100,
            "topic_data": [
                {"name": "t", "partition_data": [{"index": 0, "records": build_batch([])}]}
            ],
        },
    )[4:]
    for cut in range(8, len(frame) - 1):
        with pytest.raises(MalformedRequest):
            decode_request(frame[:cut], {0: (3, 11)})
