"""The few Kafka messages `tidalmq reassign` sends, encoded and decoded by hand: Metadata v12,
AlterPartitionReassignments v0, ListPartitionReassignments v0, SaslHandshake v1 and
SaslAuthenticate v2 (Kafka's message JSON for each, field by field).

Why not the broker's codec: it is built on kio's generated schemas, whose import (kio, and
asyncio with it) took most of the command's start ([L1] item 5, docs/cli.md). These five
messages are small and fixed; tests/unit/test_admin_wire.py checks each one against kio's own
encoding both ways, so the two cannot drift apart unnoticed. Stdlib only (struct, types).

A decoded response is a tree of SimpleNamespace with kio's field names (`md.topics[0].partitions
[0].replica_nodes`), except durations: ints in milliseconds, named with `_ms`
(`throttle_time_ms`, where kio has a timedelta `throttle_time`); error codes are ints whose
`.name` is kio's name for it.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

METADATA = (3, 12)
ALTER_PARTITION_REASSIGNMENTS = (45, 0)
LIST_PARTITION_REASSIGNMENTS = (46, 0)
SASL_HANDSHAKE = (17, 1)
SASL_AUTHENTICATE = (36, 2)

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_HEADER = struct.Struct(">hhi")
_NO_TAGS = b"\x00"


class ErrorCode(int):
    """A Kafka error code; `.name` is kio's name for it (looked up only when an error is shown)."""

    @property
    def name(self) -> str:
        from kio.schema.errors import ErrorCode as KioErrorCode

        try:
            return KioErrorCode(int(self)).name
        except ValueError:
            return f"error {int(self)}"


