"""Internal RPC over trio: an authenticated, multiplexed request/response and subscription
transport between zonefleet nodes. Framing is in `rpc_frames`, the handshake in `rpc_auth`.

Traffic accounting: `on_bytes(direction, method, nbytes, peer_node)` sees every frame; a
`RpcMeter` (see `rpc_accounting`) classifies each call once from its request and then sees
every frame of that call (request, response, pushes, cancel) with the call's tag.
"""

from __future__ import annotations

import logging
import math
import random
import select
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Protocol

import trio

from kafka_wire.framing import FrameError, FrameReader
from kafka_wire.rpc_auth import (
    AuthError,
    answer_hello,
    check_secret,
    hello_message,
    new_nonce,
    verify_auth,
    verify_ok,
)
from kafka_wire.rpc_frames import DEFAULT_MAX_FRAME_BYTES, decode_body, encode_frame

__all__ = [
    "Handler",
    "RpcAuthError",
    "RpcClient",
    "RpcError",
    "RpcMeter",
    "RpcPeer",
    "RpcRemoteError",
    "RpcServer",
    "RpcTimeout",
    "RpcUnavailable",
    "StreamHandler",
]

log = logging.getLogger("zonefleet.rpc")

HANDSHAKE_TIMEOUT: Final = 2.0
MAX_IN_FLIGHT: Final = 4096  # concurrent requests + subscriptions per server connection
MAX_BUFFERED_PUSHES: Final = 10_000  # per client subscription; past it the subscriber resyncs
_CLEANUP_TIMEOUT: Final = 1.0
_NET_ERRORS: Final = (FrameError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_ACCOUNT_HANDSHAKE: Final = "_handshake"
_DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
_MAX_DEADLINE_S: Final = 86_400.0


class RpcError(Exception):
    """Base class of RPC client errors."""


class RpcTimeout(RpcError):
    """The call's deadline passed before a response arrived."""


class RpcUnavailable(RpcError):
    """No usable connection to the peer (refused, dropped, or the handshake failed)."""


class RpcAuthError(RpcUnavailable):
    """The peer failed mutual authentication; retrying will not help."""


class RpcRemoteError(RpcError):
    """The remote handler raised; `code` is its exception class name."""

    def __init__(self, code: str, msg: str) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg


@dataclass(frozen=True, slots=True)
class RpcPeer:
    """The authenticated caller, as a handler sees it."""

    node_id: int
    address: str


Handler = Callable[[RpcPeer, dict[str, Any]], Awaitable[Any]]
StreamHandler = Callable[
    [RpcPeer, dict[str, Any], Callable[[Any], Awaitable[None]]], Awaitable[None]
]
OnBytes = Callable[[str, str, int, int], None]
_NO_PARAMS: Final[dict[str, Any]] = {}


class RpcMeter(Protocol):
    """Traffic accounting of RPC frames; both methods run on the hot path."""

    def classify(self, method: str, params: dict[str, Any]) -> Any:
        """A tag for a call or subscription, computed once from its request (the handshake
        is classified as method ``_handshake`` with no params)."""
        ...

    def count(self, tag: Any, direction: str, nbytes: int, peer_node: int) -> None:
        """One frame of the call tagged `tag`: ``in`` or ``out`` as seen from this side."""
        ...


class _Accounting:
    """The `on_bytes` and `meter` hooks of one server or client."""

    __slots__ = ("meter", "on_bytes")

    def __init__(self, on_bytes: OnBytes | None, meter: RpcMeter | None) -> None:
        self.on_bytes = on_bytes
        self.meter = meter

    def tag(self, method: str, params: dict[str, Any]) -> Any:
        meter = self.meter
        return meter.classify(method, params) if meter is not None else None

    def __call__(self, direction: str, method: str, tag: Any, nbytes: int, peer: int) -> None:
        if self.on_bytes is not None:
            self.on_bytes(direction, method, nbytes, peer)
        if self.meter is not None:
            self.meter.count(tag, direction, nbytes, peer)


def _address(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError):
        return "?"
    return f"{host}:{port}"


def _text(exc: BaseException) -> str:
    return str(exc)[:2000]  # an error reply must always fit a frame


async def _read_msg(reader: FrameReader) -> tuple[dict[str, Any], int]:
    frame = await reader.read_frame()
    if frame is None:
        raise trio.BrokenResourceError("the peer closed the connection")
    return decode_body(frame), 4 + len(frame)


# ---------------------------------------------------------------------------- server


class _Task:
    __slots__ = ("by_client", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.by_client = False


class _ServerConn:
    def __init__(
        self, server: RpcServer, stream: trio.SocketStream, reader: FrameReader, peer: RpcPeer
    ) -> None:
        self.server = server
        self.stream = stream
        self.reader = reader
        self.peer = peer
        self.tasks: dict[int, _Task] = {}
        self.send_lock = trio.Lock()
        self.dead = False
        self.nursery: trio.Nursery

    async def send(self, msg: dict[str, Any], method: str, tag: Any) -> bool:
        """Sends one frame; on a dead socket, cancels the whole connection."""
        data = encode_frame(msg, self.server.max_frame_bytes)  # the caller handles errors
        try:
            async with self.send_lock:
                if self.dead:
                    return False
                await self.stream.send_all(data)
        except _NET_ERRORS:
            self.dead = True
            self.nursery.cancel_scope.cancel()
            return False
        except BaseException:
            # Cancelled mid-write: the stream may hold half a frame, so nothing else may follow.
            self.dead = True
            self.nursery.cancel_scope.cancel()
            raise
        self.server._account("out", method, tag, len(data), self.peer.node_id)
        return True

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                while True:
                    msg, size = await _read_msg(self.reader)
                    self.dispatch(msg, size)
            except trio.BrokenResourceError:
                pass  # EOF: the client went away; its calls are moot
            except _NET_ERRORS as exc:
                log.warning("rpc: closing connection from %s: %s", self.peer.address, exc)
            except _ProtocolViolation as exc:
                log.warning("rpc: closing connection from %s: %s", self.peer.address, exc)
            nursery.cancel_scope.cancel()

    def dispatch(self, msg: dict[str, Any], size: int) -> None:
        kind, rid = msg["t"], msg.get("id")
        if type(rid) is not int:
            raise _ProtocolViolation(f"{kind!r} message without an integer id")
        if kind == "cancel":
            task = self.tasks.get(rid)
            if task is not None:
                task.by_client = True
                task.scope.cancel()
            return
        if kind not in ("req", "sub"):
            raise _ProtocolViolation(f"unexpected message type {kind!r}")
        method, params = msg.get("m"), msg.get("p", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            raise _ProtocolViolation(f"{kind!r} without a method name or a params map")
        tag = self.server._account.tag(method, params)
        self.server._account("in", method, tag, size, self.peer.node_id)
        reply = "err" if kind == "req" else "end"
        if rid in self.tasks:
            self.nursery.start_soon(self._refuse, reply, rid, method, tag, "DuplicateId")
        elif len(self.tasks) >= MAX_IN_FLIGHT:
            self.nursery.start_soon(self._refuse, reply, rid, method, tag, "TooManyRequests")
        elif kind == "req":
            handler = self.server.handlers.get(method)
            if handler is None:
                self.nursery.start_soon(self._refuse, reply, rid, method, tag, "UnknownMethod")
                return
            dl = msg.get("dl")
            timeout = dl / 1000 if isinstance(dl, int | float) and dl > 0 else math.inf
            task = self.tasks[rid] = _Task(trio.CancelScope(deadline=trio.current_time() + timeout))
            self.nursery.start_soon(self._call, task, rid, method, tag, handler, params)
        else:
            stream = self.server.streams.get(method)
            if stream is None:
                self.nursery.start_soon(self._refuse, reply, rid, method, tag, "UnknownStream")
                return
            task = self.tasks[rid] = _Task(trio.CancelScope())
            self.nursery.start_soon(self._subscription, task, rid, method, tag, stream, params)

    async def _refuse(self, kind: str, rid: int, method: str, tag: Any, code: str) -> None:
        await self.send({"t": kind, "id": rid, "code": code, "msg": method}, method, tag)

    async def _call(
        self,
        task: _Task,
        rid: int,
        method: str,
        tag: Any,
        handler: Handler,
        params: dict[str, Any],
    ) -> None:
        try:
            with task.scope:
                result = await handler(self.peer, params)
            if task.scope.cancelled_caught:
                if not task.by_client:
                    await self._refuse("err", rid, method, tag, _DEADLINE_EXCEEDED)
                return
            await self.send({"t": "res", "id": rid, "r": result}, method, tag)
        except Exception as exc:
            log.warning("rpc: %s from %s raised", method, self.peer.address, exc_info=True)
            await self.send(
                {"t": "err", "id": rid, "code": type(exc).__name__, "msg": _text(exc)},
                method,
                tag,
            )
        finally:
            del self.tasks[rid]

    async def _subscription(
        self,
        task: _Task,
        rid: int,
        stream: str,
        tag: Any,
        handler: StreamHandler,
        params: dict[str, Any],
    ) -> None:
        async def push(data: Any) -> None:
            if not await self.send({"t": "push", "id": rid, "d": data}, stream, tag):
                raise trio.BrokenResourceError("the subscriber's connection is gone")

        end: dict[str, Any] = {"t": "end", "id": rid}
        try:
            with task.scope:
                await handler(self.peer, params, push)
            if task.scope.cancelled_caught:
                return
        except Exception as exc:
            if self.dead:
                return
            log.warning("rpc: stream %s for %s raised", stream, self.peer.address, exc_info=True)
            end.update(code=type(exc).__name__, msg=_text(exc))
        finally:
            del self.tasks[rid]
        await self.send(end, stream, tag)


class _ProtocolViolation(Exception):
    pass


class RpcServer:
    """Serves `handlers` (request/response) and `streams` (subscriptions) to authenticated
    peers. Each request runs as its own task, so slow calls never block others."""

    def __init__(
        self,
        node_id: int,
        secret: bytes,
        handlers: Mapping[str, Handler],
        streams: Mapping[str, StreamHandler] = {},
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        on_bytes: OnBytes | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        meter: RpcMeter | None = None,
    ) -> None:
        self.node_id = node_id
        self.secret = check_secret(secret)
        self.handlers = dict(handlers)
        self.streams = dict(streams)
        self.max_frame_bytes = max_frame_bytes
        self.handshake_timeout = handshake_timeout
        self.port: int | None = None
        self._account = _Accounting(on_bytes, meter)

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listens until cancelled; `task_status.started(bound_port)`."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self._handle, port, host=host))
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self.port)

    async def _handle(self, stream: trio.SocketStream) -> None:
        address = _address(stream)
        try:
            peer = await self._handshake(stream, address)
            if peer is not None:
                await _ServerConn(self, stream, peer[1], peer[0]).run()
        except Exception:  # never let one connection take the listener down
            log.exception("rpc: connection from %s failed", address)
        finally:
            await trio.aclose_forcefully(stream)

    async def _handshake(
        self, stream: trio.SocketStream, address: str
    ) -> tuple[RpcPeer, FrameReader] | None:
        reader = FrameReader(stream, self.max_frame_bytes)
        nonce = new_nonce()
        sent = 0
        try:
            with trio.fail_after(self.handshake_timeout):
                hello = encode_frame(hello_message(self.node_id, nonce))
                await stream.send_all(hello)
                auth, received = await _read_msg(reader)
                client_node, ok = verify_auth(self.secret, self.node_id, nonce, auth)
                reply = encode_frame(ok)
                await stream.send_all(reply)
                sent = len(hello) + len(reply)
        except (*_NET_ERRORS, AuthError, trio.TooSlowError) as exc:
            reason = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
            log.warning("rpc: refused connection from %s: %s", address, reason or type(exc))
            return None
        tag = self._account.tag(_ACCOUNT_HANDSHAKE, _NO_PARAMS)
        self._account("in", _ACCOUNT_HANDSHAKE, tag, received, client_node)
        self._account("out", _ACCOUNT_HANDSHAKE, tag, sent, client_node)
        return RpcPeer(client_node, address), reader


# ---------------------------------------------------------------------------- client


class _Slot:
    """One outstanding call or subscription on a client connection."""

    __slots__ = ("items", "overflow", "reply", "wake")

    def __init__(self) -> None:
        self.reply: dict[str, Any] | None = None  # res/err, or a subscription's end
        self.items: deque[Any] = deque()
        self.overflow = False
        self.wake: trio.Event | None = None

    def ready(self) -> bool:
        return self.reply is not None or bool(self.items) or self.overflow


class _ClientConn:
    """An authenticated connection. There is no background reader task: whichever caller is
    waiting reads frames for everyone and hands the role on when its own reply arrives."""

    def __init__(
        self, client: RpcClient, stream: trio.SocketStream, reader: FrameReader, peer_node: int
    ) -> None:
        self.client = client
        self.stream = stream
        self.reader = reader
        self.peer_node = peer_node
        self.slots: dict[int, _Slot] = {}
        self.methods: dict[int, tuple[str, Any]] = {}  # id -> (method, accounting tag)
        self.next_id = 1
        self.send_lock = trio.Lock()
        self.reading = False
        self.error: BaseException | None = None

    def open_slot(self, method: str, params: dict[str, Any]) -> tuple[int, _Slot]:
        rid, self.next_id = self.next_id, self.next_id + 1
        slot = self.slots[rid] = _Slot()
        self.methods[rid] = (method, self.client._account.tag(method, params))
        return rid, slot

    def close_slot(self, rid: int) -> None:
        self.slots.pop(rid, None)
        self.methods.pop(rid, None)

    def fail(self, exc: BaseException) -> None:
        if self.error is not None:
            return
        self.error = exc
        self.stream.socket.close()  # wakes a reader or writer blocked on the socket
        for slot in self.slots.values():
            if slot.wake is not None:
                slot.wake.set()

    def unavailable(self) -> RpcUnavailable:
        err = RpcUnavailable(f"connection to node {self.peer_node} lost: {self.error}")
        err.__cause__ = self.error
        return err

    async def send(self, msg: dict[str, Any], rid: int) -> None:
        if self.error is not None:
            raise self.unavailable()
        data = encode_frame(msg, self.client.max_frame_bytes)
        async with self.send_lock:
            try:
                await self.stream.send_all(data)
            except _NET_ERRORS as exc:
                self.fail(exc)
                raise self.unavailable() from exc
            except BaseException as exc:
                self.fail(exc)  # cancelled mid-write: the stream may hold half a frame
                raise
        method, tag = self.methods.get(rid) or ("cancel", None)
        self.client._account("out", method, tag, len(data), self.peer_node)

    async def send_cancel(self, rid: int) -> None:
        """Best effort, even from a cancelled scope."""
        if self.error is not None:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLEANUP_TIMEOUT):
            with suppress(RpcUnavailable):
                await self.send({"t": "cancel", "id": rid}, rid)

    async def wait(self, slot: _Slot) -> None:
        while not slot.ready():
            if self.error is not None:
                raise self.unavailable()
            if self.reading:
                slot.wake = trio.Event()
                try:
                    await slot.wake.wait()
                except BaseException:
                    slot.wake = None
                    if not self.reading:  # we may have been handed the reader role
                        self._hand_off()
                    raise
                slot.wake = None
                continue
            self.reading = True
            try:
                while not slot.ready():
                    msg, size = await _read_msg(self.reader)
                    self._dispatch(msg, size)
            except _NET_ERRORS as exc:
                if not isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                    log.warning("rpc: bad frame from %s: %s", _address(self.stream), exc)
                self.fail(exc)
            finally:
                self.reading = False
                self._hand_off()

    def _hand_off(self) -> None:
        """Wakes one caller still waiting, so that someone keeps reading."""
        for other in self.slots.values():
            if other.wake is not None and not other.ready():
                other.wake.set()
                return

    def _dispatch(self, msg: dict[str, Any], size: int) -> None:
        rid = msg.get("id")
        if type(rid) is not int or (slot := self.slots.get(rid)) is None:
            return  # a late reply to a call that gave up
        method, tag = self.methods[rid]
        self.client._account("in", method, tag, size, self.peer_node)
        if msg["t"] == "push":
            if slot.overflow or len(slot.items) >= MAX_BUFFERED_PUSHES:
                slot.overflow = True  # drop the rest: a gap would corrupt the subscriber's state
            else:
                slot.items.append(msg.get("d"))
        else:
            slot.reply = msg
        if slot.wake is not None:
            slot.wake.set()


def _readable(conn: _ClientConn) -> bool:
    poller = select.poll()
    poller.register(conn.stream.socket.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _remote_error(msg: dict[str, Any]) -> RpcRemoteError:
    return RpcRemoteError(str(msg.get("code", "Error")), str(msg.get("msg", "")))


class RpcClient:
    """One authenticated, multiplexed connection to one peer; reconnects lazily."""

    def __init__(
        self,
        node_id: int,
        secret: bytes,
        host: str,
        port: int,
        *,
        connect_timeout: float = 2.0,
        on_bytes: OnBytes | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        meter: RpcMeter | None = None,
    ) -> None:
        self.node_id = node_id
        self.secret = check_secret(secret)
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self._account = _Accounting(on_bytes, meter)
        self.max_frame_bytes = max_frame_bytes
        self.peer_node: int | None = None
        self._conn: _ClientConn | None = None
        self._connect_lock = trio.Lock()
        self._closed = False

    @property
    def meter(self) -> RpcMeter | None:
        return self._account.meter

    @meter.setter
    def meter(self, meter: RpcMeter | None) -> None:
        self._account.meter = meter

    async def _connection(self) -> _ClientConn:
        async with self._connect_lock:
            if self._closed:
                raise RpcUnavailable("the client is closed")
            conn = self._conn
            if conn is not None and conn.error is None and not conn.slots and _readable(conn):
                # Idle, yet the peer sent something: EOF or RST after a restart. Reconnect now
                # rather than fail the next (maybe non-idempotent) call after writing it.
                conn.fail(trio.BrokenResourceError("the idle connection was closed by the peer"))
            if conn is None or conn.error is not None:
                conn = self._conn = await self._connect()
            return conn

    async def _connect(self) -> _ClientConn:
        stream: trio.SocketStream | None = None
        authenticating = False
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(self.host, self.port)
                reader = FrameReader(stream, self.max_frame_bytes)
                hello, received = await _read_msg(reader)
                auth, expected, peer_node = answer_hello(
                    self.secret, self.node_id, hello, new_nonce()
                )
                data = encode_frame(auth)
                await stream.send_all(data)
                authenticating = True
                ok, size = await _read_msg(reader)
                verify_ok(expected, ok)
        except BaseException as exc:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            where = f"{self.host}:{self.port}"
            if isinstance(exc, AuthError):
                raise RpcAuthError(f"RPC peer {where} failed authentication: {exc}") from exc
            if authenticating and isinstance(exc, trio.BrokenResourceError):
                # The server closes without a word on a bad MAC: most likely a wrong secret.
                raise RpcAuthError(f"RPC peer {where} refused our credentials") from exc
            if isinstance(exc, (*_NET_ERRORS, trio.TooSlowError)):
                raise RpcUnavailable(f"cannot connect to RPC peer {where}: {exc!r}") from exc
            raise
        self.peer_node = peer_node
        tag = self._account.tag(_ACCOUNT_HANDSHAKE, _NO_PARAMS)
        self._account("in", _ACCOUNT_HANDSHAKE, tag, received + size, peer_node)
        self._account("out", _ACCOUNT_HANDSHAKE, tag, len(data), peer_node)
        return _ClientConn(self, stream, reader, peer_node)

    async def call(
        self,
        method: str,
        params: dict[str, Any],
        *,
        timeout: float = 5.0,
        retries: int = 2,
        idempotent: bool = True,
    ) -> Any:
        """Calls `method` with a deadline of `timeout` per attempt.

        Retries (jittered exponential backoff) only after connection failures: always when the
        request was never written, otherwise only when `idempotent`. Raises `RpcTimeout`,
        `RpcUnavailable` (`RpcAuthError` is never retried) or `RpcRemoteError`.
        """
        attempt = 0
        while True:
            sent = False
            conn: _ClientConn | None = None
            rid = 0
            try:
                with trio.fail_after(timeout):
                    conn = await self._connection()
                    rid, slot = conn.open_slot(method, params)
                    try:
                        if conn.error is not None:
                            raise conn.unavailable()
                        # -inf once the deadline has passed (the send below then raises).
                        left = trio.current_effective_deadline() - trio.current_time()
                        dl = int(min(max(left, 0.001), _MAX_DEADLINE_S) * 1000)
                        sent = True
                        await conn.send(
                            {"t": "req", "id": rid, "m": method, "p": params, "dl": dl}, rid
                        )
                        await conn.wait(slot)
                    finally:
                        conn.close_slot(rid)
                reply = slot.reply
                assert reply is not None
                if reply["t"] == "res":
                    return reply.get("r")
                if reply.get("code") == _DEADLINE_EXCEEDED:  # the server's clock beat ours
                    raise RpcTimeout(f"{method} to {self.host}:{self.port} timed out")
                raise _remote_error(reply)
            except trio.TooSlowError:
                if conn is not None and sent:
                    await conn.send_cancel(rid)
                raise RpcTimeout(f"{method} to {self.host}:{self.port} timed out") from None
            except RpcUnavailable as exc:
                if (
                    isinstance(exc, RpcAuthError)
                    or attempt >= retries
                    or self._closed
                    or (sent and not idempotent)
                ):
                    raise
                attempt += 1
            await trio.sleep(min(1.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.5))

    def subscribe(
        self, stream: str, params: dict[str, Any]
    ) -> AbstractAsyncContextManager[AsyncIterator[Any]]:
        """Subscribes to `stream`; the iterator yields pushed items, ends when the server ends
        the stream, and raises `RpcUnavailable` when the connection drops (re-subscribe and
        expect a full snapshot first). Leaving the context cancels the subscription."""
        return self._subscribe(stream, params)

    @asynccontextmanager
    async def _subscribe(self, stream: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        with trio.fail_after(self.connect_timeout):
            try:
                conn = await self._connection()
            except trio.TooSlowError as exc:
                raise RpcUnavailable(f"cannot connect to {self.host}:{self.port}") from exc
        rid, slot = conn.open_slot(stream, params)
        try:
            await conn.send({"t": "sub", "id": rid, "m": stream, "p": params}, rid)
            yield _Subscription(conn, slot)
        finally:
            conn.close_slot(rid)
            if slot.reply is None:
                await conn.send_cancel(rid)

    async def aclose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(trio.ClosedResourceError("the client was closed"))
        await trio.lowlevel.checkpoint()


class _Subscription:
    """The iterator `RpcClient.subscribe` yields."""

    def __init__(self, conn: _ClientConn, slot: _Slot) -> None:
        self._conn = conn
        self._slot = slot

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Any:
        slot = self._slot
        await self._conn.wait(slot)
        if slot.items:
            return slot.items.popleft()
        if slot.overflow:
            raise RpcUnavailable("the subscriber fell too far behind; re-subscribe")
        assert slot.reply is not None
        if "code" in slot.reply:
            raise _remote_error(slot.reply)
        raise StopAsyncIteration
