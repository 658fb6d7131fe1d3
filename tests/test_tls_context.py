"""kafka_wire.tls.context and .reload: real TLS handshakes over loopback sockets with trio."""

from __future__ import annotations

import datetime
import logging
import re
import ssl
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from fleet.certs import (
    FleetPki,
    generate_ca,
    issue_certificate,
    write_certificate,
    write_fleet_pki,
    write_private_key,
)
from kafka_wire.tls import (
    ReloadingContext,
    SslPrincipalMapper,
    TlsConfigError,
    TlsSettings,
    client_context,
    server_context,
    ssl_principal,
    subject_dn,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> FleetPki:
    return write_fleet_pki(tmp_path_factory.mktemp("pki"), clients=("admin", "alice"))


@dataclass
class Accepted:
    """What the server saw of one connection: the peer's certificate, or the handshake error."""

    peer: dict[str, object] | None = None
    peer_der: bytes | None = None
    error: BaseException | None = None


@asynccontextmanager
async def tls_server(
    context: Callable[[], ssl.SSLContext],
) -> AsyncIterator[tuple[int, trio.MemoryReceiveChannel[Accepted]]]:
    """A TLS echo server on 127.0.0.1; each connection's handshake uses `context()` as it is
    when the connection arrives. Yields the port and a channel of what each handshake gave."""
    send, receive = trio.open_memory_channel[Accepted](16)

    async def handle(raw: trio.SocketStream) -> None:
        stream = trio.SSLStream(raw, context(), server_side=True)
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as e:
            await send.send(Accepted(error=e.__cause__))
            return
        await send.send(Accepted(stream.getpeercert(), stream.getpeercert(binary_form=True)))
        try:
            while data := await stream.receive_some():
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1], receive
        nursery.cancel_scope.cancel()


async def connect(port: int, ctx: ssl.SSLContext) -> trio.SSLStream[trio.SocketStream]:
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(raw, ctx, server_hostname="localhost")
    await stream.do_handshake()
    return stream


async def echo(stream: trio.SSLStream[trio.SocketStream], data: bytes) -> bytes:
    await stream.send_all(data)
    got = b""
    while len(got) < len(data):
        got += await stream.receive_some()
    return got


def serial_of(stream: trio.SSLStream[trio.SocketStream]) -> str:
    cert = stream.getpeercert()
    assert cert is not None
    return str(cert["serialNumber"])


def mtls_settings(pki: FleetPki, client_auth: str = "required") -> TlsSettings:
    return TlsSettings(
        pki.server.cert,
        pki.server.key,
        ca_file=pki.ca_cert,
        client_auth=client_auth,  # type: ignore[arg-type]
    )


async def test_client_certificate_is_verified_and_seen(pki: FleetPki) -> None:
    server_ctx = server_context(mtls_settings(pki))
    admin = pki.clients["admin"]
    async with tls_server(lambda: server_ctx) as (port, accepted):
        stream = await connect(port, client_context(pki.ca_cert, admin.cert, admin.key))
        assert await echo(stream, b"ping") == b"ping"
        seen = await accepted.receive()
        assert seen.error is None and seen.peer is not None
        assert subject_dn(seen.peer) == "CN=admin"
        # DEFAULT keeps the whole DN, as in Kafka; a rule takes the CN out.
        assert ssl_principal(SslPrincipalMapper.from_rules(None), seen.peer_der) == "User:CN=admin"
        mapper = SslPrincipalMapper.from_rules("RULE:^CN=([^,]+)$/$1/,DEFAULT")
        assert ssl_principal(mapper, seen.peer_der) == "User:admin"
        assert stream.version() in ("TLSv1.2", "TLSv1.3")
        await stream.aclose()


async def test_client_without_certificate_is_refused(pki: FleetPki) -> None:
    server_ctx = server_context(mtls_settings(pki))
    async with tls_server(lambda: server_ctx) as (port, accepted):
        # In TLS 1.3 the client's handshake ends before the server has checked its (absent)
        # certificate: the refusal arrives on the first read, as the server's alert or, if the
        # client's data reached the closed socket first, as a reset.
        with pytest.raises(trio.BrokenResourceError) as refused:
            stream = await connect(port, client_context(pki.ca_cert))
            await echo(stream, b"ping")
        assert isinstance(refused.value.__cause__, ssl.SSLError | ConnectionResetError)
        seen = await accepted.receive()
        assert isinstance(seen.error, ssl.SSLError)
        assert "certificate" in str(seen.error).lower()


