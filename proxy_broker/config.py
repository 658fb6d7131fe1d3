"""Configuration of one zone proxy, as fleet hands it over."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from internal_rpc.tls import RpcTlsSettings
from kafka_wire.listeners import ListenerConfig
from kafka_wire.sasl.gate import SaslSettings
from kafka_wire.tls import TlsSettings
from proxy_broker.access import AclSettings
from shared_wal import WalConfig
from telemetry import REGIONAL_ZONE
from telemetry.ledger_upload import DEFAULT_UPLOAD_INTERVAL_S


@dataclass(frozen=True)
class MainEndpoint:
    node_id: int
    zone: str
    host: str
    kafka_port: int
    rpc_port: int
    # Named listeners besides kafka_port: (name, advertised host, advertised port).
    listeners: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class ProxyEndpoint:
    node_id: int
    zone: str
    host: str
    kafka_port: int
    listeners: tuple[tuple[str, str, int], ...] = ()


@dataclass
class ProxyConfig:
    node_id: int
    zone: str
    wal_url: str
    rpc_secret: bytes
    mains: list[MainEndpoint]
    rpc_tls: RpcTlsSettings | None = None  # internal RPC over mutual TLS (internal_rpc/tls.py)
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    # Named listeners besides `port` (kafka_wire/listeners.py), and what their security
    # protocols need: SASL settings, TLS material and the mTLS principal mapping rules.
    listeners: list[ListenerConfig] = field(default_factory=list)
    sasl: SaslSettings = field(default_factory=SaslSettings)
    tls: TlsSettings | None = None
    ssl_principal_mapping_rules: str | None = None  # Kafka's; None: DEFAULT (the whole DN)
    acl: AclSettings = field(default_factory=AclSettings)  # proxy_broker/access.py
    # Other zones' proxies, so clients of unknown zone can be pointed at them (KIP-392).
    peers: list[ProxyEndpoint] = field(default_factory=list)
    zones: dict[str, str | None] = field(default_factory=dict)  # zone name -> AZ id
    max_request_bytes: int = 100 * 1024 * 1024
    max_in_flight_per_connection: int = 64
    # Kafka's max.connections, max.connections.per.ip (0: no limit) and
    # connections.max.idle.ms (kafka_wire/connection_limits.py, kafka_wire/server_loop.py).
    max_connections: int = 0
    max_connections_per_ip: int = 0
    connections_max_idle_s: float = 600.0
    # Request bytes one connection may have read but not answered; past them its socket is not
    # read until answers go out (0: max_request_bytes; set on the node's ConnectionLimits).
    max_in_flight_bytes_per_connection: int = 0
    mirror_cache_bytes: int = 256 * 1024 * 1024
    confirm_timeout_s: float = 10.0
    # Confirm calls outstanding per main (proxy_broker/confirm_pipe.py); 1 turns pipelining off.
    confirm_max_in_flight: int = 4
    wal: WalConfig = field(default_factory=WalConfig)
    # Retention of this proxy's PREPARED segments (proxy_broker/prepared_trim.py), in place of
    # the WAL's byte and time budgets. A segment goes once every main's links floor is past it
    # and it was sealed `prepared_min_age_s` ago: a payload is linked within a confirm's life
    # (queue, then at most two calls of `confirm_timeout_s`), so a floor older than the link
    # cannot free it. While a main is unreachable or not yet synced, only segments sealed
    # `prepared_retention_s` ago go (still below every floor a main last reported): their
    # payloads were never confirmed, or the main has been gone that long. An hour is far past
    # any producer's delivery timeout (2 min by default) and a main's upload interval (60 s),
    # yet lets a main be away through a restart or an upgrade before its payloads are at risk.
    prepared_min_age_s: float = 60.0
    prepared_retention_s: float | None = 3600.0
    # The mains' object store (proxy_broker/object_reads.py): offsets a mirror no longer holds
    # in the WAL are read from the objects the mains' manifests list. None: WAL only.
    object_store_url: str | None = None
    object_cache_bytes: int = 64 * 1024 * 1024  # LRU of DataBlocks, shared by every mirror
    # The cluster metadata store, where this proxy registers itself (zone, endpoint) and
    # heartbeats (s3_commit/node_registry.py). None: not registered.
    metadata_url: str | None = None
    registration_interval_s: float = 5.0
    session_timeout_s: float = 18.0
    # Traffic accounting (proxy_broker/accounting.py): JSONL under data_dir/accounting (None:
    # Prometheus only) and the zone the shared FS is booked to.
    data_dir: Path | None = None
    storage_zone: str = REGIONAL_ZONE
    # With data_dir and an object store, the closed ledger lines go up this often
    # (s3_commit/ledger_uploads.py; at most 3600 s, so none is more than an hour late).
    ledger_upload_interval_s: float = DEFAULT_UPLOAD_INTERVAL_S

    @property
    def writer_id(self) -> str:
        return f"proxy-{self.node_id}"

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)
