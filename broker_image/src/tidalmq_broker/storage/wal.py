"""The WAL object format: the batches of many partitions written by one flush.

    magic "TMQW" | version u16 | index length u32 | index (JSON) | data

The index comes first so recovery reads it with one small ranged GET. Each index entry names one
partition's contiguous run of batches in this object: topic, topic id, partition, leader epoch,
base and last offset, byte range (relative to the start of the data), max timestamp, and the
idempotent-producer metadata of each batch (producer id, epoch, first and last sequence, base
and last offset; for transactions its kind). Positions handed to callers are absolute within the object.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tidalmq_broker.storage.api import StorageError

MAGIC = b"TMQW"
VERSION = 1
_HEADER = struct.Struct(">4sHI")
HEADER_SIZE = _HEADER.size
INDEX_PROBE_BYTES = 64 * 1024  # first ranged GET of recovery; enough for most indexes

ProducerBatch = tuple[int, ...]
"""(producer id, producer epoch, first sequence, last sequence, base offset, last offset) of an
idempotent batch; a transactional batch adds its kind (producer_state.TRANSACTIONAL), a
commit/abort marker is (producer id, epoch, -1, -1, offset, offset, kind, coordinator epoch)
(docs/transactions.md)."""


class CorruptWalObject(StorageError):
    """Not a WAL object of a format this broker reads."""


@dataclass(slots=True)
class WalEntry:
    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    base_offset: int
    last_offset: int
    position: int  # absolute within the object
    size: int
    max_timestamp: int
    producers: list[ProducerBatch] = field(default_factory=list)


@dataclass(slots=True)
class WalGroup:
    """What the writer hands to the encoder: one partition's buffers in offset order."""

    topic: str
    topic_id: str
    partition: int
    leader_epoch: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    buffers: list[bytes | bytearray | memoryview]
    producers: list[ProducerBatch]


def encode_wal_object(
    groups: Sequence[WalGroup],
) -> tuple[list[bytes | bytearray | memoryview], list[WalEntry]]:
    """The object as parts to store one after the other (ObjectStore.put takes them as they
    are): the header and index, then every group's buffers themselves, not copied. Also its
    entries (absolute positions)."""
    index: list[list[Any]] = []
    rel = 0
    for g in groups:
        start = rel
        for buf in g.buffers:
            rel += len(buf)
        index.append(
            [
                g.topic,
                g.topic_id,
                g.partition,
                g.leader_epoch,
                g.base_offset,
                g.last_offset,
                start,
                rel - start,
                g.max_timestamp,
                g.producers,
            ]
        )
    index_bytes = json.dumps(index, separators=(",", ":")).encode()
    parts: list[bytes | bytearray | memoryview] = [
        _HEADER.pack(MAGIC, VERSION, len(index_bytes)) + index_bytes
    ]
    for g in groups:
        parts.extend(g.buffers)
    return parts, _entries_from_index(index, HEADER_SIZE + len(index_bytes))


def index_length(prefix: bytes) -> int:
    """Total bytes (header + index) needed to decode the index of an object starting `prefix`."""
    if len(prefix) < HEADER_SIZE:
        raise CorruptWalObject(f"WAL object shorter than its header ({len(prefix)} bytes)")
    magic, version, n = _HEADER.unpack_from(prefix)
    if magic != MAGIC or version != VERSION:
        raise CorruptWalObject(f"not a WAL object (magic {magic!r}, version {version})")
    return HEADER_SIZE + int(n)


def decode_wal_index(prefix: bytes) -> list[WalEntry]:
    need = index_length(prefix)
    if len(prefix) < need:
        raise CorruptWalObject(f"WAL index needs {need} bytes, got {len(prefix)}")
    try:
        index = json.loads(prefix[HEADER_SIZE:need])
    except ValueError as exc:
        raise CorruptWalObject(f"WAL index is not valid JSON: {exc}") from exc
    return _entries_from_index(index, need)


def _entries_from_index(index: list[list[Any]], data_start: int) -> list[WalEntry]:
    out = []
    for raw in index:
        topic, topic_id, partition, epoch, base, last, rel, size, max_ts, producers = raw
        out.append(
            WalEntry(
                str(topic),
                str(topic_id),
                int(partition),
                int(epoch),
                int(base),
                int(last),
                data_start + int(rel),
                int(size),
                int(max_ts),
                [tuple(p) for p in producers],
            )
        )
    return out
