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
so a batch's records and checksum stay byte-for-byte what the producer sent. The one exception is
the log cleaner of compacted topics, as in Kafka: `rebuild_batch` and `empty_batch` re-encode a
batch it dropped records from, keeping its offsets, producer fields and codec.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import crc32c

from tidalmq_broker.protocol.compression import CorruptCompressedData, compress, decompress
from tidalmq_broker.protocol.primitives import varint

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
MAGIC_V2 = 2
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40  # KIP-534: baseTimestamp is the batch's delete horizon

# The key of a control record: int16 version, int16 type (Kafka's ControlRecordType)
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class InvalidRecordBatch(ValueError):
    """The bytes are not a well-formed v2 record batch (maps to CORRUPT_MESSAGE)."""


class UnsupportedMagic(InvalidRecordBatch):
    """A message format older than v2 (maps to UNSUPPORTED_FOR_MESSAGE_FORMAT)."""


class BatchHeader(NamedTuple):
    """The fields of one batch header, and where the batch sits in its buffer. A named tuple:
    one is made per batch on the produce and fetch paths, and a frozen dataclass of fourteen
    fields took ~4x as long to build (each field set through object.__setattr__)."""

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
    def delete_horizon_ms(self) -> int | None:
        """The time after which the cleaner may drop this batch's tombstones or marker."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

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
    (
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_seq,
        count,
    ) = fields
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
        position,
        size,
        base_offset,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_seq,
        count,
    )


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


def read_headers(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = False
) -> list[BatchHeader]:
    """The headers of every batch of a record set, as iter_headers walks them (the same
    checks, the same errors), as a list: the produce path parses a request's batches once with
    this and hands the list on (Produce's record checks, the partition's append)."""
    return list(iter_headers(buf, verify_crc=verify_crc))


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


_ATTRIBUTES = struct.Struct(">h")
_RECORD_COUNT = struct.Struct(">i")


def count_records(buf: bytes | bytearray | memoryview) -> int:
    """Records in the complete data batches of `buf` (control batches and a trailing partial
    batch not counted), from the headers alone: the Fetch path's records-out metric."""
    position, end, count = 0, len(buf), 0
    while end - position >= HEADER_SIZE:
        length = _OFFSET_AND_LENGTH.unpack_from(buf, position)[1]
        if length < HEADER_SIZE - LOG_OVERHEAD or position + length + LOG_OVERHEAD > end:
            break
        if not _ATTRIBUTES.unpack_from(buf, position + 21)[0] & CONTROL_FLAG:
            count += _RECORD_COUNT.unpack_from(buf, position + 57)[0]
        position += length + LOG_OVERHEAD
    return count


def patch_base_offset(buf: bytearray | memoryview, header: BatchHeader, base_offset: int) -> None:
    _BASE_OFFSET.pack_into(buf, header.position, base_offset)


def patch_offset_and_epoch(
    buf: bytearray | memoryview, header: BatchHeader, base_offset: int, epoch: int
) -> None:
    """patch_base_offset and patch_leader_epoch in one write (the batch length between them
    written back as it is)."""
    _OFFSET_LENGTH_EPOCH.pack_into(
        buf, header.position, base_offset, header.size - LOG_OVERHEAD, epoch
    )


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
        rec += varint(0)  # timestamp delta
        rec += varint(delta)  # offset delta
        for field in (key, value):
            if field is None:
                rec += varint(-1)
            else:
                rec += varint(len(field))
                rec += field
        rec += varint(0)  # header count
        body += varint(len(rec))
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


@dataclass(frozen=True, slots=True)
class RecordSlice:
    """One record of a batch as the cleaner sees it: its offset, timestamp, key, whether it has
    a value, and its encoded bytes after the timestamp delta (offset delta, key, value, headers),
    which a rebuilt batch copies unchanged."""

    offset: int
    timestamp: int
    key: bytes | None
    has_value: bool
    attributes: int
    rest: bytes


