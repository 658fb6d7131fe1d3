"""Internal RPC framing: `length u32 BE | crc32c u32 BE | msgpack map`, as pure functions.

`length` counts the bytes after the length field (4 for the CRC plus the body), so the frame
body that `kafka_wire.framing.FrameReader` returns is exactly `crc | msgpack`, and the reader
already refuses an oversize length before allocating.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import crc32c
import msgpack
from typing_extensions import Buffer

from kafka_wire.framing import FrameError, FrameTooLarge

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "HEADER_BYTES",
    "BadChecksum",
    "BadMessage",
    "FrameTooLarge",
    "RpcFrameError",
    "decode_body",
    "encode_frame",
    "frame_length",
]

DEFAULT_MAX_FRAME_BYTES: Final = 16 << 20
HEADER_BYTES: Final = 8  # length + crc
_HEADER: Final = struct.Struct(">II")
_LENGTH: Final = struct.Struct(">I")
_CRC: Final = struct.Struct(">I")
_MIN_LENGTH: Final = 5  # crc + the smallest msgpack value


class RpcFrameError(FrameError):
    """A frame that is not a valid RPC frame; the connection must be closed."""


class BadChecksum(RpcFrameError):
    """The CRC-32C does not match the body (or the peer does not speak this protocol)."""


class BadMessage(RpcFrameError):
    """The body is not exactly one msgpack map with a string `t`."""


def encode_frame(msg: Mapping[str, Any], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Packs `msg` into a whole frame. Raises `FrameTooLarge` past `max_frame_bytes`, and
    `TypeError`/`ValueError` when msgpack cannot encode a value."""
    body = msgpack.packb(msg, use_bin_type=True)
    length = 4 + len(body)
    if length > max_frame_bytes:
        raise FrameTooLarge(f"RPC frame of {length} bytes exceeds {max_frame_bytes}")
    return _HEADER.pack(length, crc32c.crc32c(body)) + body


def frame_length(prefix: Buffer, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """Validates a 4-byte length prefix before anything is allocated for the frame."""
    (length,) = _LENGTH.unpack(prefix)
    if length > max_frame_bytes:
        raise FrameTooLarge(f"RPC frame of {length} bytes exceeds {max_frame_bytes}")
    if length < _MIN_LENGTH:
        raise BadMessage(f"RPC frame length {length} cannot hold a CRC and a body")
    return int(length)


def decode_body(frame: Buffer) -> dict[str, Any]:
    """Checks and decodes the bytes after the length field (`crc | msgpack`)."""
    view = memoryview(frame)
    if view.nbytes < _MIN_LENGTH:
        raise BadMessage(f"RPC frame of {view.nbytes} bytes cannot hold a CRC and a body")
    (expected,) = _CRC.unpack_from(view, 0)
    body = view[4:]
    if crc32c.crc32c(body) != expected:
        raise BadChecksum("RPC frame CRC-32C mismatch")
    try:
        # unpackb bounds every container/string by the buffer size, and rejects trailing bytes.
        msg = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise BadMessage(f"RPC frame body is not msgpack: {type(exc).__name__}") from exc
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise BadMessage("RPC frame body is not a map with a string 't'")
    return msg
