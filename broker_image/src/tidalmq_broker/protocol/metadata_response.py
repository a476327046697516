"""A hand-written encoder for MetadataResponse v0-v13, and the pieces it is built from.

Clients ask for the metadata of every topic, or of the topics they write, again and again during
a rebalance (each NOT_LEADER error makes a client refresh). Built through kio's dataclasses, a
response describing 50,000 partitions cost the broker 0.6 s of event-loop time, during which it
answered nothing else, heartbeats included. Here a topic is written straight from the metadata
image with `struct` (about a microsecond per partition), in chunks of partitions that the broker
keeps encoded until the metadata they describe changes (`TopicEncodings`), so a repeated
request costs little more than joining bytes.

The layout follows Kafka's MetadataResponse.json: partitions carry leader_epoch from v7 and
offline_replicas from v5; topics carry is_internal from v1, topic_authorized_operations from v8,
topic_id from v10 and a nullable name from v12; the response carries controller_id from v1,
cluster_id from v2, throttle_time_ms (first) from v3, cluster_authorized_operations in v8-v10 and
a top-level error code from v13. Versions 9 and later are "flexible": compact strings and arrays
(unsigned varint, length + 1) and an empty tagged-field section after every struct.
tests/unit/protocol/test_metadata_response.py checks every version against kio.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence

from kio.schema.errors import ErrorCode
from tidalmq_core.metadata import NO_LEADER, ClusterMetadata, TopicInfo
from tidalmq_core.records import MetadataDelta

from tidalmq_broker.protocol.fastpath import EncodedBody
from tidalmq_broker.protocol.primitives import array_length, nullable_string, string

FLEXIBLE_FROM = 9
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">hii")  # error code, partition index, leader
_HEAD_EPOCH = struct.Struct(">hiii")  # ... and leader epoch (v7+)
_NO_TAGS = b"\x00"
_NO_OPERATIONS = _I32.pack(-2147483648)  # authorized operations not asked for

Partition = tuple[int, int, int, int, Sequence[int], Sequence[int]]
"""(error code, partition index, leader id, leader epoch, replica nodes, isr nodes)"""

Broker = tuple[int, str, int, str | None]
"""(node id, host, port, rack)"""


def _int32_array(values: Sequence[int], flexible: bool) -> bytes:
    n = len(values)
    if n == 1:  # one replica, the usual case: no format string to build
        return (b"\x02" if flexible else b"\x00\x00\x00\x01") + _I32.pack(values[0])
    return array_length(n, flexible) + struct.pack(f">{n}i", *values)


def encode_partitions(version: int, partitions: Iterable[Partition]) -> bytes:
    """The partition structs of one topic (without the array's length)."""
    flexible = version >= FLEXIBLE_FROM
    epoch = version >= 7
    offline = (b"\x01" if flexible else b"\x00\x00\x00\x00") if version >= 5 else b""
    tail = offline + (_NO_TAGS if flexible else b"")
    head = _HEAD_EPOCH.pack if epoch else None
    out = bytearray()
    for error, index, leader, leader_epoch, replicas, isr in partitions:
        if head is not None:
            out += head(error, index, leader, leader_epoch)
        else:
            out += _HEAD.pack(error, index, leader)
        out += _int32_array(replicas, flexible)
        out += _int32_array(isr, flexible)
        out += tail
    return bytes(out)


def topic_head(
    version: int, error: int, name: str | None, topic_id: bytes, internal: bool, partitions: int
) -> bytes:
    """A topic struct up to its partitions (included: the array's length)."""
    flexible = version >= FLEXIBLE_FROM
    out = _I16.pack(error)
    if version >= 12:
        out += nullable_string(name, flexible)
    else:
        out += string(name or "", flexible)
    if version >= 10:
        out += topic_id
    if version >= 1:
        out += b"\x01" if internal else b"\x00"
    return out + array_length(partitions, flexible)


NO_OPERATIONS = -2147483648
"""The authorized-operations field of a client that did not ask for it (the schema's default)."""


def topic_tail(version: int, operations: int = NO_OPERATIONS) -> bytes:
    """What follows a topic's partitions: its authorized operations (v8+, a bit field, when the
    client asked for them)."""
    out = b""
    if version >= 8:
        out = _NO_OPERATIONS if operations == NO_OPERATIONS else _I32.pack(operations)
    return out + (_NO_TAGS if version >= FLEXIBLE_FROM else b"")


def encode_metadata_response(
    version: int,
    brokers: Sequence[Broker],
    cluster_id: str | None,
    controller_id: int,
    topics: Sequence[Sequence[bytes]],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    cluster_authorized_operations: int = NO_OPERATIONS,
) -> EncodedBody:
    """The whole response; `topics` are the encoded topic structs, each as a list of buffers."""
    if not 0 <= version <= 13:
        raise ValueError(f"MetadataResponse v{version} is not supported by the fast path")
    flexible = version >= FLEXIBLE_FROM
    head = bytearray()
    if version >= 3:
        head += _I32.pack(throttle_time_ms)
    head += array_length(len(brokers), flexible)
    for node_id, host, port, rack in brokers:
        head += _I32.pack(node_id)
        head += string(host, flexible)
        head += _I32.pack(port)
        if version >= 1:
            head += nullable_string(rack, flexible)
        if flexible:
            head += _NO_TAGS
    if version >= 2:
        head += nullable_string(cluster_id, flexible)
    if version >= 1:
        head += _I32.pack(controller_id)
    head += array_length(len(topics), flexible)
    parts: list[bytes | memoryview] = [bytes(head)]
    for topic in topics:
        parts.extend(topic)
    end = b""
    if 8 <= version <= 10:
        end += _I32.pack(cluster_authorized_operations)
    if version >= 13:
        end += _I16.pack(error_code)
    if flexible:
        end += _NO_TAGS
    parts.append(end)
    return EncodedBody(parts, flexible)


_LEADER_NOT_AVAILABLE = ErrorCode.leader_not_available.value
_LISTENER_NOT_FOUND = ErrorCode.listener_not_found.value


class TopicEncodings:
    """Topics' partitions as MetadataResponse writes them, kept per chunk of `CHUNK`
    partitions until the metadata they describe changes: the broker tells it what each
    metadata update changed (`changed`), so a chunk is encoded again only when one of its
    partitions (or its topic) changed, whatever the size of the cluster. Kept per response
    version and per set of brokers the client cannot reach (listeners)."""

    CHUNK = 512

    def __init__(self) -> None:
        # topic -> chunk index -> (version, unreachable brokers) -> encoded partitions
        self._topics: dict[str, dict[int, dict[tuple[int, frozenset[int]], bytes]]] = {}
        self._image: ClusterMetadata | None = None  # the image the chunks describe

    def clear(self) -> None:
        self._topics.clear()

    def changed(self, delta: MetadataDelta) -> None:
        """What a metadata update changed in the image (in place)."""
        if delta.brokers:  # a leader's listeners may have changed: cheap to start over
            self._topics.clear()
            return
        for names in (delta.topics, delta.removed_topics, delta.static_topics):
            for name in names:
                self._topics.pop(name, None)
        for tp in delta.partitions:
            chunks = self._topics.get(tp.topic)
            if chunks is not None:
                chunks.pop(tp.partition // self.CHUNK, None)

    def topic(
        self,
        meta: ClusterMetadata,
        topic: TopicInfo,
        version: int,
        unreachable: frozenset[int],
        operations: int = NO_OPERATIONS,
    ) -> list[bytes]:
        """The whole topic struct of `meta`'s `topic`, as buffers (with the client's authorized
        `operations` on it, when it asked for them)."""
        if meta is not self._image:  # another image (a snapshot replaced ours): start over
            self._topics.clear()
            self._image = meta
        n = len(topic.partitions)
        out = [
            topic_head(version, 0, topic.name, uuid.UUID(topic.topic_id).bytes, topic.internal, n)
        ]
        chunks = self._topics.setdefault(topic.name, {})
        key = (version, unreachable)
        for c in range((n + self.CHUNK - 1) // self.CHUNK):
            encoded = chunks.setdefault(c, {})
            block = encoded.get(key)
            if block is None:
                start = c * self.CHUNK
                block = encode_partitions(
                    version,
                    _partitions(topic, start, min(n, start + self.CHUNK), version, unreachable),
                )
                encoded[key] = block
            out.append(block)
        out.append(topic_tail(version, operations))
        return out


def _partitions(
    topic: TopicInfo, start: int, end: int, version: int, unreachable: frozenset[int]
) -> Iterator[Partition]:
    parts = topic.partitions
    for index in range(start, end):
        part = parts[index]
        leader = part.leader
        if leader == NO_LEADER:
            yield (_LEADER_NOT_AVAILABLE, index, leader, part.leader_epoch, part.replicas, ())
        elif leader in unreachable:
            code = _LISTENER_NOT_FOUND if version >= 6 else _LEADER_NOT_AVAILABLE
            yield (code, index, NO_LEADER, part.leader_epoch, part.replicas, ())
        else:
            yield (0, index, leader, part.leader_epoch, part.replicas, (leader,))
