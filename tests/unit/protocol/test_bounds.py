"""The bounds walk (protocol/bounds.py) lets through only counts and lengths the frame's bytes can
back, agrees with kio's decoder on where every valid frame ends, and strips unknown tagged fields.

kio's native reader aborts the process when a count it reserves cannot be allocated, so the
randomized test decodes in a child process under an address-space cap: a walk that let a huge
count through fails that test instead of taking pytest down or eating the machine's memory."""

from __future__ import annotations

import os
import random
import resource
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kio.serial import entity_reader
from tidalmq_broker.protocol.bounds import FrameBoundsError, check_request, prepare, request_end
from tidalmq_broker.protocol.codec import (
    MalformedRequest,
    UnsupportedApi,
    UnsupportedVersion,
    decode_request,
    encode_request,
)
from tidalmq_broker.protocol.primitives import uvarint

from tests.support.request_fuzz import (
    cases,
    known_killers,
    random_request,
    schema_of,
    served_pairs,
    served_versions,
)

PAIRS = served_pairs()


def kio_end(schema: type, frame: bytes) -> int:
    _, offset = entity_reader(schema.__header_schema__)(frame, 0)
    _, used = entity_reader(schema)(frame, offset)
    return int(offset + used)


def test_every_served_api_and_version_is_covered() -> None:
    assert len(PAIRS) > 150  # 33 APIs at the time of writing
    assert (1, 12) in PAIRS and (2, 1) in PAIRS and (75, 0) in PAIRS


@pytest.mark.parametrize(("api_key", "version"), PAIRS, ids=[f"api{k}-v{v}" for k, v in PAIRS])
def test_valid_requests_pass_as_they_are_and_end_where_kio_ends(api_key: int, version: int) -> None:
    schema = schema_of(api_key, version)
    prepare(schema)
    rng = random.Random(api_key * 100 + version)
    for _ in range(25):
        frame = random_request(api_key, version, rng)
        assert check_request(schema, frame) is frame  # not copied
        assert request_end(schema, frame) == kio_end(schema, frame) == len(frame)


def test_the_issue_frames_are_refused_before_kio_reserves_anything() -> None:
    killers = {case.attack: case for case in known_killers()}
    fetch12 = killers["issue-fetch-v12-compact-count"]
    assert len(fetch12.wire()) == 49  # the issue's 49-byte request
    for case in killers.values():
        with pytest.raises(FrameBoundsError, match="array of"):
            check_request(schema_of(case.api_key, case.version), case.frame)
        with pytest.raises(MalformedRequest, match="array of"):
            decode_request(case.frame, served_versions())


def fetch_v4(topics: list[dict[str, Any]] | None = None) -> bytes:
    body = {
        "replica_id": -1,
        "max_wait": 100,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "topics": topics
        if topics is not None
        else [
            {
                "topic": "t",
                "partitions": [{"partition": 0, "fetch_offset": 5, "partition_max_bytes": 9}],
            }
        ],
    }
    return encode_request(1, 4, 1, body, client_id="c")[4:]


TOPICS_AT = 8 + 3 + 17  # v4: header with client id "c", then 17 bytes of fixed fields


def test_an_int32_count_is_checked_against_the_bytes_left_at_its_place() -> None:
    schema = schema_of(1, 4)
    frame = fetch_v4()
    assert struct.unpack_from(">i", frame, TOPICS_AT)[0] == 1
    for count in (2, 1000, 0x7FFFFFFF):
        bad = frame[:TOPICS_AT] + struct.pack(">i", count) + frame[TOPICS_AT + 4 :]
        with pytest.raises(FrameBoundsError):
            check_request(schema, bad)
    # the partitions' fixed-width entries (16 bytes each) are checked with one multiplication
    partitions_at = TOPICS_AT + 4 + 3
    assert struct.unpack_from(">i", frame, partitions_at)[0] == 1
    bad = frame[:partitions_at] + struct.pack(">i", 2) + frame[partitions_at + 4 :]
    with pytest.raises(FrameBoundsError, match="array of 2 entries of 16"):
        check_request(schema, bad)


def test_nulls_pass_only_where_the_schema_allows_them() -> None:
    frame = fetch_v4()
    null_topics = frame[:TOPICS_AT] + struct.pack(">i", -1)
    with pytest.raises(FrameBoundsError, match="no null is allowed"):
        check_request(schema_of(1, 4), null_topics)
    with pytest.raises(FrameBoundsError):
        check_request(schema_of(1, 4), frame[:TOPICS_AT] + struct.pack(">i", -2))
    # Metadata v1's topics are nullable (null = every topic), v0's are not
    for version, allowed in ((0, False), (1, True)):
        head = encode_request(3, version, 1, {"topics": []}, client_id="c")[4:-4]
        null = head + struct.pack(">i", -1)
        if allowed:
            assert check_request(schema_of(3, version), null) is null
            assert decode_request(null, served_versions()).body.topics is None
        else:
            with pytest.raises(FrameBoundsError, match="no null"):
                check_request(schema_of(3, version), null)
    # a legacy string: -1 is null, anything below is an error
    bad_client_id = frame[:8] + struct.pack(">h", -2) + frame[11:]
    with pytest.raises(FrameBoundsError, match="client_id"):
        check_request(schema_of(1, 4), bad_client_id)


