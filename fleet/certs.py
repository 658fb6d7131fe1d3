"""Throwaway PKI for a fleet: a CA, a server certificate and client certificates, as PEM files.

For tests and local fleets that want TLS listeners without an operator's PKI. Keys are EC
P-256 (generating one takes microseconds, RSA takes tens of milliseconds), certificates carry
the SANs and extended key usages that Python's `ssl` and Kafka clients check. Nothing here is
meant to protect production traffic: the CA key is written next to the certificates.

Certificates may be made already expired (`not_after` in the past) so that tests can check
that an expired certificate is refused.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CertFiles",
    "FleetPki",
    "generate_ca",
    "issue_certificate",
    "write_certificate",
    "write_fleet_pki",
    "write_internal_pki",
    "write_private_key",
]

DEFAULT_DAYS = 30
# Certificates start a little in the past so that a peer whose clock lags ours by a few
# minutes does not see them as not yet valid.
_BACKDATE = datetime.timedelta(minutes=5)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def generate_ca(
    common_name: str, days: int = DEFAULT_DAYS
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _san(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    client: bool = False,
    server: bool = True,
    days: int = DEFAULT_DAYS,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    subject_prefix: Sequence[x509.NameAttribute] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new key and a leaf certificate for it, signed by `ca_key`.

    `hosts` become the SANs (IP addresses where they parse as one, DNS names otherwise);
    `server` and `client` choose the extended key usages. The subject is `subject_prefix`
    (the most general attributes first, e.g. C, O, OU) followed by CN=`common_name`.
    `not_after` in the past makes an expired certificate; `not_before` then defaults to a
    day before it.
    """
    if not (client or server):
        raise ValueError("a certificate needs at least one of client or server usage")
    key = _new_key()
    now = _now()
    if not_after is None:
        not_after = now + datetime.timedelta(days=days)
    if not_before is None:
        not_before = min(now - _BACKDATE, not_after - datetime.timedelta(days=1))
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    subject = x509.Name([*subject_prefix, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    # A listener that reloads its certificate may read the file at any moment: it must see the
    # old bytes or the new ones, never half of the new.
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask and ignored if tmp existed
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_certificate(path: Path, *certs: x509.Certificate) -> None:
    """Write `certs` (a leaf first, then its chain, if any) as PEM, mode 0644."""
    _write_atomically(
        path, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs), 0o644
    )


def write_private_key(
    path: Path, key: ec.EllipticCurvePrivateKey, password: str | None = None
) -> None:
    """Write `key` as PKCS#8 PEM, mode 0600; encrypted when a password is given."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password is not None
        else serialization.NoEncryption()
    )
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    _write_atomically(path, data, 0o600)


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its private key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class FleetPki:
    """Where `write_fleet_pki` put the fleet's PEM files."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server: CertFiles
    clients: Mapping[str, CertFiles] = field(default_factory=dict)


def write_fleet_pki(
    directory: Path,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    clients: Sequence[str] = ("admin",),
    *,
    days: int = DEFAULT_DAYS,
    ca_name: str = "zonefleet test CA",
) -> FleetPki:
    """A new CA, one server certificate for `hosts` and one client certificate per name in
    `clients` (CN = the name), written under `directory`:

        ca.pem, ca.key, server.pem, server.key, client-<name>.pem, client-<name>.key

    Keys are written mode 0600. Existing files are replaced.
    """
    for name in clients:
        if not name or name != Path(name).name or name.startswith("."):
            raise ValueError(f"client name {name!r} cannot be part of a file name")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = generate_ca(ca_name, days)
    pki_ca_cert, pki_ca_key = directory / "ca.pem", directory / "ca.key"
    write_certificate(pki_ca_cert, ca_cert)
    write_private_key(pki_ca_key, ca_key)

    server_key, server_cert = issue_certificate(
        ca_key, ca_cert, hosts[0] if hosts else "zonefleet", hosts=hosts, days=days
    )
    server = CertFiles(directory / "server.pem", directory / "server.key")
    write_certificate(server.cert, server_cert)
    write_private_key(server.key, server_key)

    client_files: dict[str, CertFiles] = {}
    for name in clients:
        key, cert = issue_certificate(
            ca_key, ca_cert, name, hosts=(), client=True, server=False, days=days
        )
        files = CertFiles(directory / f"client-{name}.pem", directory / f"client-{name}.key")
        write_certificate(files.cert, cert)
        write_private_key(files.key, key)
        client_files[name] = files
    return FleetPki(directory, pki_ca_cert, pki_ca_key, server, client_files)


def write_internal_pki(
    directory: Path,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    *,
    days: int = DEFAULT_DAYS,
    ca_name: str = "zonefleet internal RPC CA",
) -> FleetPki:
    """A CA of its own for internal RPC (so that a Kafka client's certificate from the
    listeners' CA cannot pass its TLS) and one node certificate for `hosts`, with both the
    server and the client usage (a node is both: a main serves proxies and calls mains):

        ca.pem, ca.key, node.pem, node.key

    `FleetPki.server` is the node certificate. Keys are written mode 0600; existing files are
    replaced.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = generate_ca(ca_name, days)
    pki_ca_cert, pki_ca_key = directory / "ca.pem", directory / "ca.key"
    write_certificate(pki_ca_cert, ca_cert)
    write_private_key(pki_ca_key, ca_key)
    key, cert = issue_certificate(
        ca_key, ca_cert, "zonefleet-node", hosts=hosts, client=True, server=True, days=days
    )
    node = CertFiles(directory / "node.pem", directory / "node.key")
    write_certificate(node.cert, cert)
    write_private_key(node.key, key)
    return FleetPki(directory, pki_ca_cert, pki_ca_key, node)
