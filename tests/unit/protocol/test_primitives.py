"""The wire primitives (protocol/primitives.py) that the broker's readers and writers and the
tests' hand-built frames share: what one writes the other reads, and a bad varint is refused
with the caller's own error, as the bounds walk and the produce fast path need."""

from __future__ import annotations

import pytest
from tidalmq_broker.protocol.bounds import FrameBoundsError
from tidalmq_broker.protocol.fastpath import MalformedProduce, decode_produce_request
from tidalmq_broker.protocol.primitives import read_uvarint, uvarint, varint
from tidalmq_broker.protocol.records import _read_varint

EDGES = [0, 1, 127, 128, 255, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 28) - 1, (1 << 32) - 1]


@pytest.mark.parametrize("value", EDGES)
def test_an_unsigned_varint_reads_back_where_it_was_written(value: int) -> None:
    raw = b"\xaa" + uvarint(value) + b"\xbb"
    assert read_uvarint(raw, 1, len(raw)) == (value, len(raw) - 1)
    assert len(uvarint(value)) == max(1, (value.bit_length() + 6) // 7)


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, -65, 1 << 31, -(1 << 63), (1 << 63) - 1])
def test_a_zigzag_varint_reads_back_with_the_record_codec(value: int) -> None:
    raw = varint(value)
    assert _read_varint(memoryview(raw), 0) == (value, len(raw))
    assert len(varint(-1)) == len(varint(0)) == 1  # zigzag: small magnitudes are one byte


@pytest.mark.parametrize("error", [ValueError, FrameBoundsError, MalformedProduce])
def test_a_bad_varint_is_refused_with_the_callers_error(error: type[ValueError]) -> None:
    with pytest.raises(error, match="varint runs past the frame"):
        read_uvarint(b"\x80\x80", 0, 2, error)
    with pytest.raises(error, match="varint runs past the frame"):
        read_uvarint(b"\x01\x02", 1, 1, error)  # `end` bounds it, not the buffer
    with pytest.raises(error, match="varint longer than 5 bytes"):
        read_uvarint(b"\xff\xff\xff\xff\xff\x01", 0, 6, error)
    # five bytes is Kafka's most, a padded small value included
    assert read_uvarint(b"\x81\x80\x80\x80\x00", 0, 5, error) == (1, 5)


def test_the_produce_fast_path_refuses_a_truncated_varint() -> None:
    # ProduceRequest v9 (flexible): header, then a transactional id whose compact length is a
    # varint the frame ends inside
    frame = b"\x00\x00\x00\x09\x00\x00\x00\x01" + b"\x00\x01c" + b"\x00" + b"\x80"
    with pytest.raises(MalformedProduce, match="varint runs past the frame"):
        decode_produce_request(memoryview(frame), 9)
