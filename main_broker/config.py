"""Configuration of one main broker, as fleet hands it over (fleet parses the TOML)."""

from __future__ import annotations

from dataclasses import dataclass, field

from main_broker.group_coordinator import GroupConfig
from shared_wal import WalConfig


@dataclass
class BrokerConfig:
    node_id: int
    zone: str
    wal_url: str
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    cluster_id: str = "zonefleet"
    # Internal RPC for zone proxies (confirms, state stream, relays); off when rpc_port is None.
    rpc_port: int | None = None
    rpc_secret: bytes | None = None
    writer_id: str | None = None
    auto_create_topics: bool = True
    num_partitions: int = 1
    max_request_bytes: int = 100 * 1024 * 1024  # socket.request.max.bytes
    max_in_flight_per_connection: int = 64
    wal_cache_bytes: int = 256 * 1024 * 1024
    topic_defaults: dict[str, str] = field(default_factory=dict)
    wal: WalConfig = field(default_factory=WalConfig)
    groups: GroupConfig = field(default_factory=GroupConfig)

    @property
    def wal_writer_id(self) -> str:
        return self.writer_id or f"main-{self.node_id}"

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)
