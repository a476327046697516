"""Hand-written encoders for the two responses on the data path: Produce and Fetch.

Every other response is described as dicts and built into kio's dataclasses (codec.encode_response),
which costs tens of microseconds per partition and copies record bytes twice (into a BytesIO and
out of it). Produce and Fetch run thousands of times a second with megabytes of records, so their
bodies are written here straight from the handlers' tuples, following Kafka's message schemas
(ProduceResponse.json v3-v12, FetchResponse.json v4-v17): fixed-width big-endian integers,
int16/varint-prefixed strings, and arrays; "flexible" versions (Produce v9+, Fetch v12+) use
compact (unsigned varint, length + 1) strings and arrays and an empty tagged-field section after
every struct (KIP-951's current leader and leader endpoints go there: Produce v10+ when a
partition is answered NOT_LEADER_OR_FOLLOWER, Fetch v16+ also for FENCED_LEADER_EPOCH). Fetch
v13+ names topics by id. Record sets are not copied: the body is a list of buffers that the
listener writes as they are. tests/unit/protocol/test_fastpath.py checks every version against
kio's encoder and decoder.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, overload

from tidalmq_broker.protocol.primitives import (
    array_length,
    nullable_string,
    read_uvarint,
    string,
    uvarint,
)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PRODUCE_PARTITION = struct.Struct(">ihqq")  # index, error, base offset, log append time
_I64 = struct.Struct(">q")
_FETCH_PARTITION_V4 = struct.Struct(">ihqq")  # index, error, high watermark, last stable
_FETCH_HEAD_V7 = struct.Struct(">ihi")  # throttle, error, session id

PRODUCE_FLEXIBLE_FROM = 9
FETCH_FLEXIBLE_FROM = 12
_NO_TAGS = b"\x00"


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body already in wire format (without size prefix and response header)."""

    parts: list[bytes | memoryview]
    flexible: bool  # selects response header v1 (with tagged fields) over v0

    @property
    def size(self) -> int:
        return sum(len(p) for p in self.parts)


ProducePartition = tuple[int, int, int, int, int, str | None]
"""(partition index, error code, base offset, log append time ms or -1, log start offset,
error message or None)"""

FetchPartition = tuple[
    int, int, int, int, int, Sequence[tuple[int, int]] | None, bytes | memoryview | None
]
"""(partition index, error code, high watermark, last stable offset, log start offset,
aborted transactions as (producer id, first offset) or None (null), records or None)"""
_ABORTED_TXN = struct.Struct(">qq")  # producer id, first offset


LeaderAndEpoch = tuple[int, int]
"""(leader id, leader epoch): a partition's current leader, as KIP-951 tells a producer"""

NodeEndpoint = tuple[int, str, int, str | None]
"""(node id, host, port, rack or None): where a current leader is reached (KIP-951)"""

RecordError = tuple[int, str | None]
"""(batch index, message or None): a record that made its partition's batch refused (KIP-467)"""

PRODUCE_RECORD_ERRORS_FROM = 8  # KIP-467: RecordErrors and ErrorMessage

PRODUCE_LEADER_HINTS_FROM = 10  # KIP-951: CurrentLeader and NodeEndpoints (tagged fields)
_LEADER_AND_EPOCH = struct.Struct(">ii")
# the partition's tagged fields holding CurrentLeader (tag 0): one field, tag 0, 9 bytes
# (leader id, leader epoch, the struct's own empty tagged fields)
_CURRENT_LEADER_HEAD = b"\x01\x00\x09"
FETCH_TOPIC_IDS_FROM = 13  # topics named by id (uuid), not by name
FETCH_LEADER_HINTS_FROM = 16  # KIP-951, as Produce v10
# in Fetch, CurrentLeader is the partition's tag 1 (tag 0 is DivergingEpoch, never sent here)
_FETCH_CURRENT_LEADER_HEAD = b"\x01\x01\x09"

FetchTopicKey = str | uuid.UUID
"""how a FetchResponse names a topic: by name up to v12, by topic id from v13"""