def describe_topic_partitions(marker: int) -> bytes:
    body = {
        "topics": [{"name": "ab"}],
        "response_partition_limit": 10,
        "cursor": {"topic_name": "ab", "partition_index": 3},
    }
    frame = bytearray(encode_request(75, 0, 1, body, client_id="c")[4:])
    at = len(frame) - 1 - 1 - 4 - 3 - 1  # outer tags, cursor tags, index, name, marker
    assert frame[at] == 0x01
    frame[at] = marker
    return bytes(frame)


@pytest.mark.parametrize("marker", [0x00, 0x01, 0x7F, 0x80, 0xFE])
def test_a_nullable_struct_is_walked_unless_its_marker_is_exactly_minus_one(marker: int) -> None:
    schema = schema_of(75, 0)
    frame = describe_topic_partitions(marker)
    # kio reads the struct after any marker but -1, so the walk must check it too
    assert request_end(schema, frame) == kio_end(schema, frame) == len(frame)
    assert decode_request(frame, served_versions()).body.cursor.partition_index == 3


def test_a_null_struct_is_one_byte() -> None:
    schema = schema_of(75, 0)
    frame = describe_topic_partitions(0x01)
    null = frame[: len(frame) - 10] + b"\xff\x00"  # marker -1, then the outer tags
    assert request_end(schema, null) == kio_end(schema, null) == len(null)
    assert decode_request(null, served_versions()).body.cursor is None


def api_versions_v3() -> bytes:
    body = {"client_software_name": "x", "client_software_version": "1"}
    return encode_request(18, 3, 7, body, client_id="c")[4:]


def test_unknown_tagged_fields_in_the_header_are_dropped() -> None:
    frame = api_versions_v3()
    tags_at = 8 + 3
    assert frame[tags_at] == 0
    extra = uvarint(2) + uvarint(5) + uvarint(2) + b"hi" + uvarint(1000) + uvarint(0)
    with_tags = frame[:tags_at] + extra + frame[tags_at + 1 :]
    stripped = check_request(schema_of(18, 3), with_tags)
    assert stripped == frame
    decoded = decode_request(with_tags, served_versions())
    assert decoded.client_id == "c"
    assert decoded.body == decode_request(frame, served_versions()).body