# ---------------------------------------------------------------------------------- writing
def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _compact_string(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    data = s.encode()
    return _uvarint(len(data) + 1) + data


def _compact_bytes(b: bytes) -> bytes:
    return _uvarint(len(b) + 1) + b


def _compact_int32s(values: list[int] | None) -> bytes:
    if values is None:
        return b"\x00"
    return _uvarint(len(values) + 1) + b"".join(_INT32.pack(v) for v in values)


def _compact_array(items: list[bytes] | None) -> bytes:
    if items is None:
        return b"\x00"
    return _uvarint(len(items) + 1) + b"".join(items)


def _header(api: tuple[int, int], correlation_id: int, client_id: str, flexible: bool) -> bytes:
    """Request header v1 (api key, version, correlation id, client id), v2 adds no tags."""
    client = client_id.encode()
    head = _HEADER.pack(*api, correlation_id) + _INT16.pack(len(client)) + client
    return head + _NO_TAGS if flexible else head


def metadata_request(topics: list[str] | None, correlation_id: int, client_id: str) -> bytes:
    """Metadata v12: the named topics (None: all), no auto-creation, no authorized operations."""
    entries = (
        None
        if topics is None
        else [bytes(16) + _compact_string(name) + _NO_TAGS for name in topics]  # no topic id
    )
    body = _compact_array(entries) + b"\x00\x00" + _NO_TAGS
    return _header(METADATA, correlation_id, client_id, True) + body


def alter_reassignments_request(
    timeout_ms: int,
    targets: dict[str, list[tuple[int, list[int] | None]]],
    correlation_id: int,
    client_id: str,
) -> bytes:
    """AlterPartitionReassignments v0: per topic, (partition, replicas or None to cancel)."""
    topics = [
        _compact_string(name)
        + _compact_array(
            [_INT32.pack(p) + _compact_int32s(replicas) + _NO_TAGS for p, replicas in partitions]
        )
        + _NO_TAGS
        for name, partitions in targets.items()
    ]
    body = _INT32.pack(timeout_ms) + _compact_array(topics) + _NO_TAGS
    return _header(ALTER_PARTITION_REASSIGNMENTS, correlation_id, client_id, True) + body


def list_reassignments_request(timeout_ms: int, correlation_id: int, client_id: str) -> bytes:
    """ListPartitionReassignments v0 of every partition (topics: null)."""
    body = _INT32.pack(timeout_ms) + b"\x00" + _NO_TAGS
    return _header(LIST_PARTITION_REASSIGNMENTS, correlation_id, client_id, True) + body


def sasl_handshake_request(mechanism: str, correlation_id: int, client_id: str) -> bytes:
    name = mechanism.encode()
    body = _INT16.pack(len(name)) + name
    return _header(SASL_HANDSHAKE, correlation_id, client_id, False) + body


def sasl_authenticate_request(token: bytes, correlation_id: int, client_id: str) -> bytes:
    body = _compact_bytes(token) + _NO_TAGS
    return _header(SASL_AUTHENTICATE, correlation_id, client_id, True) + body


# ---------------------------------------------------------------------------------- reading
class Reader:
    """Kafka's primitive types read from one response; a short frame raises ValueError."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def _take(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._data):
            raise ValueError(f"response ends after {len(self._data)} bytes, {end} needed")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self._take(8))[0]
        return value

    def error(self) -> ErrorCode:
        return ErrorCode(self.int16())

    def boolean(self) -> bool:
        return self._take(1) != b"\x00"

    def uuid(self) -> bytes:
        return self._take(16)

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def string(self) -> str:
        return self._take(self.int16()).decode()

    def compact_string(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self._take(n - 1).decode()

    def compact_bytes(self) -> bytes:
        n = self.uvarint()
        return b"" if n == 0 else self._take(n - 1)

    def compact_int32s(self) -> list[int]:
        return [self.int32() for _ in range(max(0, self.uvarint() - 1))]

    def count(self) -> int:
        """A compact array's length (a null array: 0)."""
        return max(0, self.uvarint() - 1)

    def tags(self) -> None:
        """Tagged fields: none of them is read here, all are skipped."""
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


def read_response(api: tuple[int, int], frame: bytes) -> tuple[int, Any]:
    """(correlation id, response) of a response frame without its size prefix."""
    r = Reader(frame)
    correlation_id = r.int32()
    if api != SASL_HANDSHAKE:  # response header v1 (flexible versions): tagged fields
        r.tags()
    return correlation_id, _READERS[api](r)


def _metadata(r: Reader) -> SimpleNamespace:
    throttle_time_ms = r.int32()
    brokers = []
    for _ in range(r.count()):
        brokers.append(
            SimpleNamespace(
                node_id=r.int32(), host=r.compact_string(), port=r.int32(), rack=r.compact_string()
            )
        )
        r.tags()
    cluster_id = r.compact_string()
    controller_id = r.int32()
    topics = []
    for _ in range(r.count()):
        error_code, name, topic_id, is_internal = (
            r.error(),
            r.compact_string(),
            r.uuid(),
            r.boolean(),
        )
        partitions = []
        for _ in range(r.count()):
            partitions.append(
                SimpleNamespace(
                    error_code=r.error(),
                    partition_index=r.int32(),
                    leader_id=r.int32(),
                    leader_epoch=r.int32(),
                    replica_nodes=r.compact_int32s(),
                    isr_nodes=r.compact_int32s(),
                    offline_replicas=r.compact_int32s(),
                )
            )
            r.tags()
        topics.append(
            SimpleNamespace(
                error_code=error_code,
                name=name,
                topic_id=topic_id,
                is_internal=is_internal,
                partitions=partitions,
                topic_authorized_operations=r.int32(),
            )
        )
        r.tags()
    r.tags()
    return SimpleNamespace(
        throttle_time_ms=throttle_time_ms,
        brokers=brokers,
        cluster_id=cluster_id,
        controller_id=controller_id,
        topics=topics,
    )


def _topics_of_partitions(
    r: Reader, partition: Callable[[Reader], SimpleNamespace]
) -> list[SimpleNamespace]:
    """A compact array of topics, each a name and a compact array of partitions read by
    `partition` (each partition, then each topic, closed by its tagged fields)."""
    topics = []
    for _ in range(r.count()):
        name = r.compact_string()
        partitions = []
        for _ in range(r.count()):
            partitions.append(partition(r))
            r.tags()
        topics.append(SimpleNamespace(name=name, partitions=partitions))
        r.tags()
    return topics


def _reassignments(
    r: Reader, topics_field: str, partition: Callable[[Reader], SimpleNamespace]
) -> SimpleNamespace:
    """AlterPartitionReassignments and ListPartitionReassignments answers: a throttle, an error
    with its message, then topics of partitions under `topics_field`."""
    throttle_time_ms, error_code, error_message = r.int32(), r.error(), r.compact_string()
    topics = _topics_of_partitions(r, partition)
    r.tags()
    return SimpleNamespace(
        throttle_time_ms=throttle_time_ms,
        error_code=error_code,
        error_message=error_message,
        **{topics_field: topics},
    )


def _alter_reassignments(r: Reader) -> SimpleNamespace:
    return _reassignments(
        r,
        "responses",
        lambda r: SimpleNamespace(
            partition_index=r.int32(), error_code=r.error(), error_message=r.compact_string()
        ),
    )


def _list_reassignments(r: Reader) -> SimpleNamespace:
    return _reassignments(
        r,
        "topics",
        lambda r: SimpleNamespace(
            partition_index=r.int32(),
            replicas=r.compact_int32s(),
            adding_replicas=r.compact_int32s(),
            removing_replicas=r.compact_int32s(),
        ),
    )


def _sasl_handshake(r: Reader) -> SimpleNamespace:
    error_code = r.error()
    mechanisms = [r.string() for _ in range(max(0, r.int32()))]
    return SimpleNamespace(error_code=error_code, mechanisms=mechanisms)


def _sasl_authenticate(r: Reader) -> SimpleNamespace:
    resp = SimpleNamespace(
        error_code=r.error(),
        error_message=r.compact_string(),
        auth_bytes=r.compact_bytes(),
        session_lifetime_ms=r.int64(),
    )
    r.tags()
    return resp


_READERS = {
    METADATA: _metadata,
    ALTER_PARTITION_REASSIGNMENTS: _alter_reassignments,
    LIST_PARTITION_REASSIGNMENTS: _list_reassignments,
    SASL_HANDSHAKE: _sasl_handshake,
    SASL_AUTHENTICATE: _sasl_authenticate,
}
