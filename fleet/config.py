"""Fleet configuration: one TOML file describes the whole fleet; each node takes its part.

```toml
[fleet]
cluster_id = "zonefleet-local"
data_dir = "data"                 # relative paths are relative to this file
log_format = "text"               # or "json"
log_level = "INFO"
imds_url = "http://169.254.169.254"   # where nodes with zone = "auto" ask for their zone
                                      # (AWS_EC2_METADATA_SERVICE_ENDPOINT overrides it)
storage_zone = "regional"         # zone the shared FS / object store traffic is booked to

[[zones]]
name = "us-east-1a"
az_id = "use1-az1"

[internal]                        # shared secret of the internal RPC (mains <-> proxies)
secret = "..."                    # or: secret_file = "secret.txt"
                                  # mutual TLS under it: [security] rpc_tls = true, with
                                  # rpc_ssl_certfile, rpc_ssl_keyfile, rpc_ssl_cafile (default:
                                  # the ssl_* ones) and rpc_ssl_check_hostname (docs/security.md)

[admin]                           # every node's admin HTTP endpoint (docs/security.md)
host = "127.0.0.1"                # its bind address (default: the node's host; a node's
                                  # own admin_host wins)
token = "..."                     # or: token_file = "admin.token". With a token, /status and
                                  # every path but /healthz and /metrics need the header
                                  # Authorization: Bearer <token> (else 401)

[security]                        # TLS, SASL, ACLs: docs/security.md
audit_log = "data/audit/{node}.jsonl"  # JSON lines of security events, {node} = main-1,
                                  # proxy-101 (default <data_dir>/audit/{node}.jsonl;
                                  # "" or false: off); docs/formats.md, "Audit log"

[cidrs]                           # client networks -> zone (or [[cidrs]] cidr = ..., zone = ...)
"10.0.0.0/20" = "us-east-1a"

[wal]
url = "osfs://data/wal"           # osfs:// path or mem:// (tests)
segment_bytes = 67108864
retention_bytes = -1              # -1: unbounded
retention_ms = 604800000
max_bytes = -1                    # cap on one writer's WAL; at it, Produce answers the retriable
                                  # KAFKA_STORAGE_ERROR until uploads and trimming free space
                                  # (-1: no cap)

[metadata]                        # topics, assignment, node registrations, controller lease
url = "file://data/metadata"      # or s3://...; default with several mains: <data_dir>/metadata
poll_interval_s = 0.5             # how often each main re-reads the metadata document
registration_interval_s = 5.0     # node heartbeat (one PUT each); the lease renews every third
session_timeout_s = 18.0          # of controller_lease_s; a node silent this long is dead
controller_lease_s = 15.0
reassign_dead_mains = true        # the controller moves a dead main's partitions to live mains

[storage]                         # committed data in S3 objects (absent: WAL only)
object_store = "file://data/objects"  # or s3://bucket/prefix?endpoint=...&region=...
upload_threshold_bytes = 524288000    # upload when this much committed data is not in S3
upload_interval_s = 60.0              # ... or when this long has passed since the last upload
object_cache_bytes = 67108864         # LRU of DataBlocks read back from objects (per node)
retention_check_interval_s = 30.0     # how often topic retention (retention.ms/.bytes) runs
retention_delete_delay_s = 10.0       # an expired or deleted topic's object stays this long
orphan_sweep_interval_s = 600.0       # delete objects no manifest lists (a crashed upload) ...
orphan_grace_s = 600.0                # ... once they are this old (younger: may be in flight)
compaction_interval_s = 300.0         # merge small StreamSetObjects, split large shares
compaction_small_object_bytes = 33554432   # an SSO below this is merged with others
compaction_max_object_bytes = 134217728    # at most this much per compaction job
compaction_delete_delay_s = 30.0      # replaced objects go this long after the swap
log_cleaner_enable = true             # clean compacted topics' objects (log.cleaner.enable)
log_cleaner_interval_s = 15.0         # how often it looks for a partition to clean
log_cleaner_dedupe_buffer_bytes = 16777216  # its offset map (24 bytes a key), per main

[accounting]                      # traffic ledgers, <data_dir>/accounting/dt=YYYY-MM-DD/*.jsonl
upload_interval_s = 600.0         # with a [storage] object_store, each node uploads its closed
                                  # ledger lines to it (accounting/ keys) this often, at start
                                  # and at a clean stop; at most 3600 (an hour late at most)

[[main_brokers]]
node_id = 1
zone = "us-east-1a"               # a zone name or AZ id; "auto" or absent: ask EC2 IMDSv2
host = "127.0.0.1"
port = 19092
admin_port = 19093
rpc_port = 19094                  # internal RPC; required when the fleet has proxies
listeners = [                     # named listeners besides `port` (PLAINTEXT), with the
  { name = "SASL_SSL", protocol = "SASL_SSL", port = 19097 },   # [security] settings; also
]                                 # host, advertised_host, advertised_port, ssl_client_auth.
                                  # Clients of one get every node at its address on the
                                  # listener of that name (docs/security.md); with [security]
                                  # authorizer = true they serve super users only
auto_create_topics = true
num_partitions = 1
wal_cache_bytes = 268435456
group_initial_rebalance_delay_ms = 300
group_min_session_timeout_ms = 6000         # the session.timeout.ms a classic member may ask
group_max_session_timeout_ms = 1800000      # (outside: INVALID_SESSION_TIMEOUT)
group_consumer_session_timeout_ms = 45000   # KIP-848 consumer groups (group.protocol=consumer)
group_consumer_heartbeat_interval_ms = 5000
max_connections = 0                         # Kafka's max.connections (0: no limit)
max_connections_per_ip = 0                  # ... and max.connections.per.ip
connections_max_idle_ms = 600000            # a connection with no request this long closes
max_in_flight_bytes_per_connection = 0      # request bytes one connection may have read but
                                            # not answered (0: max_request_bytes)
transaction_max_timeout_ms = 900000         # the longest transaction.timeout.ms allowed
transactional_id_expiration_ms = 604800000  # an idle transactional id is forgotten after this

[main_brokers.topic_defaults]     # broker-level defaults of topic configs
"retention.ms" = "604800000"

[[proxies]]                       # one per zone
node_id = 101
zone = "us-east-1a"
host = "127.0.0.1"
port = 19102
admin_port = 19103
listeners = [{ name = "SASL_SSL", protocol = "SASL_SSL", port = 19107 }]  # as the mains'
prepared_min_age_s = 60.0         # a PREPARED segment no main's links floor needs goes once
                                  # sealed this long (a confirm's lifetime, with margin)
prepared_retention_s = 3600.0     # ... and, while a main is away or unsynced, one sealed this
                                  # long (still below every floor a main reported; -1: never)
max_connections = 0               # as the main brokers': max.connections (0: no limit),
max_connections_per_ip = 0        # max.connections.per.ip,
connections_max_idle_ms = 600000  # connections.max.idle.ms
max_in_flight_bytes_per_connection = 0  # and unanswered request bytes per connection
```
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet.zone_discovery import DiscoveredZone, discover_zone_blocking, imds_endpoint
from internal_rpc.auth import MIN_SECRET_BYTES
from internal_rpc.tls import RpcTls, RpcTlsSettings
from kafka_wire.listeners import ListenerConfig, ListenerError, parse_listener
from kafka_wire.sasl.gate import SaslSettings
from kafka_wire.sasl.oauthbearer import OAuthBearerSettings
from kafka_wire.tls import TlsConfigError, TlsSettings
from main_broker.config import BrokerConfig, MainPeer
from main_broker.group_config import GroupConfig
from main_broker.topic_config import InvalidConfig, validate_topic_configs
from proxy_broker.access import AclSettings
from proxy_broker.config import MainEndpoint, ProxyConfig, ProxyEndpoint
from shared_wal import WalConfig
from telemetry.ledger_upload import DEFAULT_UPLOAD_INTERVAL_S, MAX_UPLOAD_INTERVAL_S
from zone_router import Node

AUTO_ZONE = "auto"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})

# Looks up this host's zone from IMDS at the given base URL: (zone name, AZ id) or None.
ZoneDiscovery = Callable[[str], tuple[str, str | None] | None]


class ConfigError(ValueError):
    pass


@dataclass
class ZoneConfig:
    name: str
    az_id: str | None = None


@dataclass
class MainBrokerNode:
    broker: BrokerConfig
    admin_host: str
    admin_port: int
    admin_token: str | None = field(default=None, repr=False)  # [admin] token
    audit_log: str | None = None  # [security] audit_log ({node} unreplaced); None: off


@dataclass
class ProxyNode:
    proxy: ProxyConfig
    admin_host: str
    admin_port: int
    admin_token: str | None = field(default=None, repr=False)  # [admin] token
    audit_log: str | None = None  # [security] audit_log ({node} unreplaced); None: off


@dataclass(frozen=True)
class FleetNode:
    """What `zonefleet status` needs to know of any node."""

    node_id: int
    role: str  # "main" or "proxy"
    zone: str
    admin_host: str
    admin_port: int
    admin_token: str | None = field(default=None, repr=False, compare=False)


@dataclass
class FleetConfig:
    cluster_id: str
    data_dir: Path
    zones: list[ZoneConfig]
    mains: list[MainBrokerNode]
    proxies: list[ProxyNode] = field(default_factory=list)
    cidrs: dict[str, str] = field(default_factory=dict)  # network -> zone name
    internal_secret: bytes | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    source: Path | None = field(default=None)
    # Set when a node's zone came from IMDSv2 (`zone = "auto"`): what it found, and where.
    discovered_zone: DiscoveredZone | None = None

    def main(self, node_id: int | None) -> MainBrokerNode:
        if node_id is None:
            if not self.mains:
                raise ConfigError("the config defines no [[main_brokers]]")
            return self.mains[0]
        for node in self.mains:
            if node.broker.node_id == node_id:
                return node
        raise ConfigError(f"no main broker with node_id {node_id} in the config")

    def proxy(self, node_id: int | None) -> ProxyNode:
        if node_id is None:
            if not self.proxies:
                raise ConfigError("the config defines no [[proxies]]")
            return self.proxies[0]
        for node in self.proxies:
            if node.proxy.node_id == node_id:
                return node
        raise ConfigError(f"no proxy with node_id {node_id} in the config")

    def nodes(self) -> list[FleetNode]:
        out = [
            FleetNode(
                m.broker.node_id,
                "main",
                m.broker.zone,
                m.admin_host,
                m.admin_port,
                m.admin_token,
            )
            for m in self.mains
        ]
        out += [
            FleetNode(
                p.proxy.node_id,
                "proxy",
                p.proxy.zone,
                p.admin_host,
                p.admin_port,
                p.admin_token,
            )
            for p in self.proxies
        ]
        return out


def _resolve_url(url: str, base: Path) -> str:
    if url.startswith("osfs://"):
        path = Path(url[len("osfs://") :])
        if not path.is_absolute():
            path = base / path
        return f"osfs://{path}"
    if url.startswith("file://") and not url[len("file://") :].startswith("/"):
        return f"file://{base / url[len('file://') :]}"  # relative to the config file
    return url


def _opt_int(value: Any) -> int | None:
    if value is None or int(value) < 0:
        return None
    return int(value)


def _opt_float(value: Any) -> float | None:
    if value is None or float(value) < 0:
        return None
    return float(value)


class _Zones:
    """Zone names as the config spells them (name or AZ id), mapped to the [[zones]] names."""

    def __init__(
        self, zones: list[ZoneConfig], discover: ZoneDiscovery | None, imds_url: str
    ) -> None:
        self.zones = zones
        self._discover = discover
        self._imds_url = imds_url
        self._local: str | None = None
        self.discovered: DiscoveredZone | None = None

    def _match(self, value: str) -> str | None:
        for zone in self.zones:
            if value in (zone.name, zone.az_id):
                return zone.name
        return None

    def canonical(self, value: str, what: str) -> str:
        if not self.zones:
            return value
        name = self._match(value)
        if name is None:
            known = ", ".join(z.name for z in self.zones)
            raise ConfigError(f"{what} names unknown zone {value!r} (the [[zones]] are {known})")
        return name

    def of_node(self, raw: dict[str, Any], what: str) -> str:
        value = raw.get("zone")
        if value is None or str(value) == AUTO_ZONE:
            return self._local_zone(what)
        return self.canonical(str(value), what)

    def _local_zone(self, what: str) -> str:
        if self._discover is None:
            return AUTO_ZONE  # left unresolved on purpose (e.g. `zonefleet status`)
        if self._local is not None:
            return self._local
        found = self._discover(self._imds_url)
        if found is None:
            raise ConfigError(
                f"{what} has no zone and none could be discovered: no EC2 instance metadata "
                f'(IMDSv2) answered at {self._imds_url}; set zone = "..." in its entry'
            )
        name, az_id = found
        self.discovered = DiscoveredZone(name, az_id, self._imds_url)
        if not self.zones:
            self.zones.append(ZoneConfig(name, az_id))
            self._local = name
            return name
        match = self._match(name) or (self._match(az_id) if az_id else None)
        if match is None:
            known = ", ".join(z.name for z in self.zones)
            raise ConfigError(
                f"{what}: this host is in zone {name!r} (AZ id {az_id}), "
                f"which is not one of the [[zones]] ({known})"
            )
        self._local = match
        return match


def _connection_limits(raw: dict[str, Any]) -> dict[str, Any]:
    """A node's max_connections, max_connections_per_ip (0: no limit) and
    connections_max_idle_ms (0: never idle), as Kafka's, and the request bytes one connection
    may have under way, max_in_flight_bytes_per_connection (0: max_request_bytes)."""
    limits = {
        "max_connections": int(raw.get("max_connections", 0)),
        "max_connections_per_ip": int(raw.get("max_connections_per_ip", 0)),
        "connections_max_idle_s": int(raw.get("connections_max_idle_ms", 600_000)) / 1000,
        "max_in_flight_bytes_per_connection": int(raw.get("max_in_flight_bytes_per_connection", 0)),
    }
    if any(value < 0 for value in limits.values()):
        raise ConfigError(f"connection limits may not be negative: {limits}")
    return limits


def _internal_secret(doc: dict[str, Any], base_dir: Path) -> bytes | None:
    internal = doc.get("internal", {})
    secret, secret_file = internal.get("secret"), internal.get("secret_file")
    if secret is not None and secret_file is not None:
        raise ConfigError("[internal] takes secret or secret_file, not both")
    if secret_file is not None:
        path = Path(str(secret_file))
        if not path.is_absolute():
            path = base_dir / path
        try:
            secret = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read [internal] secret_file {path}: {exc}") from None
    if secret is None:
        return None
    value = str(secret).encode()
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"the [internal] secret is too short ({len(value)} bytes; at least "
            f"{MIN_SECRET_BYTES}, e.g. python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return value


def _cidrs(doc: dict[str, Any], zones: _Zones) -> dict[str, str]:
    raw = doc.get("cidrs", {})
    if isinstance(raw, dict):
        pairs = [(str(k), str(v)) for k, v in raw.items()]
    else:
        try:
            pairs = [(str(e["cidr"]), str(e["zone"])) for e in raw]
        except (KeyError, TypeError):
            raise ConfigError("each [[cidrs]] entry needs cidr and zone") from None
    out: dict[str, str] = {}
    for cidr, zone in pairs:
        try:
            network = str(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            raise ConfigError(f"cidrs: {cidr!r} is not a CIDR block") from None
        if network in out:
            raise ConfigError(f"cidrs: {network} is listed twice")
        out[network] = zones.canonical(zone, f"cidr {network}")
    return out


def _node_id(raw: dict[str, Any], section: str) -> int:
    try:
        return int(raw["node_id"])
    except KeyError:
        raise ConfigError(f"[[{section}]] entry is missing node_id") from None


def _parse_main(
    raw: dict[str, Any],
    zones: _Zones,
    cluster_id: str,
    wal_url: str,
    wal: WalConfig,
    secret: bytes | None,
) -> MainBrokerNode:
    node_id = _node_id(raw, "main_brokers")
    zone = zones.of_node(raw, f"main broker {node_id}")
    try:
        topic_defaults = validate_topic_configs(
            {str(k): str(v) for k, v in raw.get("topic_defaults", {}).items()}
        )
    except InvalidConfig as exc:
        raise ConfigError(f"main broker {node_id} topic_defaults: {exc}") from None
    min_session = int(raw.get("group_min_session_timeout_ms", 6000))
    max_session = int(raw.get("group_max_session_timeout_ms", 1_800_000))
    if not 0 <= min_session <= max_session:
        raise ConfigError(
            f"main broker {node_id} needs 0 <= group_min_session_timeout_ms "
            f"({min_session}) <= group_max_session_timeout_ms ({max_session})"
        )
    txn_max_timeout = int(raw.get("transaction_max_timeout_ms", 900_000))
    txn_expiration = int(raw.get("transactional_id_expiration_ms", 7 * 24 * 3600 * 1000))
    if txn_max_timeout <= 0 or txn_expiration <= 0:
        raise ConfigError(
            f"main broker {node_id} needs transaction_max_timeout_ms and "
            "transactional_id_expiration_ms above 0"
        )
    rpc_port = raw.get("rpc_port")
    if rpc_port is not None and secret is None:
        raise ConfigError(
            f"main broker {node_id} has an rpc_port but the config has no [internal] secret"
        )
    broker = BrokerConfig(
        node_id=node_id,
        zone=zone,
        host=str(raw.get("host", "127.0.0.1")),
        port=int(raw.get("port", 9092)),
        advertised_host=raw.get("advertised_host"),
        advertised_port=raw.get("advertised_port"),
        rpc_port=None if rpc_port is None else int(rpc_port),
        rpc_secret=secret if rpc_port is not None else None,
        auto_create_topics=bool(raw.get("auto_create_topics", True)),
        num_partitions=int(raw.get("num_partitions", 1)),
        max_request_bytes=int(raw.get("max_request_bytes", 100 * 1024 * 1024)),
        **_connection_limits(raw),
        wal_cache_bytes=int(raw.get("wal_cache_bytes", 256 * 1024 * 1024)),
        topic_defaults=topic_defaults,
        groups=GroupConfig(
            group_initial_rebalance_delay_ms=int(raw.get("group_initial_rebalance_delay_ms", 300)),
            group_min_session_timeout_ms=min_session,
            group_max_session_timeout_ms=max_session,
            consumer_session_timeout_ms=int(raw.get("group_consumer_session_timeout_ms", 45000)),
            consumer_heartbeat_interval_ms=int(
                raw.get("group_consumer_heartbeat_interval_ms", 5000)
            ),
        ),
        cluster_id=cluster_id,
        wal_url=wal_url,
        wal=replace(wal),  # each node its own copy: nodes may share one process
        transaction_max_timeout_ms=txn_max_timeout,
        transactional_id_expiration_ms=txn_expiration,
        listeners=_listeners(raw, f"main broker {node_id}"),
    )
    return MainBrokerNode(
        broker,
        str(raw.get("admin_host", broker.host)),
        int(raw.get("admin_port", broker.port + 1)),
    )


def _join_mains(
    mains: list[MainBrokerNode], metadata: dict[str, Any], data_dir: Path, base_dir: Path
) -> str | None:
    """Several mains (or an explicit [metadata] url) share the cluster metadata document;
    returns its store's URL (None: a lone main keeps its topics to itself)."""
    url = metadata.get("url")
    if url is None and len(mains) < 2:
        return None
    url = _resolve_url(str(url or f"file://{data_dir / 'metadata'}"), base_dir)
    peers = [
        MainPeer(
            m.broker.node_id,
            m.broker.zone,
            *m.broker.advertised,
            m.broker.rpc_port,
            _advertised_listeners(m.broker.listeners),
        )
        for m in mains
    ]
    interval = float(metadata.get("registration_interval_s", 5.0))
    timeout = float(metadata.get("session_timeout_s", 18.0))
    lease = float(metadata.get("controller_lease_s", 15.0))
    if not 0 < interval < timeout or lease <= 0:
        raise ConfigError(
            "[metadata] needs 0 < registration_interval_s < session_timeout_s and "
            "controller_lease_s > 0"
        )
    for m in mains:
        m.broker.mains = list(peers)
        m.broker.metadata_url = url
        m.broker.metadata_poll_s = float(metadata.get("poll_interval_s", 0.5))
        m.broker.registration_interval_s = interval
        m.broker.session_timeout_s = timeout
        m.broker.controller_lease_s = lease
        m.broker.reassign_dead_mains = bool(metadata.get("reassign_dead_mains", True))
    return url


