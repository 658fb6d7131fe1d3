"""Decompression of RecordBatch v2 bodies: gzip, snappy (raw or Kafka's xerial framing), lz4
(frame format) and zstd, the codecs Kafka producers use. Pure functions; the broker needs them
only where Kafka's semantics make it read records (compacted topics' keys, tools).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from typing import TypeAlias

import cramjam

Buffer: TypeAlias = bytes | bytearray | memoryview

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
# Java's snappy-java framing (org.xerial.snappy.SnappyOutputStream): magic, version,
# compatible version, then [u32 length, raw snappy block] repeated.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
_U32 = struct.Struct(">I")


# The most bytes one batch's records may decompress to. Kafka streams records out of a
# compressed batch; we decompress it whole, so a small batch of a few KiB that inflates to
# gigabytes (zstd reaches 30000:1) must not be allowed to take the broker's memory. A producer
# checks each record's uncompressed size against its max.request.size (1 MiB by default), so
# real batches stay far below this.
MAX_DECOMPRESSED_BYTES = 64 << 20
# A first output buffer this many times the compressed size; grown fourfold up to the limit.
_FIRST_RATIO = 8


class DecompressionError(ValueError):
    pass


class DecompressedTooLarge(DecompressionError):
    """The batch inflates past the limit: MESSAGE_TOO_LARGE, not a corrupt batch (which a
    producer would retry)."""


def _too_large(codec: int, limit: int) -> DecompressedTooLarge:
    return DecompressedTooLarge(f"codec {codec} batch decompresses to more than {limit} bytes")


def _snappy_raw(data: bytes, room: int, limit: int) -> bytes:
    # A raw snappy block states its length first: refuse before allocating it.
    if cramjam.snappy.decompress_raw_len(data) > room:
        raise _too_large(SNAPPY, limit)
    return bytes(cramjam.snappy.decompress_raw(data))


def _snappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(data, limit, limit)
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecompressionError("truncated xerial snappy block length")
        (length,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise DecompressionError("truncated xerial snappy block")
        out += _snappy_raw(data[pos : pos + length], limit - len(out), limit)
        pos += length
    return bytes(out)


def _gzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while data:  # one member after another, as gzip.decompress reads them
        d = zlib.decompressobj(wbits=31)
        out += d.decompress(data, limit + 1 - len(out))
        if len(out) > limit:
            raise _too_large(GZIP, limit)
        if not d.eof:
            raise DecompressionError("truncated gzip stream")
        data = d.unused_data
    return bytes(out)


def _into(codec: int, fn: Callable[[bytes, bytearray], int], data: bytes, limit: int) -> bytes:
    """`fn` (a cramjam decompress_into) with an output buffer grown until the result fits,
    refused past `limit`; cramjam stops as soon as the buffer is full, so a bomb costs little."""
    size = min(limit, max(1 << 16, _FIRST_RATIO * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = fn(data, out)
        except cramjam.DecompressionError as exc:
            if "failed to write whole buffer" not in str(exc):
                raise
            if size >= limit:
                raise _too_large(codec, limit) from None
            size = min(limit, size * 4)
            continue
        del out[n:]
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


def decompress(codec: int, body: Buffer, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The records section of a batch compressed with `codec` (1..4); raises
    DecompressionError when the bytes do not decompress, DecompressedTooLarge when they would
    come to more than `limit` bytes."""
    data = bytes(body)
    try:
        if codec == GZIP:
            return _gzip(data, limit)
        if codec == SNAPPY:
            return _snappy(data, limit)
        if codec == LZ4:
            return _into(codec, cramjam.lz4.decompress_into, data, limit)
        if codec == ZSTD:
            return _into(codec, cramjam.zstd.decompress_into, data, limit)
    except (OSError, EOFError, zlib.error, cramjam.DecompressionError) as exc:
        raise DecompressionError(f"cannot decompress codec {codec}: {exc}") from exc
    raise DecompressionError(f"unknown compression codec {codec}")
