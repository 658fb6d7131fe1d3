"""Kafka frame I/O over trio streams: an i32 big-endian size prefix, then the body."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import trio
from typing_extensions import Buffer

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FrameError",
    "FrameReader",
    "FrameTooLarge",
    "TruncatedFrame",
    "send_frame",
]

DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
_MAX_I32: Final = 2**31 - 1
_SIZE: Final = struct.Struct(">i")
_READ_BUFFER_BYTES: Final = 64 * 1024
# Parts at least this large are handed to the kernel as they are instead of being joined.
_JOIN_LIMIT: Final = 16 * 1024
# Linux IOV_MAX; sendmsg rejects longer buffer lists.
_IOV_MAX: Final = 1024


class FrameError(Exception):
    """The byte stream does not hold a valid frame; the connection must be closed."""


class FrameTooLarge(FrameError):
    """The size prefix exceeds the configured maximum."""


class TruncatedFrame(FrameError):
    """The peer closed the stream in the middle of a frame."""


class FrameReader:
    """Reads length-prefixed frames from a stream.

    Cancellation-safe: a cancelled `read_frame` loses no bytes, the next call resumes the
    frame. Not safe for concurrent use by several tasks.
    """

    def __init__(
        self,
        stream: trio.abc.ReceiveStream,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        read_buffer_bytes: int = _READ_BUFFER_BYTES,
    ) -> None:
        if read_buffer_bytes < 16:
            raise ValueError("read_buffer_bytes must be at least 16")
        self._stream = stream
        self._sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray(read_buffer_bytes)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        # A frame whose body is being received; kept across cancellations.
        self._body: bytearray | None = None
        self._filled = 0

    async def _recv_into(self, target: memoryview) -> int:
        sock = self._sock
        if sock is not None:
            if sock.fileno() == -1:
                raise trio.ClosedResourceError("the socket was closed")
            try:
                return await sock.recv_into(target)
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket receive failed: {exc}") from exc
        data = await self._stream.receive_some(len(target))
        n = len(data)
        target[:n] = data
        return n

    async def _fill(self) -> int:
        """Receives more bytes into the read buffer; returns 0 on EOF."""
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            # Only a partial size prefix (< 4 bytes) can be left here.
            pending = self._end - self._start
            self._buf[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        n = await self._recv_into(self._view[self._end :])
        self._end += n
        return n

    async def read_frame(self) -> bytearray | None:
        """Returns the next frame body, or None on a clean EOF between frames."""
        if self._body is None:
            while self._end - self._start < 4:
                if await self._fill() == 0:
                    if self._end == self._start:
                        return None
                    raise TruncatedFrame("EOF inside a frame size prefix")
            (size,) = _SIZE.unpack_from(self._buf, self._start)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(f"frame of {size} bytes exceeds {self.max_frame_bytes}")
            self._start += 4
            body = bytearray(size)
            take = min(size, self._end - self._start)
            body[:take] = self._view[self._start : self._start + take]
            self._start += take
            self._body, self._filled = body, take
        body = self._body
        with memoryview(body) as out:
            while self._filled < len(body):
                # The read buffer is empty whenever a body is still incomplete.
                remaining = len(body) - self._filled
                if remaining >= len(self._buf):
                    # Large body: receive straight into it, no second copy.
                    n = await self._recv_into(out[self._filled :])
                    if n == 0:
                        raise TruncatedFrame(f"EOF after {self._filled} of {len(body)} bytes")
                    self._filled += n
                    continue
                # Small tail: go through the read buffer so that frames pipelined
                # behind this one arrive in the same syscall.
                if await self._fill() == 0:
                    raise TruncatedFrame(f"EOF after {self._filled} of {len(body)} bytes")
                take = min(remaining, self._end - self._start)
                out[self._filled : self._filled + take] = self._view[
                    self._start : self._start + take
                ]
                self._start += take
                self._filled += take
        self._body = None
        self._filled = 0
        return body


def _as_bytes_view(part: Buffer) -> memoryview:
    view = memoryview(part)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


async def send_frame(stream: trio.abc.SendStream, parts: Sequence[Buffer]) -> None:
    """Writes one frame: the size prefix, then `parts` back to back.

    Small parts are joined with the prefix; large ones go to the kernel without a copy (a
    single `sendmsg` on sockets). Callers must not send concurrently on one stream.
    """
    views = [_as_bytes_view(p) for p in parts]
    total = sum(v.nbytes for v in views)
    if total > _MAX_I32:
        raise FrameTooLarge(f"frame of {total} bytes does not fit an i32 size")
    chunks: list[bytearray | memoryview] = []
    joined = bytearray(_SIZE.pack(total))
    for view in views:
        if view.nbytes < _JOIN_LIMIT:
            joined += view
        else:
            if joined:
                chunks.append(joined)
                joined = bytearray()
            chunks.append(view)
    if joined:
        chunks.append(joined)
    if (
        len(chunks) > 1
        and isinstance(stream, trio.SocketStream)
        and hasattr(stream.socket, "sendmsg")
    ):
        await _sendmsg_all(stream.socket, chunks)
        return
    for chunk in chunks:
        await stream.send_all(chunk)


async def _sendmsg_all(sock: trio.socket.SocketType, chunks: list[bytearray | memoryview]) -> None:
    pending = [memoryview(c) for c in chunks]
    first = 0
    while first < len(pending):
        if sock.fileno() == -1:
            raise trio.ClosedResourceError("the socket was closed")
        try:
            sent = await sock.sendmsg(pending[first : first + _IOV_MAX])
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket send failed: {exc}") from exc
        while sent and first < len(pending):
            head = pending[first]
            if sent >= head.nbytes:
                sent -= head.nbytes
                first += 1
            else:
                pending[first] = head[sent:]
                sent = 0