def _register_proxies(
    proxies: list[ProxyNode], url: str | None, mains: list[MainBrokerNode]
) -> None:
    """Proxies register in the mains' metadata store, on the mains' heartbeat schedule."""
    if url is None or not mains:
        return
    for p in proxies:
        p.proxy.metadata_url = url
        p.proxy.registration_interval_s = mains[0].broker.registration_interval_s
        p.proxy.session_timeout_s = mains[0].broker.session_timeout_s


def _storage(
    mains: list[MainBrokerNode],
    proxies: list[ProxyNode],
    storage: dict[str, Any],
    base_dir: Path,
) -> None:
    """[storage]: the object store the mains upload committed data to, and when; proxies read
    from it what their WAL mirrors no longer hold."""
    url = storage.get("object_store")
    if url is None:
        return
    url = _resolve_url(str(url), base_dir)
    for p in proxies:
        p.proxy.object_store_url = url
        p.proxy.object_cache_bytes = int(storage.get("object_cache_bytes", 64 * 1024 * 1024))
    for m in mains:
        b = m.broker
        b.object_store_url = url
        b.upload_threshold_bytes = int(storage.get("upload_threshold_bytes", 500 * 1024 * 1024))
        b.upload_interval_s = float(storage.get("upload_interval_s", 60.0))
        b.object_cache_bytes = int(storage.get("object_cache_bytes", 64 * 1024 * 1024))
        if b.upload_threshold_bytes <= 0 or b.upload_interval_s <= 0:
            raise ConfigError("[storage] upload_threshold_bytes and upload_interval_s must be > 0")
        b.retention_check_interval_s = float(storage.get("retention_check_interval_s", 30.0))
        b.retention_delete_delay_s = float(storage.get("retention_delete_delay_s", 10.0))
        if b.retention_check_interval_s <= 0 or b.retention_delete_delay_s < 0:
            raise ConfigError(
                "[storage] retention_check_interval_s must be > 0 and retention_delete_delay_s >= 0"
            )
        _storage_upkeep(b, storage)


