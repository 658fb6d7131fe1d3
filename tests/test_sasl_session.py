"""One connection's SASL state (kafka_wire/sasl/session.py) and the SASL gate in front of a
request loop over a real loopback socket (kafka_wire/sasl/gate.py)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import trio

from kafka_wire.codec import (
    RequestHeader,
    build_request,
    build_response,
    decode_response,
    encode_request,
    encode_response,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.failures import FailedAuthDelay
from kafka_wire.sasl.gate import SaslSettings, sasl_listener
from kafka_wire.sasl.plain import PlainServer, make_credential
from kafka_wire.sasl.session import PlainExchange, SaslSession, ScramExchange
from kafka_wire.server_loop import Buffer, ConnectionInfo, Finish, serve_connection
from telemetry import BadInputLog
from tests.test_sasl_scram import Client, credential, server

CAROL = make_credential("carol-pw", iterations=4096)


def plain_session(reauth_ms: int = 0) -> SaslSession:
    users = {"carol": CAROL}
    return SaslSession({"PLAIN": partial(PlainExchange, PlainServer(users.get))}, reauth_ms)


def scram_session(reauth_ms: int = 0) -> SaslSession:
    return SaslSession({"SCRAM-SHA-256": lambda: ScramExchange(server("SCRAM-SHA-256"))}, reauth_ms)


def scram_login(session: SaslSession, now: float, password: str = "alice-secret") -> Any:
    assert session.handshake("SCRAM-SHA-256").error_code == ErrorCode.none
    client = Client("SCRAM-SHA-256", "alice", password)
    first = session.authenticate(client.first(), now)
    assert first.error_code == ErrorCode.none and first.principal is None
    return session.authenticate(client.final(first.auth_bytes), now)


def test_only_api_versions_and_the_handshake_before_authentication() -> None:
    session = plain_session()
    assert session.refusal(18, 0.0) is None
    assert session.refusal(17, 0.0) is None
    assert "before SASL authentication" in (session.refusal(3, 0.0) or "")
    assert session.handshake("PLAIN").error_code == ErrorCode.none
    # After the handshake, not even ApiVersions until the exchange is over.
    assert session.refusal(18, 0.0) is not None
    answer = session.authenticate(b"\0carol\0carol-pw", 0.0)
    assert answer.error_code == ErrorCode.none and answer.principal == "User:carol"
    assert session.authenticated and session.refusal(3, 0.0) is None


def test_scram_exchange_authenticates_and_a_wrong_password_fails_for_good() -> None:
    session = scram_session()
    final = scram_login(session, 0.0)
    assert final.principal == "User:alice" and final.auth_bytes.startswith(b"v=")
    bad = scram_session()
    failed = scram_login(bad, 0.0, password="nope")
    assert failed.error_code == ErrorCode.sasl_authentication_failed
    assert failed.close and "nope" not in str(failed.failure)
    assert bad.refusal(18, 0.0) == "authentication failed"


def test_unknown_mechanism_and_handshake_twice_without_reauth() -> None:
    session = plain_session()
    answer = session.handshake("GSSAPI")
    assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
    assert answer.mechanisms == ("PLAIN",) and answer.close
    session = plain_session()
    session.handshake("PLAIN")
    assert session.handshake("PLAIN").error_code == ErrorCode.illegal_sasl_state
    session = plain_session()
    # SaslAuthenticate without a handshake: ILLEGAL_SASL_STATE.
    assert session.authenticate(b"x", 0.0).error_code == ErrorCode.illegal_sasl_state


def test_reauthentication_renews_the_session_as_the_same_principal() -> None:
    session = scram_session(reauth_ms=1000)
    assert scram_login(session, 0.0).session_lifetime_ms == 1000
    assert session.refusal(3, 0.5) is None
    assert "expired" in (session.refusal(3, 1.0) or "")
    # KIP-368: SaslHandshake + SaslAuthenticate again on the same connection.
    assert scram_login(session, 1.2).principal == "User:alice"
    assert session.refusal(3, 2.1) is None and session.refusal(3, 2.2) is not None


def test_reauthentication_may_not_change_the_principal() -> None:
    users = {"carol": CAROL, "dave": make_credential("dave-pw", iterations=4096)}
    session = SaslSession({"PLAIN": partial(PlainExchange, PlainServer(users.get))}, 1000)
    session.handshake("PLAIN")
    assert session.authenticate(b"\0carol\0carol-pw", 0.0).principal == "User:carol"
    session.handshake("PLAIN")
    changed = session.authenticate(b"\0dave\0dave-pw", 0.5)
    assert changed.error_code == ErrorCode.sasl_authentication_failed and changed.close
    assert not session.authenticated


def test_failed_authentication_delay_doubles_per_host_and_resets() -> None:
    delays = FailedAuthDelay(base_ms=100, max_ms=1000, window_s=60)
    assert [delays.failed("h", float(t)) for t in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert delays.failed("other", 0.0) == 0.1
    delays.succeeded("h")
    assert delays.failed("h", 10.0) == 0.1
    assert delays.failed("h", 100.0) == 0.1  # outside the window: counted afresh


# -- the gate over a real socket ---------------------------------------------------------


class Echo:
    """A processor that answers Metadata with no brokers and records who asked."""

    def __init__(self) -> None:
        self.principals: list[str] = []

    def begin(self, header: RequestHeader, frame: bytearray, conn: ConnectionInfo) -> Finish:
        self.principals.append(conn.principal)
        data = {"brokers": [], "cluster_id": None, "controller_id": -1, "topics": []}

        async def answer() -> Sequence[Buffer]:
            return [encode_response(header, build_response(3, header.api_version, data))]

        return answer


async def _call(stream: trio.SocketStream, key: int, version: int, data: dict[str, Any]) -> Any:
    frame = encode_request(key, version, 1, "t", build_request(key, version, data))
    await stream.send_all(struct.pack(">i", len(frame)) + frame)
    head = await _read(stream, 4)
    body = await _read(stream, struct.unpack(">i", head)[0])
    return decode_response(key, version, body)[1]


async def _read(stream: trio.SocketStream, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = await stream.receive_some(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


@pytest.mark.trio
async def test_gate_authenticates_then_passes_requests_with_the_principal() -> None:
    scram = {"alice": credential("SCRAM-SHA-512", "alice-secret")}
    listener = sasl_listener(
        SaslSettings(("SCRAM-SHA-512", "PLAIN"), failed_delay_ms=0),
        lambda mech, user: scram.get(user),
        {"carol": CAROL}.get,
        b"fake",
        BadInputLog(__import__("logging").getLogger("test")),
    )
    failures: list[str] = []
    listener.on_failure = lambda conn, failure: failures.append(str(failure))
    echo = Echo()

    async def handle(stream: trio.SocketStream) -> None:
        await serve_connection(stream, echo, max_frame_bytes=1 << 20, gate=listener.gate)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]

        stream = await trio.open_tcp_stream("127.0.0.1", port)
        resp = await _call(stream, 17, 1, {"mechanism": "SCRAM-SHA-512"})
        assert resp.error_code == ErrorCode.none
        client = Client("SCRAM-SHA-512", "alice", "alice-secret")
        first = await _call(stream, 36, 2, {"auth_bytes": client.first()})
        final = await _call(stream, 36, 2, {"auth_bytes": client.final(first.auth_bytes)})
        assert final.error_code == ErrorCode.none
        await _call(stream, 3, 12, {"topics": [], "allow_auto_topic_creation": False})
        assert echo.principals == ["User:alice"]
        await stream.aclose()

        # PLAIN with a wrong password: SASL_AUTHENTICATION_FAILED, then the gate closes.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await _call(stream, 17, 1, {"mechanism": "PLAIN"})
        resp = await _call(stream, 36, 2, {"auth_bytes": b"\0carol\0wrong"})
        assert resp.error_code == ErrorCode.sasl_authentication_failed
        with pytest.raises(EOFError):
            await _read(stream, 1)
        assert failures and "wrong password" in failures[0] and "wrong\0" not in failures[0]
        nursery.cancel_scope.cancel()
