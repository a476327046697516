"""A bounded pre-pass over a request frame, run before kio's native decoder sees it.

kio's compiled readers reserve `count x 8` bytes for an array as soon as they read its count,
before reading a single element: a 49-byte Fetch v12 frame announcing 2^32 topics made the
broker reserve 34 GB and abort (no Python exception to catch). Strings and bytes are safe there
(their length is checked against the buffer), arrays are not, and arrays hold entities whose
sizes vary, so the count cannot be checked without walking the fields before it.

`check_request` walks the frame once with the request's schema (header included): every array
count must fit the bytes left at that point (count x the smallest encoding of one element), every
string and bytes length likewise, nulls only where the schema allows them, varints at most five
bytes. After it passes, each array kio reserves holds elements that are really in the frame, so
the decoder allocates in proportion to the bytes the client sent.

The walk follows kio 0.6.5's reader exactly where the two could part ways: the request header's
client id is a legacy string even in flexible header v2; a nullable struct is null only when its
int8 marker is -1 (kio reads the struct after any other marker, 0x80 included); a tagged field's
value is read from where its size prefix ends. Tests compare where both end on every served API
and version (tests/unit/protocol/test_bounds.py).

Unknown tagged fields are legal in flexible versions (a newer client may send them; Kafka skips
them) but kio raises KeyError on them, so the walk returns a copy of the frame without them; a
frame with none (every real client today) is returned as it is, not copied.

Each schema's walk is one Python function generated from a plan compiled once per request class:
nested structs and arrays are inlined as nested loops (a call per element cost as much as kio's
own decode), fixed-width runs are one bounds check, and an array of fixed-width structs is one
multiplication. protocol/fastpath.py's Produce reader checks its own lengths and does not come
through here.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.serial._introspect import get_field_tag
from kio.static.protocol import RequestPayload

from tidalmq_broker.protocol.primitives import read_uvarint, uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

_FIXED_WIDTH = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_LENGTH_PREFIXED = {"string", "bytes", "records"}

# op codes of a plan; every op is (code, field name, ...)
_FIXED = 0  # (op, name, width)
_STRING = 1  # (op, name, nullable, compact, wide): a string or bytes field; wide = int32 length
_ARRAY_FIXED = 2  # (op, name, nullable, compact, element width)
_ARRAY_STRING = 3  # (op, name, nullable, compact, plan of one string)
_ARRAY_ENTITY = 4  # (op, name, nullable, compact, plan)
_ENTITY = 5  # (op, name, nullable, plan): a struct field; nullable ones carry an int8 marker
_TAGS = 6  # (op, name, {tag: plan}): the tagged-field section of a flexible struct

Walk = Callable[[Any, int, int, list[Any]], int]
"""walk(buf, pos, end, drop) -> the position after the plan's fields; unknown tagged fields found
on the way are appended to drop as (start, stop, replacement)."""


class FrameBoundsError(ValueError):
    """A count, length or null in the frame that the bytes present cannot back."""


@dataclasses.dataclass(frozen=True, slots=True, eq=False)  # hashed by identity
class _Plan:
    ops: tuple[tuple[Any, ...], ...]
    min_size: int  # bytes of the shortest valid encoding (at least 1: no zero-size elements)


def check_request(schema: type[RequestPayload], frame: bytes | memoryview) -> bytes | memoryview:
    """Walk a request frame (without its size prefix, header included) for `schema`, a kio
    request class. Returns `frame`, or a copy without unknown tagged fields. Raises FrameBoundsError.
    """
    drop: list[tuple[int, int, bytes]] = []
    _walk_request(schema, frame, drop)
    if not drop:
        return frame
    return _without(frame, drop)


def request_end(schema: type[RequestPayload], frame: bytes | memoryview) -> int:
    """Where the walk of a frame without unknown tagged fields ends: the offset after the body's
    last field, which must be where kio's decoder ends too (tests compare the two)."""
    drop: list[tuple[int, int, bytes]] = []
    end = _walk_request(schema, frame, drop)
    if drop:
        raise ValueError("the frame has unknown tagged fields: walk check_request's copy")
    return end


def prepare(schema: type[RequestPayload]) -> None:
    """Compile the walk of a request class ahead of its first request (raises TypeError for a
    field type the walk has no bound for)."""
    _walkers(schema)


def _walk_request(schema: type[RequestPayload], frame: bytes | memoryview, drop: list[Any]) -> int:
    header, body = _walkers(schema)
    end = len(frame)
    try:
        return body(frame, header(frame, 0, end, drop), end, drop)
    except (struct.error, IndexError) as exc:
        raise FrameBoundsError(f"frame ends inside a field: {exc}") from exc


@cache
def _walkers(schema: type[RequestPayload]) -> tuple[Walk, Walk]:
    header: type = schema.__header_schema__  # a class: hashable, whatever its instances are
    return _compile(_plan(header, True)), _compile(_plan(schema, False))