def _storage_upkeep(b: BrokerConfig, storage: dict[str, Any]) -> None:
    """[storage] orphan sweep and compaction settings of a main."""
    b.orphan_sweep_interval_s = float(storage.get("orphan_sweep_interval_s", 600.0))
    b.orphan_grace_s = float(storage.get("orphan_grace_s", 600.0))
    b.compaction_interval_s = float(storage.get("compaction_interval_s", 300.0))
    b.compaction_small_object_bytes = int(
        storage.get("compaction_small_object_bytes", 32 * 1024 * 1024)
    )
    b.compaction_max_object_bytes = int(
        storage.get("compaction_max_object_bytes", 128 * 1024 * 1024)
    )
    b.compaction_delete_delay_s = float(storage.get("compaction_delete_delay_s", 30.0))
    b.log_cleaner_enable = bool(storage.get("log_cleaner_enable", True))
    b.log_cleaner_interval_s = float(storage.get("log_cleaner_interval_s", 15.0))
    b.log_cleaner_dedupe_buffer_bytes = int(
        storage.get("log_cleaner_dedupe_buffer_bytes", 16 * 1024 * 1024)
    )
    positive = {
        "orphan_sweep_interval_s": b.orphan_sweep_interval_s,
        "log_cleaner_interval_s": b.log_cleaner_interval_s,
        "compaction_interval_s": b.compaction_interval_s,
        "compaction_small_object_bytes": b.compaction_small_object_bytes,
        "compaction_max_object_bytes": b.compaction_max_object_bytes,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"[storage] {name} must be > 0")
    if b.log_cleaner_dedupe_buffer_bytes < 1024:
        raise ConfigError("[storage] log_cleaner_dedupe_buffer_bytes must be >= 1024")
    if b.orphan_grace_s < 0 or b.compaction_delete_delay_s < 0:
        raise ConfigError("[storage] orphan_grace_s and compaction_delete_delay_s must be >= 0")


