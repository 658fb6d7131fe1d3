"""Decompression of RecordBatch v2 bodies: gzip, snappy (raw or Kafka's xerial framing), lz4
(frame format) and zstd, the codecs Kafka producers use. Pure functions; the broker needs them
only where Kafka's semantics make it read records (compacted topics' keys, tools).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import TypeAlias

import cramjam

Buffer: TypeAlias = bytes | bytearray | memoryview

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
# Java's snappy-java framing (org.xerial.snappy.SnappyOutputStream): magic, version,
# compatible version, then [u32 length, raw snappy block] repeated.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
_U32 = struct.Struct(">I")


class DecompressionError(ValueError):
    pass


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecompressionError("truncated xerial snappy block length")
        (length,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise DecompressionError("truncated xerial snappy block")
        out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + length]))
        pos += length
    return bytes(out)


def compress(codec: int, data: Buffer) -> bytes:
    """`data` compressed as a Kafka producer would (snappy: raw blocks, as librdkafka writes
    them); for tests and tools."""
    raw = bytes(data)
    if codec == GZIP:
        return gzip.compress(raw, mtime=0)
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(raw))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(raw))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(raw))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: int, body: Buffer) -> bytes:
    """The records section of a batch compressed with `codec` (1..4); raises
    DecompressionError when the bytes do not decompress."""
    data = bytes(body)
    try:
        if codec == GZIP:
            return gzip.decompress(data)
        if codec == SNAPPY:
            return _snappy(data)
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except (OSError, EOFError, zlib.error, cramjam.DecompressionError) as exc:
        raise DecompressionError(f"cannot decompress codec {codec}: {exc}") from exc
    raise DecompressionError(f"unknown compression codec {codec}")
