"""The Kafka wire primitives the hand-written response encoders write (fastpath.py,
metadata_response.py) and the request bounds check re-encodes (bounds.py): unsigned varints,
strings, nullable strings and array lengths, each in its classic form and its flexible
(compact, KIP-482) form. Pure functions over values; they must not import the encoders."""

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


def string(text: str, flexible: bool) -> bytes:
    raw = text.encode()
    return (uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else b"\xff\xff"
    return string(text, flexible)


def array_length(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else _I32.pack(n)
