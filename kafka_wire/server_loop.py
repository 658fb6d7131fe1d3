"""The per-connection Kafka request loop, shared by every kind of broker.

Requests on one connection are read in order and may be pipelined. Each request is started
synchronously in arrival order (so that, for example, produce appends keep the client's order),
then finishes concurrently; responses are written strictly in request order, as Kafka requires.

An optional `WireMeter` sees every frame (request in, response out) for traffic accounting;
`KafkaTrafficMeter` books them by client zone, Kafka API name and, for Produce and Fetch,
topic.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import trio
from kio.schema.index import api_key_map

from kafka_wire.codec import MalformedRequest, RequestHeader, parse_request_header
from kafka_wire.connection_limits import ConnectionLimits
from kafka_wire.framing import FrameError, FrameReader, send_frame
from kafka_wire.hot_codecs import ProduceRequestData, decode_produce_request
from kafka_wire.topic_bytes import (
    NO_TOPIC,
    TopicBytes,
    TopicFinish,
    TopicParts,
    fetch_request_entries,
    split_frame,
)
from telemetry.log_limit import BadInputLog

log = logging.getLogger("zonefleet.wire")
# A node's own (with its metric) is passed to serve_connection; this one serves the others.
_BAD_INPUT = BadInputLog(log)

Buffer = bytes | bytearray | memoryview
# A started request: an awaitable that yields the response frame parts, or None for no response.
Finish = Callable[[], Awaitable[Sequence[Buffer] | None]]


ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"


class ConnectionIdentity:
    """Who the connection is: the principal its listener authenticated (SASL, or a client
    certificate), else ``User:ANONYMOUS``. It may change on the same connection: KIP-368
    re-authentication renews it."""

    __slots__ = ("mechanism", "principal")

    def __init__(self, principal: str = ANONYMOUS_PRINCIPAL, mechanism: str | None = None):
        self.principal = principal
        self.mechanism = mechanism

    def __repr__(self) -> str:
        return f"ConnectionIdentity({self.principal!r}, {self.mechanism!r})"


class ConnectionMute:
    """Until when the connection is muted (trio time): a client over its quota is not read
    from until its throttle time has passed (KIP-219), as Kafka mutes its channel."""

    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until = -math.inf

    def mute_for(self, throttle_ms: int) -> None:
        if throttle_ms > 0:
            self.until = max(self.until, trio.current_time() + throttle_ms / 1000)


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    peer_host: str
    peer_port: int
    local_port: int
    listener: str = "kafka"
    identity: ConnectionIdentity = field(default_factory=ConnectionIdentity, compare=False)
    mute: ConnectionMute = field(default_factory=ConnectionMute, compare=False)

    @property
    def principal(self) -> str:
        return self.identity.principal


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
# Records one message split by topic: (from_zone, to_zone, channel, api, [(topic, bytes)],
# requests); the requests go to the first topic's row.
RecordTopicTraffic = Callable[[str, str, str, str, Sequence[tuple[str, int]], int], None]

API_FETCH: Final = 1
MAX_CACHED_TOPIC_IDS: Final = 100_000


class WireMeter(Protocol):
    """Sees every Kafka frame on a connection: each request as read, each response as sent."""

    def request_in(
        self,
        header: RequestHeader,
        frame: bytearray,
        conn: ConnectionInfo,
        finish: Finish | None,
    ) -> Any:
        """Count a request (`frame` without its size prefix) once its processor has started
        it (`finish`; None when the processor refused it). The returned token comes back with
        its response."""
        ...

    def response_out(self, token: Any, parts: Sequence[Buffer]) -> None:
        """Count a response frame (`parts` without its size prefix)."""
        ...


class KafkaTrafficMeter:
    """Books Kafka frames as ``kafka-client`` traffic between the client's zone and
    `node_zone`, with the Kafka API name as api. `client_zone(header, conn)` must be cheap
    (a cached lookup): it runs once per request.

    Produce and Fetch frames are split by topic (`kafka_wire.topic_bytes`): Produce requests
    by the topic sizes their processor measured while decoding them (`TopicFinish`; a request
    it refused books to the empty topic), Fetch requests by a walk over their fields, and
    responses by the sizes their encoders put in `TopicParts`. Fetch v13+ requests name topics
    by id; `topic_name(id)` gives the name (it may be slow: names found are cached here), and
    an id it does not know books to the empty topic, as its response entry, which answers
    UNKNOWN_TOPIC_ID without a name, does.
    """

    CHANNEL: Final = "kafka-client"

    def __init__(
        self,
        record: RecordTraffic,
        record_topics: RecordTopicTraffic,
        node_zone: str,
        client_zone: Callable[[RequestHeader, ConnectionInfo], str],
        topic_name: Callable[[bytes], str | None] = lambda topic_id: None,
    ) -> None:
        self._record = record
        self._record_topics = record_topics
        self._zone = node_zone
        self._client_zone = client_zone
        self._topic_name = topic_name
        self._topic_names: dict[bytes, str] = {}

    def request_in(
        self,
        header: RequestHeader,
        frame: bytearray,
        conn: ConnectionInfo,
        finish: Finish | None,
    ) -> tuple[str, str]:
        zone = self._client_zone(header, conn)
        key = header.api_key
        name = API_NAMES.get(key) or api_name(key)
        nbytes = 4 + len(frame)
        if isinstance(finish, TopicFinish):
            split = self._split(name, nbytes, finish.request_topics)
            self._record_topics(zone, self._zone, self.CHANNEL, name, split, 1)
        elif key == API_FETCH:
            split = self._split(name, nbytes, self._fetch_entries(header, frame))
            self._record_topics(zone, self._zone, self.CHANNEL, name, split, 1)
        else:
            self._record(zone, self._zone, self.CHANNEL, name, nbytes, 1)
        return zone, name

    def response_out(self, token: tuple[str, str], parts: Sequence[Buffer]) -> None:
        zone, name = token
        nbytes = _frame_bytes(parts)
        if isinstance(parts, TopicParts):
            split = self._split(name, nbytes, parts.topic_bytes)
            self._record_topics(self._zone, zone, self.CHANNEL, name, split, 1)
        else:
            self._record(self._zone, zone, self.CHANNEL, name, nbytes, 1)

    @staticmethod
    def _split(name: str, nbytes: int, entries: TopicBytes) -> Sequence[tuple[str, int]]:
        try:
            return split_frame(nbytes, entries)
        except ValueError:  # a bug in a codec: never worth a client's connection
            log.exception("%s frame: topic sizes do not fit the frame of %d bytes", name, nbytes)
            return ((NO_TOPIC, nbytes),)

    def _fetch_entries(self, header: RequestHeader, frame: bytearray) -> TopicBytes:
        """The Fetch request's topic entries; none when it is malformed (its processor closes
        the connection) or older than the walk knows."""
        if header.api_version < 4:
            return []
        try:
            return fetch_request_entries(header.api_version, frame, header.size, self._name_of)
        except (ValueError, IndexError, struct.error):
            return []

    def _name_of(self, topic_id: bytes) -> str | None:
        name = self._topic_names.get(topic_id)
        if name is None:
            name = self._topic_name(topic_id)
            if name is not None:
                # Ids are never reused, so a name found stays right; unknown ids (which come
                # from clients) are not kept. Bounded all the same.
                if len(self._topic_names) >= MAX_CACHED_TOPIC_IDS:
                    self._topic_names.clear()
                self._topic_names[topic_id] = name
        return name


def _frame_bytes(parts: Sequence[Buffer]) -> int:
    return 4 + sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)


class CloseConnection(Exception):
    """Raised by a processor to drop the connection (the reason is logged)."""


def decode_produce_or_close(header: RequestHeader, frame: bytearray) -> ProduceRequestData:
    """A Produce request's body, its records zero-copy views of `frame`; a body that does not
    decode drops the connection, as Kafka does."""
    try:
        return decode_produce_request(header.api_version, memoryview(frame), header.size)
    except ValueError as exc:
        raise CloseConnection(f"malformed Produce v{header.api_version}: {exc}") from None


class RequestProcessor(Protocol):
    def begin(self, header: RequestHeader, frame: bytearray, conn: ConnectionInfo) -> Finish:
        """Start one request synchronously; raise CloseConnection to drop the connection."""
        ...


class ConnectionGate(Protocol):
    """Sees each request before the processor (a SASL listener's authentication): returns
    how to answer it itself, or None to let the processor have it; raises CloseConnection to
    drop the connection."""

    def begin(self, header: RequestHeader, frame: bytearray) -> Finish | None: ...


class LastResponse(tuple[Buffer, ...]):
    """Response parts after which the connection closes (a failed authentication)."""


class _Slot:
    __slots__ = ("done", "nbytes", "parts", "token")

    def __init__(self, token: Any = None, nbytes: int = 0) -> None:
        self.done = trio.Event()
        self.parts: Sequence[Buffer] | None = None
        self.token = token
        self.nbytes = nbytes  # the request frame's, size prefix included


class _InFlight:
    """Bytes of a connection's requests read but not yet answered (Kafka mutes a channel
    while one request is under way; this lets several run, up to `limit` bytes)."""

    __slots__ = ("answered", "closed", "limit", "limits", "nbytes")

    def __init__(self, limit: int, limits: ConnectionLimits | None) -> None:
        self.limit = limit
        self.limits = limits
        self.nbytes = 0
        self.answered = trio.Event()
        self.closed = False

    def admits(self, nbytes: int) -> bool:
        """Whether a request of `nbytes` may be read now: one always may when none is under
        way, so a request larger than the limit is served alone rather than never; and once
        the writer is gone, so that the reader finds the connection closed."""
        return self.nbytes == 0 or self.nbytes + nbytes <= self.limit or self.closed

    def close(self) -> None:
        self.closed = True
        self.answered.set()

    async def wait_for_room(self, nbytes: int) -> None:
        while not self.admits(nbytes):
            self.answered = trio.Event()
            await self.answered.wait()

    def add(self, nbytes: int) -> None:
        self.nbytes += nbytes
        if self.limits is not None:
            self.limits.add_in_flight(self.nbytes, nbytes)

    def remove(self, nbytes: int) -> None:
        self.nbytes -= nbytes
        if self.limits is not None:
            self.limits.add_in_flight(self.nbytes, -nbytes)
        self.answered.set()


def connection_info(stream: trio.abc.Stream, listener: str = "kafka") -> ConnectionInfo:
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if not isinstance(stream, trio.SocketStream):
        return ConnectionInfo("?", 0, 0, listener)
    try:
        peer = stream.socket.getpeername()
        local = stream.socket.getsockname()
        return ConnectionInfo(str(peer[0]), int(peer[1]), int(local[1]), listener)
    except OSError:
        return ConnectionInfo("?", 0, 0, listener)


class CountedGauge(Protocol):
    def inc(self) -> None: ...

    def dec(self) -> None: ...


class ClientLimitsConfig(Protocol):
    """The client-connection settings every broker's configuration has (Kafka's names in
    each field's comment there)."""

    @property
    def max_request_bytes(self) -> int: ...
    @property
    def max_in_flight_per_connection(self) -> int: ...
    @property
    def connections_max_idle_s(self) -> float: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def max_connections_per_ip(self) -> int: ...
    @property
    def max_in_flight_bytes_per_connection(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ClientServing:
    """A node's client connections, each served by `serve_connection` with the node's limits,
    meter and bad-input log, and counted in its open-connections gauge. `serve` suits
    trio.serve_tcp and the named listeners (kafka_wire.secure_listeners) alike."""

    processor: RequestProcessor
    max_frame_bytes: int
    max_in_flight: int
    idle_timeout_s: float | None
    meter: WireMeter | None
    bad_input: BadInputLog | None
    limits: ConnectionLimits
    connections: CountedGauge

    @classmethod
    def for_node(
        cls,
        processor: RequestProcessor,
        config: ClientLimitsConfig,
        meter: WireMeter,
        connections: CountedGauge,
        bad_input: BadInputLog,
    ) -> ClientServing:
        limits = ConnectionLimits(
            config.max_connections,
            config.max_connections_per_ip,
            config.max_in_flight_bytes_per_connection,
        )
        return cls(
            processor,
            max_frame_bytes=config.max_request_bytes,
            max_in_flight=config.max_in_flight_per_connection,
            idle_timeout_s=config.connections_max_idle_s or None,
            meter=meter,
            bad_input=bad_input,
            limits=limits,
            connections=connections,
        )

    async def serve(
        self,
        stream: trio.abc.Stream,
        conn: ConnectionInfo | None = None,
        gate: Callable[[ConnectionInfo], ConnectionGate] | None = None,
    ) -> None:
        self.connections.inc()
        try:
            await serve_connection(
                stream,
                self.processor,
                conn=conn,
                gate=gate,
                max_frame_bytes=self.max_frame_bytes,
                max_in_flight=self.max_in_flight,
                meter=self.meter,
                bad_input=self.bad_input,
                limits=self.limits,
                idle_timeout_s=self.idle_timeout_s,
            )
        finally:
            self.connections.dec()


async def serve_connection(
    stream: trio.abc.Stream,
    processor: RequestProcessor,
    *,
    max_frame_bytes: int,
    max_in_flight: int = 64,
    listener: str = "kafka",
    meter: WireMeter | None = None,
    bad_input: BadInputLog | None = None,
    limits: ConnectionLimits | None = None,
    idle_timeout_s: float | None = None,
    max_in_flight_bytes: int | None = None,
    gate: Callable[[ConnectionInfo], ConnectionGate] | None = None,
    conn: ConnectionInfo | None = None,
) -> None:
    """`gate(conn)` makes the connection's `ConnectionGate` (a SASL listener's); `conn` is
    the connection's info when the caller made it already (a TLS listener, which sets the
    certificate's principal). `bad_input` says why a connection is closed for what its peer
    sent (one line, rate limited per peer, and counted: a node passes its own with a metric).
    `limits` admits the connection first (Kafka's max.connections and
    max.connections.per.ip): one over them is closed at once. A connection that sends no
    request for `idle_timeout_s` while none of its requests is under way is closed (Kafka's
    connections.max.idle.ms); so is one that takes that long to send one frame (a slowloris).

    At most `max_in_flight` requests and `max_in_flight_bytes` of request frames (default
    `max_frame_bytes`; `limits.max_in_flight_bytes` when set) are under way on the connection
    (read, not yet answered): past either the loop stops reading the socket until answers go
    out, so a client that pipelines without reading its answers is slowed by TCP, not given
    the node's memory."""
    if max_in_flight_bytes is None:
        configured = limits.max_in_flight_bytes if limits is not None else 0
        max_in_flight_bytes = configured or max_frame_bytes
    bad = bad_input or _BAD_INPUT
    if conn is None:
        conn = connection_info(stream, listener)
    if limits is not None:
        refused = limits.admit(conn.peer_host)
        if refused is not None:
            bad.warn(conn.peer_host, "connection", "refusing a connection from %s:%s: %s",
                     conn.peer_host, conn.peer_port, refused)  # fmt: skip
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            return
    in_flight = _InFlight(max_in_flight_bytes, limits)
    try:
        await _serve_admitted(
            stream,
            processor,
            conn,
            bad,
            max_frame_bytes,
            max_in_flight,
            meter,
            idle_timeout_s,
            in_flight,
            gate(conn) if gate is not None else None,
        )
    finally:
        in_flight.remove(in_flight.nbytes)  # requests never answered
        if limits is not None:
            limits.release(conn.peer_host)


async def _serve_admitted(
    stream: trio.abc.Stream,
    processor: RequestProcessor,
    conn: ConnectionInfo,
    bad: BadInputLog,
    max_frame_bytes: int,
    max_in_flight: int,
    meter: WireMeter | None,
    idle_timeout_s: float | None,
    in_flight: _InFlight,
    gate: ConnectionGate | None,
) -> None:
    reader = FrameReader(stream, max_frame_bytes)
    send_slots, receive_slots = trio.open_memory_channel[_Slot](max_in_flight)
    under_way: list[_Slot] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_responses, stream, receive_slots, meter, in_flight)
            async with send_slots:
                while True:
                    if conn.mute.until > trio.current_time():  # throttled: not idle meanwhile
                        await trio.sleep_until(conn.mute.until)
                    try:
                        with trio.move_on_after(idle_timeout_s or math.inf) as idle:
                            size = await reader.read_size()
                            if size is not None and not in_flight.admits(4 + size):
                                # Backpressure: not idle while its answers are awaited, and
                                # the frame's time (the slowloris rule) starts again after.
                                idle.deadline = math.inf
                                await in_flight.wait_for_room(4 + size)
                                idle.deadline = trio.current_time() + (idle_timeout_s or math.inf)
                            frame = await reader.read_frame()
                        if idle.cancelled_caught:
                            under_way = [s for s in under_way if not s.done.is_set()]
                            if under_way:
                                continue  # waiting on its own answers (a long poll): not idle
                            log.info("closing idle connection %s:%s after %.0f s",
                                     conn.peer_host, conn.peer_port, idle_timeout_s)  # fmt: skip
                            break
                    except FrameError as exc:
                        bad.warn(conn.peer_host, "frame", "closing %s:%s: %s",
                                 conn.peer_host, conn.peer_port, exc)  # fmt: skip
                        break
                    if frame is None:
                        break
                    try:
                        header = parse_request_header(frame)
                        try:
                            gated = gate.begin(header, frame) if gate is not None else None
                            finish = gated or processor.begin(header, frame, conn)
                        except BaseException:
                            if meter is not None:  # a refused request's bytes still count
                                meter.request_in(header, frame, conn, None)
                            raise
                        token = None
                        if meter is not None:
                            # After begin: the processor has measured the request's topics.
                            token = meter.request_in(header, frame, conn, finish)
                    except (MalformedRequest, CloseConnection) as exc:
                        bad.warn(conn.peer_host, "request", "closing %s:%s: %s",
                                 conn.peer_host, conn.peer_port, exc)  # fmt: skip
                        break
                    slot = _Slot(token, 4 + len(frame))
                    in_flight.add(slot.nbytes)
                    if idle_timeout_s is not None:
                        if len(under_way) >= 2 * max_in_flight:
                            under_way = [s for s in under_way if not s.done.is_set()]
                        under_way.append(slot)
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
    stream: trio.abc.Stream,
    slots: trio.MemoryReceiveChannel[_Slot],
    meter: WireMeter | None,
    in_flight: _InFlight,
) -> None:
    try:
        async with slots:
            async for slot in slots:
                await slot.done.wait()
                if slot.parts is _CLOSE:
                    await stream.aclose()
                    return
                if slot.parts is not None:
                    await send_frame(stream, slot.parts)
                    if meter is not None:
                        meter.response_out(slot.token, slot.parts)
                in_flight.remove(slot.nbytes)
                if isinstance(slot.parts, LastResponse):
                    await stream.aclose()
                    return
    finally:
        in_flight.close()  # a reader waiting for room would otherwise wait for ever
