"""The trio shell of the RPC server: listens, authenticates (TLS first when it is on, then
the HMAC handshake), and runs each call or subscription that `protocol.ServerSession` starts
as its own task, so slow calls never block others."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import Any, Final

import trio

from internal_rpc.auth import AuthError, check_secret, hello_message, new_nonce, verify_auth
from internal_rpc.errors import Accounting, Handler, OnBytes, RpcMeter, RpcPeer, StreamHandler
from internal_rpc.frames import DEFAULT_MAX_FRAME_BYTES, encode_frame
from internal_rpc.messages import MalformedMessage
from internal_rpc.protocol import (
    DEADLINE_EXCEEDED,
    CallStarted,
    CancelRequested,
    ProtocolViolation,
    Refused,
    ServerSession,
    SubscriptionStarted,
    end_message,
    error_message,
    push_message,
    result_message,
)
from internal_rpc.tls import RpcTls, RpcTlsSettings, describe, looks_like_tls
from internal_rpc.transport import NET_ERRORS, address, read_message, text
from kafka_wire.framing import FrameReader
from telemetry.log_limit import BadInputLog

__all__ = ["HANDSHAKE_TIMEOUT", "RpcServer"]

log = logging.getLogger("zonefleet.rpc")

HANDSHAKE_TIMEOUT: Final = 2.0


class _Task:
    __slots__ = ("by_client", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.by_client = False


class _ServerConn:
    def __init__(
        self, server: RpcServer, stream: trio.abc.Stream, reader: FrameReader, peer: RpcPeer
    ) -> None:
        self.server = server
        self.stream = stream
        self.reader = reader
        self.peer = peer
        self.session = ServerSession(server.handlers, server.streams)
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
        except NET_ERRORS:
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
                    msg, size = await read_message(self.reader)
                    self.dispatch(msg, size)
            except trio.BrokenResourceError:
                pass  # EOF: the client went away; its calls are moot
            except (*NET_ERRORS, ProtocolViolation) as exc:
                log.warning("rpc: closing connection from %s: %s", self.peer.address, exc)
            nursery.cancel_scope.cancel()

    def dispatch(self, msg: dict[str, Any], size: int) -> None:
        event = self.session.receive(msg)
        if event is None:
            return
        if isinstance(event, CancelRequested):
            task = self.tasks[event.rid]
            task.by_client = True
            task.scope.cancel()
            return
        tag = self.server._account.tag(event.method, event.params)
        self.server._account("in", event.method, tag, size, self.peer.node_id)
        if isinstance(event, Refused):
            self.nursery.start_soon(self.send, event.message, event.method, tag)
        elif isinstance(event, CallStarted):
            deadline = trio.current_time() + event.timeout
            task = self.tasks[event.rid] = _Task(trio.CancelScope(deadline=deadline))
            handler = self.server.handlers[event.method]
            self.nursery.start_soon(self._call, task, event, tag, handler)
        elif isinstance(event, SubscriptionStarted):
            task = self.tasks[event.rid] = _Task(trio.CancelScope())
            stream = self.server.streams[event.method]
            self.nursery.start_soon(self._subscription, task, event, tag, stream)

    def _finish(self, rid: int) -> None:
        del self.tasks[rid]
        self.session.finish(rid)

    async def _call(self, task: _Task, call: CallStarted, tag: Any, handler: Handler) -> None:
        rid, method = call.rid, call.method
        try:
            with task.scope:
                result = await handler(self.peer, call.params)
            if task.scope.cancelled_caught:
                if not task.by_client:
                    await self.send(error_message(rid, DEADLINE_EXCEEDED, method), method, tag)
                return
            await self.send(result_message(rid, result), method, tag)
        except self.server.refusals as exc:
            self.server.bad_input.warn(
                self.peer.address, "rpc", "rpc: %s from %s refused: %s", method,
                self.peer.address, exc,
            )  # fmt: skip
            await self.send(error_message(rid, type(exc).__name__, text(exc)), method, tag)
        except Exception as exc:
            log.warning("rpc: %s from %s raised", method, self.peer.address, exc_info=True)
            await self.send(error_message(rid, type(exc).__name__, text(exc)), method, tag)
        finally:
            self._finish(rid)

    async def _subscription(
        self, task: _Task, sub: SubscriptionStarted, tag: Any, handler: StreamHandler
    ) -> None:
        rid, stream = sub.rid, sub.method

        async def push(data: Any) -> None:
            if not await self.send(push_message(rid, data), stream, tag):
                raise trio.BrokenResourceError("the subscriber's connection is gone")

        end = end_message(rid)
        try:
            with task.scope:
                await handler(self.peer, sub.params, push)
            if task.scope.cancelled_caught:
                return
        except Exception as exc:
            if self.dead:
                return
            log.warning("rpc: stream %s for %s raised", stream, self.peer.address, exc_info=True)
            end = end_message(rid, type(exc).__name__, text(exc))
        finally:
            self._finish(rid)
        await self.send(end, stream, tag)


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
        refusals: tuple[type[Exception], ...] = (),
        bad_input: BadInputLog | None = None,
        tls: RpcTlsSettings | None = None,
    ) -> None:
        """`refusals`: the errors a handler raises for what its caller sent (a malformed
        message, say), on top of `MalformedMessage`: each is answered and logged as one
        line, rate-limited per peer (`bad_input`), never with a traceback.

        `tls`: every client must first complete a TLS handshake with a certificate of the
        fleet CA (`internal_rpc.tls`); its material is read now (`TlsConfigError`)."""
        self.node_id = node_id
        self.refusals: tuple[type[Exception], ...] = (MalformedMessage, *refusals)
        self.bad_input = bad_input or BadInputLog(log)
        self.secret = check_secret(secret)
        self.handlers = dict(handlers)
        self.streams = dict(streams)
        self.max_frame_bytes = max_frame_bytes
        self.handshake_timeout = handshake_timeout
        self.port: int | None = None
        self._account = Accounting(on_bytes, meter)
        self.tls = None if tls is None else RpcTls(tls, server_side=True)

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listens until cancelled; `task_status.started(bound_port)`."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self._handle, port, host=host))
            self.port = listeners[0].socket.getsockname()[1]
            if self.tls is not None:
                log.info(
                    "rpc: %s:%d takes mutual TLS only (fleet CA %s), then the HMAC handshake",
                    host, self.port, self.tls.settings.ca_file,
                )  # fmt: skip
            task_status.started(self.port)

    async def _handle(self, stream: trio.SocketStream) -> None:
        where = address(stream)
        served: trio.abc.Stream = stream
        try:
            if self.tls is not None:
                secured = await self._tls_handshake(stream, where)
                if secured is None:
                    return
                served = secured
            peer = await self._handshake(served, where)
            if peer is not None:
                await _ServerConn(self, served, peer[1], peer[0]).run()
        except Exception:  # never let one connection take the listener down
            log.exception("rpc: connection from %s failed", where)
        finally:
            await trio.aclose_forcefully(served)

    async def _tls_handshake(
        self, stream: trio.SocketStream, where: str
    ) -> trio.SSLStream[trio.SocketStream] | None:
        """The TLS handshake; a client without a certificate of the fleet CA (or without TLS)
        is one warning line, rate-limited per host, and the connection closes."""
        assert self.tls is not None
        tls = self.tls.wrap(stream)
        try:
            with trio.fail_after(self.handshake_timeout):
                await tls.do_handshake()
        except (*NET_ERRORS, trio.TooSlowError) as exc:
            if isinstance(exc, trio.TooSlowError):
                reason = f"no TLS handshake within {self.handshake_timeout:g} s"
            else:
                reason = describe(exc)
            self.bad_input.warn(
                where.rsplit(":", 1)[0], "rpc_tls",
                "rpc: refused connection from %s: %s (internal RPC needs TLS with a certificate "
                "of the fleet CA)", where, reason,
            )  # fmt: skip
            return None
        return tls

    async def _handshake(
        self, stream: trio.abc.Stream, where: str
    ) -> tuple[RpcPeer, FrameReader] | None:
        reader = FrameReader(stream, self.max_frame_bytes)
        nonce = new_nonce()
        try:
            with trio.fail_after(self.handshake_timeout):
                hello = encode_frame(hello_message(self.node_id, nonce))
                await stream.send_all(hello)
                auth, received = await read_message(reader)
                client_node, ok = verify_auth(self.secret, self.node_id, nonce, auth)
                reply = encode_frame(ok)
                await stream.send_all(reply)
        except (*NET_ERRORS, AuthError, trio.TooSlowError) as exc:
            reason = "timed out" if isinstance(exc, trio.TooSlowError) else str(exc)
            if self.tls is None and looks_like_tls(exc):
                reason += " (a TLS client on a plaintext RPC port: is this node's rpc_tls off?)"
            log.warning("rpc: refused connection from %s: %s", where, reason or type(exc))
            return None
        self._account.handshake(received, len(hello) + len(reply), client_node)
        return RpcPeer(client_node, where), reader