def fetch_v12(cluster_id: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "replica_id": -1,
        "max_wait": 100,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {"partition": p, "fetch_offset": 5, "partition_max_bytes": 9} for p in range(3)
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    if cluster_id is not None:
        body["cluster_id"] = cluster_id
    return encode_request(1, 12, 1, body, client_id="c")[4:]


PARTITION_V12 = 33  # 32 bytes of fixed fields and an empty tag section


def test_unknown_tagged_fields_in_nested_structs_are_dropped() -> None:
    frame = fetch_v12()
    schema = schema_of(1, 12)
    # the three partitions are the last 3 x 33 bytes before topic tags, forgotten, rack, tags
    first = len(frame) - 4 - 3 * PARTITION_V12
    second_tags = first + PARTITION_V12 + 32
    assert frame[second_tags] == 0
    # a padded count (two bytes for 2) and a tag number past anything Kafka uses
    extra = b"\x82\x00" + uvarint(9) + uvarint(3) + b"abc" + uvarint(1 << 20) + uvarint(0)
    with_tags = frame[:second_tags] + extra + frame[second_tags + 1 :]
    assert check_request(schema, with_tags) == frame
    topics = decode_request(with_tags, served_versions()).body.topics
    assert [p.partition for p in topics[0].partitions] == [0, 1, 2]


def test_a_known_tagged_field_is_kept_and_must_be_as_long_as_its_size() -> None:
    schema = schema_of(1, 12)
    frame = fetch_v12(cluster_id="kc")
    assert check_request(schema, frame) is frame
    assert decode_request(frame, served_versions()).body.cluster_id == "kc"
    # the body's tag section: count 1, tag 0, size 3, compact string "kc"
    assert frame.endswith(b"\x01\x00\x03\x03kc")
    for size in (2, 4):
        bad = frame[:-4] + bytes([size]) + frame[-3:]
        with pytest.raises(FrameBoundsError, match=r"tagged field 0|cluster_id: length"):
            check_request(schema, bad if size == 2 else bad + b"\x00")


def test_tag_sections_that_cannot_fit_are_refused() -> None:
    schema = schema_of(1, 12)
    frame = fetch_v12()
    assert frame.endswith(b"\x00")  # the body's empty tag section
    for tail in (
        uvarint(1000),  # more tagged fields than bytes
        uvarint(1) + uvarint(7) + uvarint(50) + b"short",  # a size past the frame
        uvarint(1) + b"\xff\xff\xff\xff\xff\x01",  # a tag varint longer than five bytes
    ):
        with pytest.raises(FrameBoundsError):
            check_request(schema, frame[:-1] + tail)


def test_a_varint_count_longer_than_five_bytes_is_refused() -> None:
    frame = fetch_v12()
    topics_at = 8 + 3 + 1 + 25
    assert frame[topics_at] == 2
    padded = b"\x82\x80\x80\x80\x80\x00"
    with pytest.raises(FrameBoundsError, match="longer than 5"):
        check_request(schema_of(1, 12), frame[:topics_at] + padded + frame[topics_at + 1 :])


def test_strings_and_bytes_past_the_frame_are_refused() -> None:
    frame = api_versions_v3()
    name_at = 8 + 3 + 1
    assert frame[name_at] == 2  # compact "x"
    with pytest.raises(FrameBoundsError, match="client_software_name"):
        check_request(schema_of(18, 3), frame[:name_at] + uvarint(1 << 30) + frame[name_at + 1 :])
    with pytest.raises(FrameBoundsError):
        check_request(schema_of(18, 3), frame[:-2])


# ----------------------------------------------------------------- randomized, in a capped child
CHILD_ADDRESS_SPACE = 1 << 30
ROOT = Path(__file__).resolve().parents[3]
EXPECTED = (MalformedRequest, UnsupportedApi, UnsupportedVersion)


def differential(seed: int, count: int) -> None:
    """Decode `count` mutated requests of every served API and version (Produce through the fast
    path); each must decode or fail with one of the codec's own errors, and where kio decodes a
    frame the walk accepted, both must end at the same offset. Prints a summary, exits non-zero
    on a disagreement."""
    supported = served_versions()
    outcomes: Counter[str] = Counter()
    problems = []
    for case in [*known_killers(), *cases(seed, count)]:
        try:
            decode_request(case.frame, supported)
            outcomes["decoded"] += 1
        except EXPECTED as exc:
            outcomes[type(exc).__name__] += 1
        except Exception as exc:  # anything else escapes the codec: a finding
            problems.append(f"{case.describe()}: {exc!r}")
            continue
        if case.api_key == 0 or case.api_key not in supported:
            continue
        schema = schema_of(case.api_key, case.version)
        try:
            stripped = check_request(schema, case.frame)
            end = kio_end(schema, bytes(stripped))
        except Exception:
            continue
        if request_end(schema, stripped) != end:
            problems.append(f"{case.describe()}: walk ends at {request_end(schema, stripped)}")
    print(dict(outcomes))
    for problem in problems[:20]:
        print("PROBLEM", problem)
    sys.exit(1 if problems else 0)


def _cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))


@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_requests_of_every_api_decode_or_fail_cleanly(seed: int) -> None:
    code = f"from tests.unit.protocol.test_bounds import differential; differential({seed}, 2500)"
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_cap_address_space,
    )
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
    assert "MalformedRequest" in child.stdout


def test_large_frames_arrive_as_memoryviews_and_walk_the_same() -> None:
    """Frames of 32 KiB and more come from the framing as views of a buffer of their own."""
    partitions = [
        {"partition": p, "fetch_offset": 5, "partition_max_bytes": 9} for p in range(2000)
    ]
    body: dict[str, Any] = {
        "replica_id": -1,
        "max_wait": 100,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": partitions}],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    frame = encode_request(1, 12, 1, body, client_id="c")[4:]
    assert len(frame) > 32 * 1024
    schema = schema_of(1, 12)
    view = memoryview(bytearray(frame)).toreadonly()
    assert check_request(schema, view) is view
    assert request_end(schema, view) == len(frame)
    decoded = decode_request(memoryview(bytearray(frame)), served_versions())
    assert len(decoded.body.topics[0].partitions) == 2000
    # one partition with a tagged field: the strided check falls back to the loop
    last_tags = len(frame) - 4 - 1
    assert frame[last_tags] == 0
    tagged = frame[:last_tags] + uvarint(1) + uvarint(77) + uvarint(0) + frame[last_tags + 1 :]
    stripped = check_request(schema, memoryview(bytearray(tagged)).toreadonly())
    assert bytes(stripped) == frame
    truncated = memoryview(bytearray(frame[: len(frame) // 2])).toreadonly()
    with pytest.raises(FrameBoundsError, match="partitions: array of 2000"):
        check_request(schema, truncated)
