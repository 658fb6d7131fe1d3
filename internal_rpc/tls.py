"""Internal RPC over TLS: mutual TLS with the fleet's certificates, under the HMAC handshake.

With TLS on, a connection first completes a TLS 1.2+ handshake in which both sides show a
certificate the fleet CA signed: the server requires one from every client (Kafka's
`ssl.client.auth=required`), the client verifies the server's and, unless told not to, that
it names the host it dialled. The HMAC handshake of `auth` then runs inside the TLS stream,
unchanged, and so do the frames: TLS only wraps the bytes. A peer must hold both the fleet
certificate and the secret; either alone is refused.

A node uses one certificate for both roles (a main is the server of its proxies and the client
of other mains), so it carries both extended key usages, and the SANs of the host its peers
dial. `RpcTls` holds the current context of one side; the files are checked when a connection
starts (three `stat`s), so a rotated certificate is used by the next connection, with no
restart and no task of its own. Connections already up keep theirs. Bad material at start
raises `TlsConfigError` (the node does not start); bad material in a rotation is logged once
and the old context stays (`kafka_wire.tls.reload`).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

import trio

from kafka_wire.tls import ReloadingContext, TlsSettings, client_context, server_context
from kafka_wire.tls.context import StrPath

__all__ = ["RpcTls", "RpcTlsSettings", "describe", "looks_like_tls", "tls_error"]


@dataclass(frozen=True)
class RpcTlsSettings:
    """A node's fleet certificate (`cert_file`, then any intermediates; `key_file`, encrypted
    with `key_password` if one is given) and the fleet CA (`ca_file`) that peers' certificates
    must chain to. `check_hostname`: a client also checks that the server's certificate names
    the host it dialled (its SANs)."""

    cert_file: StrPath
    key_file: StrPath
    ca_file: StrPath
    key_password: str | None = None
    check_hostname: bool = True

    def as_listener(self) -> TlsSettings:
        """The same material as a listener's, client certificates required."""
        return TlsSettings(
            self.cert_file, self.key_file, self.ca_file, "required", self.key_password
        )


class RpcTls:
    """The TLS side of one RPC server (`server_side`) or client: the current context, rebuilt
    when its files change, and the wrapping of a new connection's stream."""

    def __init__(self, settings: RpcTlsSettings, *, server_side: bool) -> None:
        self.settings = settings
        self.server_side = server_side
        self._context = ReloadingContext(
            settings.as_listener(), server_context if server_side else self._client_context
        )

    def _client_context(self, listener: TlsSettings) -> ssl.SSLContext:
        assert listener.ca_file is not None
        return client_context(
            listener.ca_file,
            listener.cert_file,
            listener.key_file,
            key_password=listener.key_password,
            check_hostname=self.settings.check_hostname,
        )

    def context(self) -> ssl.SSLContext:
        """The context for a new connection, reloaded first if the files changed."""
        if self._context.changed():
            self._context.reload()
        return self._context.context

    def wrap(self, stream: trio.SocketStream, host: str = "") -> trio.SSLStream[trio.SocketStream]:
        """`stream` under TLS, the handshake not done yet; a client names the `host` dialled."""
        if self.server_side:
            return trio.SSLStream(stream, self.context(), server_side=True)
        return trio.SSLStream(stream, self.context(), server_hostname=host)


def tls_error(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind `exc` (trio raises `BrokenResourceError` from it), if any."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return cause
        cause = cause.__cause__
    return None


def describe(exc: BaseException) -> str:
    """One line on why a TLS handshake (or the first read after it) failed."""
    err = tls_error(exc)
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {err.verify_message}"
    if err is None or isinstance(err, ssl.SSLEOFError):
        return "the peer closed the connection during the TLS handshake (does it trust ours?)"
    if err.reason == "WRONG_VERSION_NUMBER":
        return "TLS handshake failed: the peer does not speak TLS (is its rpc_tls on?)"
    return f"TLS handshake failed: {err.reason or err}"


def looks_like_tls(exc: BaseException) -> bool:
    """Whether a plaintext port's refusal of a frame was a TLS ClientHello: its record header
    (0x16 0x03, then the version's minor byte) read as the size of a frame."""
    m = re.match(r"frame of (\d+) bytes", str(exc))
    return m is not None and int(m.group(1)) >> 16 == 0x1603
