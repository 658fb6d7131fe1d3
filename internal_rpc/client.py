"""The trio shell of the RPC client: one authenticated, multiplexed connection to one peer,
reconnected lazily. `protocol.ClientSession` decides which call each frame completes; this
module only moves bytes and wakes the callers that wait."""

from __future__ import annotations

import logging
import random
import select
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, Final

import trio

from internal_rpc.auth import AuthError, answer_hello, check_secret, new_nonce, verify_ok
from internal_rpc.errors import (
    Accounting,
    OnBytes,
    RpcAuthError,
    RpcMeter,
    RpcTimeout,
    RpcUnavailable,
    remote_error,
)
from internal_rpc.frames import DEFAULT_MAX_FRAME_BYTES, encode_frame
from internal_rpc.protocol import DEADLINE_EXCEEDED, ClientSession, Slot
from internal_rpc.tls import RpcTls, RpcTlsSettings, describe, tls_error
from internal_rpc.transport import NET_ERRORS, address, read_message
from kafka_wire.framing import FrameReader

__all__ = ["RpcClient"]

log = logging.getLogger("zonefleet.rpc")

_CLEANUP_TIMEOUT: Final = 1.0


class _ClientConn:
    """An authenticated connection. There is no background reader task: whichever caller is
    waiting reads frames for everyone and hands the role on when its own reply arrives."""

    def __init__(
        self,
        client: RpcClient,
        stream: trio.abc.Stream,
        sock: trio.SocketStream,
        reader: FrameReader,
        peer_node: int,
    ) -> None:
        self.client = client
        self.stream = stream  # `sock`, or TLS over it
        self.sock = sock
        self.reader = reader
        self.peer_node = peer_node
        self.session = ClientSession()
        self.wakes: dict[int, trio.Event] = {}  # the callers parked while another one reads
        self.send_lock = trio.Lock()
        self.reading = False
        self.error: BaseException | None = None

    def open_slot(self, method: str, params: dict[str, Any]) -> tuple[int, Slot]:
        return self.session.open(method, self.client._account.tag(method, params))

    def close_slot(self, rid: int) -> None:
        self.session.close(rid)

    def fail(self, exc: BaseException) -> None:
        if self.error is not None:
            return
        self.error = exc
        self.sock.socket.close()  # wakes a reader or writer blocked on the socket
        for wake in self.wakes.values():
            wake.set()

    def abort(self, exc: BaseException) -> None:
        """Fail the connection with a reset: whatever of ours the peer has not received yet
        is dropped by our kernel, never delivered later (a plain close would keep sending it,
        after a network partition heals too)."""
        if self.error is None:
            with suppress(OSError):
                self.sock.socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
        self.fail(exc)

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
            except NET_ERRORS as exc:
                self.fail(exc)
                raise self.unavailable() from exc
            except BaseException as exc:
                self.fail(exc)  # cancelled mid-write: the stream may hold half a frame
                raise
        slot = self.session.slots.get(rid)
        method, tag = (slot.method, slot.tag) if slot is not None else ("cancel", None)
        self.client._account("out", method, tag, len(data), self.peer_node)

    async def send_cancel(self, rid: int) -> None:
        """Best effort, even from a cancelled scope."""
        if self.error is not None:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLEANUP_TIMEOUT):
            with suppress(RpcUnavailable):
                await self.send(ClientSession.cancel(rid), rid)

    async def wait(self, rid: int, slot: Slot) -> None:
        while not slot.ready():
            if self.error is not None:
                raise self.unavailable()
            if self.reading:
                wake = self.wakes[rid] = trio.Event()
                try:
                    await wake.wait()
                except BaseException:
                    del self.wakes[rid]
                    if not self.reading:  # we may have been handed the reader role
                        self._hand_off()
                    raise
                del self.wakes[rid]
                continue
            self.reading = True
            try:
                while not slot.ready():
                    msg, size = await read_message(self.reader)
                    self._dispatch(msg, size)
            except NET_ERRORS as exc:
                if not isinstance(exc, trio.BrokenResourceError | trio.ClosedResourceError):
                    log.warning("rpc: bad frame from %s: %s", address(self.sock), exc)
                self.fail(exc)
            finally:
                self.reading = False
                self._hand_off()

    def _hand_off(self) -> None:
        """Wakes one caller still waiting, so that someone keeps reading."""
        for rid, wake in self.wakes.items():
            slot = self.session.slots.get(rid)
            if slot is not None and not slot.ready():
                wake.set()
                return

    def _dispatch(self, msg: dict[str, Any], size: int) -> None:
        slot = self.session.receive(msg)
        if slot is None:
            return  # a late reply to a call that gave up
        self.client._account("in", slot.method, slot.tag, size, self.peer_node)
        wake = self.wakes.get(msg["id"])
        if wake is not None:
            wake.set()


