"""`ssl.SSLContext`s for Kafka listeners and for fleet-internal clients, from PEM files.

TLS 1.2 is the floor, as in Kafka's defaults since 3.0 (`ssl.enabled.protocols`). Client
authentication follows Kafka's `ssl.client.auth`: `required` refuses a handshake without a
certificate the CA vouches for, `requested` asks for one and lets a client without one in (its
principal is then ANONYMOUS), `none` does not ask.

Every misconfiguration is a `TlsConfigError` whose message names the file at fault, because
OpenSSL's own errors ("PEM lib", errno 2 without a path) do not say which of three files it was.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from typing import Literal, NoReturn

__all__ = [
    "ClientAuth",
    "StrPath",
    "TlsConfigError",
    "TlsSettings",
    "client_context",
    "server_context",
]

ClientAuth = Literal["required", "requested", "none"]
StrPath = str | os.PathLike[str]

_VERIFY_MODES: dict[str, ssl.VerifyMode] = {
    "required": ssl.CERT_REQUIRED,
    "requested": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL)


class TlsConfigError(ValueError):
    """TLS material or settings that cannot make a context; the message names the file."""


@dataclass(frozen=True)
class TlsSettings:
    """A listener's TLS material: Kafka's `ssl.keystore.*`, `ssl.truststore.*` and
    `ssl.client.auth`, as PEM files.

    `cert_file` holds the listener's certificate, then any intermediates; `key_file` its
    private key, encrypted with `key_password` if one is given. `ca_file` holds the CAs that
    client certificates must chain to; client authentication other than `none` needs it.
    """

    cert_file: StrPath
    key_file: StrPath
    ca_file: StrPath | None = None
    client_auth: ClientAuth = "none"
    key_password: str | None = None

    def __post_init__(self) -> None:
        if self.client_auth not in _VERIFY_MODES:
            raise TlsConfigError(
                f"client_auth must be one of required, requested, none, not {self.client_auth!r}"
            )
        if self.client_auth != "none" and self.ca_file is None:
            raise TlsConfigError(
                f"client_auth={self.client_auth} needs ca_file: the CAs that client certificates "
                "are verified against"
            )

    def files(self) -> tuple[str, ...]:
        """The paths the context is built from, to watch for changes."""
        paths = [self.cert_file, self.key_file]
        if self.ca_file is not None:
            paths.append(self.ca_file)
        return tuple(os.fspath(p) for p in paths)


def _read(path: StrPath, role: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsConfigError(f"{role} {os.fspath(path)}: {e.strerror or e}") from e


def _load_chain(
    ctx: ssl.SSLContext, cert_file: StrPath, key_file: StrPath, key_password: str | None
) -> None:
    cert_path, key_path = os.fspath(cert_file), os.fspath(key_file)
    # Read both first so that a missing or unreadable file is named, and check the certificate
    # file alone so that OpenSSL's "PEM lib" can then only be about the key.
    certs = _PEM_CERT.findall(_read(cert_path, "certificate file"))
    _read(key_path, "key file")
    if not certs:
        raise TlsConfigError(f"certificate file {cert_path}: no PEM certificate in it")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=b"\n".join(certs).decode("ascii")
        )
    except (ssl.SSLError, UnicodeDecodeError) as e:
        raise TlsConfigError(f"certificate file {cert_path}: certificate does not parse") from e

    def no_password() -> NoReturn:
        # Without a callback OpenSSL would prompt on the terminal for the passphrase.
        raise TlsConfigError(f"key file {key_path} is encrypted and no key_password is set")

    try:
        ctx.load_cert_chain(
            cert_path, key_path, key_password if key_password is not None else no_password
        )
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(
                f"key file {key_path} does not match the certificate in {cert_path}"
            ) from e
        hint = "wrong key_password, or " if key_password is not None else ""
        raise TlsConfigError(f"key file {key_path}: {hint}not a PEM private key") from e
    except OSError as e:  # the file went away between the read and the load
        raise TlsConfigError(f"{cert_path} or {key_path}: {e.strerror or e}") from e


def _load_ca(ctx: ssl.SSLContext, ca_file: StrPath) -> None:
    path = os.fspath(ca_file)
    _read(path, "CA file")
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError as e:
        raise TlsConfigError(
            f"CA file {path}: no PEM certificate in it, or one does not parse"
        ) from e
    except OSError as e:
        raise TlsConfigError(f"CA file {path}: {e.strerror or e}") from e


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A server-side context for a listener: TLS 1.2+, its certificate chain and key, and
    client certificates verified against `settings.ca_file` as `client_auth` says."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, settings.cert_file, settings.key_file, settings.key_password)
    if settings.ca_file is not None:
        _load_ca(ctx, settings.ca_file)
    ctx.verify_mode = _VERIFY_MODES[settings.client_auth]
    return ctx


def client_context(
    ca_file: StrPath,
    cert_file: StrPath | None = None,
    key_file: StrPath | None = None,
    *,
    key_password: str | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client-side context (for fleet-internal RPC): TLS 1.2+, the server's certificate
    verified against `ca_file` and, unless `check_hostname` is false, matched to the host
    name; with `cert_file` (and `key_file`, else the key is read from `cert_file`) it also
    presents a client certificate."""
    if key_file is not None and cert_file is None:
        raise TlsConfigError(f"key file {os.fspath(key_file)} given without a certificate file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load_ca(ctx, ca_file)
    if cert_file is not None:
        _load_chain(ctx, cert_file, key_file if key_file is not None else cert_file, key_password)
    return ctx
