"""The admin HTTP endpoint: /healthz, /metrics and /status, served with h11 on trio.

Each connection runs in its own task with read and write deadlines, so a slow or idle client
holds only its own connection. Handler errors are logged and answered, never propagated.

With a token (`[admin] token`), /healthz and /metrics stay open (load balancers and
Prometheus scrape them) and every other request, /status and whatever may change state
later, needs `Authorization: Bearer <token>`: without it, or with another token, the answer
is 401 with `WWW-Authenticate: Bearer` (RFC 6750), compared in constant time, and the refusal
goes to `on_unauthorized(peer host, peer port, what)` (the audit log). No token: all open.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

import h11
import trio

from telemetry.metrics import MetricsRegistry

__all__ = ["METRICS_CONTENT_TYPE", "OPEN_PATHS", "bearer_headers", "serve_admin_http"]

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_HEAD = 16 * 1024
MAX_REQUEST_BODY = 64 * 1024
READ_TIMEOUT_S = 10.0  # for each request, from its first byte (or keep-alive idle) to its end
WRITE_TIMEOUT_S = 10.0
RECV_SIZE = 16 * 1024
LINGER_S = 1.0
LINGER_MAX_BYTES = 1024 * 1024
SERVER_HEADER = b"zonefleet-admin"
OPEN_PATHS = frozenset({b"/healthz", b"/metrics"})  # never behind the token
REALM = b'Bearer realm="zonefleet-admin"'

# Sees each request refused for its token: (peer host, peer port, "GET /status: why").
OnUnauthorized = Callable[[str, int, str], None]


def bearer_headers(token: str | None) -> dict[str, str]:
    """The headers a client of the admin endpoint sends: the token, when there is one."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


