"""The Kafka wire primitives, in one place for everyone who reads or writes them by hand: the
hand-written response encoders (fastpath.py, metadata_response.py), the produce fast path's
reader (fastpath.py), the request bounds check (bounds.py), the record batch codec (records.py)
and the tests that build or take apart frames byte by byte (the request fuzzer, the bounds tests).

Unsigned varints (written and read), zigzag varints (written), strings, nullable strings and
array lengths, each in its classic form and its flexible (compact, KIP-482) form. Pure functions
over values and buffers; they must not import the encoders, the readers or anything that does
I/O."""

from __future__ import annotations

import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def uvarint(value: int) -> bytes:
    """An unsigned varint (7 bits a byte, low bits first)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    error: type[ValueError] = ValueError,
) -> tuple[int, int]:
    """The unsigned varint at `pos` and where it ends. Kafka's readUnsignedVarint: at most five
    bytes; `error` (the caller's own ValueError) if it runs past `end` or is longer than that."""
    result = shift = 0
    while True:
        if pos >= end:
            raise error("varint runs past the frame")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise error("varint longer than 5 bytes")


def varint(value: int) -> bytes:
    """A signed varint, zigzag-encoded (the record fields of a v2 record batch), for values in
    the int64 range."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def string(text: str, flexible: bool) -> bytes:
    raw = text.encode()
    return (uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else b"\xff\xff"
    return string(text, flexible)


def array_length(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else _I32.pack(n)
