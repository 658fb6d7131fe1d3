"""Internal RPC over TLS (issue 15, "Fleet-internal") over loopback: a client needs both the
fleet certificate and the secret. A client without a certificate, one with a certificate of
another CA, a plaintext client on the TLS port and one with the wrong secret are each refused
with one log line and no traceback, and the server keeps serving."""

from __future__ import annotations

import datetime
import logging
import ssl
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from fleet.certs import (
    issue_certificate,
    write_certificate,
    write_internal_pki,
    write_private_key,
)
from fleet.config import ConfigError, FleetConfig, local_zones_fleet_toml, parse_fleet_config
from fleet.local_tls import write_local_tls
from internal_rpc import RpcAuthError, RpcClient, RpcPeer, RpcServer, RpcUnavailable
from internal_rpc.frames import encode_frame
from internal_rpc.tls import RpcTlsSettings
from kafka_wire.framing import FrameReader
from kafka_wire.tls import TlsConfigError, client_context

SECRET = b"k" * 32
WRONG = b"w" * 32
HOST = "127.0.0.1"


async def echo(peer: RpcPeer, params: dict[str, Any]) -> Any:
    return {"params": params, "peer": peer.node_id}


async def ticks(peer: RpcPeer, params: dict[str, Any], push: Any) -> None:
    for i in range(params["n"]):
        await push(i)


@dataclass(frozen=True)
class Pki:
    fleet: RpcTlsSettings  # the fleet CA's node certificate, trusting the fleet CA
    stranger: RpcTlsSettings  # another CA's node certificate, trusting the fleet CA
    directory: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    base = tmp_path_factory.mktemp("rpc-tls")
    fleet = write_internal_pki(base / "fleet")
    other = write_internal_pki(base / "other", ca_name="another CA")
    return Pki(
        RpcTlsSettings(fleet.server.cert, fleet.server.key, fleet.ca_cert),
        RpcTlsSettings(other.server.cert, other.server.key, fleet.ca_cert),
        base,
    )


@asynccontextmanager
async def running(server: RpcServer, port: int = 0) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(server.serve, HOST, port)
        yield bound
        nursery.cancel_scope.cancel()


def tls_server(tls: RpcTlsSettings | None, **kw: Any) -> RpcServer:
    return RpcServer(1, SECRET, {"echo": echo}, {"ticks": ticks}, tls=tls, **kw)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused connection" in r.getMessage()]


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_client_with_the_fleet_certificate_and_secret_is_served(pki: Pki) -> None:
    async with running(tls_server(pki.fleet)) as port:
        client = RpcClient(7, SECRET, HOST, port, tls=pki.fleet)
        assert await client.call("echo", {"x": b"\x00"}) == {"params": {"x": b"\x00"}, "peer": 7}
        conn = client._conn
        assert conn is not None and isinstance(conn.stream, trio.SSLStream)
        assert conn.stream.version() in ("TLSv1.2", "TLSv1.3")
        # Many calls on the one connection, and a subscription, as over plain TCP.
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(client.call, "echo", {"i": i})
        async with client.subscribe("ticks", {"n": 3}) as items:
            assert [i async for i in items] == [0, 1, 2]
        await client.aclose()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
async def test_tls_1_2_is_the_floor(pki: Pki) -> None:
    async with running(tls_server(pki.fleet)) as port:
        context = client_context(pki.fleet.ca_file, pki.fleet.cert_file, pki.fleet.key_file)
        context.maximum_version = ssl.TLSVersion.TLSv1_1
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        stream = trio.SSLStream(
            await trio.open_tcp_stream(HOST, port), context, server_hostname=HOST
        )
        with pytest.raises(trio.BrokenResourceError):
            await stream.do_handshake()
        await trio.aclose_forcefully(stream)


