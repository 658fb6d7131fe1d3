"""Named Kafka listeners and their security protocols (Kafka's `listeners`,
`advertised.listeners` and `listener.security.protocol.map`), and the edge that accepts a
connection on one: TLS first for SSL and SASL_SSL, then a SASL gate for SASL_PLAINTEXT and
SASL_SSL, then the node's own connection handler.

A node's default listener (its `port`) stays PLAINTEXT; named listeners come on top of it.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

import trio

from kafka_wire.server_loop import ConnectionGate, ConnectionInfo, connection_info
from telemetry.log_limit import BadInputLog

__all__ = [
    "PROTOCOLS",
    "ListenerConfig",
    "ListenerError",
    "SecurityProtocol",
    "accept_secured",
    "parse_listener",
]

log = logging.getLogger("zonefleet.listeners")

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
PROTOCOLS: Final[tuple[SecurityProtocol, ...]] = (
    "PLAINTEXT",
    "SSL",
    "SASL_PLAINTEXT",
    "SASL_SSL",
)
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0


class ListenerError(ValueError):
    """A listener setting that cannot work; the message names the listener."""


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    name: str
    protocol: SecurityProtocol
    host: str
    port: int  # 0: any free port (tests); the bound one is advertised
    advertised_host: str | None = None
    advertised_port: int | None = None
    # Kafka's listener.name.<name>.ssl.client.auth; None: the node's ssl_client_auth.
    client_auth: Literal["required", "requested", "none"] | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def advertised(self, bound_port: int | None = None) -> tuple[str, int]:
        port = self.advertised_port or bound_port or self.port
        return (self.advertised_host or self.host, port)


def parse_listener(raw: dict[str, object], where: str, default_host: str) -> ListenerConfig:
    """One `[[...listeners]]` table: name, protocol, port, and optional host,
    advertised_host and advertised_port."""
    name = str(raw.get("name", "")).strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ListenerError(f"{where}: a listener needs a name of letters, digits, _ and -")
    protocol = str(raw.get("protocol", "")).upper()
    if protocol not in PROTOCOLS:
        raise ListenerError(
            f"{where}: listener {name} has protocol {protocol!r}, not one of {', '.join(PROTOCOLS)}"
        )
    try:
        port = int(raw["port"])  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        raise ListenerError(f"{where}: listener {name} needs a port") from None
    adv_port = raw.get("advertised_port")
    client_auth = raw.get("ssl_client_auth")
    if client_auth is not None and client_auth not in ("required", "requested", "none"):
        raise ListenerError(
            f"{where}: listener {name} has ssl_client_auth {client_auth!r}, not one of "
            "required, requested, none"
        )
    return ListenerConfig(
        name=name,
        protocol=protocol,  # type: ignore[arg-type]
        host=str(raw.get("host", default_host)),
        port=port,
        advertised_host=None if raw.get("advertised_host") is None else str(raw["advertised_host"]),
        advertised_port=None if adv_port is None else int(adv_port),  # type: ignore[call-overload]
        client_auth=client_auth,  # type: ignore[arg-type]
    )


# (stream, connection info, gate factory or None) -> serves the connection.
Handler = Callable[
    [trio.abc.Stream, ConnectionInfo, Callable[[ConnectionInfo], ConnectionGate] | None],
    Awaitable[None],
]


async def accept_secured(
    stream: trio.SocketStream,
    listener: ListenerConfig,
    handler: Handler,
    *,
    ssl_context: Callable[[], ssl.SSLContext] | None,
    principal_of_cert: Callable[[bytes | None], str] | None = None,
    gate: Callable[[ConnectionInfo], ConnectionGate] | None = None,
    bad_input: BadInputLog | None = None,
) -> None:
    """Serves one accepted connection of `listener`: the TLS handshake (a failure is one
    rate-limited line, no traceback), the principal of a client certificate, the SASL gate."""
    conn = connection_info(stream, listener.name)
    served: trio.abc.Stream = stream
    if listener.tls:
        if ssl_context is None:
            raise ListenerError(f"listener {listener.name} is {listener.protocol} without TLS")
        tls = trio.SSLStream(stream, ssl_context(), server_side=True)
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT_S):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
            cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
            (bad_input or BadInputLog(log)).warn(
                conn.peer_host,
                "tls",
                "TLS handshake with %s:%s on listener %s failed: %s",
                conn.peer_host,
                conn.peer_port,
                listener.name,
                cause or exc,
            )
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            return
        served = tls
        cert = tls.getpeercert(binary_form=True)
        if cert and principal_of_cert is not None:
            try:
                conn.identity.principal = principal_of_cert(cert)
            except LookupError as exc:  # no ssl.principal.mapping.rules rule applies
                (bad_input or BadInputLog(log)).warn(
                    conn.peer_host, "tls", "refusing %s:%s on listener %s: %s",
                    conn.peer_host, conn.peer_port, listener.name, exc,
                )  # fmt: skip
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await tls.aclose()
                return
            conn.identity.mechanism = "SSL"
    await handler(served, conn, gate if listener.sasl else None)