async def test_requested_client_auth_lets_anonymous_in(pki: FleetPki) -> None:
    server_ctx = server_context(mtls_settings(pki, "requested"))
    async with tls_server(lambda: server_ctx) as (port, accepted):
        stream = await connect(port, client_context(pki.ca_cert))
        assert await echo(stream, b"x") == b"x"
        seen = await accepted.receive()
        assert seen.error is None and not seen.peer
        assert ssl_principal(SslPrincipalMapper.from_rules(None), seen.peer_der) == "User:ANONYMOUS"
        await stream.aclose()


async def test_client_certificate_from_another_ca_is_refused(pki: FleetPki, tmp_path: Path) -> None:
    other_key, other_ca = generate_ca("someone else")
    key, cert = issue_certificate(other_key, other_ca, "mallory", client=True, server=False)
    write_certificate(tmp_path / "m.pem", cert)
    write_private_key(tmp_path / "m.key", key)
    server_ctx = server_context(mtls_settings(pki))
    async with tls_server(lambda: server_ctx) as (port, accepted):
        with pytest.raises(trio.BrokenResourceError):
            stream = await connect(
                port, client_context(pki.ca_cert, tmp_path / "m.pem", tmp_path / "m.key")
            )
            await echo(stream, b"ping")
        seen = await accepted.receive()
        assert isinstance(seen.error, ssl.SSLCertVerificationError)


async def test_tls_1_1_client_is_refused(pki: FleetPki) -> None:
    server_ctx = server_context(TlsSettings(pki.server.cert, pki.server.key))
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(pki.ca_cert)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    # OpenSSL 3 would not even offer TLS 1.1 at its default security level; offer it, so that
    # the refusal tested is the server's.
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    async with tls_server(lambda: server_ctx) as (port, accepted):
        with pytest.raises(trio.BrokenResourceError):
            await connect(port, old)
        seen = await accepted.receive()
        assert isinstance(seen.error, ssl.SSLError)
        assert seen.error.reason == "UNSUPPORTED_PROTOCOL"


async def test_expired_server_certificate_is_refused(pki: FleetPki, tmp_path: Path) -> None:
    ca_key_pem = pki.ca_key.read_bytes()
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    ca_key = load_pem_private_key(ca_key_pem, None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    key, cert = issue_certificate(ca_key, ca_cert, "localhost", not_after=past)  # type: ignore[arg-type]
    write_certificate(tmp_path / "expired.pem", cert)
    write_private_key(tmp_path / "expired.key", key)
    server_ctx = server_context(TlsSettings(tmp_path / "expired.pem", tmp_path / "expired.key"))
    async with tls_server(lambda: server_ctx) as (port, _):
        with pytest.raises(trio.BrokenResourceError) as refused:
            await connect(port, client_context(pki.ca_cert))
        cause = refused.value.__cause__
        assert isinstance(cause, ssl.SSLCertVerificationError)
        assert cause.verify_message == "certificate has expired"


async def test_client_checks_the_host_name(pki: FleetPki) -> None:
    server_ctx = server_context(TlsSettings(pki.server.cert, pki.server.key))
    async with tls_server(lambda: server_ctx) as (port, _):
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(raw, client_context(pki.ca_cert), server_hostname="elsewhere")
        with pytest.raises(trio.BrokenResourceError) as refused:
            await stream.do_handshake()
        assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)


# Configuration errors name the file at fault.


def named(path: Path) -> str:
    return re.escape(str(path))


def test_missing_files_are_named(pki: FleetPki, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TlsConfigError, match=f"certificate file {named(missing)}: No such file"):
        server_context(TlsSettings(missing, pki.server.key))
    with pytest.raises(TlsConfigError, match=f"key file {named(missing)}: No such file"):
        server_context(TlsSettings(pki.server.cert, missing))
    with pytest.raises(TlsConfigError, match=f"CA file {named(missing)}: No such file"):
        server_context(TlsSettings(pki.server.cert, pki.server.key, missing, "required"))
    with pytest.raises(TlsConfigError, match=f"CA file {named(missing)}"):
        client_context(missing)


def test_bad_material_is_named(pki: FleetPki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(
        TlsConfigError, match=f"certificate file {named(garbage)}: no PEM certificate"
    ):
        server_context(TlsSettings(garbage, pki.server.key))
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsConfigError, match=f"certificate file {named(broken)}: .*does not parse"):
        server_context(TlsSettings(broken, pki.server.key))
    with pytest.raises(TlsConfigError, match=f"key file {named(garbage)}: not a PEM private key"):
        server_context(TlsSettings(pki.server.cert, garbage))
    with pytest.raises(TlsConfigError, match=f"CA file {named(garbage)}: no PEM certificate"):
        server_context(TlsSettings(pki.server.cert, pki.server.key, garbage, "required"))
    other = pki.clients["alice"].key
    with pytest.raises(
        TlsConfigError,
        match=f"key file {named(other)} does not match .*{named(pki.server.cert)}",
    ):
        server_context(TlsSettings(pki.server.cert, other))