def encode_produce_response(
    version: int,
    topics: Sequence[tuple[str, Sequence[ProducePartition]]],
    throttle_time_ms: int = 0,
    *,
    current_leaders: Mapping[tuple[str, int], LeaderAndEpoch] | None = None,
    node_endpoints: Sequence[NodeEndpoint] = (),
    record_errors: Mapping[tuple[str, int], Sequence[RecordError]] | None = None,
) -> EncodedBody:
    """ProduceResponse v3-v12 (the versions served). From v8 (KIP-467), `record_errors` (by
    topic and partition: the records that made a partition's batch refused) go with each
    partition's error message; older versions have neither. From v10 (KIP-951), `current_leaders`
    (by topic and partition: partitions answered NOT_LEADER_OR_FOLLOWER) and `node_endpoints`
    (where those leaders are) go in the tagged fields; as Kafka writes them, only when they
    differ from their defaults (leader -1 and epoch -1, no endpoints). Older versions have no
    place for them: they are left out."""
    if not 3 <= version <= 12:
        raise ValueError(f"ProduceResponse v{version} is not supported by the fast path")
    flexible = version >= PRODUCE_FLEXIBLE_FROM
    if version < PRODUCE_LEADER_HINTS_FROM:
        current_leaders, node_endpoints = None, ()
    out = bytearray(array_length(len(topics), flexible))
    for name, partitions in topics:
        out += string(name, flexible)
        out += array_length(len(partitions), flexible)
        for index, error, base, append_time, log_start, message in partitions:
            out += _PRODUCE_PARTITION.pack(index, error, base, append_time)
            if version >= 5:
                out += _I64.pack(log_start)
            if version >= PRODUCE_RECORD_ERRORS_FROM:
                refused = None if record_errors is None else record_errors.get((name, index))
                if refused is None:
                    out += array_length(0, flexible)
                else:
                    out += array_length(len(refused), flexible)
                    for batch_index, record_message in refused:
                        out += _I32.pack(batch_index)
                        out += nullable_string(record_message, flexible)
                        if flexible:
                            out += _NO_TAGS
                out += nullable_string(message, flexible)
            if flexible:
                leader = None if current_leaders is None else current_leaders.get((name, index))
                if leader is None or leader == (-1, -1):
                    out += _NO_TAGS
                else:
                    out += _CURRENT_LEADER_HEAD
                    out += _LEADER_AND_EPOCH.pack(*leader)
                    out += _NO_TAGS
        if flexible:
            out += _NO_TAGS
    out += _I32.pack(throttle_time_ms)
    if node_endpoints:
        out += _node_endpoints_tag(node_endpoints)
    elif flexible:
        out += _NO_TAGS
    return EncodedBody([bytes(out)], flexible)


