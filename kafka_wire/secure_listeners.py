"""A node's named listeners (SSL, SASL_PLAINTEXT, SASL_SSL) and what serving them takes: the
TLS contexts, the SASL gate, OAUTHBEARER's keys, the audit of failed logins. Zone proxies
(`proxy_broker.secure_listeners`) and mains (`main_broker.broker`) serve theirs with it.

SCRAM credentials are the fleet's own, stored by the mains in `cluster/scram.json`
(docs/formats.md); how a node keeps its copy fresh is its own business, so the credentials
come from a callable that returns the copy in force (a proxy follows the metadata store, a
main reads its document store). PLAIN checks against the node's credentials file of hashes.
OAUTHBEARER checks JWTs against the OAuth provider's JWKS, which each node fetches itself and
keeps fresh (`kafka_wire.sasl.jwks`).

TLS listeners share the node's certificate (`[security]` ssl_* settings), each with its own
`ssl.client.auth`; the files are polled every `TLS_RELOAD_S` and reloaded on SIGHUP, and a
new handshake uses what they hold then. A client certificate's subject is the principal
(Kafka's `ssl.principal.mapping.rules`) unless SASL names another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Final

import trio

from kafka_wire.listeners import ListenerConfig, ListenerError, accept_secured
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.gate import SaslListener, SaslSettings, sasl_listener
from kafka_wire.sasl.jwks import JwksKeys
from kafka_wire.sasl.plain import PlainCredentials, load_credentials
from kafka_wire.sasl.scram import ScramCredential
from kafka_wire.security_docs import ScramDoc
from kafka_wire.server_loop import ConnectionGate, ConnectionInfo
from kafka_wire.tls import ReloadingContext, SslPrincipalMapper, TlsSettings, ssl_principal, watch
from telemetry import BadInputLog, BrokerMetrics
from telemetry.audit import AuditLog, AuthenticationFailed

__all__ = ["SCRAM_REFRESH_S", "TLS_RELOAD_S", "SecureListeners", "Serve"]

log = logging.getLogger("zonefleet.listeners")

SCRAM_REFRESH_S: Final = 5.0  # how often a node re-reads the stored SCRAM credentials
TLS_RELOAD_S: Final = 5.0

# (stream, connection info, gate factory or None) -> serves the connection.
Serve = Callable[
    [trio.abc.Stream, ConnectionInfo, Callable[[ConnectionInfo], ConnectionGate] | None],
    Awaitable[None],
]


class SecureListeners:
    def __init__(
        self,
        listeners: list[ListenerConfig],
        settings: SaslSettings,
        fleet_secret: bytes,
        metrics: BrokerMetrics,
        bad_input: BadInputLog,
        tls: TlsSettings | None = None,
        principal_rules: str | None = None,
        audit: AuditLog | None = None,
        *,
        scram: Callable[[], ScramDoc],  # the stored SCRAM credentials in force now
    ) -> None:
        self.listeners = listeners
        self.settings = settings
        self.metrics = metrics
        self.bad_input = bad_input
        self.audit = audit or AuditLog.off()
        self._scram = scram
        self.plain = PlainCredentials({})
        self.bound: dict[str, int] = {}  # listener name -> bound port
        self.sasl: SaslListener | None = None
        self.jwks: JwksKeys | None = None  # OAUTHBEARER's keys
        # One context per ssl.client.auth in use; built now, so bad material stops the node.
        self.tls: dict[str, ReloadingContext] = {}
        self.mapper = SslPrincipalMapper.from_rules(principal_rules)
        for lst in listeners:
            if not lst.tls:
                continue
            if tls is None:
                raise ListenerError(
                    f"listener {lst.name} is {lst.protocol}: TLS listeners need the "
                    "[security] ssl_certfile and ssl_keyfile"
                )
            auth = lst.client_auth or tls.client_auth
            if auth not in self.tls:
                self.tls[auth] = ReloadingContext(dataclasses.replace(tls, client_auth=auth))
        if any(lst.sasl for lst in listeners):
            if settings.plain_credentials_file is not None:
                with open(settings.plain_credentials_file, "rb") as f:
                    self.plain = load_credentials(f.read())
            # The fake salt of an unknown user must not change across restarts or nodes.
            fake = hashlib.sha256(b"zonefleet scram fake salt\0" + fleet_secret).digest()
            if settings.oauthbearer is not None:
                self.jwks = JwksKeys(settings.oauthbearer)
            self.sasl = sasl_listener(
                settings,
                self._scram_credential,
                self.plain.get,
                fake,
                bad_input,
                self._failed,
                oauth_keys=self.jwks,
            )

    def _scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        return self._scram().credential(user, mechanism)

    def _failed(self, conn: ConnectionInfo, failure: SaslAuthenticationFailed) -> None:
        self.metrics.auth_failures.labels(conn.listener, failure.mechanism).inc()
        self.audit.record(
            AuthenticationFailed(
                conn.principal,
                conn.peer_host,
                conn.peer_port,
                conn.listener,
                failure.mechanism,
                failure.user,
                failure.reason,
                failure.error_code.name.upper(),
            )
        )

    def names(self) -> frozenset[str]:
        return frozenset(lst.name for lst in self.listeners)

    def advertised(self) -> tuple[tuple[str, str, int], ...]:
        """(name, host, port) of each listener, once bound."""
        return tuple(
            (lst.name, *lst.advertised(self.bound.get(lst.name))) for lst in self.listeners
        )

    def tls_context(self, listener: ListenerConfig) -> ReloadingContext | None:
        if not listener.tls:
            return None
        settings = next(iter(self.tls.values())).settings
        return self.tls[listener.client_auth or settings.client_auth]

    def principal_of_cert(self, cert_der: bytes | None) -> str:
        return ssl_principal(self.mapper, cert_der)

    def reload_tls(self) -> None:
        for ctx in self.tls.values():
            ctx.reload()

    async def _reload_on_sighup(self) -> None:
        try:
            receiver = trio.open_signal_receiver(signal.SIGHUP)
        except (RuntimeError, ValueError):  # not the main thread (nodes sharing a process)
            return
        with receiver as signals:
            async for _ in signals:
                log.info("SIGHUP: reloading TLS material")
                self.reload_tls()

    async def serve(self, nursery: trio.Nursery, serve: Serve) -> None:
        """Starts every named listener in `nursery`; returns once all are bound."""
        for ctx in self.tls.values():
            nursery.start_soon(watch, ctx, TLS_RELOAD_S)
        if self.tls:
            nursery.start_soon(self._reload_on_sighup)
        if self.jwks is not None:
            nursery.start_soon(self.jwks.keep_fresh)
        for lst in self.listeners:
            handler = _Accept(self, lst, serve)
            bound = await nursery.start(_serve_tcp(handler, lst))
            self.bound[lst.name] = bound[0].socket.getsockname()[1]
            log.info("listener %s (%s) on %s:%d", lst.name, lst.protocol, lst.host,
                     self.bound[lst.name])  # fmt: skip


class _Accept:
    def __init__(self, owner: SecureListeners, listener: ListenerConfig, serve: Serve) -> None:
        self.owner = owner
        self.listener = listener
        self.serve = serve

    async def __call__(self, stream: trio.SocketStream) -> None:
        owner = self.owner
        gate = owner.sasl.gate if owner.sasl is not None else None
        tls = owner.tls_context(self.listener)
        await accept_secured(
            stream,
            self.listener,
            self.serve,
            ssl_context=None if tls is None else (lambda: tls.context),
            principal_of_cert=owner.principal_of_cert,
            gate=gate,
            bad_input=owner.bad_input,
        )


def _serve_tcp(handler: _Accept, listener: ListenerConfig) -> Callable[..., Awaitable[None]]:
    async def run(task_status: trio.TaskStatus[list[trio.SocketListener]]) -> None:
        await trio.serve_tcp(handler, listener.port, host=listener.host, task_status=task_status)

    return run
