"""`zonefleet up --tls`: a throwaway CA, certificates and a PLAIN user for a local fleet, so
that SASL_SSL and mTLS can be tried in one command.

Under `<data-dir>/tls/`: the fleet PKI (`fleet/certs.py`: ca.pem, server.pem/.key valid for
localhost and 127.0.0.1, client-admin.pem/.key), `plain.json` (user `admin`, its password
hashed, `kafka_wire/sasl/plain.py`), `admin.password` (0600) and `admin.token` (0600, the
`[admin] token_file`: /status on every admin port needs it as a bearer token). Each zone
proxy gets two named listeners: SASL_SSL on +5 and SSL with required client certificates on
+6; each main a SASL_SSL listener on +7 (offsets from base + 10*K, as
`local_zones_fleet_toml` lays ports out). A certificate's CN is its principal. Both
SASL_SSL listeners have one name, so a client of either gets each node at its SASL_SSL
address (the zone's main for what it leads, the proxy for the rest).

Internal RPC runs over mutual TLS too (`[security] rpc_tls`, internal_rpc/tls.py), with a CA
of its own under `rpc/` (`fleet/certs.py` `write_internal_pki`: ca.pem, ca.key, node.pem and
node.key, the node certificate valid for localhost and 127.0.0.1 as server and client), so
that a Kafka client's certificate cannot pass the RPC ports' TLS.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from fleet.certs import write_fleet_pki, write_internal_pki
from kafka_wire.sasl.plain import dump_credentials, make_credential

__all__ = [
    "MAIN_SASL_SSL_OFFSET",
    "SASL_SSL_OFFSET",
    "SSL_OFFSET",
    "LocalTls",
    "write_local_tls",
]

SASL_SSL_OFFSET: Final = 5
SSL_OFFSET: Final = 6
MAIN_SASL_SSL_OFFSET: Final = 7  # the main's; +8 and +9 stay free
ADMIN: Final = "admin"
# The CN of a client certificate is its principal (User:admin), as the CN rule of Kafka's
# ssl.principal.mapping.rules documentation does.
CN_RULE: Final = "RULE:^CN=([^,]*).*$/$1/,DEFAULT"


@dataclass(frozen=True)
class LocalTls:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    plain_credentials: Path
    admin_password: str = field(repr=False)
    admin_token_file: Path
    admin_token: str = field(repr=False)

    def security_toml(self) -> str:
        return (
            "[security]\n"
            'sasl_enabled_mechanisms = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]\n'
            f'plain_credentials_file = "{self.plain_credentials}"\n'
            f'ssl_certfile = "{self.server_cert}"\n'
            f'ssl_keyfile = "{self.server_key}"\n'
            f'ssl_cafile = "{self.ca}"\n'
            f'ssl_principal_mapping_rules = "{CN_RULE}"\n'
            "rpc_tls = true\n"
            f'rpc_ssl_certfile = "{self.rpc_directory / "node.pem"}"\n'
            f'rpc_ssl_keyfile = "{self.rpc_directory / "node.key"}"\n'
            f'rpc_ssl_cafile = "{self.rpc_directory / "ca.pem"}"\n'
        )

    @property
    def rpc_directory(self) -> Path:
        """The internal RPC PKI: ca.pem, ca.key, node.pem, node.key."""
        return self.directory / "rpc"

    def admin_toml(self) -> str:
        return f'[admin]\ntoken_file = "{self.admin_token_file}"\n'

    def admin_line(self) -> str:
        """What `zonefleet up --tls` prints of the admin token."""
        return (
            f"admin token={self.admin_token} (in {self.admin_token_file}; /status on every "
            "admin port wants the header Authorization: Bearer <token>)"
        )

    @staticmethod
    def proxy_listeners_toml(zone_base: int) -> str:
        return (
            "listeners = [\n"
            f'  {{ name = "SASL_SSL", protocol = "SASL_SSL", '
            f"port = {zone_base + SASL_SSL_OFFSET} }},\n"
            f'  {{ name = "SSL", protocol = "SSL", port = {zone_base + SSL_OFFSET}, '
            'ssl_client_auth = "required" },\n'
            "]\n"
        )

    @staticmethod
    def main_listeners_toml(zone_base: int) -> str:
        return (
            f'listeners = [{{ name = "SASL_SSL", protocol = "SASL_SSL", '
            f"port = {zone_base + MAIN_SASL_SSL_OFFSET} }}]\n"
        )

    def main_client_settings(self, zone_base: int) -> str:
        """librdkafka properties for the SASL_SSL listener of the main of a zone whose ports
        start at `zone_base`."""
        return (
            f"SASL_SSL: bootstrap.servers=127.0.0.1:{zone_base + MAIN_SASL_SSL_OFFSET} "
            f"security.protocol=SASL_SSL sasl.mechanism=PLAIN sasl.username={ADMIN} "
            f"sasl.password={self.admin_password} ssl.ca.location={self.ca}"
        )

    def client_settings(self, zone_base: int) -> list[str]:
        """librdkafka properties for each listener of a zone whose ports start at
        `zone_base`."""
        return [
            f"SASL_SSL: bootstrap.servers=127.0.0.1:{zone_base + SASL_SSL_OFFSET} "
            f"security.protocol=SASL_SSL sasl.mechanism=PLAIN sasl.username={ADMIN} "
            f"sasl.password={self.admin_password} ssl.ca.location={self.ca}",
            f"SSL (mTLS): bootstrap.servers=127.0.0.1:{zone_base + SSL_OFFSET} "
            f"security.protocol=SSL ssl.ca.location={self.ca} "
            f"ssl.certificate.location={self.client_cert} ssl.key.location={self.client_key}",
        ]


def write_local_tls(data_dir: Path) -> LocalTls:
    """New material under `<data_dir>/tls` (replacing an earlier run's)."""
    directory = data_dir / "tls"
    pki = write_fleet_pki(directory, ("localhost", "127.0.0.1"), (ADMIN,))
    password = secrets.token_urlsafe(18)
    plain = directory / "plain.json"
    plain.write_bytes(dump_credentials({ADMIN: make_credential(password)}))
    _write_secret(directory / "admin.password", password)
    token = secrets.token_urlsafe(32)
    _write_secret(directory / "admin.token", token)
    write_internal_pki(directory / "rpc", ("localhost", "127.0.0.1"))
    client = pki.clients[ADMIN]
    return LocalTls(
        directory,
        pki.ca_cert,
        pki.server.cert,
        pki.server.key,
        client.cert,
        client.key,
        plain,
        password,
        directory / "admin.token",
        token,
    )


def _write_secret(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file left by an earlier run
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
