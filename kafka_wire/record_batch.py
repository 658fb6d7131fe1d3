"""RecordBatch v2: header parsing, produce-time validation and in-place patching.

Pure functions over bytes/memoryview; no I/O. The hot path (validate, assign offsets, stamp
LogAppendTime) never decodes individual records, so compressed batches pass through untouched.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from kafka_wire.compression import (
    DecompressedTooLarge,
    DecompressionError,
    compress,
    decompress,
)

Buffer: TypeAlias = bytes | bytearray | memoryview

BATCH_HEADER_SIZE = 61
# baseOffset(8) + batchLength(4): batchLength counts the bytes after these.
LOG_OVERHEAD = 12
MAGIC_V2 = 2

# Field offsets inside the batch (see the v2 layout in docs/formats.md).
_LEADER_EPOCH_OFFSET = 12
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_BASE_TIMESTAMP_OFFSET = 27
_MAX_TIMESTAMP_OFFSET = 35

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

NO_TIMESTAMP = -1
_INT32_MAX = 2**31 - 1


class InvalidBatch(Exception):
    """A batch Kafka would reject; carries the error code to answer with."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(f"{error_code.name}: {message}")
        self.error_code = error_code
        self.message = message


@dataclass(slots=True)
class BatchInfo:
    """The parsed 61-byte header of one batch, plus where it sits in its buffer."""

    position: int
    size: int
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
    def compression(self) -> int:
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type_log_append(self) -> bool:
        return bool(self.attributes & _TIMESTAMP_TYPE_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's producer sequence arithmetic: wraps past 2**31-1 to 0; -1 stays -1."""
    if sequence < 0:
        return sequence
    if sequence > _INT32_MAX - increment:
        return increment - (_INT32_MAX - sequence) - 1
    return sequence + increment


def parse_batch_header(buf: Buffer, position: int = 0) -> BatchInfo:
    """Parse the v2 header at ``position``; InvalidBatch(corrupt_message) if too short."""
    if position < 0 or len(buf) - position < BATCH_HEADER_SIZE:
        raise InvalidBatch(
            ErrorCode.corrupt_message,
            f"need {BATCH_HEADER_SIZE} bytes for a batch header at {position}, "
            f"buffer has {len(buf)}",
        )
    (
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    ) = _HEADER.unpack_from(buf, position)
    return BatchInfo(
        position,
        LOG_OVERHEAD + batch_length,
        base_offset,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )


def iter_batches(buf: Buffer) -> Iterator[BatchInfo]:
    """Walk a records blob batch by batch (framing only, no CRC).

    Stops silently at a trailing partial batch, as Kafka fetch responses may end with one.
    A length field too small to hold a v2 header is corruption, not truncation.
    """
    position = 0
    end = len(buf)
    while end - position >= LOG_OVERHEAD:
        batch_length = _I32.unpack_from(buf, position + 8)[0]
        if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
            raise InvalidBatch(
                ErrorCode.corrupt_message,
                f"batch at {position} has batchLength {batch_length}, below the v2 minimum",
            )
        if end - position < LOG_OVERHEAD + batch_length:
            return
        batch = parse_batch_header(buf, position)
        yield batch
        position += batch.size


class ProduceLimits(NamedTuple):
    """What a topic allows a produced batch, as of `now_ms`."""

    now_ms: int
    log_append_time: bool
    timestamp_before_max_ms: int
    timestamp_after_max_ms: int
    max_message_bytes: int
    api_version: int | None = None  # rejects zstd below Produce v7 when given


def validate_produce_records(
    buf: Buffer,
    *,
    now_ms: int,
    log_append_time: bool,
    timestamp_before_max_ms: int,
    timestamp_after_max_ms: int,
    max_message_bytes: int,
    api_version: int | None = None,
) -> BatchInfo:
    """`validate_batch` with the limits as keywords."""
    limits = ProduceLimits(
        now_ms,
        log_append_time,
        timestamp_before_max_ms,
        timestamp_after_max_ms,
        max_message_bytes,
        api_version,
    )
    return validate_batch(buf, limits)


def validate_batch(buf: Buffer, limits: ProduceLimits) -> BatchInfo:
    """Validate the records of ONE partition of a Produce request (exactly one v2 batch).

    Checks framing, magic, size, CRC, count/offset consistency, control bit, producer fields
    and (for CreateTime topics) the base and max timestamps, in Kafka's order (the size before
    the CRC). Raises InvalidBatch with the error code Kafka answers with.
    """
    total = len(buf)
    if total < LOG_OVERHEAD:
        # Kafka's batch iterator sees no batch at all here.
        raise InvalidBatch(
            ErrorCode.invalid_record,
            f"produce records must hold one record batch, got {total} bytes",
        )
    batch_length = _I32.unpack_from(buf, 8)[0]
    if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidBatch(
            ErrorCode.corrupt_message,
            f"batchLength {batch_length} is smaller than a v2 batch header",
        )
    size = LOG_OVERHEAD + batch_length
    if size > total:
        raise InvalidBatch(
            ErrorCode.invalid_record,
            f"truncated record batch: batchLength says {size} bytes, have {total}",
        )
    if size < total:
        raise InvalidBatch(
            ErrorCode.invalid_record,
            f"produce records must hold exactly one record batch; {total - size} bytes follow it",
        )
    magic = buf[_MAGIC_OFFSET]
    magic = magic - 256 if magic > 127 else magic
    if magic != MAGIC_V2:
        if 0 <= magic < MAGIC_V2:
            raise InvalidBatch(
                ErrorCode.unsupported_for_message_format,
                f"record batch magic {magic}: only magic 2 is accepted",
            )
        raise InvalidBatch(ErrorCode.corrupt_message, f"invalid record batch magic {magic}")
    _check_size(size, limits.max_message_bytes)
    batch = parse_batch_header(buf, 0)
    actual_crc = crc32c(memoryview(buf)[_ATTRIBUTES_OFFSET:size])
    if actual_crc != batch.crc:
        raise InvalidBatch(
            ErrorCode.corrupt_message,
            f"record batch CRC mismatch: header {batch.crc:#010x}, computed {actual_crc:#010x}",
        )
    check_batch_limits(batch, limits)
    return batch


def check_batch_limits(batch: BatchInfo, limits: ProduceLimits) -> BatchInfo:
    """The checks of `validate_batch` that need only the batch header, for a batch whose
    framing and CRC someone else checked (a zone proxy, which holds the bytes): size against
    the topic's limit, header semantics, and CreateTime timestamps. Raises InvalidBatch as
    the full validation would; returns the batch."""
    _check_size(batch.size, limits.max_message_bytes)
    _check_semantics(batch, limits.api_version)
    if not limits.log_append_time:
        _check_timestamps(
            batch, limits.now_ms, limits.timestamp_before_max_ms, limits.timestamp_after_max_ms
        )
    return batch


def _check_size(size: int, max_message_bytes: int) -> None:
    if size > max_message_bytes:
        raise InvalidBatch(
            ErrorCode.message_too_large,
            f"record batch of {size} bytes exceeds max.message.bytes {max_message_bytes}",
        )


def _check_timestamps(batch: BatchInfo, now_ms: int, before_ms: int, after_ms: int) -> None:
    low = now_ms - before_ms
    high = now_ms + after_ms
    for name, ts in (("base", batch.base_timestamp), ("max", batch.max_timestamp)):
        if ts != NO_TIMESTAMP and not low <= ts <= high:
            raise InvalidBatch(
                ErrorCode.invalid_timestamp,
                f"{name} timestamp {ts} is outside [{low}, {high}] "
                f"(now {now_ms}, message.timestamp.before/after.max.ms)",
            )


def _check_semantics(batch: BatchInfo, api_version: int | None) -> None:
    compression = batch.compression
    if compression > COMPRESSION_ZSTD:
        raise InvalidBatch(ErrorCode.invalid_record, f"unknown compression type id {compression}")
    if compression == COMPRESSION_ZSTD and api_version is not None and api_version < 7:
        raise InvalidBatch(
            ErrorCode.unsupported_compression_type,
            f"zstd needs Produce v7 or later, request is v{api_version}",
        )
    if batch.is_control:
        raise InvalidBatch(
            ErrorCode.invalid_record, "clients are not allowed to write control records"
        )
    if batch.record_count < 1:
        raise InvalidBatch(
            ErrorCode.invalid_record,
            f"invalid reported count for record batch: {batch.record_count}",
        )
    if batch.last_offset_delta != batch.record_count - 1:
        raise InvalidBatch(
            ErrorCode.invalid_record,
            f"inconsistent batch offset range: lastOffsetDelta {batch.last_offset_delta} "
            f"with {batch.record_count} records",
        )
    if batch.has_producer_id and batch.base_sequence < 0:
        raise InvalidBatch(
            ErrorCode.invalid_record,
            f"producer id {batch.producer_id} with invalid base sequence {batch.base_sequence}",
        )


def assign_offsets(buf: memoryview, batch: BatchInfo, base_offset: int, leader_epoch: int) -> None:
    """Patch baseOffset and partitionLeaderEpoch in place; both lie outside the CRC."""
    _I64.pack_into(buf, batch.position, base_offset)
    _I32.pack_into(buf, batch.position + _LEADER_EPOCH_OFFSET, leader_epoch)
    batch.base_offset = base_offset
    batch.partition_leader_epoch = leader_epoch


def stamp_log_append_time(buf: memoryview, batch: BatchInfo, now_ms: int) -> None:
    """Mark the batch LogAppendTime with ``now_ms`` and rewrite its CRC, in place."""
    pos = batch.position
    attributes = batch.attributes | _TIMESTAMP_TYPE_BIT
    _I16.pack_into(buf, pos + _ATTRIBUTES_OFFSET, attributes)
    _I64.pack_into(buf, pos + _BASE_TIMESTAMP_OFFSET, now_ms)
    _I64.pack_into(buf, pos + _MAX_TIMESTAMP_OFFSET, now_ms)
    crc = crc32c(buf[pos + _ATTRIBUTES_OFFSET : pos + batch.size])
    _U32.pack_into(buf, pos + _CRC_OFFSET, crc)
    batch.attributes = attributes
    batch.base_timestamp = now_ms
    batch.max_timestamp = now_ms
    batch.crc = crc


# --- builders and decoders for tests and tools (not the hot path) ---------------------------


def _zigzag_varint(value: int, out: bytearray) -> None:
    n = (value << 1) ^ (value >> 63)
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    n = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise InvalidBatch(ErrorCode.corrupt_message, "bad varint in record")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7


def _encode_record(
    offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None
) -> bytes:
    body = bytearray(b"\x00")  # record attributes (unused)
    _zigzag_varint(timestamp_delta, body)
    _zigzag_varint(offset_delta, body)
    for part in (key, value):
        if part is None:
            _zigzag_varint(-1, body)
        else:
            _zigzag_varint(len(part), body)
            body += part
    _zigzag_varint(0, body)  # no headers
    out = bytearray()
    _zigzag_varint(len(body), out)
    return bytes(out + body)


def build_batch(
    records: list[tuple[bytes | None, bytes | None]],
    *,
    base_offset: int = 0,
    timestamp_ms: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: int = COMPRESSION_NONE,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Build a valid v2 batch of (key, value) records, all stamped ``timestamp_ms``.

    For tests and tools, and the transaction markers (kafka_wire.control_batch).
    ``compression``: any codec id (kafka_wire.compression).
    """
    body = b"".join(_encode_record(i, 0, k, v) for i, (k, v) in enumerate(records))
    if compression != COMPRESSION_NONE:
        body = compress(compression, body)
    attributes = compression | (_TRANSACTIONAL_BIT if transactional else 0)
    attributes |= _CONTROL_BIT if control else 0
    count = len(records)
    header = bytearray(
        _HEADER.pack(
            base_offset,
            BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body),
            -1,
            MAGIC_V2,
            0,
            attributes,
            count - 1,
            timestamp_ms,
            timestamp_ms,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    crc = crc32c(body, crc32c(memoryview(header)[_ATTRIBUTES_OFFSET:]))
    _U32.pack_into(header, _CRC_OFFSET, crc)
    return bytes(header) + body


def _records_body(buf: Buffer, batch: BatchInfo) -> Buffer:
    """The records section of one batch, decompressed when it is compressed."""
    body = memoryview(buf)[batch.position + BATCH_HEADER_SIZE : batch.position + batch.size]
    if batch.compression == COMPRESSION_NONE:
        return body
    try:
        return decompress(batch.compression, body)
    except DecompressedTooLarge as exc:
        raise InvalidBatch(ErrorCode.message_too_large, str(exc)) from None
    except DecompressionError as exc:
        raise InvalidBatch(ErrorCode.corrupt_message, str(exc)) from None


def null_key_indexes(buf: Buffer, batch: BatchInfo) -> list[int]:
    """The indexes (within the batch) of its records without a key: a compacted topic refuses
    them. Reads each record's length and key length only (decompressing a compressed batch);
    raises InvalidBatch(corrupt_message) for records that do not parse."""
    body = _records_body(buf, batch)
    pos = 0
    out = []
    for index in range(batch.record_count):
        length, pos = _read_varint(body, pos)
        end = pos + length
        if length < 0 or end > len(body):
            raise InvalidBatch(ErrorCode.corrupt_message, f"record {index} overruns its batch")
        pos += 1  # record attributes
        _, pos = _read_varint(body, pos)  # timestamp delta
        _, pos = _read_varint(body, pos)  # offset delta
        key_length, pos = _read_varint(body, pos)
        if pos > end:
            # Else a batch of zero-length records, 1 byte each, reads as valid.
            raise InvalidBatch(ErrorCode.corrupt_message, f"record {index} overruns its length")
        if key_length < 0:
            out.append(index)
        pos = end
    return out


def decode_records_for_tools(buf: Buffer) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, timestamp, key, value) of every record in the complete batches of ``buf``.

    Handles every codec (kafka_wire.compression); for tests and tools only.
    """
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    view = memoryview(buf)
    for batch in iter_batches(view):
        body = _records_body(view, batch)
        pos = 0
        for index in range(batch.record_count):
            length, pos = _read_varint(body, pos)
            end = pos + length
            if length < 0 or end > len(body):
                # A negative length would move `pos` back: an endless loop, or a negative index.
                raise InvalidBatch(ErrorCode.corrupt_message, f"record {index} overruns its batch")
            pos += 1  # record attributes
            ts_delta, pos = _read_varint(body, pos)
            offset_delta, pos = _read_varint(body, pos)
            fields: list[bytes | None] = []
            for _part in range(2):
                n, pos = _read_varint(body, pos)
                if n < 0:
                    fields.append(None)
                else:
                    fields.append(bytes(body[pos : pos + n]))
                    pos += n
            if pos > end:
                raise InvalidBatch(ErrorCode.corrupt_message, f"record {index} overruns its length")
            pos = end  # headers are skipped
            ts = (
                batch.max_timestamp
                if batch.timestamp_type_log_append
                else batch.base_timestamp + ts_delta
            )
            out.append((batch.base_offset + offset_delta, ts, fields[0], fields[1]))
    return out
