"""Request/response framing on top of kio's generated schemas (Kafka's own message JSON).

A frame on the wire is `int32 size` followed by `size` bytes. A request starts with
`int16 api_key, int16 api_version, int32 correlation_id`, then the rest of its header (v1: nullable
client id; v2: plus tagged fields) and the body. Responses carry the response header the schema
names (ApiVersions always uses header v0, so clients can parse it before they know our versions).
"""

from __future__ import annotations

import io
import struct
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import DecodeError
from kio.static.constants import EntityType
from kio.static.protocol import RequestPayload, ResponsePayload

from tidalmq_broker.protocol.bounds import FrameBoundsError, check_request
from tidalmq_broker.protocol.entities import build
from tidalmq_broker.protocol.fastpath import EncodedBody, MalformedProduce, decode_produce_request

_PREFIX = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")

PRODUCE_KEY = 0
API_VERSIONS_KEY = 18


class MalformedRequest(ValueError):
    """The frame cannot be decoded with the schema its header names."""


class UnsupportedApi(ValueError):
    """An API key this broker does not serve (the connection is closed, as Kafka does)."""


class UnsupportedVersion(ValueError):
    """A version outside the advertised range of a served API."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request dataclass of this api_key/version
    size: int  # bytes of the frame, for metrics and quotas


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a frame, without decoding the rest."""
    if len(frame) < _PREFIX.size:
        raise MalformedRequest(f"request of {len(frame)} bytes is shorter than its header")
    return _PREFIX.unpack_from(frame, 0)