async def test_a_client_without_a_certificate_is_refused(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(tls_server(pki.fleet)) as port:
        # It trusts the fleet CA, so its own handshake completes (TLS 1.3); the server's
        # refusal arrives as an alert on its first read.
        stream = trio.SSLStream(
            await trio.open_tcp_stream(HOST, port),
            client_context(pki.fleet.ca_file),
            server_hostname=HOST,
        )
        with trio.fail_after(5):
            with pytest.raises(trio.BrokenResourceError) as refused:
                await stream.do_handshake()
                await FrameReader(stream).read_frame()
        assert isinstance(refused.value.__cause__, ssl.SSLError)
        await trio.aclose_forcefully(stream)
        good = RpcClient(8, SECRET, HOST, port, tls=pki.fleet)
        assert (await good.call("echo", {}))["peer"] == 8
        await good.aclose()
    [line] = refusals(caplog)
    assert "refused connection from 127.0.0.1:" in line
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in line and "fleet CA" in line
    no_traceback(caplog)


async def test_a_client_with_another_cas_certificate_is_refused(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(tls_server(pki.fleet)) as port:
        stranger = RpcClient(7, SECRET, HOST, port, tls=pki.stranger)
        with pytest.raises(RpcAuthError, match=r":\d+ closed .* refused our certificate"):
            await stranger.call("echo", {})
        await stranger.aclose()
        good = RpcClient(8, SECRET, HOST, port, tls=pki.fleet)
        assert (await good.call("echo", {}))["peer"] == 8
        await good.aclose()
    [line] = refusals(caplog)
    assert "certificate verify failed: unable to get local issuer certificate" in line
    no_traceback(caplog)


async def test_an_expired_fleet_certificate_is_refused(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    fleet = pki.directory / "fleet"
    ca_key = serialization.load_pem_private_key((fleet / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((fleet / "ca.pem").read_bytes())
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    key, cert = issue_certificate(
        ca_key,  # type: ignore[arg-type]
        ca_cert,
        "zonefleet-node",
        client=True,
        not_after=past,
    )
    write_certificate(tmp_path / "old.pem", cert)
    write_private_key(tmp_path / "old.key", key)
    expired = replace(pki.fleet, cert_file=tmp_path / "old.pem", key_file=tmp_path / "old.key")
    async with running(tls_server(pki.fleet)) as port:
        client = RpcClient(7, SECRET, HOST, port, tls=expired)
        with pytest.raises(RpcAuthError, match="refused our certificate"):
            await client.call("echo", {})
        await client.aclose()
    [line] = refusals(caplog)
    assert "certificate verify failed: certificate has expired" in line
    no_traceback(caplog)


async def test_a_plaintext_client_on_the_tls_port_is_refused(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    # Neither side speaks first on a TLS port: the server gives up on the handshake.
    async with running(tls_server(pki.fleet, handshake_timeout=0.3)) as port:
        plain = RpcClient(7, SECRET, HOST, port, connect_timeout=2.0)
        with pytest.raises(RpcUnavailable):
            await plain.call("echo", {}, retries=0)
        await plain.aclose()
        good = RpcClient(8, SECRET, HOST, port, tls=pki.fleet)
        assert (await good.call("echo", {}))["peer"] == 8
        await good.aclose()
    [line] = refusals(caplog)
    assert "no TLS handshake within 0.3 s" in line
    no_traceback(caplog)


async def test_a_client_with_the_certificate_but_the_wrong_secret_is_refused(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(tls_server(pki.fleet)) as port:
        bad = RpcClient(7, WRONG, HOST, port, tls=pki.fleet)
        with pytest.raises(RpcAuthError, match="refused our credentials"):
            await bad.call("echo", {})
        await bad.aclose()
        good = RpcClient(8, SECRET, HOST, port, tls=pki.fleet)
        assert (await good.call("echo", {}))["peer"] == 8
        await good.aclose()
    [line] = refusals(caplog)
    assert "client MAC mismatch" in line
    no_traceback(caplog)


async def test_a_tls_client_on_a_plaintext_port_is_refused(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(tls_server(None)) as port:
        client = RpcClient(7, SECRET, HOST, port, tls=pki.fleet)
        with pytest.raises(RpcAuthError, match="the peer does not speak TLS"):
            await client.call("echo", {})
        await client.aclose()
    [line] = refusals(caplog)
    assert "a TLS client on a plaintext RPC port" in line
    no_traceback(caplog)


async def test_the_client_refuses_a_server_without_the_fleet_certificate(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(tls_server(pki.stranger)) as port:
        client = RpcClient(7, SECRET, HOST, port, tls=pki.fleet)
        with pytest.raises(RpcAuthError, match="certificate verify failed"):
            await client.call("echo", {})
        await client.aclose()
    [line] = refusals(caplog)
    assert "closed the connection during the TLS handshake (does it trust ours?)" in line
    no_traceback(caplog)


async def test_the_client_checks_the_host_it_dialled(pki: Pki, tmp_path: Path) -> None:
    other = write_internal_pki(tmp_path, hosts=("mains.example",))
    elsewhere = RpcTlsSettings(other.server.cert, other.server.key, other.ca_cert)
    async with running(tls_server(elsewhere)) as port:
        client = RpcClient(7, SECRET, HOST, port, tls=elsewhere)
        with pytest.raises(RpcAuthError, match="IP address mismatch"):
            await client.call("echo", {})
        await client.aclose()
        lax = RpcClient(7, SECRET, HOST, port, tls=replace(elsewhere, check_hostname=False))
        assert (await lax.call("echo", {}))["peer"] == 7
        await lax.aclose()


async def test_a_rotated_certificate_is_used_by_the_next_connection(tmp_path: Path) -> None:
    fleet = write_internal_pki(tmp_path)
    tls = RpcTlsSettings(fleet.server.cert, fleet.server.key, fleet.ca_cert)
    srv = tls_server(tls)

    def serial(client: RpcClient) -> int:
        conn = client._conn
        assert conn is not None and isinstance(conn.stream, trio.SSLStream)
        der = conn.stream.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number

    async with running(srv) as port:
        first = RpcClient(7, SECRET, HOST, port, tls=tls)
        await first.call("echo", {})
        before = serial(first)
        ca_key = serialization.load_pem_private_key(fleet.ca_key.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(fleet.ca_cert.read_bytes())
        key, cert = issue_certificate(
            ca_key,  # type: ignore[arg-type]
            ca_cert,
            "zonefleet-node",
            client=True,
        )
        write_private_key(fleet.server.key, key)
        write_certificate(fleet.server.cert, cert)
        second = RpcClient(8, SECRET, HOST, port, tls=tls)
        await second.call("echo", {})
        assert serial(second) == cert.serial_number != before
        # The connection made before keeps working.
        assert (await first.call("echo", {}))["peer"] == 7
        await first.aclose()
        await second.aclose()


async def test_bad_material_stops_the_node_at_start(pki: Pki, tmp_path: Path) -> None:
    missing = replace(pki.fleet, key_file=tmp_path / "nowhere.key")
    with pytest.raises(TlsConfigError, match=r"nowhere\.key"):
        tls_server(missing)
    with pytest.raises(TlsConfigError, match=r"nowhere\.key"):
        RpcClient(7, SECRET, HOST, 1, tls=missing)
    (tmp_path / "empty.pem").write_bytes(b"")
    with pytest.raises(TlsConfigError, match=r"empty\.pem"):
        tls_server(replace(pki.fleet, ca_file=tmp_path / "empty.pem"))


async def test_a_server_restart_is_noticed_on_an_idle_tls_connection(pki: Pki) -> None:
    async with running(tls_server(pki.fleet)) as port:
        client = RpcClient(7, SECRET, HOST, port, tls=pki.fleet)
        await client.call("echo", {})
    async with running(tls_server(pki.fleet), port):
        # The idle connection's EOF is seen before sending: a non-idempotent call goes
        # through on a fresh connection.
        assert (await client.call("echo", {"n": 2}, idempotent=False))["peer"] == 7
    await client.aclose()


async def test_garbage_after_the_tls_handshake_is_one_line(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(tls_server(pki.fleet)) as port:
        stream = trio.SSLStream(
            await trio.open_tcp_stream(HOST, port),
            client_context(pki.fleet.ca_file, pki.fleet.cert_file, pki.fleet.key_file),
            server_hostname=HOST,
        )
        await stream.do_handshake()
        reader = FrameReader(stream)
        assert await reader.read_frame() is not None  # the hello
        await stream.send_all(encode_frame({"t": "auth", "node": 7}))
        with trio.fail_after(5):
            try:
                assert await reader.read_frame() is None
            except trio.BrokenResourceError:
                pass  # closed without a TLS close_notify
        await trio.aclose_forcefully(stream)
    [line] = refusals(caplog)
    assert "bad 'nonce'" in line
    no_traceback(caplog)


def test_zonefleet_up_tls_turns_rpc_tls_on_for_every_node(tmp_path: Path) -> None:
    tls = write_local_tls(tmp_path)
    text = local_zones_fleet_toml(tmp_path, 30000, 2, "s" * 64, security_toml=tls.security_toml())
    config = parse_fleet_config(tomllib.loads(text), tmp_path, discover=None)
    rpc = tls.rpc_directory
    expected = RpcTlsSettings(str(rpc / "node.pem"), str(rpc / "node.key"), str(rpc / "ca.pem"))
    assert [m.broker.rpc_tls for m in config.mains] == [expected] * 2
    assert [p.proxy.rpc_tls for p in config.proxies] == [expected] * 2
    # A CA of its own: the listeners' client certificate is not one of it.
    node = x509.load_pem_x509_certificate((rpc / "node.pem").read_bytes())
    assert node.issuer != x509.load_pem_x509_certificate(tls.ca.read_bytes()).subject
    sans = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usages = node.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def _fleet_with(tmp_path: Path, security: str) -> FleetConfig:
    text = local_zones_fleet_toml(tmp_path, 30000, 2, "s" * 64, security_toml=security)
    return parse_fleet_config(tomllib.loads(text), tmp_path, discover=None)


def test_rpc_tls_defaults_to_the_listeners_material(pki: Pki, tmp_path: Path) -> None:
    fleet = pki.fleet
    config = _fleet_with(
        tmp_path,
        "[security]\nrpc_tls = true\n"
        f'ssl_certfile = "{fleet.cert_file}"\nssl_keyfile = "{fleet.key_file}"\n'
        f'ssl_cafile = "{fleet.ca_file}"\nrpc_ssl_check_hostname = false\n',
    )
    assert config.mains[0].broker.rpc_tls == RpcTlsSettings(
        str(fleet.cert_file), str(fleet.key_file), str(fleet.ca_file), None, False
    )
    assert _fleet_with(tmp_path, "").mains[0].broker.rpc_tls is None


@pytest.mark.parametrize(
    ("security", "error"),
    [
        ("rpc_tls = 1", "rpc_tls is true or false"),
        ("rpc_tls = true", r"rpc_ssl_certfile \(or ssl_certfile\), rpc_ssl_keyfile"),
        (
            'rpc_tls = true\nrpc_ssl_certfile = "nowhere.pem"\nrpc_ssl_keyfile = "k.key"\n'
            'rpc_ssl_cafile = "ca.pem"',
            r"rpc_tls: .*nowhere\.pem",
        ),
    ],
)
def test_rpc_tls_configuration_errors(tmp_path: Path, security: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        _fleet_with(tmp_path, f"[security]\n{security}\n")