class _ClientError(Exception):
    """The client misbehaved (timeout, oversize body); close the connection."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def _always_healthy() -> tuple[bool, str]:
    return True, "ok"


async def serve_admin_http(
    host: str,
    port: int,
    registry: MetricsRegistry,
    status: Callable[[], dict[str, Any]],
    health: Callable[[], tuple[bool, str]] = _always_healthy,
    *,
    token: str | None = None,
    on_unauthorized: OnUnauthorized | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin endpoint on host:port until cancelled; reports the bound port. With
    `token`, every path but OPEN_PATHS needs it as a bearer token."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    if port == 0 and len(listeners) > 1:
        # Each address family would get its own random port; keep one so the port is unique.
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    bound_port = listeners[0].socket.getsockname()[1]
    app = _AdminApp(registry, status, health, token, on_unauthorized)
    log.info("admin http listening", extra={"host": host, "port": bound_port})
    task_status.started(bound_port)
    await trio.serve_listeners(app.handle_connection, listeners)


class _AdminApp:
    def __init__(
        self,
        registry: MetricsRegistry,
        status: Callable[[], dict[str, Any]],
        health: Callable[[], tuple[bool, str]],
        token: str | None = None,
        on_unauthorized: OnUnauthorized | None = None,
    ) -> None:
        self.registry = registry
        self.status = status
        self.health = health
        self.token = None if token is None else token.encode()
        self.on_unauthorized = on_unauthorized

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        try:
            peer = stream.socket.getpeername()
        except OSError:
            peer = ("?", 0)
        try:
            async with stream:
                await self._serve(conn, stream, (str(peer[0]), int(peer[1])))
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass  # the client went away or stopped reading
        except Exception:
            log.exception("admin http connection failed")

    async def _serve(
        self, conn: h11.Connection, stream: trio.SocketStream, peer: tuple[str, int]
    ) -> None:
        while True:
            try:
                event = await _next_event(conn, stream)
                if isinstance(event, h11.ConnectionClosed):
                    return
                assert isinstance(event, h11.Request)
                await _drain_body(conn, stream)
            except h11.RemoteProtocolError as exc:
                await _send_error(conn, stream, exc.error_status_hint, str(exc))
                return
            except _ClientError as exc:
                await _send_error(conn, stream, exc.status, str(exc))
                return
            refusal = self._refusal(event, peer)
            code, ctype, body, extra = refusal if refusal is not None else self._route(event)
            await _send_response(conn, stream, code, ctype, body, extra)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # MUST_CLOSE (Connection: close, HTTP/1.0) or an unfinished request
            conn.start_next_cycle()

    def _refusal(
        self, req: h11.Request, peer: tuple[str, int]
    ) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]] | None:
        """The 401 of a request that needs the token and lacks it (None: go on)."""
        if self.token is None:
            return None
        path = req.target.split(b"?", 1)[0]
        if path in OPEN_PATHS:
            return None
        given = [v for k, v in req.headers if k == b"authorization"]
        scheme, _, credentials = given[0].partition(b" ") if len(given) == 1 else (b"", b"", b"")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token):
            return None
        why = "no bearer token" if not given else "wrong or malformed bearer token"
        challenge = REALM if not given else REALM + b', error="invalid_token"'
        what = f"{req.method.decode('latin-1')} {path.decode('latin-1')[:200]}: {why}"
        log.info("admin http unauthorized", extra={"peer": peer[0], "request": what})
        if self.on_unauthorized is not None:
            self.on_unauthorized(peer[0], peer[1], what)
        body = b"unauthorized: this path needs Authorization: Bearer <[admin] token>\n"
        return 401, "text/plain; charset=utf-8", body, [(b"www-authenticate", challenge)]

    def _route(self, req: h11.Request) -> tuple[int, str, bytes, list[tuple[bytes, bytes]]]:
        path = req.target.split(b"?", 1)[0]
        if path not in (b"/healthz", b"/metrics", b"/status"):
            return 404, "text/plain; charset=utf-8", b"not found\n", []
        if req.method != b"GET":
            return 405, "text/plain; charset=utf-8", b"method not allowed\n", [(b"allow", b"GET")]
        try:
            if path == b"/healthz":
                ok, reason = self.health()
                if ok:
                    return 200, "text/plain; charset=utf-8", b"ok", []
                return 503, "text/plain; charset=utf-8", reason.encode(), []
            if path == b"/metrics":
                return 200, METRICS_CONTENT_TYPE, self.registry.render().encode(), []
            body = json.dumps(self.status(), default=str, sort_keys=True).encode()
            return 200, "application/json", body, []
        except Exception as exc:
            log.exception("admin http handler failed", extra={"path": path.decode("latin-1")})
            return 500, "text/plain; charset=utf-8", f"internal error: {exc}\n".encode(), []


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> Any:
    with trio.move_on_after(READ_TIMEOUT_S) as scope:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await stream.receive_some(RECV_SIZE)
            conn.receive_data(data)  # b"" signals EOF to h11
    assert scope.cancelled_caught
    if conn.their_state is h11.IDLE and not conn.trailing_data[0]:
        # An idle keep-alive connection: close quietly.
        return h11.ConnectionClosed()
    raise _ClientError(408, "request timeout")


async def _drain_body(conn: h11.Connection, stream: trio.SocketStream) -> None:
    size = 0
    while True:
        event = await _next_event(conn, stream)
        if isinstance(event, h11.EndOfMessage):
            return
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_REQUEST_BODY:
                raise _ClientError(413, "request body too large")
        elif isinstance(event, h11.ConnectionClosed):
            raise trio.BrokenResourceError("client closed mid-request")


async def _send(conn: h11.Connection, stream: trio.SocketStream, event: Any) -> None:
    data = conn.send(event)
    if data:
        with trio.fail_after(WRITE_TIMEOUT_S):
            await stream.send_all(data)


async def _send_response(
    conn: h11.Connection,
    stream: trio.SocketStream,
    code: int,
    content_type: str,
    body: bytes,
    extra_headers: list[tuple[bytes, bytes]],
    *,
    close: bool = False,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"server", SERVER_HEADER),
        *extra_headers,
    ]
    if close:
        headers.append((b"connection", b"close"))
    await _send(conn, stream, h11.Response(status_code=code, headers=headers))
    await _send(conn, stream, h11.Data(data=body))
    await _send(conn, stream, h11.EndOfMessage())


async def _send_error(
    conn: h11.Connection, stream: trio.SocketStream, code: int, reason: str
) -> None:
    """Answer a bad request when the protocol state still allows a response, then close."""
    log.info("admin http bad request", extra={"status": code, "reason": reason})
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    try:
        body = f"{reason}\n".encode()
        await _send_response(conn, stream, code, "text/plain; charset=utf-8", body, [], close=True)
        await _lingering_close(stream)
    except (h11.LocalProtocolError, trio.TooSlowError):
        pass


async def _lingering_close(stream: trio.SocketStream) -> None:
    """Half-close, then discard what the client still sends for a moment.

    Closing with unread input makes the kernel send RST, which can destroy the error response
    before the client reads it.
    """
    await stream.send_eof()
    discarded = 0
    with trio.move_on_after(LINGER_S):
        while discarded < LINGER_MAX_BYTES:
            data = await stream.receive_some(RECV_SIZE)
            if not data:
                break
            discarded += len(data)