# ---------------------------------------------------------------------------------- the walk
def _fail(message: str) -> None:
    raise FrameBoundsError(message)


class _Source:
    """The source of one walk function, generated from a plan (never from frame bytes)."""

    def __init__(self) -> None:
        self.lines = ["def walk(buf, pos, end, drop):"]
        self.env: dict[str, Any] = {
            "_fail": _fail,
            "_uvarint": read_uvarint,
            "_FrameBoundsError": FrameBoundsError,
            "_i16": _I16.unpack_from,
            "_i32": _I32.unpack_from,
            "_walk_tags": _walk_tags,
        }

    def emit(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def length(self, indent: int, compact: bool, width: int, var: str, what: str) -> None:
        """Read a length (or count; -1 = null) into `var`."""
        if compact:
            self.emit(indent, f"if pos >= end: _fail({what + ' runs past the frame'!r})")
            self.emit(indent, f"{var} = buf[pos]")
            self.emit(indent, f"if {var} < 0x80: pos += 1")
            self.emit(indent, f"else: {var}, pos = _uvarint(buf, pos, end, _FrameBoundsError)")
            self.emit(indent, f"{var} -= 1")
        else:
            reader = "_i16" if width == 2 else "_i32"
            self.emit(indent, f"if pos + {width} > end: _fail({what + ' runs past the frame'!r})")
            self.emit(indent, f"{var} = {reader}(buf, pos)[0]")
            self.emit(indent, f"pos += {width}")

    def null_check(self, indent: int, nullable: bool, var: str, what: str) -> None:
        if nullable:
            self.emit(indent, f"if {var} < -1: _fail(f'{what} {{{var}}}')")
        else:
            self.emit(indent, f"if {var} < 0: _fail(f'{what} {{{var}}} where no null is allowed')")

    def ops(self, plan: _Plan, indent: int, depth: int) -> None:
        n = f"n{depth}"
        for op in plan.ops:
            code, name = op[0], op[1]
            if code == _FIXED:
                self.emit(indent, f"pos += {op[2]}")
                self.emit(indent, f"if pos > end: _fail({'frame ends inside ' + name!r})")
            elif code == _STRING:
                _, _, nullable, compact, wide = op
                self.length(indent, compact, 4 if wide else 2, n, f"{name}: length")
                self.null_check(indent, nullable, n, f"{name}: length")
                self.emit(indent, f"if {n} > 0:")
                self.emit(indent + 1, f"pos += {n}")
                self.emit(
                    indent + 1,
                    f"if pos > end: _fail(f'{name}: length {{{n}}} runs past the frame')",
                )
            elif code == _ENTITY:
                _, _, nullable, inner = op
                if nullable:
                    self.emit(indent, f"if pos >= end: _fail({name + ': no struct marker'!r})")
                    self.emit(indent, "pos += 1")
                    # kio reads the struct unless the marker is exactly -1 (0x80..0xfe included)
                    self.emit(indent, "if buf[pos - 1] != 0xFF:")
                    self.ops(inner, indent + 1, depth + 1)
                else:
                    self.ops(inner, indent, depth + 1)
            elif code == _TAGS:
                known = f"tags{len(self.env)}"
                self.env[known] = op[2]
                self.emit(indent, "if pos < end and buf[pos] == 0: pos += 1")  # none: the usual
                self.emit(indent, f"else: pos = _walk_tags(buf, pos, end, {known}, drop)")
            else:
                _, _, nullable, compact, inner = op
                self.length(indent, compact, 4, n, f"{name}: array count")
                self.null_check(indent, nullable, n, f"{name}: array count")
                width = inner if code == _ARRAY_FIXED else _fixed_width(inner)
                least = width if width is not None else inner.min_size
                self.emit(indent, f"if {n} > 0:")
                self.emit(indent + 1, f"if {n} * {least} > end - pos:")
                self.emit(
                    indent + 2,
                    f"_fail(f'{name}: array of {{{n}}} entries of {least}+ bytes"
                    f" in {{end - pos}}')",
                )
                if width is not None:
                    self.emit(indent + 1, f"pos += {n} * {width}")
                    continue
                loop = indent + 1
                tagged_width = _fixed_width_then_tags(inner)
                if tagged_width is not None:
                    # fixed fields then (almost always) no tagged fields: every element is
                    # width + 1 bytes and ends in a zero, checked in one strided slice
                    stride = tagged_width + 1
                    self.emit(
                        indent + 1,
                        f"if bytes(buf[pos + {tagged_width} : pos + {n} * {stride} : {stride}])"
                        f".count(0) == {n}:",
                    )
                    self.emit(indent + 2, f"pos += {n} * {stride}")
                    self.emit(indent + 1, "else:")
                    loop += 1
                self.emit(loop, f"for _ in range({n}):")
                self.ops(inner, loop + 1, depth + 1)


def _fixed_width(plan: _Plan) -> int | None:
    """The size of every encoding of a struct with fixed-width fields only, else None."""
    if len(plan.ops) == 1 and plan.ops[0][0] == _FIXED:
        return int(plan.ops[0][2])
    return None


def _fixed_width_then_tags(plan: _Plan) -> int | None:
    """The width of a flexible struct's fixed-width fields when it has no others, else None."""
    ops = plan.ops
    if len(ops) == 2 and ops[0][0] == _FIXED and ops[1][0] == _TAGS:
        return int(ops[0][2])
    return None


@cache
def _compile(plan: _Plan) -> Walk:
    source = _Source()
    source.ops(plan, 1, 0)
    source.emit(1, "return pos")
    env = source.env
    exec("\n".join(source.lines), env)  # source built from the schema only, never from a frame
    walk: Walk = env["walk"]
    return walk


def _walk_tags(buf: Any, pos: int, end: int, known: dict[int, _Plan], drop: list[Any]) -> int:
    count_at = pos
    count, pos = read_uvarint(buf, pos, end, FrameBoundsError)
    count_end = pos  # a client may pad the varint: replace the bytes it used, not a re-encoding
    if count * 2 > end - pos:
        raise FrameBoundsError(f"{count} tagged fields in {end - pos} bytes")
    unknown = 0
    for _ in range(count):
        start = pos
        tag, pos = read_uvarint(buf, pos, end, FrameBoundsError)
        size, pos = read_uvarint(buf, pos, end, FrameBoundsError)
        field_end = pos + size
        if field_end > end:
            raise FrameBoundsError(f"tagged field {tag} of {size} bytes runs past the frame")
        plan = known.get(tag)
        if plan is None:
            unknown += 1
            drop.append((start, field_end, b""))
        elif _compile(plan)(buf, pos, field_end, drop) != field_end:
            raise FrameBoundsError(f"tagged field {tag} is not {size} bytes long")
        pos = field_end
    if unknown:
        drop.append((count_at, count_end, uvarint(count - unknown)))
    return pos


def _without(frame: bytes | memoryview, edits: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray()
    pos = 0
    for start, stop, replacement in sorted(edits):
        out += frame[pos:start]
        out += replacement
        pos = stop
    out += frame[pos:]
    return bytes(out)


# ---------------------------------------------------------------------------------- plans
@cache
def _plan(cls: type, is_header: bool) -> _Plan:
    flexible = bool(getattr(cls, "__flexible__", False))
    hints = typing.get_type_hints(cls)
    ops: list[tuple[Any, ...]] = []
    tagged: dict[int, _Plan] = {}
    min_size = 0
    for field in dataclasses.fields(cls):
        # the header's client id is a legacy string even in flexible header v2
        compact = flexible and not (is_header and field.name == "client_id")
        op, size = _field_op(cls, field, hints[field.name], compact)
        tag = get_field_tag(field)
        if tag is not None:
            tagged[int(tag)] = _Plan((op,), max(size, 1))
            continue
        min_size += size
        if op[0] == _FIXED and ops and ops[-1][0] == _FIXED:
            first = ops[-1][1].split("..")[0]
            ops[-1] = (_FIXED, f"{first}..{field.name}", ops[-1][2] + op[2])
        else:
            ops.append(op)
    if flexible:
        ops.append((_TAGS, cls.__name__, tagged))
        min_size += 1
    return _Plan(tuple(ops), max(min_size, 1))


def _nullable(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _field_op(
    cls: type, field: dataclasses.Field[Any], hint: Any, compact: bool
) -> tuple[tuple[Any, ...], int]:
    nullable, inner = _nullable(hint)
    kafka_type = field.metadata.get("kafka_type")
    name = field.name
    prefix = 1 if compact else 4
    if typing.get_origin(inner) is tuple:
        element_nullable, element = _nullable(typing.get_args(inner)[0])
        if isinstance(element, type) and dataclasses.is_dataclass(element):
            return (_ARRAY_ENTITY, name, nullable, compact, _plan(element, False)), prefix
        if kafka_type in _FIXED_WIDTH:
            return (_ARRAY_FIXED, name, nullable, compact, _FIXED_WIDTH[kafka_type]), prefix
        if kafka_type == "string":
            string = _Plan(((_STRING, name, element_nullable, compact, False),), prefix // 2 or 1)
            return (_ARRAY_STRING, name, nullable, compact, string), prefix  # 1 or 2 bytes each
        raise TypeError(f"{cls.__qualname__}.{name}: no bound for arrays of {kafka_type}")
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        plan = _plan(inner, False)
        return (_ENTITY, name, nullable, plan), 1 if nullable else plan.min_size  # null: marker
    if kafka_type in _FIXED_WIDTH:
        width = _FIXED_WIDTH[kafka_type]
        return (_FIXED, name, width), width
    if kafka_type in _LENGTH_PREFIXED:
        wide = kafka_type != "string"
        return (_STRING, name, nullable, compact, wide), 1 if compact else (4 if wide else 2)
    raise TypeError(f"{cls.__qualname__}.{name}: no bound for kafka type {kafka_type}")
