"""One connection's SASL state, as Kafka's SaslServerAuthenticator keeps it, without I/O.

A SASL listener's connection starts unauthenticated: it may send ApiVersions, then
SaslHandshake (v1) naming a mechanism, then SaslAuthenticate until the mechanism is done.
Anything else before that closes the connection. Once authenticated, and when
`connections.max.reauth.ms` is set or the credential expires (an OAUTHBEARER token's `exp`),
the session lasts that long, the shorter of the two (KIP-368): the client re-authenticates
on the same connection (SaslHandshake again, then SaslAuthenticate) as the same principal
with the same mechanism, and a request other than those after the session expired closes
the connection.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.plain import PlainServer
from kafka_wire.sasl.scram import ScramServer

__all__ = [
    "ANONYMOUS",
    "API_SASL_AUTHENTICATE",
    "API_SASL_HANDSHAKE",
    "AuthAnswer",
    "Exchange",
    "HandshakeAnswer",
    "PlainExchange",
    "SaslSession",
    "ScramExchange",
]

API_SASL_HANDSHAKE: Final = 17
API_API_VERSIONS: Final = 18
API_SASL_AUTHENTICATE: Final = 36
ANONYMOUS: Final = "User:ANONYMOUS"


class Exchange(Protocol):
    """One mechanism's server side: each client message gives the reply and, once the
    exchange is complete, the authenticated user name; a failure raises
    `SaslAuthenticationFailed`. `credential_lifetime_ms`, once complete, is how long the
    credential stays valid (an OAUTHBEARER token's `exp`), or None if it does not expire."""

    credential_lifetime_ms: int | None

    def step(self, message: bytes) -> tuple[bytes, str | None]: ...


class PlainExchange:
    credential_lifetime_ms: int | None = None

    def __init__(self, server: PlainServer) -> None:
        self._server = server

    def step(self, message: bytes) -> tuple[bytes, str | None]:
        return b"", self._server.authenticate(message)


class ScramExchange:
    credential_lifetime_ms: int | None = None

    def __init__(self, server: ScramServer) -> None:
        self._server = server
        self._first_done = False

    def step(self, message: bytes) -> tuple[bytes, str | None]:
        if not self._first_done:
            self._first_done = True
            return self._server.first(message), None
        reply = self._server.final(message)
        return reply, self._server.user


class _State(enum.Enum):
    HANDSHAKE = "handshake"  # before the first SaslHandshake
    AUTHENTICATE = "authenticate"  # a mechanism chosen, exchange under way
    AUTHENTICATED = "authenticated"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class HandshakeAnswer:
    error_code: ErrorCode
    mechanisms: tuple[str, ...]
    close: bool  # the connection closes once the answer is sent


@dataclass(frozen=True, slots=True)
class AuthAnswer:
    error_code: ErrorCode
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int
    failure: SaslAuthenticationFailed | None  # what the broker logs; never sent as-is
    principal: str | None  # set on the step that completed authentication

    @property
    def close(self) -> bool:
        return self.failure is not None


class SaslSession:
    """`mechanisms` maps each enabled mechanism to a factory of a fresh `Exchange`.
    `reauth_ms` is `connections.max.reauth.ms` (0: a session never expires). Times are
    seconds of any monotonic clock the caller passes."""

    def __init__(self, mechanisms: Mapping[str, Callable[[], Exchange]], reauth_ms: int = 0):
        self._factories = dict(mechanisms)
        self.reauth_ms = max(0, reauth_ms)
        self._state = _State.HANDSHAKE
        self._exchange: Exchange | None = None
        self.mechanism: str | None = None
        self.principal: str | None = None  # None until authenticated
        self._expires_at = float("inf")
        self._reauthenticating = False

    @property
    def authenticated(self) -> bool:
        return self.principal is not None and self._state is not _State.FAILED

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def refusal(self, api_key: int, now: float) -> str | None:
        """Why a request of `api_key` may not be served now (the connection then closes), or
        None. SaslHandshake and SaslAuthenticate are the session's own: see `handshake`."""
        state = self._state
        if state is _State.FAILED:
            return "authentication failed"
        if api_key in (API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE):
            return None
        if self.principal is None:
            if state is _State.HANDSHAKE and api_key == API_API_VERSIONS:
                return None
            return f"api {api_key} before SASL authentication"
        if now >= self._expires_at:
            return f"api {api_key} after the SASL session of {self.principal} expired"
        return None

    def handshake(self, mechanism: str) -> HandshakeAnswer:
        enabled = self.mechanisms
        if self._state is _State.AUTHENTICATE or (
            self._state is _State.AUTHENTICATED and self._expires_at == float("inf")
        ):
            self._state = _State.FAILED
            return HandshakeAnswer(ErrorCode.illegal_sasl_state, enabled, close=True)
        factory = self._factories.get(mechanism)
        reauth = self._state is _State.AUTHENTICATED
        if factory is None or (reauth and mechanism != self.mechanism):
            self._state = _State.FAILED
            return HandshakeAnswer(ErrorCode.unsupported_sasl_mechanism, enabled, close=True)
        self._exchange = factory()
        self.mechanism = mechanism
        self._reauthenticating = reauth
        self._state = _State.AUTHENTICATE
        return HandshakeAnswer(ErrorCode.none, enabled, close=False)

    def authenticate(self, auth_bytes: bytes, now: float) -> AuthAnswer:
        if self._state is not _State.AUTHENTICATE or self._exchange is None:
            failure = SaslAuthenticationFailed(
                self.mechanism or "SASL",
                "SaslAuthenticate without a SaslHandshake before it",
                error_code=ErrorCode.illegal_sasl_state,
                client_message="Unexpected SaslAuthenticate: no mechanism was chosen",
            )
            return self._failed(failure)
        try:
            reply, user = self._exchange.step(auth_bytes)
        except SaslAuthenticationFailed as exc:
            return self._failed(exc)
        if user is None:
            return AuthAnswer(ErrorCode.none, None, reply, 0, None, None)
        principal = f"User:{user}"
        if self._reauthenticating and principal != self.principal:
            changed = SaslAuthenticationFailed(
                self.mechanism or "SASL",
                f"re-authenticated as {principal}, not {self.principal}",
                user=user,
                client_message="Cannot change principals during re-authentication",
            )
            return self._failed(changed)
        lifetime_ms = self._lifetime_ms(self._exchange.credential_lifetime_ms)
        self.principal = principal
        self._state = _State.AUTHENTICATED
        self._exchange = None
        self._reauthenticating = False
        self._expires_at = float("inf") if lifetime_ms is None else now + lifetime_ms / 1000
        return AuthAnswer(ErrorCode.none, None, reply, lifetime_ms or 0, None, principal)

    def _lifetime_ms(self, credential_ms: int | None) -> int | None:
        """The session's lifetime as Kafka's SaslServerAuthenticator computes it: the
        credential's, capped by `connections.max.reauth.ms`; None if neither is set (0 is
        a session already over)."""
        if credential_ms is None:
            return self.reauth_ms or None
        credential_ms = max(0, credential_ms)
        return min(credential_ms, self.reauth_ms) if self.reauth_ms else credential_ms

    def _failed(self, failure: SaslAuthenticationFailed) -> AuthAnswer:
        self._state = _State.FAILED
        self._exchange = None
        return AuthAnswer(failure.error_code, failure.client_message, b"", 0, failure, None)
