"""Kafka frame I/O over trio streams: an i32 big-endian size prefix, then the body."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Final, cast

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
# A frame body is given at most _GROWTH times the bytes of the frame received so far (prefix
# included; at least _BODY_START), never the size its prefix announced: a slowloris announcing
# 100 MB and sending a byte a second holds 4 KiB. 16: a frame of up to 1 MiB streaming in
# (64 KiB in the read buffer with its prefix) gets its whole body at once, received straight
# into, as before; each growth of a larger one copies what arrived.
_BODY_START: Final = 4096
_GROWTH: Final = 16
# Empty read buffers waiting for the next connection with bytes to read: reuse saves a 64 KiB
# allocation each time a connection's buffer empties. At most _POOL_MAX kept (4 MiB).
_POOL_MAX: Final = 64
_POOL: list[tuple[bytearray, memoryview]] = []
_EMPTY: Final = bytearray()
# MSG_PEEK target: its bytes are never used, so every reader shares it.
_PEEK_VIEW: Final = memoryview(bytearray(64))


class FrameError(Exception):
    """The byte stream does not hold a valid frame; the connection must be closed."""


class FrameTooLarge(FrameError):
    """The size prefix exceeds the configured maximum."""


class TruncatedFrame(FrameError):
    """The peer closed the stream in the middle of a frame."""


def _drain_tls(tls: ssl.SSLObject, target: memoryview) -> int:
    """Decrypts into `target` what the SSL object holds already, without waiting.

    trio's SSLStream returns one TLS record (16 KiB at most) per `receive_some`, and passes
    through the scheduler for each one even when the next is already in its buffer: a 1 MB
    produce frame took 64 round trips (most of what TLS cost the proxy, docs/performance.md).
    Only the task that reads the stream calls this, between its own receive_some calls, so
    it never races trio's reader; anything but plain data (more bytes wanted, a close, an
    error) stops it, and the next receive_some meets it as trio would.
    """
    got = 0
    while got < len(target):
        try:
            # With a buffer, read() returns the count (typeshed says bytes).
            n = cast(int, tls.read(len(target) - got, target[got:]))
        except ssl.SSLError:
            break
        if not n:
            break
        got += n
    return got


class FrameReader:
    """Reads length-prefixed frames from a stream.

    Cancellation-safe: a cancelled `read_frame` loses no bytes, the next call resumes the
    frame. Not safe for concurrent use by several tasks.

    Memory follows the bytes that arrived, not what peers announce, so that thousands of idle
    or slow connections cost little (docs/reliability.md, "Idle connections and slowloris"):
    on a socket, the read buffer is held only while bytes are being taken from it (it goes
    back to a shared pool, the odd bytes of a size prefix aside, while the reader waits for
    data with a MSG_PEEK), and a frame's body grows as its bytes come in, to at most 16 times
    what arrived (at least 4 KiB), rather than being allocated at the size its prefix
    announces (a slowloris announcing 100 MB and sending a byte a second holds 4 KiB).
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
        # A TLS stream's SSL object, to take every record already received in one go
        # (`_drain_tls`); None where trio's SSLStream does not have it as expected.
        self._tls: ssl.SSLObject | None = None
        if isinstance(stream, trio.SSLStream):
            tls = getattr(stream, "_ssl_object", None)
            self._tls = tls if isinstance(tls, ssl.SSLObject) else None
        self.max_frame_bytes = max_frame_bytes
        self._buf_bytes = read_buffer_bytes
        self._buf = _EMPTY
        self._view = memoryview(_EMPTY)
        self._start = 0
        self._end = 0
        self._stash = b""  # part of a size prefix, while the read buffer is in the pool
        self._more = False  # the last fill of the read buffer filled it: the peer streams
        # The size of the frame whose prefix was read, and its body as received so far (it
        # grows as bytes arrive); both kept across cancellations.
        self._size = -1
        self._body: bytearray | None = None
        self._filled = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for frames not yet returned: the read buffer's and a partial body's."""
        body = self._body
        return len(self._buf) + len(self._stash) + (len(body) if body is not None else 0)

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
        if self._tls is not None and 0 < n < len(target):
            n += _drain_tls(self._tls, target[n:])
        return n

    def _release_buffer(self) -> None:
        """On a socket, gives the read buffer back to the pool; what it still held (part of a
        size prefix at most) is kept aside until the next `_take_buffer`."""
        if self._buf is _EMPTY or self._sock is None:
            return
        self._stash = bytes(self._view[self._start : self._end])
        if len(self._buf) == _READ_BUFFER_BYTES and len(_POOL) < _POOL_MAX:
            _POOL.append((self._buf, self._view))
        self._buf = _EMPTY
        self._view = memoryview(_EMPTY)
        self._start = self._end = 0

    def _take_buffer(self) -> None:
        if self._buf_bytes == _READ_BUFFER_BYTES and _POOL:
            self._buf, self._view = _POOL.pop()
        else:
            self._buf = bytearray(self._buf_bytes)
            self._view = memoryview(self._buf)
        stash = self._stash
        self._start, self._end = 0, len(stash)
        if stash:
            self._buf[: len(stash)] = stash
            self._stash = b""

    async def _fill(self) -> int:
        """Receives more bytes into the read buffer; returns 0 on EOF. What the buffer holds
        here is part of a size prefix at most (< 4 bytes)."""
        sock = self._sock
        if sock is not None and not self._more:
            # Wait for bytes (or EOF) without holding a read buffer: a MSG_PEEK into a scratch
            # buffer all readers share (only the count is used). trio yields after each
            # receive, so a buffer received into is held across a yield: thousands of
            # connections woken at once by a byte each would hold a read buffer each. Skipped
            # (a syscall and a yield saved) while the peer streams: the last receive filled
            # all the room it had.
            self._release_buffer()
            if sock.fileno() == -1:
                raise trio.ClosedResourceError("the socket was closed")
            try:
                peeked = await sock.recv_into(_PEEK_VIEW, len(_PEEK_VIEW), socket.MSG_PEEK)
                if 0 < peeked < len(_PEEK_VIEW):
                    # A trickle: take just these bytes, then the read buffer (no yield).
                    data = await sock.recv(min(peeked, self._buf_bytes - len(self._stash)))
                    self._more = False
                    self._stash += data
                    self._take_buffer()
                    return len(data)
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket receive failed: {exc}") from exc
            if peeked == 0:  # EOF: thousands of peers may leave at once; take no buffer
                if self._stash:
                    self._take_buffer()  # for the truncated prefix's error
                return 0
            self._take_buffer()
        elif self._buf is _EMPTY:
            self._take_buffer()
        elif self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            pending = self._end - self._start
            self._buf[:pending] = self._view[self._start : self._end]
            self._start, self._end = 0, pending
        room = len(self._buf) - self._end
        n = await self._recv_into(self._view[self._end :])
        # A body received straight into is not a sign: its last receive fills it exactly.
        self._more = n == room
        self._end += n
        return n

    async def read_size(self) -> int | None:
        """Reads the next frame's size prefix (once: again returns the same size until
        `read_frame` returns that frame), or None on a clean EOF between frames. Lets a server
        decide whether to take the body in now, before any of it is allocated."""
        if self._size >= 0:
            return self._size
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
        self._size = size
        return size

    async def read_frame(self) -> bytearray | None:
        """Returns the next frame body, or None on a clean EOF between frames."""
        if self._body is None:
            size = await self.read_size()
            if size is None:
                return None
            # Sized by what arrived with the prefix; a body that has not all arrived grows as
            # the rest comes in.
            buffered = self._end - self._start
            body = bytearray(min(size, max(_BODY_START, _GROWTH * (4 + buffered))))
            take = min(size, buffered)
            body[:take] = self._view[self._start : self._start + take]
            self._start += take
            self._body, self._filled = body, take
        body = self._body
        size = self._size
        while self._filled < size:
            # The read buffer is empty whenever a body is still incomplete.
            remaining = size - self._filled
            if len(body) < size and (self._filled == len(body) or remaining < self._buf_bytes):
                # Grow with what arrived (to the whole frame for its last read buffer's worth).
                grown = size
                if remaining >= self._buf_bytes:
                    grown = min(size, _GROWTH * (4 + self._filled))
                body.extend(bytes(grown - len(body)))
            if remaining >= self._buf_bytes:
                # Large body: receive straight into it, no second copy.
                self._release_buffer()  # empty: not held while this waits
                with memoryview(body) as out:
                    n = await self._recv_into(out[self._filled :])
                if n == 0:
                    raise TruncatedFrame(f"EOF after {self._filled} of {size} bytes")
                self._filled += n
                continue
            # Small tail: go through the read buffer so that frames pipelined
            # behind this one arrive in the same syscall.
            if await self._fill() == 0:
                raise TruncatedFrame(f"EOF after {self._filled} of {size} bytes")
            take = min(remaining, self._end - self._start)
            with memoryview(body) as out:
                out[self._filled : self._filled + take] = self._view[
                    self._start : self._start + take
                ]
            self._start += take
            self._filled += take
        self._body = None
        self._filled = 0
        self._size = -1
        if self._start == self._end:
            self._release_buffer()
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
