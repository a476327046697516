from __future__ import annotations

import json
import struct

import pytest
from tidalmq_broker.storage.wal import (
    HEADER_SIZE,
    CorruptWalObject,
    WalGroup,
    decode_wal_index,
    encode_wal_object,
    index_length,
)


def test_round_trip_with_absolute_positions() -> None:
    groups = [
        WalGroup("t", "id1", 0, 5, 10, 12, 999, [b"aaa", bytearray(b"bb")], [(7, 1, 0, 2, 10, 12)]),
        WalGroup("u", "id2", 3, 1, 0, 0, 5, [memoryview(b"cccc")], []),
    ]
    parts, entries = encode_wal_object(groups)
    assert parts[1:] == [b"aaa", bytearray(b"bb"), memoryview(b"cccc")]  # as given, not copied
    assert all(
        part is buf
        for part, buf in zip(parts[1:], [*groups[0].buffers, *groups[1].buffers], strict=True)
    )
    blob = b"".join(parts)
    decoded = decode_wal_index(blob)
    assert decoded == entries
    first, second = decoded
    assert (first.topic, first.topic_id, first.partition, first.leader_epoch) == ("t", "id1", 0, 5)
    assert (first.base_offset, first.last_offset, first.max_timestamp) == (10, 12, 999)
    assert blob[first.position : first.position + first.size] == b"aaabb"
    assert first.producers == [(7, 1, 0, 2, 10, 12)]
    assert blob[second.position : second.position + second.size] == b"cccc"
    assert index_length(blob[:HEADER_SIZE]) == first.position


def test_truncated_or_foreign_objects_are_rejected() -> None:
    blob = b"".join(encode_wal_object([WalGroup("t", "i", 0, 0, 0, 0, 0, [b"x"], [])])[0])
    with pytest.raises(CorruptWalObject):
        decode_wal_index(blob[: HEADER_SIZE + 2])
    with pytest.raises(CorruptWalObject):
        decode_wal_index(b"NOPE" + blob[4:])
    with pytest.raises(CorruptWalObject):
        index_length(b"TM")


def test_the_stored_bytes_are_the_format() -> None:
    """magic | version | index length | index JSON | data, byte for byte (what recovery and
    compaction of objects written by older brokers read)."""
    parts, _ = encode_wal_object(
        [
            WalGroup("t", "id1", 2, 5, 10, 12, 999, [b"aaa", b"bb"], [(7, 1, 0, 2, 10, 12)]),
            WalGroup("u", "id2", 3, 1, 0, 0, 5, [b"cccc"], []),
        ]
    )
    index = [
        ["t", "id1", 2, 5, 10, 12, 0, 5, 999, [[7, 1, 0, 2, 10, 12]]],
        ["u", "id2", 3, 1, 0, 0, 5, 4, 5, []],
    ]
    index_bytes = json.dumps(index, separators=(",", ":")).encode()
    assert b"".join(parts) == (
        struct.pack(">4sHI", b"TMQW", 1, len(index_bytes)) + index_bytes + b"aaabbcccc"
    )
