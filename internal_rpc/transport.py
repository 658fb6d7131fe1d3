"""What the trio shells share: reading one message off a stream, and the errors that mean
the connection is gone."""

from __future__ import annotations

from typing import Any, Final

import trio

from internal_rpc.frames import decode_body
from kafka_wire.framing import FrameError, FrameReader

__all__ = ["NET_ERRORS", "address", "read_message", "text"]

NET_ERRORS: Final = (FrameError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def address(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError):
        return "?"
    return f"{host}:{port}"


def text(exc: BaseException) -> str:
    return str(exc)[:2000]  # an error reply must always fit a frame


async def read_message(reader: FrameReader) -> tuple[dict[str, Any], int]:
    """The next message and its size on the wire; EOF raises `trio.BrokenResourceError`."""
    frame = await reader.read_frame()
    if frame is None:
        raise trio.BrokenResourceError("the peer closed the connection")
    return decode_body(frame), 4 + len(frame)
