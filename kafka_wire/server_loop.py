"""The per-connection Kafka request loop, shared by every kind of broker.

Requests on one connection are read in order and may be pipelined. Each request is started
synchronously in arrival order (so that, for example, produce appends keep the client's order),
then finishes concurrently; responses are written strictly in request order, as Kafka requires.

An optional `WireMeter` sees every frame's size (request in, response out) for traffic
accounting; `KafkaTrafficMeter` books them by client zone and Kafka API name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import trio
from kio.schema.index import api_key_map

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


def _camel(snake: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in snake.split("_"))


#: Kafka API names as the protocol spells them ("Produce", "ListOffsets"), by api key.
API_NAMES: Final[dict[int, str]] = {key: _camel(name) for key, name in api_key_map.items()}


def api_name(api_key: int) -> str:
    """The Kafka name of `api_key`, or ``api<key>`` for keys kio does not know."""
    name = API_NAMES.get(api_key)
    return name if name is not None else f"api{api_key}"


# Records traffic: (from_zone, to_zone, channel, api, bytes, requests).
RecordTraffic = Callable[[str, str, str, str, int, int], None]


class WireMeter(Protocol):
    """Sees the size of every Kafka frame on a connection, size prefix included."""

    def request_in(self, header: RequestHeader, conn: ConnectionInfo, nbytes: int) -> Any:
        """Count a request; the returned token comes back with its response's size."""
        ...

    def response_out(self, token: Any, nbytes: int) -> None: ...


class KafkaTrafficMeter:
    """Books Kafka frames as ``kafka-client`` traffic between the client's zone and
    `node_zone`, with the Kafka API name as api. `client_zone(header, conn)` must be cheap
    (a cached lookup): it runs once per request."""

    CHANNEL: Final = "kafka-client"

    def __init__(
        self,
        record: RecordTraffic,
        node_zone: str,
        client_zone: Callable[[RequestHeader, ConnectionInfo], str],
    ) -> None:
        self._record = record
        self._zone = node_zone
        self._client_zone = client_zone

    def request_in(
        self, header: RequestHeader, conn: ConnectionInfo, nbytes: int
    ) -> tuple[str, str]:
        zone = self._client_zone(header, conn)
        name = API_NAMES.get(header.api_key) or api_name(header.api_key)
        self._record(zone, self._zone, self.CHANNEL, name, nbytes, 1)
        return zone, name

    def response_out(self, token: tuple[str, str], nbytes: int) -> None:
        zone, name = token
        self._record(self._zone, zone, self.CHANNEL, name, nbytes, 1)


def _frame_bytes(parts: Sequence[Buffer]) -> int:
    return 4 + sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


class CloseConnection(Exception):
    """Raised by a processor to drop the connection (the reason is logged)."""


class RequestProcessor(Protocol):
    def begin(self, header: RequestHeader, frame: bytearray, conn: ConnectionInfo) -> Finish:
        """Start one request synchronously; raise CloseConnection to drop the connection."""
        ...


class _Slot:
    __slots__ = ("done", "parts", "token")

    def __init__(self, token: Any = None) -> None:
        self.done = trio.Event()
        self.parts: Sequence[Buffer] | None = None
        self.token = token


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
    meter: WireMeter | None = None,
) -> None:
    conn = connection_info(stream, listener)
    reader = FrameReader(stream, max_frame_bytes)
    send_slots, receive_slots = trio.open_memory_channel[_Slot](max_in_flight)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_responses, stream, receive_slots, meter)
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
                        token = None
                        if meter is not None:
                            token = meter.request_in(header, conn, 4 + len(frame))
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
                    slot = _Slot(token)
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
    stream: trio.SocketStream, slots: trio.MemoryReceiveChannel[_Slot], meter: WireMeter | None
) -> None:
    async with slots:
        async for slot in slots:
            await slot.done.wait()
            if slot.parts is _CLOSE:
                await stream.aclose()
                return
            if slot.parts is not None:
                await send_frame(stream, slot.parts)
                if meter is not None:
                    meter.response_out(slot.token, _frame_bytes(slot.parts))