def _main_endpoint(node: MainBrokerNode) -> MainEndpoint:
    cfg = node.broker
    if not cfg.rpc_port:
        raise ConfigError(
            f"the fleet has proxies, so main broker {cfg.node_id} needs a fixed rpc_port"
        )
    host, port = cfg.advertised
    return MainEndpoint(
        cfg.node_id, cfg.zone, host, port, cfg.rpc_port, _advertised_listeners(cfg.listeners)
    )


def _parse_proxies(
    raws: list[dict[str, Any]],
    zones: _Zones,
    mains: list[MainBrokerNode],
    secret: bytes | None,
    wal_url: str,
    wal: WalConfig,
) -> list[ProxyNode]:
    if not raws:
        return []
    if secret is None:
        raise ConfigError(
            "the fleet has [[proxies]] but no [internal] secret (secret or secret_file): "
            "proxies and mains authenticate to each other with it"
        )
    if not mains:
        raise ConfigError("the fleet has [[proxies]] but no [[main_brokers]] to confirm to")
    endpoints = [_main_endpoint(m) for m in mains]
    zone_map = {z.name: z.az_id for z in zones.zones}
    nodes: list[ProxyNode] = []
    for raw in raws:
        node_id = _node_id(raw, "proxies")
        zone = zones.of_node(raw, f"proxy {node_id}")
        cfg = ProxyConfig(
            node_id=node_id,
            zone=zone,
            wal_url=wal_url,
            rpc_secret=secret,
            mains=list(endpoints),
            host=str(raw.get("host", "127.0.0.1")),
            port=int(raw.get("port", 9092)),
            advertised_host=raw.get("advertised_host"),
            advertised_port=raw.get("advertised_port"),
            zones=dict(zone_map),
            max_request_bytes=int(raw.get("max_request_bytes", 100 * 1024 * 1024)),
            **_connection_limits(raw),
            mirror_cache_bytes=int(raw.get("mirror_cache_bytes", 256 * 1024 * 1024)),
            confirm_timeout_s=float(raw.get("confirm_timeout_s", 10.0)),
            prepared_min_age_s=float(raw.get("prepared_min_age_s", 60.0)),
            prepared_retention_s=_opt_float(raw.get("prepared_retention_s", 3600.0)),
            wal=replace(wal),
            listeners=_listeners(raw, f"proxy {node_id}"),
        )
        nodes.append(
            ProxyNode(
                cfg, str(raw.get("admin_host", cfg.host)), int(raw.get("admin_port", cfg.port + 1))
            )
        )
    seen_zones: dict[str, int] = {}
    for node in nodes:
        cfg = node.proxy
        if cfg.zone != AUTO_ZONE and cfg.zone in seen_zones:
            raise ConfigError(
                f"proxies {seen_zones[cfg.zone]} and {cfg.node_id} are both in zone "
                f"{cfg.zone!r}: one proxy per zone"
            )
        seen_zones[cfg.zone] = cfg.node_id
        cfg.peers = [
            ProxyEndpoint(
                p.node_id,
                p.zone,
                *p.advertised,
                _advertised_listeners(p.listeners),
            )
            for p in (other.proxy for other in nodes)
            if p.node_id != cfg.node_id
        ]
    return nodes


