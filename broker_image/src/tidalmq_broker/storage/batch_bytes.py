"""Whole record batches inside stored bytes, by offset: the slice a read returns (from the batch
holding an offset, within a byte budget), the batches below an offset (read_committed stops at
the last stable offset), and the log-append time a partition stamps into a batch it takes.

Pure functions over bytes (the codec, protocol/records.py, parses the headers): the open
partition's reads (storage/partition/) and the reads of sealed partitions (storage/sealed.py)
share them. They must not touch the object store, the cache or a partition's state."""

from __future__ import annotations

import struct

import crc32c

from tidalmq_broker.protocol import records

_ATTRS_AND_MAX_TS = 21
_MAX_TS_POS = 35
_CRC_POS = 17


def set_log_append_time(buf: bytearray | memoryview, h: records.BatchHeader, now_ms: int) -> None:
    """Mark the batch at `h` as LogAppendTime with `now_ms` as its max timestamp (in place),
    and recompute its CRC."""
    _set_timestamp_type(buf, h, records.TIMESTAMP_TYPE_MASK, now_ms)


def set_create_time(buf: bytearray | memoryview, h: records.BatchHeader) -> None:
    """Mark the batch at `h` as CreateTime (in place, its CRC recomputed), keeping its max
    timestamp: what Kafka's LogValidator does on a CreateTime topic to a batch its producer
    marked LogAppendTime, whose records all had that max timestamp (they get their own
    timestamps back). A batch already CreateTime is left as it is."""
    if h.attributes & records.TIMESTAMP_TYPE_MASK:
        _set_timestamp_type(buf, h, 0, h.max_timestamp)


def _set_timestamp_type(
    buf: bytearray | memoryview, h: records.BatchHeader, bit: int, max_timestamp: int
) -> None:
    pos = h.position
    attributes = struct.unpack_from(">h", buf, pos + _ATTRS_AND_MAX_TS)[0]
    attributes = (attributes & ~records.TIMESTAMP_TYPE_MASK) | bit
    struct.pack_into(">h", buf, pos + _ATTRS_AND_MAX_TS, attributes)
    struct.pack_into(">q", buf, pos + _MAX_TS_POS, max_timestamp)
    crc = crc32c.crc32c(memoryview(buf)[pos + _ATTRS_AND_MAX_TS : pos + h.size])
    struct.pack_into(">I", buf, pos + _CRC_POS, crc)


def batches_below(data: bytes, end: int) -> tuple[bytes, int]:
    """The whole batches of `data` ending below offset `end`, and the last offset they hold
    (-1 if none)."""
    last = -1
    for h in records.iter_headers(data):
        if h.last_offset >= end:
            return data[: h.position], last
        last = h.last_offset
    return data, last


def slice_batches(view: memoryview, offset: int, max_bytes: int) -> memoryview:
    """The whole batches of `view` from the one holding `offset`, within max_bytes (at least
    one batch). Fast path: the view already starts at `offset` and fits."""
    if len(view) <= max_bytes:
        h = records.read_header(view, 0)
        if h.last_offset >= offset:
            return view
    start = None
    end = 0
    for h in records.iter_headers(view):
        if start is None:
            if h.last_offset < offset:
                continue
            start = h.position
            end = h.position + h.size
            continue
        if h.position + h.size - start > max_bytes:
            break
        end = h.position + h.size
    if start is None:
        return view[:0]
    return view[start:end]
