"""Configuration of one main broker, as fleet hands it over (fleet parses the TOML)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from internal_rpc.tls import RpcTlsSettings
from kafka_wire.listeners import ListenerConfig
from kafka_wire.sasl.gate import SaslSettings
from kafka_wire.tls import TlsSettings
from main_broker.group_config import GroupConfig
from shared_wal import WalConfig
from telemetry import REGIONAL_ZONE
from telemetry.ledger_upload import DEFAULT_UPLOAD_INTERVAL_S
from zone_router import Node


def main_writer_id(node_id: int) -> str:
    """A main's WAL writer id, by which the other mains find its WAL to take over from."""
    return f"main-{node_id}"


@dataclass(frozen=True)
class MainPeer:
    """A main broker of the fleet as its peers and clients reach it."""

    node_id: int
    zone: str
    host: str
    port: int
    rpc_port: int | None = None
    # Named listeners besides `port`: (name, advertised host, advertised port).
    listeners: tuple[tuple[str, str, int], ...] = ()


@dataclass
class BrokerConfig:
    node_id: int
    zone: str
    wal_url: str
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
    # With `[security] authorizer = true`: the super users, the only principals the main's
    # own listeners (its plaintext port and its named ones) serve; relayed requests were
    # checked by their proxy (a main enforces no ACLs). None: every principal is served.
    listener_super_users: frozenset[str] | None = None
    cluster_id: str = "zonefleet"
    # Internal RPC for zone proxies (confirms, state stream, relays); off when rpc_port is None.
    rpc_port: int | None = None
    rpc_secret: bytes | None = None
    # Mutual TLS with the fleet's certificates under the HMAC handshake, for the RPC server
    # and this main's clients of the other mains (internal_rpc/tls.py); None: plain TCP.
    rpc_tls: RpcTlsSettings | None = None
    writer_id: str | None = None
    # With several mains: every main of the fleet (this one included) and the object store
    # that holds the cluster metadata document. None: a single main that owns everything.
    mains: list[MainPeer] = field(default_factory=list)
    metadata_url: str | None = None
    metadata_poll_s: float = 0.5
    # Node registrations and the controller lease (main_broker/cluster/controller.py): each
    # heartbeat and lease renewal is one PUT, so these set the fleet's standing S3 request cost.
    registration_interval_s: float = 5.0
    session_timeout_s: float = 18.0  # no heartbeat this long and no clean stop: dead
    # The controller moves a dead main's partitions to live mains (main_broker/cluster/handoff.py).
    reassign_dead_mains: bool = True
    controller_lease_s: float = 15.0
    # The zone proxies: a client that connects straight to a main still gets the view of its
    # zone (its zone's main and proxy only) in Metadata, FindCoordinator and DescribeCluster.
    zone_proxies: list[Node] = field(default_factory=list)
    # After this main starts serving, a zone proxy that has not subscribed yet still counts as
    # live this long: the proxies of before re-subscribe within their 2 s backoff, and until
    # then their zones' clients would be sent to every main (cross-zone) for a moment.
    proxy_resubscribe_grace_s: float = 10.0
    auto_create_topics: bool = True
    num_partitions: int = 1
    max_request_bytes: int = 100 * 1024 * 1024  # socket.request.max.bytes
    max_in_flight_per_connection: int = 64
    # Kafka's max.connections, max.connections.per.ip (0: no limit) and
    # connections.max.idle.ms (kafka_wire/connection_limits.py, kafka_wire/server_loop.py).
    max_connections: int = 0
    max_connections_per_ip: int = 0
    connections_max_idle_s: float = 600.0
    # Request bytes one connection may have read but not answered; past them its socket is not
    # read until answers go out (0: max_request_bytes; set on the node's ConnectionLimits).
    max_in_flight_bytes_per_connection: int = 0
    wal_cache_bytes: int = 256 * 1024 * 1024
    # The object store that holds committed data (main_broker/objects/tier.py); None keeps
    # data only in the WAL. Upload when the committed bytes not yet in objects pass the
    # threshold or the interval has passed since the last upload.
    object_store_url: str | None = None
    upload_threshold_bytes: int = 500 * 1024 * 1024
    upload_interval_s: float = 60.0
    object_cache_bytes: int = 64 * 1024 * 1024  # LRU of DataBlocks read back
    orphan_sweep_interval_s: float = 600.0
    orphan_grace_s: float = 600.0  # an unlisted object younger than this may be in flight
    # Topic retention over objects and DeleteTopics' object removal (main_broker/
    # object_retention.py): how often expired ranges are looked for, and how long an object
    # no manifest lists any more stays for readers of the previous manifest.
    retention_check_interval_s: float = 30.0
    retention_delete_delay_s: float = 10.0
    # Background compaction (main_broker/objects/compaction.py; defaults and why in
    # s3_commit/compaction.py): merge SSOs below the small size, up to the max size per job,
    # every interval; replaced objects are deleted this long after the manifest swap.
    compaction_interval_s: float = 300.0
    compaction_small_object_bytes: int = 32 * 1024 * 1024
    compaction_max_object_bytes: int = 128 * 1024 * 1024
    compaction_delete_delay_s: float = 30.0
    # The log cleaner of compacted topics (main_broker/objects/cleaner.py): Kafka's
    # log.cleaner.enable, log.cleaner.backoff.ms (how often it looks for a partition to clean)
    # and log.cleaner.dedupe.buffer.size (its offset map's budget, 24 bytes a key).
    log_cleaner_enable: bool = True
    log_cleaner_interval_s: float = 15.0
    log_cleaner_dedupe_buffer_bytes: int = 16 * 1024 * 1024
    topic_defaults: dict[str, str] = field(default_factory=dict)
    # Kafka's transaction.max.timeout.ms: the longest transaction.timeout.ms a producer may ask.
    transaction_max_timeout_ms: int = 900_000
    # Kafka's transactional.id.expiration.ms: an id with nothing under way, unused this long,
    # is forgotten (a DEAD `txn` record).
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    wal: WalConfig = field(default_factory=WalConfig)
    groups: GroupConfig = field(default_factory=GroupConfig)
    # Traffic accounting (main_broker/accounting.py): JSONL under data_dir/accounting (None:
    # Prometheus only); the zone the shared FS is booked to; node id -> zone of RPC peers
    # (proxies; mains come from `mains`); zone name -> AZ id and CIDR -> zone, to resolve the
    # zone of Kafka clients that connect directly.
    data_dir: Path | None = None
    storage_zone: str = REGIONAL_ZONE
    # With data_dir and an object store, the closed ledger lines go up this often
    # (s3_commit/ledger_uploads.py; at most 3600 s, so none is more than an hour late).
    ledger_upload_interval_s: float = DEFAULT_UPLOAD_INTERVAL_S
    peer_zones: dict[int, str] = field(default_factory=dict)
    zones: dict[str, str | None] = field(default_factory=dict)
    cidrs: dict[str, str] = field(default_factory=dict)

    @property
    def wal_writer_id(self) -> str:
        return self.writer_id or main_writer_id(self.node_id)

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)