def _listeners(raw: dict[str, Any], where: str) -> list[ListenerConfig]:
    """A node's named listeners: `listeners = [{name, protocol, port, ...}, ...]`."""
    host = str(raw.get("host", "127.0.0.1"))
    try:
        out = [parse_listener(dict(lst), where, host) for lst in raw.get("listeners", [])]
    except (ListenerError, TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    names = [lst.name for lst in out]
    if len(set(names)) != len(names) or "kafka" in names:
        raise ConfigError(f"{where}: listener names must be unique and not 'kafka'")
    return out


def _advertised_listeners(listeners: list[ListenerConfig]) -> tuple[tuple[str, str, int], ...]:
    """(name, advertised host, advertised port) of each named listener, as peers list it."""
    return tuple((lst.name, *lst.advertised()) for lst in listeners)


def _security(
    mains: list[MainBrokerNode], proxies: list[ProxyNode], raw: dict[str, Any], base_dir: Path
) -> None:
    """[security]: SASL mechanisms, the PLAIN credentials file, connections.max.reauth.ms,
    TLS material, the authorizer; for the named listeners of every node."""
    mechanisms = tuple(raw.get("sasl_enabled_mechanisms", ("SCRAM-SHA-512", "SCRAM-SHA-256")))
    known = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"}
    unknown = [m for m in mechanisms if m not in known]
    if unknown or not mechanisms:
        raise ConfigError(
            f"[security] sasl_enabled_mechanisms {list(mechanisms)}: each one of {sorted(known)}"
        )
    plain_file = raw.get("plain_credentials_file")
    if "PLAIN" in mechanisms and plain_file is None:
        raise ConfigError(
            "[security] PLAIN needs plain_credentials_file (kafka_wire/sasl/plain.py)"
        )
    settings = SaslSettings(
        mechanisms=mechanisms,
        plain_credentials_file=None if plain_file is None else str(base_dir / str(plain_file)),
        reauth_ms=int(raw.get("connections_max_reauth_ms", 0)),
        failed_delay_ms=int(raw.get("connection_failed_authentication_delay_ms", 100)),
        oauthbearer=_oauthbearer(raw) if "OAUTHBEARER" in mechanisms else None,
    )
    tls = _tls_settings(raw, base_dir)
    rules = raw.get("ssl_principal_mapping_rules")
    super_users = raw.get("super_users", [])
    if not isinstance(super_users, list) or not all(
        isinstance(u, str) and ":" in u for u in super_users
    ):
        raise ConfigError('[security] super_users is a list of principals ("User:admin")')
    acl = AclSettings(
        enabled=bool(raw.get("authorizer", False)),
        super_users=frozenset(super_users),
        allow_everyone_if_no_acl_found=bool(raw.get("allow_everyone_if_no_acl_found", False)),
    )
    for p in proxies:
        p.proxy.acl = acl
        p.proxy.sasl = settings
        p.proxy.tls = tls
        p.proxy.ssl_principal_mapping_rules = None if rules is None else str(rules)
        if acl.enabled:
            # A main enforces no ACLs: its named listeners serve super users only (below), so
            # the proxies send their clients to none of them; they reach every main through
            # their proxy, which checks the ACLs.
            p.proxy.mains = [replace(e, listeners=()) for e in p.proxy.mains]
    for m in mains:
        m.broker.sasl = settings
        m.broker.tls = tls
        m.broker.ssl_principal_mapping_rules = None if rules is None else str(rules)
        m.broker.listener_super_users = acl.super_users if acl.enabled else None


def _oauthbearer(raw: dict[str, Any]) -> OAuthBearerSettings:
    """[security] sasl_oauthbearer_*: Kafka's KIP-768 broker settings for OAUTHBEARER."""
    url = raw.get("sasl_oauthbearer_jwks_endpoint_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "file:")):
        raise ConfigError(
            "[security] OAUTHBEARER needs sasl_oauthbearer_jwks_endpoint_url "
            "(an http, https or file URL)"
        )
    issuer = raw.get("sasl_oauthbearer_expected_issuer")
    audience = raw.get("sasl_oauthbearer_expected_audience", [])
    audiences = [audience] if isinstance(audience, str) else audience
    claim = raw.get("sasl_oauthbearer_sub_claim_name", "sub")
    if (
        (issuer is not None and not isinstance(issuer, str))
        or not isinstance(audiences, list)
        or not all(isinstance(a, str) and a for a in audiences)
        or not isinstance(claim, str)
        or not claim
    ):
        raise ConfigError(
            "[security] sasl_oauthbearer_expected_issuer and _sub_claim_name are strings, "
            "sasl_oauthbearer_expected_audience a string or a list of them"
        )
    numbers = {  # field: (key, default, least)
        "clock_skew_s": ("sasl_oauthbearer_clock_skew_seconds", 30, 0),
        "jwks_refresh_ms": ("sasl_oauthbearer_jwks_endpoint_refresh_ms", 3_600_000, 1),
        "jwks_min_refresh_ms": ("sasl_oauthbearer_jwks_endpoint_min_refresh_ms", 5_000, 0),
        "jwks_timeout_ms": ("sasl_oauthbearer_jwks_endpoint_timeout_ms", 10_000, 1),
    }
    values: dict[str, int] = {}
    for field_name, (key, default, least) in numbers.items():
        value = raw.get(key, default)
        if type(value) is not int or value < least:
            raise ConfigError(f"[security] {key} is an integer of at least {least}")
        values[field_name] = value
    return OAuthBearerSettings(
        jwks_endpoint_url=url,
        expected_issuer=issuer,
        expected_audiences=tuple(audiences),
        sub_claim_name=claim,
        **values,
    )


def _tls_settings(raw: dict[str, Any], base_dir: Path) -> TlsSettings | None:
    """[security] ssl_certfile, ssl_keyfile (PEM), ssl_cafile, ssl_client_auth,
    ssl_key_password: the TLS material of every SSL and SASL_SSL listener."""
    cert, key = raw.get("ssl_certfile"), raw.get("ssl_keyfile")
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("[security] needs both ssl_certfile and ssl_keyfile, or neither")
    ca = raw.get("ssl_cafile")
    try:
        return TlsSettings(
            cert_file=str(base_dir / str(cert)),
            key_file=str(base_dir / str(key)),
            ca_file=None if ca is None else str(base_dir / str(ca)),
            client_auth=raw.get("ssl_client_auth", "none"),
            key_password=raw.get("ssl_key_password"),
        )
    except ValueError as exc:
        raise ConfigError(f"[security] {exc}") from None


MIN_ADMIN_TOKEN_CHARS = 16


def _admin(
    doc: dict[str, Any], mains: list[MainBrokerNode], proxies: list[ProxyNode], base_dir: Path
) -> None:
    """[admin]: the bind address of every node's admin port (a node's admin_host wins) and
    the bearer token that guards /status (token or token_file; none: open, as before)."""
    raw = dict(doc.get("admin", {}))
    unknown = set(raw) - {"host", "token", "token_file"}
    if unknown:
        raise ConfigError(f"[admin] has unknown keys {sorted(unknown)} (host, token, token_file)")
    token, token_file = raw.get("token"), raw.get("token_file")
    if token is not None and token_file is not None:
        raise ConfigError("[admin] takes token or token_file, not both")
    if token_file is not None:
        path = Path(str(token_file))
        if not path.is_absolute():
            path = base_dir / path
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read [admin] token_file {path}: {exc}") from None
    if token is not None:
        token = str(token)
        if len(token) < MIN_ADMIN_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
            raise ConfigError(
                f"the [admin] token must be at least {MIN_ADMIN_TOKEN_CHARS} printable ASCII "
                "characters without spaces (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
    host = raw.get("host")
    nodes: list[tuple[dict[str, Any], MainBrokerNode | ProxyNode]] = [
        *zip(doc.get("main_brokers", []), mains, strict=True),
        *zip(doc.get("proxies", []), proxies, strict=True),
    ]
    for entry, node in nodes:
        if host is not None and "admin_host" not in entry:
            node.admin_host = str(host)
        node.admin_token = token


def _audit_log(
    mains: list[MainBrokerNode],
    proxies: list[ProxyNode],
    security: dict[str, Any],
    data_dir: Path,
    base_dir: Path,
) -> None:
    """[security] audit_log: the path of each node's audit log, `{node}` standing for the
    node's name (main-1, proxy-101); "" or false: no audit log."""
    raw = security.get("audit_log", str(data_dir / "audit" / "{node}.jsonl"))
    if raw is False or raw == "":
        path = None
    elif isinstance(raw, str):
        path = raw if Path(raw).is_absolute() else str(base_dir / raw)
    else:
        raise ConfigError(f'[security] audit_log is a path, "" or false: {raw!r}')
    for main in mains:
        main.audit_log = path
    for proxy in proxies:
        proxy.audit_log = path


def _rpc_tls(
    mains: list[MainBrokerNode], proxies: list[ProxyNode], raw: dict[str, Any], base_dir: Path
) -> None:
    """[security] rpc_tls = true: internal RPC over mutual TLS, under the HMAC handshake
    (internal_rpc/tls.py). rpc_ssl_certfile, rpc_ssl_keyfile and rpc_ssl_cafile (the fleet CA)
    default to the listeners' ssl_certfile, ssl_keyfile and ssl_cafile, rpc_ssl_key_password
    to ssl_key_password while the key is the listeners'; rpc_ssl_check_hostname (default
    true): a client checks that a main's certificate names the host it dials. The material
    is loaded once here, so that a bad file stops the node with a line that names it."""
    enabled = raw.get("rpc_tls", False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"[security] rpc_tls is true or false, not {enabled!r}")
    if not enabled:
        return
    paths = {
        k: raw.get(f"rpc_{k}", raw.get(k)) for k in ("ssl_certfile", "ssl_keyfile", "ssl_cafile")
    }
    missing = [f"rpc_{k} (or {k})" for k, v in paths.items() if v is None]
    if missing:
        raise ConfigError(
            f"[security] rpc_tls needs {', '.join(missing)}: the node's fleet certificate, its "
            "key and the fleet CA"
        )
    check_hostname = raw.get("rpc_ssl_check_hostname", True)
    if not isinstance(check_hostname, bool):
        raise ConfigError("[security] rpc_ssl_check_hostname is true or false")
    password = raw.get("rpc_ssl_key_password")
    if password is None and "rpc_ssl_keyfile" not in raw:
        password = raw.get("ssl_key_password")
    cert, key, ca = (str(base_dir / str(paths[k])) for k in paths)
    settings = RpcTlsSettings(
        cert, key, ca, None if password is None else str(password), check_hostname
    )
    try:
        RpcTls(settings, server_side=True)
        RpcTls(settings, server_side=False)
    except TlsConfigError as exc:
        raise ConfigError(f"[security] rpc_tls: {exc}") from None
    for m in mains:
        m.broker.rpc_tls = settings
    for p in proxies:
        p.proxy.rpc_tls = settings


def _may_share_a_host(a: str, b: str) -> bool:
    """Whether binds on `a` and `b` would clash on one machine, as far as the file can tell.

    A wildcard bind clashes with every address of its own machine, but a specific address in
    a fleet file may be another machine's: the Terraform layout lists the other zones' proxies
    at their bootstrap addresses while a proxy binds 0.0.0.0 in its own file. So a wildcard
    clashes with wildcards and loopback addresses only, which are surely this machine's.
    """
    if a == b:
        return True
    wild_a, wild_b = a in WILDCARD_HOSTS, b in WILDCARD_HOSTS
    if wild_a and wild_b:
        return True
    if wild_a or wild_b:
        other = b if wild_a else a
        if other == "localhost":
            return True
        try:
            return ipaddress.ip_address(other).is_loopback
        except ValueError:
            return False  # a DNS name: another machine's, as far as we know
    return False


def _check_unique(mains: list[MainBrokerNode], proxies: list[ProxyNode]) -> None:
    ports: list[tuple[str, int, str]] = []
    for m in mains:
        b = m.broker
        ports += [(b.host, b.port, f"main broker {b.node_id} port")]
        ports += [(m.admin_host, m.admin_port, f"main broker {b.node_id} admin_port")]
        if b.rpc_port:
            ports += [(b.host, b.rpc_port, f"main broker {b.node_id} rpc_port")]
        ports += [
            (lst.host, lst.port, f"main broker {b.node_id} listener {lst.name}")
            for lst in b.listeners
        ]
    seen: set[int] = set()
    for node_id in [m.broker.node_id for m in mains] + [p.proxy.node_id for p in proxies]:
        if node_id in seen:
            raise ConfigError(f"node_id {node_id} is used by more than one node")
        seen.add(node_id)
    for p in proxies:
        c = p.proxy
        ports += [(c.host, c.port, f"proxy {c.node_id} port")]
        ports += [(p.admin_host, p.admin_port, f"proxy {c.node_id} admin_port")]
        ports += [
            (lst.host, lst.port, f"proxy {c.node_id} listener {lst.name}") for lst in c.listeners
        ]
    for i, (host, port, what) in enumerate(ports):
        if port == 0:
            continue  # an ephemeral port never clashes
        for other_host, other_port, other in ports[:i]:
            if port == other_port and _may_share_a_host(host, other_host):
                raise ConfigError(f"{what} and {other} are both {host}:{port}")


def _wire_accounting(
    mains: list[MainBrokerNode],
    proxies: list[ProxyNode],
    zones: _Zones,
    cidrs: dict[str, str],
    data_dir: Path,
    storage_zone: str,
) -> None:
    """Traffic accounting: every node writes JSONL under data_dir; mains learn the zones of
    their RPC peers and the client-zone map."""
    zone_map = {z.name: z.az_id for z in zones.zones}
    peer_zones = {p.proxy.node_id: p.proxy.zone for p in proxies}
    for m in mains:
        b = m.broker
        b.data_dir, b.zones, b.cidrs = data_dir, dict(zone_map), dict(cidrs)
        b.peer_zones = {**peer_zones, **{o.broker.node_id: o.broker.zone for o in mains}}
        if storage_zone:
            b.storage_zone = storage_zone
    for p in proxies:
        p.proxy.data_dir = data_dir
        if storage_zone:
            p.proxy.storage_zone = storage_zone


def _ledger_uploads(
    mains: list[MainBrokerNode], proxies: list[ProxyNode], accounting: dict[str, Any]
) -> None:
    """[accounting] upload_interval_s: how often each node uploads its closed ledger lines to
    the [storage] object store (docs/formats.md, "Ledger uploads")."""
    raw = accounting.get("upload_interval_s", DEFAULT_UPLOAD_INTERVAL_S)
    try:
        interval = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"[accounting] upload_interval_s is not a number: {raw!r}") from None
    if not 0 < interval <= MAX_UPLOAD_INTERVAL_S:
        raise ConfigError(
            f"[accounting] upload_interval_s must be > 0 and at most {MAX_UPLOAD_INTERVAL_S:g} "
            f"(no closed minute may reach the object store more than an hour late): {raw!r}"
        )
    for m in mains:
        m.broker.ledger_upload_interval_s = interval
    for p in proxies:
        p.proxy.ledger_upload_interval_s = interval


def parse_fleet_config(
    doc: dict[str, Any],
    base_dir: Path,
    source: Path | None = None,
    *,
    discover: ZoneDiscovery | None = discover_zone_blocking,
) -> FleetConfig:
    """Parse a fleet TOML document.

    Nodes without a zone (or `zone = "auto"`) get this host's zone from `discover`, called at
    most once with the IMDS endpoint (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, else `[fleet]
    imds_url`, else the default); with discover=None their zone stays "auto".
    """
    fleet = doc.get("fleet", {})
    cluster_id = str(fleet.get("cluster_id", "zonefleet-local"))
    data_dir = Path(fleet.get("data_dir", "data"))
    if not data_dir.is_absolute():
        data_dir = base_dir / data_dir
    try:
        declared = [ZoneConfig(str(z["name"]), z.get("az_id")) for z in doc.get("zones", [])]
    except KeyError:
        raise ConfigError("each [[zones]] entry needs a name") from None
    imds_url = fleet.get("imds_url")
    zones = _Zones(declared, discover, imds_endpoint(None if imds_url is None else str(imds_url)))
    secret = _internal_secret(doc, base_dir)
    cidrs = _cidrs(doc, zones)
    wal = doc.get("wal", {})
    wal_url = _resolve_url(str(wal.get("url", f"osfs://{data_dir / 'wal'}")), base_dir)
    wal_config = WalConfig(
        segment_bytes=int(wal.get("segment_bytes", 64 * 1024 * 1024)),
        retention_bytes=_opt_int(wal.get("retention_bytes", -1)),
        retention_ms=_opt_int(wal.get("retention_ms", 7 * 24 * 3600 * 1000)),
        max_bytes=_opt_int(wal.get("max_bytes", -1)),
    )
    mains = [
        _parse_main(raw, zones, cluster_id, wal_url, wal_config, secret)
        for raw in doc.get("main_brokers", [])
    ]
    metadata_url = _join_mains(mains, doc.get("metadata", {}), data_dir, base_dir)
    proxies = _parse_proxies(
        list(doc.get("proxies", [])), zones, mains, secret, wal_url, wal_config
    )
    _security(mains, proxies, dict(doc.get("security", {})), base_dir)
    _rpc_tls(mains, proxies, dict(doc.get("security", {})), base_dir)
    _admin(doc, mains, proxies, base_dir)
    _audit_log(mains, proxies, doc.get("security", {}), data_dir, base_dir)
    _register_proxies(proxies, metadata_url, mains)
    _storage(mains, proxies, doc.get("storage", {}), base_dir)
    zone_proxies = [
        Node(
            p.proxy.node_id,
            p.proxy.zone,
            "proxy",
            *p.proxy.advertised,
            _advertised_listeners(p.proxy.listeners),
        )
        for p in proxies
    ]
    for m in mains:
        m.broker.zone_proxies = list(zone_proxies)
    _check_unique(mains, proxies)
    _wire_accounting(mains, proxies, zones, cidrs, data_dir, str(fleet.get("storage_zone", "")))
    _ledger_uploads(mains, proxies, doc.get("accounting", {}))
    return FleetConfig(
        cluster_id=cluster_id,
        data_dir=data_dir,
        zones=zones.zones or [ZoneConfig(m.broker.zone) for m in mains],
        mains=mains,
        proxies=proxies,
        cidrs=cidrs,
        internal_secret=secret,
        log_format=str(fleet.get("log_format", "text")),
        log_level=str(fleet.get("log_level", "INFO")),
        source=source,
        discovered_zone=zones.discovered,
    )


def load_fleet_config(
    path: str | Path, *, discover: ZoneDiscovery | None = discover_zone_blocking
) -> FleetConfig:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_fleet_config(doc, path.resolve().parent, path, discover=discover)


def local_fleet_toml(data_dir: Path, base_port: int, zone: str = "us-east-1a") -> str:
    """The one-node fleet that `zonefleet up` starts. Its topics live in the cluster metadata
    document and its data in objects, both under data_dir: a restart with only those two
    directories left (the WAL wiped) brings back every topic and every committed record."""
    return f"""\
[fleet]
cluster_id = "zonefleet-local"
data_dir = "{data_dir}"

[[zones]]
name = "{zone}"
az_id = "use1-az1"

[wal]
url = "osfs://{data_dir / "wal"}"

[metadata]
url = "file://{data_dir / "metadata"}"

[storage]
object_store = "file://{data_dir / "objects"}"
upload_threshold_bytes = 524288000
upload_interval_s = 60.0

[[main_brokers]]
node_id = 1
zone = "{zone}"
host = "127.0.0.1"
port = {base_port}
admin_port = {base_port + 1}
"""


# Port layout of `zonefleet up --zones N`, as offsets from --base-port + 10*K for zone K.
ZONE_PORT_STRIDE = 10
PROXY_KAFKA_OFFSET, PROXY_ADMIN_OFFSET = 0, 1
MAIN_KAFKA_OFFSET, MAIN_ADMIN_OFFSET, MAIN_RPC_OFFSET = 2, 3, 4
PROXY_NODE_ID_BASE = 100  # proxy K is node 100+K; main K is node K


def local_zones_fleet_toml(
    data_dir: Path,
    base_port: int,
    zones: int,
    secret: str,
    *,
    security_toml: str = "",
    proxy_listeners: Callable[[int], str] | None = None,
    main_listeners: Callable[[int], str] | None = None,
) -> str:
    """The fleet of `zonefleet up --zones N`: in each zone azK (K = 1..N) a main broker
    (node K) and a zone proxy (node 100+K), sharing one WAL directory and one cluster
    metadata document, with partitions placed across the mains.

    Ports, from base + 10*K: proxy kafka +0, proxy admin +1, main kafka +2, main admin +3,
    main internal RPC +4. So the fleet uses base+10 .. base+10*N+4. `security_toml` (a
    [security] table), `proxy_listeners(zone base port)` and `main_listeners(zone base port)`
    (a proxy's and a main's `listeners = [...]`) add named listeners on +5 .. +9 (`zonefleet
    up --tls`, fleet/local_tls.py).
    """
    if zones < 1:
        raise ConfigError("--zones must be at least 1")
    parts = [
        f"""\
[fleet]
cluster_id = "zonefleet-local"
data_dir = "{data_dir}"

[internal]
secret = "{secret}"

[wal]
url = "osfs://{data_dir / "wal"}"
"""
    ]
    if security_toml:
        parts.append(security_toml)
    for k in range(1, zones + 1):
        parts.append(f'[[zones]]\nname = "az{k}"\naz_id = "use1-az{k}"\n')
    parts.append(f'[metadata]\nurl = "file://{data_dir / "metadata"}"\n')
    parts.append(
        f'[storage]\nobject_store = "file://{data_dir / "objects"}"\n'
        "upload_threshold_bytes = 524288000\nupload_interval_s = 60.0\n"
    )
    for k in range(1, zones + 1):
        base = base_port + ZONE_PORT_STRIDE * k
        parts.append(
            f"""\
[[main_brokers]]
node_id = {k}
zone = "az{k}"
host = "127.0.0.1"
port = {base + MAIN_KAFKA_OFFSET}
admin_port = {base + MAIN_ADMIN_OFFSET}
rpc_port = {base + MAIN_RPC_OFFSET}
"""
            + (main_listeners(base) if main_listeners else "")
        )
    for k in range(1, zones + 1):
        port = base_port + ZONE_PORT_STRIDE * k + PROXY_KAFKA_OFFSET
        parts.append(
            f"""\
[[proxies]]
node_id = {PROXY_NODE_ID_BASE + k}
zone = "az{k}"
host = "127.0.0.1"
port = {port}
admin_port = {port + 1}
"""
            + (proxy_listeners(port - PROXY_KAFKA_OFFSET) if proxy_listeners else "")
        )
    return "\n".join(parts)
