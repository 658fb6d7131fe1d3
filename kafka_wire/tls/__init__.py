"""TLS for Kafka listeners (issue "Security: TLS, SASL, ACLs"): the building blocks, without
sockets.

- `context`: `ssl.SSLContext`s from PEM files (`TlsSettings`), TLS 1.2+, Kafka's
  `ssl.client.auth`, and errors that name the file at fault;
- `reload`: `ReloadingContext`, certificate rotation without a restart;
- `dn`: a certificate's subject as the RFC 2253 string Java prints;
- `principal`: Kafka's `ssl.principal.mapping.rules` (KIP-371), from that string to
  `User:<name>`.

`kafka_wire.listeners` puts them on a listener; zone proxies serve SSL and SASL_SSL with them.
"""

from kafka_wire.tls.context import (
    ClientAuth,
    TlsConfigError,
    TlsSettings,
    client_context,
    server_context,
)
from kafka_wire.tls.dn import subject_dn, subject_dn_der
from kafka_wire.tls.principal import (
    ANONYMOUS,
    MappingRule,
    NoMatchingRule,
    PrincipalMappingError,
    SslPrincipalMapper,
    parse_rules,
    ssl_principal,
)
from kafka_wire.tls.reload import ReloadingContext, watch

__all__ = [
    "ANONYMOUS",
    "ClientAuth",
    "MappingRule",
    "NoMatchingRule",
    "PrincipalMappingError",
    "ReloadingContext",
    "SslPrincipalMapper",
    "TlsConfigError",
    "TlsSettings",
    "client_context",
    "parse_rules",
    "server_context",
    "ssl_principal",
    "subject_dn",
    "subject_dn_der",
    "watch",
]
