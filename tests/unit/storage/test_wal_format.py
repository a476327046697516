from __future__ import annotations

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
    blob, entries, positions = encode_wal_object(groups)
    assert blob[positions[0] : positions[0] + 3] == b"aaa"
    assert blob[positions[1] : positions[1] + 2] == b"bb"
    assert blob[positions[2] : positions[2] + 4] == b"cccc"
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
    blob, _, _ = encode_wal_object([WalGroup("t", "i", 0, 0, 0, 0, 0, [b"x"], [])])
    with pytest.raises(CorruptWalObject):
        decode_wal_index(blob[: HEADER_SIZE + 2])
    with pytest.raises(CorruptWalObject):
        decode_wal_index(b"NOPE" + blob[4:])
    with pytest.raises(CorruptWalObject):
        index_length(b"TM")