def encode_fetch_response(
    version: int,
    topics: Sequence[tuple[FetchTopicKey, Sequence[FetchPartition]]],
    *,
    error_code: int = 0,
    session_id: int = 0,
    throttle_time_ms: int = 0,
    current_leaders: Mapping[tuple[FetchTopicKey, int], LeaderAndEpoch] | None = None,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> EncodedBody:
    """FetchResponse v4-v17 (the versions served); record sets stay separate buffers.

    A topic is named by its name up to v12 and by its id (a `uuid.UUID`) from v13. From v16
    (KIP-951), `current_leaders` (by topic, as named in `topics`, and partition: partitions
    answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH) and `node_endpoints` (where those
    leaders are) go in the tagged fields, only when they differ from their defaults, as Kafka
    writes them; older versions leave them out (v12-v15 have the partition's field but Kafka
    fills it only from v16)."""
    if not 4 <= version <= 17:
        raise ValueError(f"FetchResponse v{version} is not supported by the fast path")
    flexible = version >= FETCH_FLEXIBLE_FROM
    by_id = version >= FETCH_TOPIC_IDS_FROM
    if version < FETCH_LEADER_HINTS_FROM or not current_leaders:
        current_leaders = None
    if version < FETCH_LEADER_HINTS_FROM:
        node_endpoints = ()
    parts: list[bytes | memoryview] = []
    out = bytearray()
    if version >= 7:
        out += _FETCH_HEAD_V7.pack(throttle_time_ms, error_code, session_id)
    else:
        out += _I32.pack(throttle_time_ms)
    out += array_length(len(topics), flexible)
    for key, partitions in topics:
        if by_id:
            if not isinstance(key, uuid.UUID):
                raise TypeError(f"FetchResponse v{version} names topics by id, not {key!r}")
            out += key.bytes
        else:
            if not isinstance(key, str):
                raise TypeError(f"FetchResponse v{version} names topics by name, not {key!r}")
            out += string(key, flexible)
        out += array_length(len(partitions), flexible)
        for index, error, hw, lso, log_start, aborted, records in partitions:
            out += _FETCH_PARTITION_V4.pack(index, error, hw, lso)
            if version >= 5:
                out += _I64.pack(log_start)
            if aborted is not None:
                out += array_length(len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    out += _ABORTED_TXN.pack(producer_id, first_offset)
                    if flexible:
                        out += _NO_TAGS
            else:
                out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            if version >= 11:
                out += b"\xff\xff\xff\xff"  # preferred_read_replica: -1
            if records is None:
                out += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                out += uvarint(len(records) + 1) if flexible else _I32.pack(len(records))
                if len(records):
                    parts.append(bytes(out))
                    parts.append(records)
                    out = bytearray()
            if flexible:
                leader = None if current_leaders is None else current_leaders.get((key, index))
                if leader is None or leader == (-1, -1):
                    out += _NO_TAGS
                else:
                    out += _FETCH_CURRENT_LEADER_HEAD
                    out += _LEADER_AND_EPOCH.pack(*leader)
                    out += _NO_TAGS
        if flexible:
            out += _NO_TAGS
    if node_endpoints:
        out += _node_endpoints_tag(node_endpoints)
    elif flexible:
        out += _NO_TAGS
    parts.append(bytes(out))
    return EncodedBody(parts, flexible)


def _node_endpoints_tag(node_endpoints: Sequence[NodeEndpoint]) -> bytes:
    """A response's tagged fields holding NodeEndpoints (tag 0 in Produce and Fetch alike)."""
    endpoints = bytearray(array_length(len(node_endpoints), True))
    for node_id, host, port, rack in node_endpoints:
        endpoints += _I32.pack(node_id)
        endpoints += string(host, True)
        endpoints += _I32.pack(port)
        endpoints += nullable_string(rack, True)
        endpoints += _NO_TAGS
    return b"\x01\x00" + uvarint(len(endpoints)) + endpoints  # one tagged field, tag 0


# ------------------------------------------------------------------------------ produce requests
class MalformedProduce(ValueError):
    """The produce request does not parse (codec turns this into MalformedRequest)."""


@dataclass(slots=True)
class ProducePartitionData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class ProduceTopicData:
    name: str
    partition_data: list[ProducePartitionData]


@dataclass(slots=True)
class ProduceRequestData:
    """What the Produce handler reads of a request (the attribute names kio's classes use)."""

    transactional_id: str | None
    acks: int
    timeout: datetime.timedelta
    topic_data: list[ProduceTopicData]


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise MalformedProduce(f"field of {n} bytes at {self.pos} runs past the frame")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def int16(self) -> int:
        (value,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return int(value)

    def int32(self) -> int:
        (value,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def uvarint(self) -> int:
        pos = self.pos
        if pos < len(self.buf) and (byte := self.buf[pos]) < 0x80:  # one byte: most of them
            self.pos = pos + 1
            return int(byte)
        value, self.pos = read_uvarint(self.buf, pos, len(self.buf), MalformedProduce)
        return value

    @overload
    def string(self, flexible: bool, nullable: Literal[False]) -> str: ...
    @overload
    def string(self, flexible: bool, nullable: bool) -> str | None: ...
    def string(self, flexible: bool, nullable: bool) -> str | None:
        n = self.uvarint() - 1 if flexible else self.int16()
        if n < 0:
            if not nullable:
                raise MalformedProduce("null where a string is required")
            return None
        return bytes(self.take(n)).decode()

    def array_length(self, flexible: bool) -> int:
        n = self.uvarint() - 1 if flexible else self.int32()
        if n < 0:
            raise MalformedProduce("null where an array is required")
        return n

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


def decode_produce_request(
    frame: bytes | memoryview, api_version: int
) -> tuple[str | None, ProduceRequestData]:
    """(client id, body) of a ProduceRequest v3-v12 frame (without its size prefix).

    Record sets are slices of `frame`, not copies: when the frame is a writable buffer of the
    connection's own, the partition log can patch offsets in place.
    """
    if not 3 <= api_version <= 12:
        raise MalformedProduce(f"ProduceRequest v{api_version} is not supported by the fast path")
    flexible = api_version >= PRODUCE_FLEXIBLE_FROM
    try:
        r = _Reader(memoryview(frame), 8)  # after api key, version, correlation id
        client_id = r.string(flexible=False, nullable=True)  # header v1/v2: never compact
        if flexible:
            r.skip_tags()
        transactional_id = r.string(flexible, nullable=True)
        acks = r.int16()
        timeout_ms = r.int32()
        topics = []
        for _ in range(r.array_length(flexible)):
            name = r.string(flexible, nullable=False)
            partitions = []
            for _ in range(r.array_length(flexible)):
                index = r.int32()
                n = r.uvarint() - 1 if flexible else r.int32()
                records = None if n < 0 else r.take(n)
                if flexible:
                    r.skip_tags()
                partitions.append(ProducePartitionData(index, records))
            if flexible:
                r.skip_tags()
            topics.append(ProduceTopicData(name, partitions))
        if flexible:
            r.skip_tags()
    except (struct.error, UnicodeDecodeError) as exc:
        raise MalformedProduce(str(exc)) from exc
    return client_id, ProduceRequestData(
        transactional_id, acks, datetime.timedelta(milliseconds=timeout_ms), topics
    )
