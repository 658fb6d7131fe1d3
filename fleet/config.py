"""Fleet configuration: one TOML file describes the whole fleet; each node takes its part.

```toml
[fleet]
cluster_id = "zonefleet-local"
data_dir = "data"                 # relative paths are relative to this file
log_format = "text"               # or "json"
log_level = "INFO"

[[zones]]
name = "us-east-1a"
az_id = "use1-az1"

[wal]
url = "osfs://data/wal"           # osfs:// path or mem:// (tests)
segment_bytes = 67108864
retention_bytes = -1              # -1: unbounded
retention_ms = 604800000

[[main_brokers]]
node_id = 1
zone = "us-east-1a"
host = "127.0.0.1"
port = 19092
admin_port = 19093
auto_create_topics = true
num_partitions = 1
wal_cache_bytes = 268435456
group_initial_rebalance_delay_ms = 300

[main_brokers.topic_defaults]     # broker-level defaults of topic configs
"retention.ms" = "604800000"
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from main_broker.config import BrokerConfig
from main_broker.group_coordinator import GroupConfig
from main_broker.topic_config import InvalidConfig, validate_topic_configs
from shared_wal import WalConfig


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


@dataclass
class FleetConfig:
    cluster_id: str
    data_dir: Path
    zones: list[ZoneConfig]
    mains: list[MainBrokerNode]
    log_format: str = "text"
    log_level: str = "INFO"
    source: Path | None = field(default=None)

    def main(self, node_id: int | None) -> MainBrokerNode:
        if node_id is None:
            if not self.mains:
                raise ConfigError("the config defines no [[main_brokers]]")
            return self.mains[0]
        for node in self.mains:
            if node.broker.node_id == node_id:
                return node
        raise ConfigError(f"no main broker with node_id {node_id} in the config")


def _resolve_url(url: str, base: Path) -> str:
    if url.startswith("osfs://"):
        path = Path(url[len("osfs://") :])
        if not path.is_absolute():
            path = base / path
        return f"osfs://{path}"
    return url


def _opt_int(value: Any) -> int | None:
    if value is None or int(value) < 0:
        return None
    return int(value)


def parse_fleet_config(
    doc: dict[str, Any], base_dir: Path, source: Path | None = None
) -> FleetConfig:
    fleet = doc.get("fleet", {})
    cluster_id = str(fleet.get("cluster_id", "zonefleet-local"))
    data_dir = Path(fleet.get("data_dir", "data"))
    if not data_dir.is_absolute():
        data_dir = base_dir / data_dir
    zones = [ZoneConfig(str(z["name"]), z.get("az_id")) for z in doc.get("zones", [])]
    zone_names = {z.name for z in zones}
    wal = doc.get("wal", {})
    wal_url = _resolve_url(str(wal.get("url", f"osfs://{data_dir / 'wal'}")), base_dir)
    mains = []
    for raw in doc.get("main_brokers", []):
        try:
            node_id = int(raw["node_id"])
            zone = str(raw["zone"])
        except KeyError as exc:
            raise ConfigError(f"[[main_brokers]] entry is missing {exc.args[0]}") from None
        if zone_names and zone not in zone_names:
            raise ConfigError(f"main broker {node_id} names unknown zone {zone!r}")
        try:
            topic_defaults = validate_topic_configs(
                {str(k): str(v) for k, v in raw.get("topic_defaults", {}).items()}
            )
        except InvalidConfig as exc:
            raise ConfigError(f"main broker {node_id} topic_defaults: {exc}") from None
        broker = BrokerConfig(
            node_id=node_id,
            zone=zone,
            wal_url=wal_url,
            host=str(raw.get("host", "127.0.0.1")),
            port=int(raw.get("port", 9092)),
            advertised_host=raw.get("advertised_host"),
            advertised_port=raw.get("advertised_port"),
            cluster_id=cluster_id,
            auto_create_topics=bool(raw.get("auto_create_topics", True)),
            num_partitions=int(raw.get("num_partitions", 1)),
            max_request_bytes=int(raw.get("max_request_bytes", 100 * 1024 * 1024)),
            wal_cache_bytes=int(raw.get("wal_cache_bytes", 256 * 1024 * 1024)),
            topic_defaults=topic_defaults,
            wal=WalConfig(
                segment_bytes=int(wal.get("segment_bytes", 64 * 1024 * 1024)),
                retention_bytes=_opt_int(wal.get("retention_bytes", -1)),
                retention_ms=_opt_int(wal.get("retention_ms", 7 * 24 * 3600 * 1000)),
            ),
            groups=GroupConfig(
                group_initial_rebalance_delay_ms=int(
                    raw.get("group_initial_rebalance_delay_ms", 300)
                ),
            ),
        )
        mains.append(
            MainBrokerNode(
                broker,
                str(raw.get("admin_host", broker.host)),
                int(raw.get("admin_port", broker.port + 1)),
            )
        )
    return FleetConfig(
        cluster_id=cluster_id,
        data_dir=data_dir,
        zones=zones or [ZoneConfig(m.broker.zone) for m in mains],
        mains=mains,
        log_format=str(fleet.get("log_format", "text")),
        log_level=str(fleet.get("log_level", "INFO")),
        source=source,
    )


def load_fleet_config(path: str | Path) -> FleetConfig:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_fleet_config(doc, path.resolve().parent, path)


def local_fleet_toml(data_dir: Path, base_port: int, zone: str = "us-east-1a") -> str:
    """The one-node fleet that `zonefleet up` starts."""
    return f"""\
[fleet]
cluster_id = "zonefleet-local"
data_dir = "{data_dir}"

[[zones]]
name = "{zone}"
az_id = "use1-az1"

[wal]
url = "osfs://{data_dir / "wal"}"

[[main_brokers]]
node_id = 1
zone = "{zone}"
host = "127.0.0.1"
port = {base_port}
admin_port = {base_port + 1}
"""