def value_size(record: RecordSlice) -> int:
    """The length of a record's value, 0 without one (as Kafka's DefaultRecord prints it)."""
    if not record.has_value:
        return 0
    view = memoryview(record.rest)
    _, pos = _read_varint(view, 0)  # offset delta
    key_length, pos = _read_varint(view, pos)
    value_length, _ = _read_varint(view, pos + max(key_length, 0))
    return value_length


def iter_record_slices(
    batch: bytes | bytearray | memoryview, header: BatchHeader
) -> Iterator[RecordSlice]:
    """Every record of a batch, compressed or not, checked against the bytes that arrived: a
    record whose declared length, key or value runs past its end, a count that does not match,
    or trailing bytes raise InvalidRecordBatch."""
    body = _records_body(batch, header)
    where = f"records of the batch at offset {header.base_offset}"
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = _read_varint(body, pos)
            end = pos + length
            if length < 1 or end > len(body):
                raise InvalidRecordBatch(f"{where} declare a record of {length} bytes")
            attributes = body[pos]
            timestamp_delta, rest_start = _read_varint(body, pos + 1)
            offset_delta, p = _read_varint(body, rest_start)
            key_length, p = _read_varint(body, p)
            key = None
            if key_length >= 0:
                if p + key_length > end:
                    raise InvalidRecordBatch(f"{where} have a key past its record's end")
                key = bytes(body[p : p + key_length])
                p += key_length
            value_length, p = _read_varint(body, p)
            if p + max(value_length, 0) > end:
                raise InvalidRecordBatch(f"{where} have a value past its record's end")
            if offset_delta < 0 or offset_delta > header.last_offset_delta:
                raise InvalidRecordBatch(f"{where} hold offset delta {offset_delta}")
            yield RecordSlice(
                header.base_offset + offset_delta,
                header.base_timestamp + timestamp_delta,
                key,
                value_length >= 0,
                attributes,
                bytes(body[rest_start:end]),
            )
            pos = end
    except IndexError:
        raise InvalidRecordBatch(f"{where} are truncated") from None
    if pos != len(body):
        raise InvalidRecordBatch(f"{where} are followed by {len(body) - pos} stray bytes")


def iter_record_keys(
    batch: bytes | bytearray | memoryview, header: BatchHeader
) -> Iterator[tuple[int, bytes | None]]:
    """(offset, key) of every record of a batch, compressed or not: what the log cleaner's
    key map needs, and nothing more. It reads four varints of each record and skips its value
    and headers, which makes it about three times as fast as `iter_record_slices` (a cleaning
    pass maps every dirty record; docs/compaction.md, benchmark). Checks the same record and
    key bounds, offset deltas, count and stray bytes; the value's bounds are checked when the
    batch is rewritten."""
    body = _records_body(batch, header)
    where = f"records of the batch at offset {header.base_offset}"
    base, last_delta, size = header.base_offset, header.last_offset_delta, len(body)
    pos = 0
    try:
        for _ in range(header.record_count):
            length, pos = _read_varint(body, pos)
            end = pos + length
            if length < 1 or end > size:
                raise InvalidRecordBatch(f"{where} declare a record of {length} bytes")
            _, p = _read_varint(body, pos + 1)  # the timestamp delta, after the attributes
            offset_delta, p = _read_varint(body, p)
            if offset_delta < 0 or offset_delta > last_delta:
                raise InvalidRecordBatch(f"{where} hold offset delta {offset_delta}")
            key_length, p = _read_varint(body, p)
            if p + key_length > end:
                raise InvalidRecordBatch(f"{where} have a key past its record's end")
            yield base + offset_delta, bytes(body[p : p + key_length]) if key_length >= 0 else None
            pos = end
    except IndexError:
        raise InvalidRecordBatch(f"{where} are truncated") from None
    if pos != size:
        raise InvalidRecordBatch(f"{where} are followed by {size - pos} stray bytes")