def test_encrypted_key(pki: FleetPki, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(pki.server.key.read_bytes(), None)
    encrypted = tmp_path / "enc.key"
    write_private_key(encrypted, key, password="s3cret")  # type: ignore[arg-type]
    with pytest.raises(
        TlsConfigError, match=f"key file {named(encrypted)} is encrypted and no key_"
    ):
        server_context(TlsSettings(pki.server.cert, encrypted))
    with pytest.raises(TlsConfigError, match=f"key file {named(encrypted)}: wrong key_password"):
        server_context(TlsSettings(pki.server.cert, encrypted, key_password="nope"))
    ctx = server_context(TlsSettings(pki.server.cert, encrypted, key_password="s3cret"))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_settings_and_context_modes(pki: FleetPki) -> None:
    with pytest.raises(TlsConfigError, match="client_auth=required needs ca_file"):
        TlsSettings(pki.server.cert, pki.server.key, client_auth="required")
    with pytest.raises(TlsConfigError, match="client_auth must be one of"):
        TlsSettings(pki.server.cert, pki.server.key, client_auth="always")  # type: ignore[arg-type]
    assert issubclass(TlsConfigError, ValueError)
    modes = {
        auth: server_context(mtls_settings(pki, auth)).verify_mode
        for auth in ("required", "requested", "none")
    }
    assert modes == {
        "required": ssl.CERT_REQUIRED,
        "requested": ssl.CERT_OPTIONAL,
        "none": ssl.CERT_NONE,
    }
    client = client_context(pki.ca_cert)
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert not client_context(pki.ca_cert, check_hostname=False).check_hostname
    with pytest.raises(TlsConfigError, match="without a certificate file"):
        client_context(pki.ca_cert, key_file=pki.server.key)


# Reloading.


def rotate_server_certificate(pki: FleetPki, directory: Path) -> None:
    """A new key and certificate from the fleet CA, over the server's files."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    ca_key = load_pem_private_key(pki.ca_key.read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key, cert = issue_certificate(ca_key, ca_cert, "localhost")  # type: ignore[arg-type]
    write_private_key(directory / "server.key", key)
    write_certificate(directory / "server.pem", cert)


async def test_reload_swaps_for_new_handshakes_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = write_fleet_pki(tmp_path)
    reloading = ReloadingContext(TlsSettings(pki.server.cert, pki.server.key))
    assert not reloading.changed()
    client = client_context(pki.ca_cert)
    async with tls_server(lambda: reloading.context) as (port, _):
        old_stream = await connect(port, client)
        old_serial = serial_of(old_stream)

        rotate_server_certificate(pki, tmp_path)
        assert reloading.changed()
        first = reloading.context
        assert reloading.reload()
        assert reloading.context is not first
        assert not reloading.changed()

        new_stream = await connect(port, client)
        new_serial = serial_of(new_stream)
        assert new_serial != old_serial
        # The connection made before the rotation carries on with its certificate.
        assert await echo(old_stream, b"still here") == b"still here"
        assert serial_of(old_stream) == old_serial
        assert await echo(new_stream, b"new") == b"new"

        # A corrupt certificate: refused with one warning line, the current context kept.
        kept = reloading.context
        pki.server.cert.write_text("-----BEGIN CERTIFICATE-----\ngarbage\n")
        assert reloading.changed()
        with caplog.at_level(logging.WARNING, logger="zonefleet.tls"):
            assert not reloading.reload()
        warnings_logged = [r for r in caplog.records if r.name == "zonefleet.tls"]
        assert len(warnings_logged) == 1
        assert warnings_logged[0].exc_info is None
        assert str(pki.server.cert) in warnings_logged[0].getMessage()
        assert reloading.context is kept
        # Seen and refused: a poller does not warn again until the files change again.
        assert not reloading.changed()
        still = await connect(port, client)
        assert serial_of(still) == new_serial
        for s in (old_stream, new_stream, still):
            await s.aclose()


def test_reload_needs_good_material_to_start(tmp_path: Path) -> None:
    with pytest.raises(TlsConfigError):
        ReloadingContext(TlsSettings(tmp_path / "a.pem", tmp_path / "a.key"))


async def test_watch_reloads_on_change(tmp_path: Path) -> None:
    from kafka_wire.tls import watch

    pki = write_fleet_pki(tmp_path, clients=())
    reloading = ReloadingContext(TlsSettings(pki.server.cert, pki.server.key))
    first = reloading.context
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, reloading, 0.01)
        rotate_server_certificate(pki, tmp_path)
        with trio.fail_after(2):
            while reloading.context is first:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