def decode_request(frame: bytes | memoryview, supported: dict[int, tuple[int, int]]) -> Request:
    """Decode one request frame (without its size prefix).

    A Produce request's record sets are views of `frame` (see fastpath.decode_produce_request).
    Raises UnsupportedApi, UnsupportedVersion or MalformedRequest.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    versions = supported.get(api_key)
    if versions is None:
        raise UnsupportedApi(f"api key {api_key} is not served by this broker")
    if not versions[0] <= api_version <= versions[1]:
        raise UnsupportedVersion(api_key, api_version, correlation_id)
    if api_key == PRODUCE_KEY:
        # the data path: parsed by hand, record sets left in the frame (protocol.fastpath)
        try:
            client_id, produce = decode_produce_request(frame, api_version)
        except MalformedProduce as exc:
            raise MalformedRequest(f"api {api_key} v{api_version}: {exc}") from exc
        return Request(api_key, api_version, correlation_id, client_id, produce, len(frame))
    if isinstance(frame, memoryview) and not frame.readonly:
        frame = frame.toreadonly()  # kio's decoder refuses writable buffers
    schema = _request_schema(api_key, api_version)
    header_reader, body_reader = _readers(schema)
    try:
        # kio's native readers reserve an array's count before reading it: only counts the
        # frame's bytes can back get there (see protocol.bounds)
        frame = check_request(schema, frame)
        header, offset = header_reader(frame, 0)
        body, used = body_reader(frame, offset)
    except FrameBoundsError as exc:
        raise MalformedRequest(f"api {api_key} v{api_version}: {exc}") from exc
    except (DecodeError, ValueError, TypeError, IndexError, OverflowError, UnicodeError) as exc:
        raise MalformedRequest(f"api {api_key} v{api_version}: {exc}") from exc
    except Exception as exc:  # whatever else the native decoder raises on hostile bytes
        raise MalformedRequest(f"api {api_key} v{api_version}: {exc!r}") from exc
    if offset + used > len(frame):
        raise MalformedRequest(f"api {api_key} v{api_version}: frame shorter than its fields")
    # Bytes after the last field are ignored, as Apache Kafka's parser does: some clients
    # (librdkafka's Metadata v12 when listing all topics) send a few.
    return Request(api_key, api_version, correlation_id, header.client_id, body, len(frame))


_HEADER_V0 = struct.Struct(">ii")  # size, correlation id
_HEADER_V1 = struct.Struct(">iib")  # size, correlation id, no tagged fields


def encode_response_parts(
    api_key: int, api_version: int, correlation_id: int, body: Any
) -> bytes | list[bytes | memoryview]:
    """Like encode_response, but a body already in wire format (fastpath.EncodedBody) comes
    back as a list of buffers to write in order, its record sets not copied."""
    if not isinstance(body, EncodedBody):
        return encode_response(api_key, api_version, correlation_id, body)
    return _framed(correlation_id, body)


# a body of one part up to this size is joined to its header: one buffer, one write (a
# Produce answer is tens of bytes; joining costs less than a second send on the socket)
_JOIN_UP_TO = 64 * 1024


def _framed(correlation_id: int, body: EncodedBody) -> list[bytes | memoryview]:
    """A body already in wire format behind its response header and size prefix."""
    size = body.size
    if body.flexible:
        head = _HEADER_V1.pack(size + 5, correlation_id, 0)
    else:
        head = _HEADER_V0.pack(size + 4, correlation_id)
    if len(body.parts) == 1 and size <= _JOIN_UP_TO:
        return [head + body.parts[0]]
    return [head, *body.parts]


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """Serialise a response (a kio dataclass, or a dict built into one) with its size prefix."""
    if isinstance(body, EncodedBody):
        return b"".join(_framed(correlation_id, body))
    schema = response_schema(api_key, api_version)
    if not isinstance(body, schema):
        body = build(schema, body)
    header_schema, header_writer, body_writer = _writers(schema)
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    header_writer(buf, build(header_schema, {"correlation_id": correlation_id}))
    body_writer(buf, body)
    out = buf.getbuffer()
    _SIZE.pack_into(out, 0, len(out) - 4)
    del out
    return buf.getvalue()


def encode_request(
    api_key: int, api_version: int, correlation_id: int, body: Any, client_id: str = "tidalmq"
) -> bytes:
    """Serialise a request with its size prefix (the broker's own clients and tests use this)."""
    schema = _request_schema(api_key, api_version)
    if not isinstance(body, schema):
        body = build(schema, body)
    header_schema = schema.__header_schema__
    header = build(
        header_schema,
        {
            "request_api_key": api_key,
            "request_api_version": api_version,
            "correlation_id": correlation_id,
            "client_id": client_id,
        },
    )
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    entity_writer(header_schema)(buf, header)
    entity_writer(schema)(buf, body)
    out = buf.getbuffer()
    _SIZE.pack_into(out, 0, len(out) - 4)
    del out
    return buf.getvalue()


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation_id, body) of a response frame without its size prefix."""
    schema = response_schema(api_key, api_version)
    header, offset = entity_reader(schema.__header_schema__)(frame, 0)
    body, _ = entity_reader(schema)(frame, offset)
    return header.correlation_id, body


def preload_schemas(served: dict[int, tuple[int, int]]) -> int:
    """Import the schemas of the newest served version of every API now (a starting broker
    calls it on a thread of its own once it serves): what current clients ask for does not pay
    for it on the event loop with its first request (older versions still do, once). Returns
    how many versions were loaded."""
    loaded = 0
    for key, (_low, high) in sorted(served.items()):
        try:
            _readers(_request_schema(key, high))
            _writers(response_schema(key, high))
        except (UnknownAPIKey, UnknownEntity):
            continue
        loaded += 1
        time.sleep(0)  # let the event loop's thread have the GIL between imports
    return loaded


def schema_versions(api_key: int) -> tuple[int, int] | None:
    """The version range kio has schemas for, or None for an unknown key. Read from kio's
    index, without importing the schemas: each version's modules are imported when its first
    request comes (importing all of them cost a starting broker 0.6 s)."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    found = [
        v
        for v, entities in schema_name_map.get(name, {}).items()
        if EntityType.request in entities and EntityType.response in entities
    ]
    return (min(found), max(found)) if found else None


@cache
def _request_schema(api_key: int, api_version: int) -> type[RequestPayload]:
    return load_request_schema(api_key, api_version)


@cache
def response_schema(api_key: int, api_version: int) -> type[ResponsePayload]:
    return load_response_schema(api_key, api_version)


@cache
def _readers(schema: type[RequestPayload]) -> tuple[Any, Any]:
    return entity_reader(schema.__header_schema__), entity_reader(schema)


@cache
def _writers(schema: type[ResponsePayload]) -> tuple[type, Any, Any]:
    header_schema = schema.__header_schema__
    return header_schema, entity_writer(header_schema), entity_writer(schema)