def _records_body(batch: bytes | bytearray | memoryview, header: BatchHeader) -> memoryview:
    """The records of a batch, decompressed if need be."""
    records = memoryview(batch)[header.position + HEADER_SIZE : header.position + header.size]
    try:
        return (
            memoryview(decompress(header.compression, records)) if header.compression else records
        )
    except CorruptCompressedData as exc:
        raise InvalidRecordBatch(str(exc)) from exc


def keyless_records(data: bytes | bytearray | memoryview) -> list[int]:
    """The index in its batch of every record without a key in `data` (a Produce request's
    batches, compressed or not): what a compacted topic refuses. Raises InvalidRecordBatch
    (and UnsupportedMagic) for batches the append would refuse anyway."""
    return [
        index
        for header in iter_headers(data)
        for index, record in enumerate(iter_record_slices(data, header))
        if record.key is None
    ]


def control_type(batch: bytes | bytearray | memoryview, header: BatchHeader) -> int | None:
    """CONTROL_ABORT or CONTROL_COMMIT for a marker batch; None for an empty control batch (one
    the cleaner already emptied) or an unknown control type."""
    for record in iter_record_slices(batch, header):
        if record.key is None or len(record.key) < 4:
            raise InvalidRecordBatch(f"control record at offset {record.offset} has no type")
        kind = int.from_bytes(record.key[2:4], "big", signed=True)
        return kind if kind in (CONTROL_ABORT, CONTROL_COMMIT) else None
    return None


def rebuild_batch(
    header: BatchHeader, kept: list[RecordSlice], *, delete_horizon_ms: int | None = None
) -> bytes:
    """The batch of `header` holding only the records `kept` (at least one), as Kafka's cleaner
    rebuilds it: same base offset, last offset delta, producer id, epoch, base sequence, leader
    epoch, attributes and codec, so offsets and sequences never change. With a delete horizon,
    the base timestamp becomes the horizon and the records' timestamp deltas are re-encoded from
    it (they may go negative); their timestamps stay what they were."""
    if not kept:
        raise ValueError("a rebuilt batch keeps at least one record; use empty_batch")
    attributes = header.attributes
    base_timestamp = header.base_timestamp
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
        base_timestamp = delete_horizon_ms
    body = bytearray()
    for record in kept:
        timestamp_delta = varint(record.timestamp - base_timestamp)
        body += varint(1 + len(timestamp_delta) + len(record.rest))
        body.append(record.attributes)
        body += timestamp_delta
        body += record.rest
    if attributes & TIMESTAMP_TYPE_MASK:
        max_timestamp = header.max_timestamp  # LogAppendTime: the broker's time for all
    else:
        max_timestamp = max(record.timestamp for record in kept)
    return _assemble(
        header,
        attributes,
        base_timestamp,
        max_timestamp,
        len(kept),
        compress(header.compression, body) if header.compression else bytes(body),
    )


def empty_batch(header: BatchHeader) -> bytes:
    """The header of `header`'s batch with no records (Kafka's writeEmptyHeader): the cleaner
    keeps it where a batch's last offset and producer sequence must survive."""
    attributes = header.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG | CONTROL_FLAG)
    return _assemble(header, attributes, header.max_timestamp, header.max_timestamp, 0, b"")


def _assemble(
    header: BatchHeader,
    attributes: int,
    base_timestamp: int,
    max_timestamp: int,
    count: int,
    records: bytes,
) -> bytes:
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            header.last_offset_delta,
            base_timestamp,
            max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            count,
        )
        + records
    )
    crc = crc32c.crc32c(after_crc)
    return (
        struct.pack(
            ">qiibI",
            header.base_offset,
            4 + 1 + 4 + len(after_crc),
            header.partition_leader_epoch,
            MAGIC_V2,
            crc,
        )
        + after_crc
    )


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    byte = view[pos]
    if byte < 0x80:  # most varints of a record are one byte (key length, small deltas)
        return (byte >> 1) ^ -(byte & 1), pos + 1
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