def _readable(conn: _ClientConn) -> bool:
    poller = select.poll()
    poller.register(conn.sock.socket.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class RpcClient:
    """One authenticated, multiplexed connection to one peer; reconnects lazily.

    With `tls`, each connection is TLS first (this node's fleet certificate shown, the peer's
    verified against the fleet CA and, by default, `host`), then the HMAC handshake; the
    material is read now (`TlsConfigError`)."""

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
        tls: RpcTlsSettings | None = None,
    ) -> None:
        self.node_id = node_id
        self.secret = check_secret(secret)
        self.tls = None if tls is None else RpcTls(tls, server_side=False)
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self._account = Accounting(on_bytes, meter)
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
            if (
                conn is not None
                and conn.error is None
                and not conn.session.slots
                and _readable(conn)
            ):
                # Idle, yet the peer sent something: EOF or RST after a restart. Reconnect now
                # rather than fail the next (maybe non-idempotent) call after writing it.
                conn.fail(trio.BrokenResourceError("the idle connection was closed by the peer"))
            if conn is None or conn.error is not None:
                conn = self._conn = await self._connect()
            return conn

    async def _connect(self) -> _ClientConn:
        sock: trio.SocketStream | None = None
        stream: trio.abc.Stream | None = None
        authenticating = secured = False
        try:
            with trio.fail_after(self.connect_timeout):
                stream = sock = await trio.open_tcp_stream(self.host, self.port)
                if self.tls is not None:
                    stream = self.tls.wrap(sock, self.host)
                    await stream.do_handshake()
                    secured = True
                reader = FrameReader(stream, self.max_frame_bytes)
                hello, received = await read_message(reader)
                auth, expected, peer_node = answer_hello(
                    self.secret, self.node_id, hello, new_nonce()
                )
                data = encode_frame(auth)
                await stream.send_all(data)
                authenticating = True
                ok, size = await read_message(reader)
                verify_ok(expected, ok)
        except BaseException as exc:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            where = f"{self.host}:{self.port}"
            if isinstance(exc, AuthError):
                raise RpcAuthError(f"RPC peer {where} failed authentication: {exc}") from exc
            failed = tls_error(exc) if self.tls is not None else None
            if failed is not None and not isinstance(failed, ssl.SSLEOFError):
                # The peer's certificate is not the fleet's, or the peer does not speak TLS:
                # retrying will not help.
                raise RpcAuthError(f"TLS with RPC peer {where}: {describe(exc)}") from exc
            if secured and not authenticating and isinstance(exc, trio.BrokenResourceError):
                # TLS 1.3 ends the client's handshake before the server has checked its
                # certificate; a server that refuses it closes instead of sending its hello.
                raise RpcAuthError(
                    f"RPC peer {where} closed the connection after the TLS handshake: it "
                    "refused our certificate (not one of the fleet CA?)"
                ) from exc
            if authenticating and isinstance(exc, trio.BrokenResourceError):
                # The server closes without a word on a bad MAC: most likely a wrong secret.
                raise RpcAuthError(f"RPC peer {where} refused our credentials") from exc
            if isinstance(exc, (*NET_ERRORS, trio.TooSlowError)):
                raise RpcUnavailable(f"cannot connect to RPC peer {where}: {exc!r}") from exc
            raise
        self.peer_node = peer_node
        self._account.handshake(received + size, len(data), peer_node)
        assert sock is not None
        return _ClientConn(self, stream, sock, reader, peer_node)

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
        `RpcUnavailable` (`RpcAuthError` is never retried) or `RpcRemoteError`. A
        non-idempotent call that times out once written resets the connection (the other
        calls on it fail with `RpcUnavailable`), so that it cannot reach the peer afterwards.
        """
        attempt = 0
        ever_sent = False
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
                        sent = True
                        await conn.send(ClientSession.request(rid, method, params, left), rid)
                        await conn.wait(rid, slot)
                    finally:
                        conn.close_slot(rid)
                reply = slot.reply
                assert reply is not None
                if reply["t"] == "res":
                    return reply.get("r")
                if reply.get("code") == DEADLINE_EXCEEDED:  # the server's clock beat ours
                    raise RpcTimeout(f"{method} to {self.host}:{self.port} timed out")
                raise remote_error(reply)
            except trio.TooSlowError:
                if conn is not None and sent:
                    if idempotent:
                        await conn.send_cancel(rid)
                    else:
                        # It may still be on its way (a network partition keeps it in our
                        # send buffer, delivered when it heals): the caller is told it
                        # failed, so it must never land. The peer never sees the rest of the
                        # connection, and the next call opens a new one.
                        conn.abort(RpcTimeout(f"a non-idempotent {method} timed out"))
                raise RpcTimeout(f"{method} to {self.host}:{self.port} timed out") from None
            except RpcUnavailable as exc:
                ever_sent = ever_sent or sent
                if (
                    isinstance(exc, RpcAuthError)
                    or attempt >= retries
                    or self._closed
                    or (sent and not idempotent)
                ):
                    exc.request_sent = ever_sent
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
        try:
            # The deadline's TooSlowError is raised as the block exits: caught out here.
            with trio.fail_after(self.connect_timeout):
                conn = await self._connection()
        except trio.TooSlowError as exc:
            raise RpcUnavailable(f"cannot connect to {self.host}:{self.port}") from exc
        rid, slot = conn.open_slot(stream, params)
        try:
            await conn.send(ClientSession.subscription(rid, stream, params), rid)
            yield _Subscription(conn, rid, slot)
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

    def __init__(self, conn: _ClientConn, rid: int, slot: Slot) -> None:
        self._conn = conn
        self._rid = rid
        self._slot = slot

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Any:
        slot = self._slot
        await self._conn.wait(self._rid, slot)
        if slot.items:
            return slot.items.popleft()
        if slot.overflow:
            raise RpcUnavailable("the subscriber fell too far behind; re-subscribe")
        assert slot.reply is not None
        if "code" in slot.reply:
            raise remote_error(slot.reply)
        raise StopAsyncIteration
