"""Valid Kafka requests of every API and version the broker serves, and hostile mutations of them.

Shared by the protocol unit tests, the fuzz test against a real broker process
(tests/integration/broker/test_fuzz_requests.py) and the longer benchmark (bench/fuzz_requests.py).

`random_request` fills a kio request class with random but plausible values (short arrays, names
from a small pool so some requests reach real topics, small timeouts so handlers return soon) and
encodes it with kio. `layout` walks an encoded frame with the schema and records where every
count, length, struct marker and tagged-field section sits; it is written independently of
tidalmq_broker.protocol.bounds (a plain recursive interpreter), so the mutations it guides are not
blind to what bounds.py might skip. `mutate` then applies one of the attacks the issue measured:
huge and negative counts and lengths, truncation, bit flips, unknown tagged fields, and a few
byte-level edits.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import pkgutil
import random
import struct
import types
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import get_field_tag
from tidalmq_broker.protocol.codec import _request_schema, encode_request
from tidalmq_broker.protocol.primitives import read_uvarint, uvarint
from tidalmq_broker.protocol.records import build_batch

TOPICS = ("fuzz-a", "fuzz-b")
GROUP = "fuzz-group"


@cache
def served_versions() -> dict[int, tuple[int, int]]:
    """api key -> (min, max) version, as the broker registers them."""
    import tidalmq_broker.apis as apis

    for module in pkgutil.iter_modules(apis.__path__):
        importlib.import_module(f"tidalmq_broker.apis.{module.name}")
    from tidalmq_broker.apis.kafka_registry import supported_versions

    return dict(supported_versions())


def served_pairs() -> list[tuple[int, int]]:
    return [(k, v) for k, (lo, hi) in sorted(served_versions().items()) for v in range(lo, hi + 1)]


def schema_of(api_key: int, version: int) -> type:
    return _request_schema(api_key, version)


# ------------------------------------------------------------------------------- valid requests
def _nullable(tp: Any) -> tuple[bool, Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(args) < len(typing.get_args(tp)), args[0]
    return False, tp


_INT_RANGES = {
    "int8": (-128, 127),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint8": (0, 255),
    "uint16": (0, (1 << 16) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}


def _int(rng: random.Random, kafka_type: str, name: str) -> int:
    low, high = _INT_RANGES[kafka_type]
    if rng.random() < 0.85:
        # plausible: the partition, epoch, id and count values handlers act on
        pool = [0, 0, 1, 2, -1] if "partition" in name or "epoch" in name else [0, 1, 3, -1]
        return rng.choice(pool)
    return rng.choice([low, high, rng.randint(low, high)])


def _string(rng: random.Random, name: str) -> str:
    # client text a broker might log: a line break in it must not start a forged log line
    forged = "fuzz\n2026-01-01 00:00:00,000 ERROR forged\r\x1b[0m"
    if "topic" in name or name == "name":
        pool = [*TOPICS, f"fuzz-{rng.randrange(100)}", "", forged]
    elif "group" in name:
        pool = [GROUP, GROUP, "", forged]
    else:
        pool = ["", "x", "fuzz", "é" * rng.randint(1, 4), forged]
    return rng.choice(pool)


def _value(rng: random.Random, kafka_type: str, hint: Any, name: str) -> Any:
    if kafka_type in _INT_RANGES:
        return _int(rng, kafka_type, name)
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "float64":
        return rng.choice([0.0, 1.5, -1.0])
    if kafka_type == "string":
        return _string(rng, name)
    if kafka_type == "bytes":
        return rng.randbytes(rng.randint(0, 12))
    if kafka_type == "records":
        return build_batch([(b"k", b"v" * rng.randint(0, 20))]) if rng.random() < 0.8 else b""
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.5 else uuid.UUID(int=0)
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.choice([0, 10, 100]))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randint(0, 1 << 31), tz=datetime.UTC)
    raise TypeError(f"no generator for kafka type {kafka_type} ({hint})")


def random_entity(cls: type, rng: random.Random, depth: int = 0, null_rate: float = 0.15) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        tagged = get_field_tag(field) is not None
        if tagged and rng.random() < 0.6:
            continue  # absent: kio writes no tag for a default
        nullable, inner = _nullable(hints[field.name])
        kafka_type = field.metadata.get("kafka_type", "")
        if nullable and not tagged and rng.random() < null_rate:
            kwargs[field.name] = None
            continue
        if typing.get_origin(inner) is tuple:
            _, element = _nullable(typing.get_args(inner)[0])
            count = rng.choice([0, 1, 1, 2, 3]) if depth < 3 else 0
            if dataclasses.is_dataclass(element):
                items = [random_entity(element, rng, depth + 1, null_rate) for _ in range(count)]
            else:
                items = [_value(rng, kafka_type, element, field.name) for _ in range(count)]
            kwargs[field.name] = tuple(items)
        elif dataclasses.is_dataclass(inner):
            kwargs[field.name] = random_entity(inner, rng, depth + 1, null_rate)
        else:
            kwargs[field.name] = _value(rng, kafka_type, inner, field.name)
    return cls(**kwargs)


def random_request(
    api_key: int, version: int, rng: random.Random, correlation: int = 1, null_rate: float = 0.15
) -> bytes:
    """A valid request frame (without its size prefix); each nullable field is null at
    `null_rate`."""
    body = random_entity(schema_of(api_key, version), rng, null_rate=null_rate)
    client_id = rng.choice(["fuzz", "", "fuzz-client"])
    return encode_request(api_key, version, correlation, body, client_id=client_id)[4:]


# ------------------------------------------------------------------------------- frame layout
@dataclass(frozen=True, slots=True)
class Slot:
    """Where one length-prefixed or marked thing sits in a frame."""

    kind: str  # "array", "string", "bytes", "marker" (nullable struct), "tags"
    offset: int
    width: int  # bytes of the prefix as encoded (varints: as the frame has them)
    compact: bool
    path: str


class _Layout:
    def __init__(self, frame: bytes) -> None:
        self.buf = frame
        self.pos = 0
        self.slots: list[Slot] = []

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos, len(self.buf))
        return value

    def prefix(self, kind: str, compact: bool, width: int, path: str) -> int:
        start = self.pos
        if compact:
            n = self.uvarint() - 1
        else:
            fmt = ">h" if width == 2 else ">i"
            (n,) = struct.unpack_from(fmt, self.buf, self.pos)
            self.pos += width
        self.slots.append(Slot(kind, start, self.pos - start, compact, path))
        return n

    def entity(self, cls: type, is_header: bool, path: str) -> None:
        flexible = bool(getattr(cls, "__flexible__", False))
        hints = typing.get_type_hints(cls)
        tagged = {}
        for field in dataclasses.fields(cls):
            tag = get_field_tag(field)
            compact = flexible and not (is_header and field.name == "client_id")
            if tag is not None:
                tagged[int(tag)] = (field, compact)
                continue
            self.field(field, hints[field.name], compact, f"{path}.{field.name}")
        if flexible:
            start = self.pos
            count = self.uvarint()
            self.slots.append(Slot("tags", start, self.pos - start, True, path))
            for _ in range(count):
                tag = self.uvarint()
                size = self.uvarint()
                field, compact = tagged[tag]
                self.field(field, hints[field.name], compact, f"{path}.{field.name}")
                del size

    def field(self, field: dataclasses.Field[Any], hint: Any, compact: bool, path: str) -> None:
        _, inner = _nullable(hint)
        kafka_type = field.metadata.get("kafka_type", "")
        if typing.get_origin(inner) is tuple:
            n = self.prefix("array", compact, 4, path)
            _, element = _nullable(typing.get_args(inner)[0])
            for i in range(max(n, 0)):
                if dataclasses.is_dataclass(element):
                    self.entity(element, False, f"{path}[{i}]")
                else:
                    self.scalar(kafka_type, compact, f"{path}[{i}]")
        elif dataclasses.is_dataclass(inner):
            if _nullable(hint)[0]:
                self.slots.append(Slot("marker", self.pos, 1, False, path))
                self.pos += 1
                if self.buf[self.pos - 1] == 0xFF:
                    return
            self.entity(inner, False, path)
        else:
            self.scalar(kafka_type, compact, path)

    def scalar(self, kafka_type: str, compact: bool, path: str) -> None:
        fixed = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2}
        fixed |= {"int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8}
        fixed |= {"timedelta_i64": 8, "datetime_i64": 8, "float64": 8, "uuid": 16}
        if kafka_type in fixed:
            self.pos += fixed[kafka_type]
            return
        kind = "string" if kafka_type == "string" else "bytes"
        n = self.prefix(kind, compact, 2 if kind == "string" else 4, path)
        self.pos += max(n, 0)


def layout(api_key: int, version: int, frame: bytes) -> list[Slot]:
    """Every count, length, struct marker and tag section of a valid frame, in frame order."""
    schema = schema_of(api_key, version)
    walk = _Layout(frame)
    walk.entity(schema.__header_schema__, True, "header")
    walk.entity(schema, False, "body")
    return walk.slots


# ------------------------------------------------------------------------------- mutations
def _replace(frame: bytes, slot: Slot, prefix: bytes) -> bytes:
    return frame[: slot.offset] + prefix + frame[slot.offset + slot.width :]


def _count(frame: bytes, slot: Slot, rng: random.Random) -> tuple[str, bytes]:
    """A count or length the bytes behind it cannot back (or just off by a little)."""
    if slot.compact:
        value = rng.choice(
            [0xFFFFFFFF, 0x7FFFFFFF, 1 << 28, 1 << 20, 65536, 0, 1, 2, 3, 1000, 34359738367]
        )
        raw = uvarint(value)
        if rng.random() < 0.2:  # the same value padded to five bytes, as a sloppy client might
            raw = bytes([b | 0x80 for b in raw]) + b"\x00" if len(raw) < 5 else raw
        return f"{slot.kind}-count-varint-{value}", _replace(frame, slot, raw)
    width = slot.width
    high = (1 << (8 * width - 1)) - 1
    value = rng.choice([high, -1, -2, -high - 1, high // 2, high >> 8, 1000, 1])
    raw = value.to_bytes(width, "big", signed=True)
    return f"{slot.kind}-count-{value}", _replace(frame, slot, raw)


def _unknown_tags(frame: bytes, slot: Slot, rng: random.Random) -> tuple[str, bytes]:
    """One or more tagged fields the schema does not know, some with a size past the frame."""
    count, body_at = read_uvarint(frame, slot.offset, len(frame))
    extra = rng.randint(1, 3)
    fields = b""
    for _ in range(extra):
        tag = rng.choice([7, 99, 1000, 1 << 20, 0x7FFFFFFF])
        payload = rng.randbytes(rng.randint(0, 8))
        size = len(payload)
        if rng.random() < 0.2:
            size = rng.choice([size + 1, 1 << 20, 0x7FFFFFFF])
        fields += uvarint(tag) + uvarint(size) + payload
    head = uvarint(count + extra)
    # new fields go first: Kafka sorts tags, but a reader must cope with any order
    return f"unknown-tags-{extra}", frame[: slot.offset] + head + fields + frame[body_at:]


def _null_marker(frame: bytes, slot: Slot, rng: random.Random) -> tuple[str, bytes]:
    marker = rng.choice([0x00, 0x80, 0xFE, 0x7F])
    return f"struct-marker-{marker:#x}", frame[: slot.offset] + bytes([marker]) + frame[
        slot.offset + 1 :
    ]


def _truncate(frame: bytes, rng: random.Random) -> tuple[str, bytes]:
    cut = rng.randrange(0, len(frame))
    return f"truncate-{cut}-of-{len(frame)}", frame[:cut]


def _bit_flips(frame: bytes, rng: random.Random) -> tuple[str, bytes]:
    out = bytearray(frame)
    flips = rng.randint(1, 4)
    for _ in range(flips):
        # past the api key and version: a flip there only names another (or no) schema
        at = rng.randrange(4, len(out)) if len(out) > 4 else 0
        out[at] ^= 1 << rng.randrange(8)
    return f"bit-flips-{flips}", bytes(out)


def _bytes_edit(frame: bytes, rng: random.Random) -> tuple[str, bytes]:
    at = rng.randrange(8, len(frame) + 1) if len(frame) > 8 else len(frame)
    choice = rng.randrange(4)
    if choice == 0:
        return "insert-ff", frame[:at] + b"\xff" * rng.randint(1, 8) + frame[at:]
    if choice == 1:
        return "insert-random", frame[:at] + rng.randbytes(rng.randint(1, 16)) + frame[at:]
    if choice == 2:
        return "delete", frame[:at] + frame[at + rng.randint(1, 8) :]
    return "set-ff", frame[:at] + b"\xff" * min(4, len(frame) - at) + frame[at + 4 :]


def mutate(api_key: int, version: int, frame: bytes, rng: random.Random) -> tuple[str, bytes]:
    """(what was done, the mutated frame) for a valid frame of api_key/version."""
    slots = layout(api_key, version, frame)
    counts = [s for s in slots if s.kind in ("array", "string", "bytes")]
    tags = [s for s in slots if s.kind == "tags"]
    markers = [s for s in slots if s.kind == "marker"]
    attack = rng.random()
    if attack < 0.45 and counts:
        arrays = [s for s in counts if s.kind == "array"]
        slot = rng.choice(arrays if arrays and rng.random() < 0.7 else counts)
        return _count(frame, slot, rng)
    if attack < 0.6 and tags:
        return _unknown_tags(frame, rng.choice(tags), rng)
    if attack < 0.63 and markers:
        return _null_marker(frame, rng.choice(markers), rng)
    if attack < 0.75:
        return _truncate(frame, rng)
    if attack < 0.9:
        return _bit_flips(frame, rng)
    return _bytes_edit(frame, rng)


@dataclass(frozen=True, slots=True)
class Case:
    api_key: int
    version: int
    attack: str
    frame: bytes  # without the size prefix

    def wire(self) -> bytes:
        return struct.pack(">i", len(self.frame)) + self.frame

    def describe(self) -> str:
        return f"api {self.api_key} v{self.version} {self.attack}: {self.frame[:64].hex()}"


def known_killers() -> list[Case]:
    """The frames the issue measured killing a broker: a Fetch v12 whose compact topics count is
    the varint ff ff ff ff 0f (49 bytes), and int32 counts of 2^31 - 1 in Fetch v4 and
    ListOffsets v1."""
    fetch12 = (
        struct.pack(">hhi", 1, 12, 1)
        + b"\x00\x01f\x00"  # client id "f", no header tags
        + struct.pack(">iiiibii", -1, 100, 1, 1 << 20, 0, 0, -1)
        + b"\xff\xff\xff\xff\x0f"  # topics: 2^32 - 2 entries
        + b"\x01\x00\x00"  # forgotten topics, rack id, tags
    )
    fetch4 = struct.pack(">hhi", 1, 4, 2) + b"\x00\x04fuzz"
    fetch4 += struct.pack(">iiiib", -1, 100, 1, 1 << 20, 0) + struct.pack(">i", 0x7FFFFFFF)
    offsets1 = struct.pack(">hhi", 2, 1, 3) + b"\x00\x04fuzz"
    offsets1 += struct.pack(">i", -1) + struct.pack(">i", 0x7FFFFFFF)
    return [
        Case(1, 12, "issue-fetch-v12-compact-count", fetch12),
        Case(1, 4, "issue-fetch-v4-int32-count", fetch4),
        Case(2, 1, "issue-list-offsets-v1-int32-count", offsets1),
    ]


def cases(seed: int, count: int, pairs: list[tuple[int, int]] | None = None) -> Iterator[Case]:
    """`count` mutated requests, cycling through every served API and version, reproducibly."""
    rng = random.Random(seed)
    pairs = pairs or served_pairs()
    for i in range(count):
        api_key, version = pairs[i % len(pairs)]
        frame = random_request(api_key, version, rng, correlation=i + 1)
        attack, mutated = mutate(api_key, version, frame, rng)
        yield Case(api_key, version, attack, mutated)
