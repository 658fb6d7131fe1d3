"""WAL record framing: ``length u32 | crc32c u32 | type u8 | header (msgpack map) | payload``.

See docs/formats.md ("## WAL") for the exact bytes.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, TypeAlias

import crc32c
import msgpack

Buffer: TypeAlias = bytes | bytearray | memoryview

LENGTH = struct.Struct(">I")
PREFIX = struct.Struct(">IIB")  # length, crc32c, type
#: Bytes a record takes besides its header and payload: length, crc and type.
OVERHEAD = PREFIX.size
#: Smallest legal value of the length field: crc + type + a one-byte (empty) msgpack map.
MIN_BODY = 4 + 1 + 1
MAX_BODY = 0xFFFFFFFF
_HEADER_CHUNK = 256


class RecordType(enum.IntEnum):
    DATA = 1  # a full Kafka RecordBatch, offsets assigned
    PREPARED = 2  # a proxy's raw Produce payload, offsets not yet assigned
    LINK = 3  # a pointer into another writer's WAL
    CONTROL = 4  # broker state changes
    TRIM = 5
    SNAPSHOT = 6  # first record of every segment when the owner gave a snapshot provider


class WalError(Exception):
    """Base class of every WAL failure."""


class CorruptRecord(WalError):
    """A record failed its framing or CRC check.

    ``position`` is the record's byte position in its segment; ``torn`` is True when the bytes
    simply end too early (a write that never completed) rather than being wrong.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        segment: int | None = None,
        position: int | None = None,
        torn: bool = False,
    ) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.segment = segment
        self.position = position
        self.torn = torn


class SegmentNotFound(WalError):
    """The segment a position or offset points into does not exist (deleted, or never was)."""


class OffsetOutOfRange(SegmentNotFound):
    """A read started below the oldest retained segment."""


@dataclass(frozen=True, slots=True)
class WalPosition:
    """Where a record lives; also the target of other writers' LINK records."""

    writer: str
    segment: int  # logical offset of the segment's first byte
    position: int  # byte position of the record's length field inside the segment
    length: int  # whole record, including the 4-byte length field

    @property
    def offset(self) -> int:
        return self.segment + self.position

    @property
    def end_offset(self) -> int:
        return self.segment + self.position + self.length


@dataclass(frozen=True, slots=True)
class WalRecord:
    type: RecordType
    header: dict[str, Any]
    payload: memoryview  # read-only view into the bytes read from the segment
    position: WalPosition


def pack_header(header: dict[str, Any]) -> bytes:
    if not isinstance(header, dict):
        raise TypeError(f"WAL record header must be a dict, not {type(header).__name__}")
    return msgpack.packb(header, use_bin_type=True)


def byte_view(payload: Buffer) -> memoryview:
    view = memoryview(payload)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


def encode_prefix(rtype: int, header_bytes: bytes, payload: memoryview) -> bytes:
    """Everything of a record but its payload, so the payload is written without a copy."""
    body = 5 + len(header_bytes) + payload.nbytes
    if body > MAX_BODY:
        raise WalError(f"WAL record of {body} bytes does not fit a u32 length")
    crc = crc32c.crc32c(
        payload, value=crc32c.crc32c(header_bytes, value=crc32c.crc32c(bytes((rtype,))))
    )
    return PREFIX.pack(body, crc, rtype) + header_bytes


def encode_record(rtype: int, header: dict[str, Any], payload: Buffer = b"") -> bytes:
    """A whole record as one bytes object (tools and tests; the writer avoids this copy)."""
    view = byte_view(payload)
    return encode_prefix(rtype, pack_header(header), view) + view.tobytes()


def _unpack_header(view: memoryview) -> tuple[dict[str, Any], int]:
    # Feed the Unpacker growing prefixes: the header is small, the payload after it may not be,
    # and feeding copies.
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(view.nbytes, 1))
    fed = 0
    chunk = _HEADER_CHUNK
    while True:
        unpacker.feed(view[fed : fed + chunk])
        fed = min(fed + chunk, view.nbytes)
        try:
            header = unpacker.unpack()
        except msgpack.OutOfData:
            if fed >= view.nbytes:
                raise ValueError("header runs past the end of the record") from None
            chunk *= 2
            continue
        if not isinstance(header, dict):
            raise ValueError(f"header is a {type(header).__name__}, not a map")
        return header, unpacker.tell()


def decode_body(body: memoryview, position: WalPosition) -> WalRecord:
    """Check and decode the bytes after a record's length field (``position.length - 4`` bytes)."""
    if body.nbytes < MIN_BODY:
        raise _corrupt(position, f"record body of {body.nbytes} bytes is too short")
    (stored,) = LENGTH.unpack_from(body, 0)
    actual = crc32c.crc32c(body[4:])
    if stored != actual:
        raise _corrupt(position, f"CRC mismatch (stored {stored:#010x}, computed {actual:#010x})")
    try:
        rtype = RecordType(body[4])
    except ValueError:
        raise _corrupt(position, f"unknown record type {body[4]}") from None
    try:
        header, header_len = _unpack_header(body[5:])
    except Exception as exc:  # any msgpack failure on bytes that passed the CRC
        raise _corrupt(position, f"bad msgpack header: {exc}") from exc
    payload = body[5 + header_len :].toreadonly()
    return WalRecord(rtype, header, payload, position)


def _corrupt(position: WalPosition, reason: str) -> CorruptRecord:
    return CorruptRecord(
        f"WAL {position.writer}/{position.segment:020d}.wal at byte {position.position}: {reason}",
        reason=reason,
        segment=position.segment,
        position=position.position,
    )
