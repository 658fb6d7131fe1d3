"""A SASL listener's gate: answers SaslHandshake and SaslAuthenticate itself and lets no other
request through to the broker before the connection is authenticated (`SaslSession`).

A failed authentication is answered after a delay (`FailedAuthDelay`), logged once (the
principal, the mechanism and the peer address, never the client's bytes), reported to
`on_failure`, and then the connection closes, as Kafka's does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from kafka_wire.codec import (
    MalformedRequest,
    RequestHeader,
    build_response,
    decode_request,
    encode_response,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.failures import FailedAuthDelay
from kafka_wire.sasl.oauthbearer import (
    OAUTHBEARER,
    KeySource,
    OAuthBearerExchange,
    OAuthBearerSettings,
    TokenValidator,
)
from kafka_wire.sasl.plain import PLAIN, PlainCredential, PlainServer
from kafka_wire.sasl.scram import MECHANISMS, ScramCredential, ScramServer
from kafka_wire.sasl.session import (
    API_SASL_AUTHENTICATE,
    API_SASL_HANDSHAKE,
    Exchange,
    PlainExchange,
    SaslSession,
    ScramExchange,
)
from kafka_wire.server_loop import (
    Buffer,
    CloseConnection,
    ConnectionInfo,
    Finish,
    LastResponse,
)
from telemetry.log_limit import BadInputLog

__all__ = ["SaslGate", "SaslListener", "SaslSettings", "sasl_listener"]

SCRAM_MECHANISMS = frozenset(name for name, _ in MECHANISMS.values())

log = logging.getLogger("zonefleet.sasl")


@dataclass
class SaslListener:
    """What every connection of one SASL listener shares. `mechanisms` maps each enabled
    mechanism to a factory of a fresh exchange; `on_success(conn, mechanism)` and
    `on_failure(conn, failure)` see each outcome (metrics, the audit log)."""

    mechanisms: Mapping[str, Callable[[], Exchange]]
    reauth_ms: int = 0
    delays: FailedAuthDelay = field(default_factory=FailedAuthDelay)
    bad_input: BadInputLog = field(default_factory=lambda: BadInputLog(log))
    on_success: Callable[[ConnectionInfo, str], None] | None = None
    on_failure: Callable[[ConnectionInfo, SaslAuthenticationFailed], None] | None = None
    # PLAIN hashes the password (thousands of iterations): off the event loop. OAUTHBEARER
    # may wait there for a JWKS fetch when a token names a key not seen yet.
    blocking_mechanisms: frozenset[str] = frozenset({"PLAIN", "OAUTHBEARER"})
    limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(4))

    def gate(self, conn: ConnectionInfo) -> SaslGate:
        return SaslGate(self, conn)


class SaslGate:
    def __init__(self, listener: SaslListener, conn: ConnectionInfo) -> None:
        self.listener = listener
        self.conn = conn
        self.session = SaslSession(listener.mechanisms, listener.reauth_ms)

    def begin(self, header: RequestHeader, frame: bytearray) -> Finish | None:
        key = header.api_key
        refusal = self.session.refusal(key, trio.current_time())
        if refusal is not None:
            raise CloseConnection(f"{self._peer()}: {refusal}")
        if key not in (API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE):
            return None
        try:
            request = decode_request(header, frame)
        except MalformedRequest as exc:
            raise CloseConnection(f"{self._peer()}: malformed api {key}: {exc}") from None
        if key == API_SASL_HANDSHAKE:
            return self._handshake(header, request)
        return self._authenticate(header, bytes(request.auth_bytes))

    def _peer(self) -> str:
        return f"{self.conn.peer_host}:{self.conn.peer_port}"

    def _handshake(self, header: RequestHeader, request: Any) -> Finish:
        answer = self.session.handshake(str(request.mechanism))
        data = {"error_code": answer.error_code, "mechanisms": list(answer.mechanisms)}
        parts = [encode_response(header, build_response(17, header.api_version, data))]
        if answer.close:
            self.listener.bad_input.warn(
                self.conn.peer_host,
                "sasl",
                "closing %s: SaslHandshake for mechanism %r: %s (enabled: %s)",
                self._peer(),
                str(request.mechanism)[:64],
                answer.error_code.name,
                ", ".join(answer.mechanisms),
            )
            final: Sequence[Buffer] = LastResponse(parts)

            async def refuse() -> Sequence[Buffer]:
                return final

            return refuse

        async def answered() -> Sequence[Buffer]:
            return parts

        return answered

    def _authenticate(self, header: RequestHeader, auth_bytes: bytes) -> Finish:
        session = self.session
        now = trio.current_time()
        listener = self.listener
        # The exchange's state moves here, in arrival order; only the hashing of a PLAIN
        # password may run in a thread, so it is done before the answer is awaited.
        if session.mechanism in listener.blocking_mechanisms:

            async def step() -> Sequence[Buffer]:
                answer = await trio.to_thread.run_sync(
                    session.authenticate, auth_bytes, now, limiter=listener.limiter
                )
                return await self._answer(header, answer)

            return step
        answer = session.authenticate(auth_bytes, now)

        async def answered() -> Sequence[Buffer]:
            return await self._answer(header, answer)

        return answered

    async def _answer(self, header: RequestHeader, answer: Any) -> Sequence[Buffer]:
        data = {
            "error_code": answer.error_code,
            "error_message": answer.error_message,
            "auth_bytes": answer.auth_bytes,
            "session_lifetime": answer.session_lifetime_ms,
        }
        parts = [encode_response(header, build_response(36, header.api_version, data))]
        listener = self.listener
        conn = self.conn
        if answer.failure is None:
            if answer.principal is not None:
                conn.identity.principal = answer.principal
                conn.identity.mechanism = self.session.mechanism
                listener.delays.succeeded(conn.peer_host)
                if listener.on_success is not None:
                    listener.on_success(conn, self.session.mechanism or "")
            return parts
        failure: SaslAuthenticationFailed = answer.failure
        listener.bad_input.warn(
            conn.peer_host,
            "sasl",
            "authentication failed from %s (listener %s): %s",
            self._peer(),
            conn.listener,
            failure,
        )
        if listener.on_failure is not None:
            listener.on_failure(conn, failure)
        delay = listener.delays.failed(conn.peer_host, trio.current_time())
        if delay and failure.error_code != ErrorCode.illegal_sasl_state:
            await trio.sleep(delay)
        return LastResponse(parts)


@dataclass(frozen=True)
class SaslSettings:
    """A node's SASL settings (Kafka's `sasl.enabled.mechanisms` and
    `connections.max.reauth.ms`): SCRAM against the fleet's stored credentials, PLAIN
    against a credentials file of hashes (`kafka_wire.sasl.plain`), OAUTHBEARER against a
    JWKS (`kafka_wire.sasl.oauthbearer`)."""

    mechanisms: tuple[str, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256")
    plain_credentials_file: str | None = None
    reauth_ms: int = 0
    failed_delay_ms: int = 100
    oauthbearer: OAuthBearerSettings | None = None


def sasl_listener(
    settings: SaslSettings,
    scram: Callable[[str, str], ScramCredential | None],
    plain: Callable[[str], PlainCredential | None],
    fake_secret: bytes,
    bad_input: BadInputLog,
    on_failure: Callable[[ConnectionInfo, SaslAuthenticationFailed], None] | None = None,
    oauth_keys: KeySource | None = None,
) -> SaslListener:
    """The shared state of a node's SASL listeners. `scram(mechanism, user)` and
    `plain(user)` look credentials up as they are now (they may change under a listener);
    `oauth_keys` are OAUTHBEARER's signature keys (`kafka_wire.sasl.jwks.JwksKeys`)."""
    factories: dict[str, Callable[[], Exchange]] = {}
    plain_server = PlainServer(plain)
    for mechanism in settings.mechanisms:
        if mechanism == PLAIN:
            factories[mechanism] = partial(PlainExchange, plain_server)
        elif mechanism in SCRAM_MECHANISMS:
            lookup = partial(scram, mechanism)
            factories[mechanism] = partial(_scram_exchange, mechanism, lookup, fake_secret)
        elif mechanism == OAUTHBEARER:
            if settings.oauthbearer is None or oauth_keys is None:
                raise ValueError("OAUTHBEARER needs its settings and a key source")
            validator = TokenValidator(settings.oauthbearer, oauth_keys)
            factories[mechanism] = partial(OAuthBearerExchange, validator)
        else:
            raise ValueError(f"unknown SASL mechanism {mechanism!r}")
    return SaslListener(
        factories,
        settings.reauth_ms,
        FailedAuthDelay(settings.failed_delay_ms),
        bad_input,
        on_failure=on_failure,
    )


def _scram_exchange(
    mechanism: str, lookup: Callable[[str], ScramCredential | None], fake_secret: bytes
) -> Exchange:
    return ScramExchange(ScramServer(mechanism, lookup, fake_secret=fake_secret))
