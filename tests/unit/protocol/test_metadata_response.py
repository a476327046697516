"""The hand-written MetadataResponse encoder writes exactly what kio writes for the same response,
in every version the broker serves (0-13), and the broker's chunk cache of encoded partitions
follows the metadata: a changed partition or topic is encoded again, the rest is reused."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tidalmq_broker.protocol.codec import decode_response, encode_response, encode_response_parts
from tidalmq_broker.protocol.metadata_response import (
    TopicEncodings,
    encode_metadata_response,
    topic_head,
    topic_tail,
)
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, PartitionState, TopicInfo
from tidalmq_core.model import TopicPartition
from tidalmq_core.records import MetadataDelta

VERSIONS = range(14)
METADATA = 3


def topic(name: str, leaders: list[int], *, internal: bool = False) -> TopicInfo:
    partitions = [
        PartitionState(leader=leader, leader_epoch=7 + i, replicas=[leader if leader >= 0 else 2])
        for i, leader in enumerate(leaders)
    ]
    return TopicInfo(
        name=name, topic_id=str(uuid.uuid4()), partitions=partitions, internal=internal
    )


def reference_topic(t: TopicInfo, version: int, unreachable: set[int]) -> dict[str, Any]:
    """What the handler described for kio before the fast path."""
    partitions = []
    for index, part in enumerate(t.partitions):
        leader = part.leader
        code = ErrorCode.none if leader != NO_LEADER else ErrorCode.leader_not_available
        if leader in unreachable:
            code = ErrorCode.listener_not_found if version >= 6 else ErrorCode.leader_not_available
            leader = NO_LEADER
        partitions.append(
            {
                "error_code": code,
                "partition_index": index,
                "leader_id": leader,
                "leader_epoch": part.leader_epoch,
                "replica_nodes": list(part.replicas),
                "isr_nodes": [leader] if leader != NO_LEADER else [],
                "offline_replicas": [],
            }
        )
    return {
        "error_code": ErrorCode.none,
        "name": t.name,
        "topic_id": uuid.UUID(t.topic_id),
        "is_internal": t.internal,
        "partitions": partitions,
    }


def join(parts: bytes | list[bytes | memoryview]) -> bytes:
    return parts if isinstance(parts, bytes) else b"".join(parts)


@pytest.mark.parametrize("version", VERSIONS)
def test_metadata_response_matches_kio(version: int) -> None:
    meta = ClusterMetadata(cluster_id="c-1", version=5)
    orders = topic("orders", [0, 1, NO_LEADER, 2, 1] * 300)  # 1,500 partitions: three chunks
    offsets = topic("__consumer_offsets", [1, 0], internal=True)
    meta.topics = {t.name: t for t in (orders, offsets)}
    unreachable = {2}
    brokers = [(0, "b0.example", 9092, None), (1, "héte", 19092, "rack-a")]
    unknown_id = uuid.uuid4()
    encodings = TopicEncodings()
    fast_topics = [
        encodings.topic(meta, orders, version, frozenset(unreachable)),
        encodings.topic(meta, offsets, version, frozenset(unreachable)),
        [
            topic_head(
                version, ErrorCode.unknown_topic_or_partition.value, "nope", bytes(16), False, 0
            ),
            topic_tail(version),
        ],
    ]
    ref_topics = [
        reference_topic(orders, version, unreachable),
        reference_topic(offsets, version, unreachable),
        {
            "error_code": ErrorCode.unknown_topic_or_partition,
            "name": "nope",
            "topic_id": uuid.UUID(int=0),
            "is_internal": False,
            "partitions": [],
        },
    ]
    if version >= 12:  # a topic asked for by an id nobody knows: no name
        fast_topics.append(
            [
                topic_head(
                    version, ErrorCode.unknown_topic_id.value, None, unknown_id.bytes, False, 0
                ),
                topic_tail(version),
            ]
        )
        ref_topics.append(
            {
                "error_code": ErrorCode.unknown_topic_id,
                "name": None,
                "topic_id": unknown_id,
                "is_internal": False,
                "partitions": [],
            }
        )
    fast = encode_metadata_response(version, brokers, "c-1", 1, fast_topics)
    frame = join(encode_response_parts(METADATA, version, 42, fast))
    reference = join(
        encode_response(
            METADATA,
            version,
            42,
            {
                "throttle_time": 0,
                "brokers": [
                    {"node_id": n, "host": h, "port": p, "rack": r} for n, h, p, r in brokers
                ],
                "cluster_id": "c-1",
                "controller_id": 1,
                "topics": ref_topics,
                "cluster_authorized_operations": -2147483648,
                "error_code": ErrorCode.none,
            },
        )
    )
    assert frame == reference
    _, decoded = decode_response(METADATA, version, frame[4:])
    assert len(decoded.topics[0].partitions) == 1500


def test_a_changed_partition_is_encoded_again_and_the_rest_reused() -> None:
    meta = ClusterMetadata(cluster_id="c", version=1)
    t = topic("t", [0] * 1200)
    meta.topics = {"t": t}
    enc = TopicEncodings()
    first = enc.topic(meta, t, 13, frozenset())
    t.partitions[700].leader = 1
    stale = enc.topic(meta, t, 13, frozenset())
    assert stale[2] is first[2], "nothing said partition 700 changed: the chunk is reused"
    delta = MetadataDelta()
    delta.partitions.add(TopicPartition("t", 700))
    enc.changed(delta)
    after = enc.topic(meta, t, 13, frozenset())
    assert after[1] is first[1] and after[3] is first[3], "chunks 0 and 2 reused"
    assert after[2] != first[2], "chunk 1 (partitions 512-1023) encoded again"
    full = encode_metadata_response(13, [(0, "h", 1, None), (1, "h", 2, None)], "c", 0, [after])
    _, decoded = decode_response(
        METADATA, 13, join(encode_response_parts(METADATA, 13, 1, full))[4:]
    )
    assert decoded.topics[0].partitions[700].leader_id == 1


def test_a_changed_topic_or_another_image_starts_over() -> None:
    meta = ClusterMetadata(cluster_id="c", version=1)
    t = topic("t", [0] * 10)
    meta.topics = {"t": t}
    enc = TopicEncodings()
    first = enc.topic(meta, t, 9, frozenset())
    delta = MetadataDelta()
    delta.topics.add("t")
    enc.changed(delta)
    assert enc.topic(meta, t, 9, frozenset())[1] is not first[1]
    other = ClusterMetadata(cluster_id="c", version=2)
    other.topics = {"t": t}
    again = enc.topic(meta, t, 9, frozenset())
    assert enc.topic(other, t, 9, frozenset())[1] is not again[1]
