"""The per-connection Kafka request loop, shared by every kind of broker.

Requests on one connection are read in order and may be pipelined. Each request is started
synchronously in arrival order (so that, for example, produce appends keep the client's order),
then finishes concurrently; responses are written strictly in request order, as Kafka requires.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from kafka_wire.codec import MalformedRequest, RequestHeader, parse_request_header
from kafka_wire.framing import FrameError, FrameReader, send_frame

log = logging.getLogger("zonefleet.wire")

Buffer = bytes | bytearray | memoryview
# A started request: an awaitable that yields the response frame parts, or None for no response.
Finish = Callable[[], Awaitable[Sequence[Buffer] | None]]


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    peer_host: str
    peer_port: int
    local_port: int
    listener: str = "kafka"


class CloseConnection(Exception):
    """Raised by a processor to drop the connection (the reason is logged)."""


class RequestProcessor(Protocol):
    def begin(self, header: RequestHeader, frame: bytearray, conn: ConnectionInfo) -> Finish:
        """Start one request synchronously; raise CloseConnection to drop the connection."""
        ...


class _Slot:
    __slots__ = ("done", "parts")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.parts: Sequence[Buffer] | None = None


def connection_info(stream: trio.SocketStream, listener: str = "kafka") -> ConnectionInfo:
    try:
        peer = stream.socket.getpeername()
        local = stream.socket.getsockname()
        return ConnectionInfo(str(peer[0]), int(peer[1]), int(local[1]), listener)
    except OSError:
        return ConnectionInfo("?", 0, 0, listener)


async def serve_connection(
    stream: trio.SocketStream,
    processor: RequestProcessor,
    *,
    max_frame_bytes: int,
    max_in_flight: int = 64,
    listener: str = "kafka",
) -> None:
    conn = connection_info(stream, listener)
    reader = FrameReader(stream, max_frame_bytes)
    send_slots, receive_slots = trio.open_memory_channel[_Slot](max_in_flight)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_responses, stream, receive_slots)
            async with send_slots:
                while True:
                    try:
                        frame = await reader.read_frame()
                    except FrameError as exc:
                        log.warning("closing %s:%s: %s", conn.peer_host, conn.peer_port, exc)
                        break
                    if frame is None:
                        break
                    try:
                        header = parse_request_header(frame)
                        finish = processor.begin(header, frame, conn)
                    except (MalformedRequest, CloseConnection) as exc:
                        log.warning(
                            "closing %s:%s: %s",
                            conn.peer_host,
                            conn.peer_port,
                            exc,
                            extra={"peer": f"{conn.peer_host}:{conn.peer_port}"},
                        )
                        break
                    slot = _Slot()
                    await send_slots.send(slot)
                    nursery.start_soon(_finish, slot, finish)
            # Reader done: pending responses still go out (the writer drains the channel), unless
            # the peer is gone, in which case the writer fails and the nursery unwinds.
    except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
        log.debug("connection %s:%s ended: %r", conn.peer_host, conn.peer_port, group.exceptions)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


async def _finish(slot: _Slot, finish: Finish) -> None:
    try:
        slot.parts = await finish()
    except CloseConnection as exc:
        log.warning("closing connection: %s", exc)
        slot.parts = _CLOSE
    except Exception:
        log.exception("request handler failed; closing the connection")
        slot.parts = _CLOSE
    finally:
        slot.done.set()


_CLOSE: Sequence[Buffer] = (b"",)


async def _write_responses(
    stream: trio.SocketStream, slots: trio.MemoryReceiveChannel[_Slot]
) -> None:
    async with slots:
        async for slot in slots:
            await slot.done.wait()
            if slot.parts is _CLOSE:
                await stream.aclose()
                return
            if slot.parts is not None:
                await send_frame(stream, slot.parts)
