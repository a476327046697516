"""RecordBatch v2 headers: parse, validate and patch without re-encoding records.

Layout of a v2 batch (all big-endian), from Kafka's DefaultRecordBatch:

    0  baseOffset            int64
    8  batchLength           int32   (bytes after this field)
    12 partitionLeaderEpoch  int32
    16 magic                 int8    (2)
    17 crc                   uint32  CRC-32C of bytes [21, end)
    21 attributes            int16
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordCount           int32
    61 records...

The broker only ever rewrites baseOffset and partitionLeaderEpoch, neither of which the CRC covers,
so a batch's records and checksum stay byte-for-byte what the producer sent.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from tidalmq_broker.protocol.compression import CorruptCompressedData, decompress

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
MAGIC_V2 = 2
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20


class InvalidRecordBatch(ValueError):
    """The bytes are not a well-formed v2 record batch (maps to CORRUPT_MESSAGE)."""


class UnsupportedMagic(InvalidRecordBatch):
    """A message format older than v2 (maps to UNSUPPORTED_FOR_MESSAGE_FORMAT)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fields of one batch header, and where the batch sits in its buffer."""

    position: int
    size: int  # whole batch including the 12-byte log overhead
    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header of the batch at `position` without checking its CRC."""
    if len(buf) - position < HEADER_SIZE:
        raise InvalidRecordBatch(
            f"record batch at byte {position} is truncated: "
            f"{len(buf) - position} bytes, a v2 header needs {HEADER_SIZE}"
        )
    fields = _HEADER.unpack_from(buf, position)
    (base_offset, batch_length, leader_epoch, magic, crc, attributes, last_delta, base_ts,
     max_ts, producer_id, producer_epoch, base_seq, count) = fields  # fmt: skip
    if magic != MAGIC_V2:
        raise UnsupportedMagic(f"record batch magic {magic} is not supported (only v2)")
    size = batch_length + LOG_OVERHEAD
    if batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatch(f"record batch length {batch_length} is shorter than its header")
    if position + size > len(buf):
        raise InvalidRecordBatch(
            f"record batch at byte {position} declares {size} bytes but only "
            f"{len(buf) - position} remain"
        )
    if count < 0 or last_delta < 0:
        raise InvalidRecordBatch(f"record batch has negative count {count} or delta {last_delta}")
    return BatchHeader(
        position, size, base_offset, leader_epoch, magic, crc, attributes, last_delta,
        base_ts, max_ts, producer_id, producer_epoch, base_seq, count,
    )  # fmt: skip


def crc_matches(buf: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    view = memoryview(buf)[header.position + 21 : header.position + header.size]
    return crc32c.crc32c(view) == header.crc


def iter_headers(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = False
) -> Iterator[BatchHeader]:
    """Walk the batches of a record set. Raises InvalidRecordBatch on any malformed batch."""
    position = 0
    end = len(buf)
    while position < end:
        header = read_header(buf, position)
        if verify_crc and not crc_matches(buf, header):
            raise InvalidRecordBatch(f"record batch at byte {position} fails its CRC-32C check")
        yield header
        position += header.size


def iter_complete_headers(buf: bytes | bytearray | memoryview) -> Iterator[BatchHeader]:
    """Like iter_headers but stops quietly at a trailing partial batch (fetch responses)."""
    position = 0
    end = len(buf)
    while end - position >= LOG_OVERHEAD:
        _, length = _OFFSET_AND_LENGTH.unpack_from(buf, position)
        if position + length + LOG_OVERHEAD > end:
            return
        header = read_header(buf, position)
        yield header
        position += header.size


def patch_base_offset(buf: bytearray | memoryview, header: BatchHeader, base_offset: int) -> None:
    _BASE_OFFSET.pack_into(buf, header.position, base_offset)


def patch_leader_epoch(buf: bytearray | memoryview, header: BatchHeader, epoch: int) -> None:
    _LEADER_EPOCH.pack_into(buf, header.position + 12, epoch)


def build_batch(
    records: list[tuple[bytes | None, bytes | None]],
    *,
    base_offset: int = 0,
    timestamp_ms: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    attributes: int = 0,
) -> bytes:
    """Encode an uncompressed v2 batch of (key, value) records with no headers.

    Used by the broker for its own internal records (group metadata and offsets), never to
    re-encode what a client sent.
    """
    body = bytearray()
    for delta, (key, value) in enumerate(records):
        rec = bytearray()
        rec.append(0)  # record attributes
        rec += _varint(0)  # timestamp delta
        rec += _varint(delta)  # offset delta
        for field in (key, value):
            if field is None:
                rec += _varint(-1)
            else:
                rec += _varint(len(field))
                rec += field
        rec += _varint(0)  # header count
        body += _varint(len(rec))
        body += rec
    count = len(records)
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        max(count - 1, 0),
        timestamp_ms,
        timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) + bytes(body)
    crc = crc32c.crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, -1, MAGIC_V2, crc) + after_crc


def iter_records(
    batch: bytes | memoryview, header: BatchHeader
) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """Decode (offset, key, value) of an uncompressed batch (internal records only)."""
    if header.compression:
        raise InvalidRecordBatch("internal batches are never compressed")
    view = memoryview(batch)
    pos = header.position + HEADER_SIZE
    for _ in range(header.record_count):
        length, pos = _read_varint(view, pos)
        end = pos + length
        pos += 1  # attributes
        _, pos = _read_varint(view, pos)  # timestamp delta
        offset_delta, pos = _read_varint(view, pos)
        fields: list[bytes | None] = []
        for _field in range(2):
            n, pos = _read_varint(view, pos)
            if n < 0:
                fields.append(None)
            else:
                fields.append(bytes(view[pos : pos + n]))
                pos += n
        yield header.base_offset + offset_delta, fields[0], fields[1]
        pos = end


def iter_record_timestamps(
    batch: bytes | bytearray | memoryview, header: BatchHeader
) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of a client's batch, compressed or not. Reads only
    each record's length, timestamp delta and offset delta (of a decompressed copy if the
    batch is compressed). Raises InvalidRecordBatch if the records are malformed."""
    if header.attributes & TIMESTAMP_TYPE_MASK:  # LogAppendTime: the broker's time for all
        for delta in range(header.record_count):
            yield header.base_offset + delta, header.max_timestamp
        return
    records = memoryview(batch)[header.position + HEADER_SIZE : header.position + header.size]
    try:
        body = (
            memoryview(decompress(header.compression, records)) if header.compression else records
        )
    except CorruptCompressedData as exc:
        raise InvalidRecordBatch(str(exc)) from exc
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = _read_varint(body, pos)
            end = pos + length
            timestamp_delta, after = _read_varint(body, pos + 1)  # after the record attributes
            offset_delta, _ = _read_varint(body, after)
            yield header.base_offset + offset_delta, header.base_timestamp + timestamp_delta
            pos = end
    except IndexError:
        raise InvalidRecordBatch(
            f"records of the batch at offset {header.base_offset} are truncated"
        ) from None


def _varint(value: int) -> bytes:
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


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise InvalidRecordBatch("varint is too long")
    return (result >> 1) ^ -(result & 1), pos
