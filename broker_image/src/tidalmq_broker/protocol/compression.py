"""Decompression of record batch bodies, for the few places that must look inside a batch a
client compressed (ListOffsets by timestamp, the log cleaner), and compression for the one place
that re-encodes: the log cleaner, which rebuilds a batch it dropped records from with the codec
the producer chose (docs/compaction.md). Everything else stores and serves the producer's bytes."""

from __future__ import annotations

import gzip
import struct

import lz4.frame
import snappy
import zstandard

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
COMPRESSION_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

# The Java client frames snappy as xerial's SnappyOutputStream does: this magic, two int32
# versions, then blocks of (int32 length, raw snappy). librdkafka sends raw snappy.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = len(_XERIAL_MAGIC) + 8
_XERIAL_VERSIONS = struct.pack(">ii", 1, 1)  # version, compatible version
_XERIAL_BLOCK = 32 * 1024  # SnappyOutputStream's default block size


class CorruptCompressedData(ValueError):
    """The data does not decompress with the codec its batch names (or the codec is unknown)."""


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """The records section of a batch whose attributes name `codec`, uncompressed."""
    try:
        return _decompress(codec, data)
    except CorruptCompressedData:
        raise
    except Exception as exc:  # each library has its own errors (OSError, ZstdError, ...)
        name = COMPRESSION_NAMES[codec]
        raise CorruptCompressedData(f"{name} data does not decompress: {exc}") from exc


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """`data` compressed as Kafka's Java producer writes `codec`: gzip; snappy in xerial's
    framing; an LZ4 frame of independent 64 KiB blocks (what KafkaLZ4BlockOutputStream writes
    and KafkaLZ4BlockInputStream reads); a zstd frame."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return gzip.compress(bytes(data), mtime=0)
    if codec == SNAPPY:
        raw = bytes(data)
        out = bytearray(_XERIAL_MAGIC + _XERIAL_VERSIONS)
        for start in range(0, len(raw), _XERIAL_BLOCK):
            block = snappy.compress(raw[start : start + _XERIAL_BLOCK])
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == LZ4:
        framed: bytes = lz4.frame.compress(  # lz4 ships no types
            bytes(data),
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
        return framed
    if codec == ZSTD:
        return zstandard.ZstdCompressor().compress(bytes(data))
    raise CorruptCompressedData(f"compression type {codec} is not one of Kafka's")


def _decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return gzip.decompress(data)
    if codec == SNAPPY:
        return _snappy(bytes(data))
    if codec == LZ4:
        raw: bytes = lz4.frame.decompress(data)  # lz4 ships no types
        return raw
    if codec == ZSTD:
        # frames from streaming producers carry no content size: decompress as a stream
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise CorruptCompressedData(f"compression type {codec} is not one of Kafka's")


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return snappy.decompress(data)
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out += snappy.decompress(data[pos : pos + length])
        pos += length
    return bytes(out)
