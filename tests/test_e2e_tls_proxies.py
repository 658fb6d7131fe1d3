"""TLS through the zone proxies (issue 15), started as a user starts it: `zonefleet up --zones
3 --tls`, with the client settings it prints.

Stock clients produce and consume over SASL_SSL (PLAIN from the generated credentials file,
and SCRAM-SHA-512 for a user created with AlterUserScramCredentials) and over mTLS. A
plaintext client on a TLS port, a TLS client on the plaintext port, a client without a
certificate and one with an expired certificate on the mTLS listener are each refused with
one log line and no traceback. Replacing the server certificate's files is picked up by new
handshakes without a restart.

Internal RPC runs over mutual TLS as well (`--tls` sets `[security] rpc_tls`), so every
produce and consume here has its confirms, state streams and relays on it. A main's RPC port
refuses a client without the fleet's RPC certificate or without the secret.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import socket
import ssl
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fleet.certs import issue_certificate, write_certificate, write_private_key
from fleet.config import MAIN_RPC_OFFSET, ZONE_PORT_STRIDE
from internal_rpc import RpcAuthError, RpcClient, RpcTlsSettings
from internal_rpc.messages import Probe
from tests.fleet_process import FleetProcess
from tests.test_e2e_sasl_proxies import round_trip, values_read
from tests.zone_fleet import PORT_BLOCK, free_port_block

ZONES = ("az1", "az2", "az3")


class TlsFleet:
    def __init__(self, proc: FleetProcess) -> None:
        self.proc = proc
        self.tls = proc.data_dir / "tls"
        self.settings: dict[tuple[str, str], dict[str, str]] = {}
        self.main_settings: dict[str, dict[str, str]] = {}
        for line in proc.output:
            m = re.match(r"zone=(\S+) client (SASL_SSL|SSL)[^:]*: (.*)", line)
            if m:
                pairs = dict(kv.split("=", 1) for kv in m.group(3).split())
                self.settings[(m.group(1), m.group(2))] = pairs
            m = re.match(r"zone=(\S+) main SASL_SSL: (.*)", line)
            if m:  # the zone main's own SASL_SSL listener
                pairs = dict(kv.split("=", 1) for kv in m.group(2).split())
                self.main_settings[m.group(1)] = pairs

    def conf(self, zone: str, listener: str, **extra: Any) -> dict[str, Any]:
        return {**self.settings[(zone, listener)], **extra}

    def port(self, zone: str, listener: str) -> int:
        return int(self.settings[(zone, listener)]["bootstrap.servers"].rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def tls_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsFleet]:
    data_dir = tmp_path_factory.mktemp("tls") / "fleet"
    proc = FleetProcess(data_dir, free_port_block(PORT_BLOCK), ["--zones", "3", "--tls"])
    proc.start()
    try:
        fleet = TlsFleet(proc)
        assert len(fleet.settings) == 6, proc.output[:10]
        assert sorted(fleet.main_settings) == list(ZONES), proc.output[:10]
        yield fleet
    finally:
        code = proc.stop()
        assert code == 0, "zonefleet up did not stop cleanly:\n" + "".join(proc.output[-40:])


def test_sasl_ssl_produce_and_mtls_consume_across_zones(tls_fleet: TlsFleet) -> None:
    round_trip(tls_fleet.conf("az1", "SASL_SSL"), tls_fleet.conf("az2", "SSL"), 40)
    round_trip(tls_fleet.conf("az3", "SSL"), tls_fleet.conf("az3", "SASL_SSL"), 40)


def test_sasl_ssl_at_the_mains(tls_fleet: TlsFleet) -> None:
    """Each main's SASL_SSL listener (+7): a round trip bootstrapped at a main, read back
    through another main, and Metadata there naming every node by its SASL_SSL address."""
    az1, az2 = tls_fleet.main_settings["az1"], tls_fleet.main_settings["az2"]
    round_trip(az1, az2, 40)
    brokers = AdminClient(az1).list_topics(timeout=10).brokers
    ports = {b.port for b in brokers.values()}
    main_port = int(az1["bootstrap.servers"].rsplit(":", 1)[1])
    assert ports == {main_port, tls_fleet.port("az1", "SASL_SSL")}, brokers


def test_scram_over_tls_with_kcat_kafka_python_and_aiokafka(tls_fleet: TlsFleet) -> None:
    admin = AdminClient(tls_fleet.conf("az1", "SASL_SSL"))
    upsert = UserScramCredentialUpsertion(
        "dana", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"dana-secret"
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    ca = str(tls_fleet.tls / "ca.pem")
    topic = f"tls-clients-{uuid.uuid4().hex[:8]}"
    kcat = [
        "kcat", "-b", tls_fleet.conf("az2", "SASL_SSL")["bootstrap.servers"],
        "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512",
        "-X", "sasl.username=dana", "-X", "sasl.password=dana-secret",
        "-X", f"ssl.ca.location={ca}",
    ]  # fmt: skip
    # The proxies read SCRAM credentials every few seconds: retry until dana is known.
    deadline = time.monotonic() + 30
    while True:
        done = subprocess.run([*kcat, "-P", "-t", topic], input=b"kc1\n", timeout=60, check=False)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
    assert done.returncode == 0

    from kafka import KafkaConsumer, KafkaProducer

    plain = tls_fleet.settings[("az1", "SASL_SSL")]
    kp = KafkaProducer(
        bootstrap_servers=plain["bootstrap.servers"],
        security_protocol="SASL_SSL",
        ssl_cafile=ca,
        sasl_mechanism="PLAIN",
        sasl_plain_username=plain["sasl.username"],
        sasl_plain_password=plain["sasl.password"],
    )
    kp.send(topic, b"kp1").get(timeout=30)
    kp.close()

    async def aio() -> None:
        from aiokafka import AIOKafkaProducer
        from aiokafka.helpers import create_ssl_context

        producer = AIOKafkaProducer(
            bootstrap_servers=tls_fleet.conf("az3", "SASL_SSL")["bootstrap.servers"],
            security_protocol="SASL_SSL",
            ssl_context=create_ssl_context(cafile=ca),
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="dana",
            sasl_plain_password="dana-secret",
        )
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aio1")
        finally:
            await producer.stop()

    asyncio.run(aio())
    mtls = tls_fleet.settings[("az1", "SSL")]
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=mtls["bootstrap.servers"],
        security_protocol="SSL",
        ssl_cafile=ca,
        ssl_certfile=mtls["ssl.certificate.location"],
        ssl_keyfile=mtls["ssl.key.location"],
        auto_offset_reset="earliest",
        consumer_timeout_ms=20000,
    )
    assert values_read(consumer, 3) == {b"kc1", b"kp1", b"aio1"}


def _refused(conf: dict[str, Any]) -> list[KafkaError]:
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append, "socket.timeout.ms": 5000})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        admin.poll(0.5)
    return errors


def test_wrong_protocol_missing_or_expired_certificate_are_refused(
    tls_fleet: TlsFleet, tmp_path: Path
) -> None:
    proc = tls_fleet.proc
    sasl_ssl = tls_fleet.conf("az1", "SASL_SSL")
    mtls = tls_fleet.conf("az1", "SSL")
    # A plaintext client on the TLS port, a TLS client on the plaintext port.
    assert _refused({"bootstrap.servers": sasl_ssl["bootstrap.servers"]})
    assert _refused(
        {
            "bootstrap.servers": proc.zones["az1"],
            "security.protocol": "SSL",
            "ssl.ca.location": sasl_ssl["ssl.ca.location"],
        }
    )
    # No client certificate on the mTLS listener.
    no_cert = {k: v for k, v in mtls.items() if not k.startswith(("ssl.certificate", "ssl.key"))}
    assert _refused(no_cert)
    # An expired client certificate from the fleet's own CA.
    ca_key = serialization.load_pem_private_key((tls_fleet.tls / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((tls_fleet.tls / "ca.pem").read_bytes())
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    key, cert = issue_certificate(
        ca_key,  # type: ignore[arg-type]
        ca_cert,
        "old-client",
        client=True,
        server=False,
        not_after=past,
    )
    write_certificate(tmp_path / "old.pem", cert)
    write_private_key(tmp_path / "old.key", key)
    expired = {
        **mtls,
        "ssl.certificate.location": str(tmp_path / "old.pem"),
        "ssl.key.location": str(tmp_path / "old.key"),
    }
    assert _refused(expired)
    # The same two through the standard library from their own loopback addresses, so that
    # each refusal's log line is the first from its peer (warnings are rate-limited per peer).
    port = tls_fleet.port("az1", "SSL")
    ca = tls_fleet.tls / "ca.pem"
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(port, ca, "127.0.0.11")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(port, ca, "127.0.0.12", (tmp_path / "old.pem", tmp_path / "old.key"))
    _wait_log(proc, r"TLS handshake with 127\.0\.0\.11:\d+ on listener SSL failed: .*certificate")
    _wait_log(proc, r"TLS handshake with 127\.0\.0\.12:\d+ on listener SSL failed: .*expired")
    assert "Traceback" not in "".join(proc.output)


def _handshake(port: int, ca: Path, source: str, client: tuple[Path, Path] | None = None) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), 5, (source, 0)) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            # TLS 1.3: a refused client certificate shows on the first read.
            tls.sendall(b"\0\0\0\0")
            if tls.recv(1) == b"":
                raise ConnectionError("closed by the proxy")


def _wait_log(proc: FleetProcess, pattern: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, "".join(proc.output)):
        assert time.monotonic() < deadline, f"no log line matching {pattern!r}"
        time.sleep(0.2)


def _serial(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_new_server_certificate_is_used_without_a_restart(tls_fleet: TlsFleet) -> None:
    tls = tls_fleet.tls
    port = tls_fleet.port("az2", "SASL_SSL")
    before = _serial(port, tls / "ca.pem")
    ca_key = serialization.load_pem_private_key((tls / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
    key, cert = issue_certificate(ca_key, ca_cert, "localhost")  # type: ignore[arg-type]
    # Key first, then the certificate: a poll between the two refuses the pair (one line)
    # and keeps the old context; the certificate's write changes the files again.
    write_private_key(tls / "server.key", key)
    write_certificate(tls / "server.pem", cert)
    deadline = time.monotonic() + 30
    while _serial(port, tls / "ca.pem") == before:
        assert time.monotonic() < deadline, "the proxy still serves the old certificate"
        time.sleep(0.5)
    assert _serial(port, tls / "ca.pem") == cert.serial_number
    # Clients keep working on the new certificate.
    round_trip(tls_fleet.conf("az2", "SASL_SSL"), tls_fleet.conf("az2", "SSL"), 5)


def test_internal_rpc_refuses_a_client_without_the_fleet_certificate_or_secret(
    tls_fleet: TlsFleet,
) -> None:
    proc, tls = tls_fleet.proc, tls_fleet.tls
    port = proc.base_port + ZONE_PORT_STRIDE * 2 + MAIN_RPC_OFFSET  # az2's main
    rpc = tls / "rpc"
    _wait_log(proc, rf"rpc: 127\.0\.0\.1:{port} takes mutual TLS only")
    # Round trips through the proxies have gone over it (confirm, state stream, relay).
    round_trip(tls_fleet.conf("az2", "SASL_SSL"), tls_fleet.conf("az3", "SSL"), 5)
    # TLS without a certificate, and with the listeners' client certificate (another CA).
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(port, rpc / "ca.pem", "127.0.0.21")
    admin = (tls / "client-admin.pem", tls / "client-admin.key")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(port, rpc / "ca.pem", "127.0.0.22", admin)
    # Plain TCP: neither side speaks first, the main gives up on the TLS handshake.
    with socket.create_connection(("127.0.0.1", port), 10, ("127.0.0.23", 0)) as raw:
        raw.settimeout(10)
        assert raw.recv(1) == b""
    # The fleet certificate without the secret, then with it.
    settings = RpcTlsSettings(rpc / "node.pem", rpc / "node.key", rpc / "ca.pem")
    secret = tomllib.loads((proc.data_dir / "fleet.toml").read_text())["internal"]["secret"]

    async def calls() -> Any:
        bad = RpcClient(999, b"w" * 32, "127.0.0.1", port, tls=settings)
        with pytest.raises(RpcAuthError, match="refused our credentials"):
            await bad.call("probe", Probe(999).to_wire())
        good = RpcClient(999, secret.encode(), "127.0.0.1", port, tls=settings)
        try:
            return Probe.from_wire(await good.call("probe", Probe(999).to_wire()))
        finally:
            await good.aclose()

    assert trio.run(calls) == Probe(2)
    _wait_log(proc, r"refused connection from 127\.0\.0\.21:\d+: .*PEER_DID_NOT_RETURN")
    _wait_log(proc, r"refused connection from 127\.0\.0\.22:\d+: certificate verify failed")
    _wait_log(proc, r"refused connection from 127\.0\.0\.23:\d+: no TLS handshake within")
    _wait_log(proc, r"refused connection from 127\.0\.0\.1:\d+: client MAC mismatch")
    assert "Traceback" not in "".join(proc.output)
