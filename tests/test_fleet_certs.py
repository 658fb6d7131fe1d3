"""fleet.certs: the throwaway fleet PKI."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleet.certs import generate_ca, issue_certificate, write_fleet_pki, write_private_key
from kafka_wire.tls import TlsSettings, client_context, server_context


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_fleet_pki(tmp_path: Path) -> None:
    pki = write_fleet_pki(
        tmp_path / "pki", hosts=("broker.zf", "10.0.0.7"), clients=("admin", "bob")
    )
    assert sorted(p.name for p in pki.directory.iterdir()) == [
        "ca.key",
        "ca.pem",
        "client-admin.key",
        "client-admin.pem",
        "client-bob.key",
        "client-bob.pem",
        "server.key",
        "server.pem",
    ]
    for key in (pki.ca_key, pki.server.key, *(c.key for c in pki.clients.values())):
        assert _mode(key) == 0o600
        assert isinstance(load_pem_private_key(key.read_bytes(), None), ec.EllipticCurvePrivateKey)

    ca = _cert(pki.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    server = _cert(pki.server.cert)
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["broker.zf"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca

    for name, files in pki.clients.items():
        client = _cert(files.cert)
        client.verify_directly_issued_by(ca)
        cn = client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        assert [a.value for a in cn] == [name]
        eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]

    # The files make contexts as they are.
    server_context(TlsSettings(pki.server.cert, pki.server.key, pki.ca_cert, "required"))
    client_context(pki.ca_cert, pki.clients["bob"].cert, pki.clients["bob"].key)


def test_expired_and_dated_certificates() -> None:
    ca_key, ca_cert = generate_ca("ca", days=1)
    now = datetime.datetime.now(datetime.UTC)
    _, expired = issue_certificate(
        ca_key, ca_cert, "old", not_after=now - datetime.timedelta(hours=1)
    )
    assert expired.not_valid_after_utc < now
    assert expired.not_valid_before_utc < expired.not_valid_after_utc
    start = now + datetime.timedelta(days=2)
    _, future = issue_certificate(
        ca_key, ca_cert, "later", not_before=start, not_after=start + datetime.timedelta(days=1)
    )
    assert future.not_valid_before_utc == start.replace(microsecond=0)
    _, both = issue_certificate(ca_key, ca_cert, "both", client=True, hosts=())
    eku = both.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    with pytest.raises(x509.ExtensionNotFound):
        both.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    with pytest.raises(ValueError, match="client or server"):
        issue_certificate(ca_key, ca_cert, "none", client=False, server=False)


def test_rewrites_replace_files_and_keep_modes(tmp_path: Path) -> None:
    first = write_fleet_pki(tmp_path, clients=())
    serial = _cert(first.server.cert).serial_number
    first.server.key.chmod(0o644)
    second = write_fleet_pki(tmp_path, clients=())
    assert _cert(second.server.cert).serial_number != serial
    assert _mode(second.server.key) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))


def test_encrypted_key(tmp_path: Path) -> None:
    key, _ = generate_ca("ca")
    write_private_key(tmp_path / "k.pem", key, password="pw")
    assert b"ENCRYPTED" in (tmp_path / "k.pem").read_bytes()
    with pytest.raises(TypeError):
        load_pem_private_key((tmp_path / "k.pem").read_bytes(), None)
    load_pem_private_key((tmp_path / "k.pem").read_bytes(), b"pw")


def test_client_names_must_be_file_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="client name"):
        write_fleet_pki(tmp_path, clients=("../evil",))
