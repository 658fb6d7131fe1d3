"""Traffic accounting of a main broker: Kafka clients that reach it directly, its internal RPC
with proxies and other mains, and its shared-WAL I/O (the wiring of `telemetry.NodeTraffic`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import trio

from internal_rpc.accounting import RpcTrafficMeter
from kafka_wire.codec import RequestHeader
from kafka_wire.server_loop import ConnectionInfo, KafkaTrafficMeter
from main_broker.config import BrokerConfig
from s3_commit.node_ledger import NodeLedger
from shared_wal import set_io_hook
from telemetry import (
    UNKNOWN_ZONE,
    MetricsRegistry,
    NodeTraffic,
)
from zone_router import ZoneMap, ZoneResolver

__all__ = ["ClientZones", "MainTraffic"]

MAX_CACHED_CLIENTS: Final = 10_000


class ClientZones:
    """The zone of a Kafka client connected straight to a main. A main's listener is not bound
    to a zone, so: a ``client.id`` tag, else the CIDR map, else ``unknown``. Cached per
    (address, client.id), so a request costs one dict lookup."""

    def __init__(self, resolver: ZoneResolver, max_cached: int = MAX_CACHED_CLIENTS) -> None:
        self.resolver = resolver
        self.max_cached = max_cached
        self._cache: dict[tuple[str, str | None], str] = {}

    def __call__(self, header: RequestHeader, conn: ConnectionInfo) -> str:
        key = (conn.peer_host, header.client_id)
        zone = self._cache.get(key)
        if zone is None:
            decision = self.resolver.resolve(
                listener_zone=None, client_id=header.client_id, client_host=conn.peer_host
            )
            zone = decision.zone or UNKNOWN_ZONE
            if len(self._cache) >= self.max_cached:
                self._cache.clear()  # client ids come from clients: keep the map bounded
            self._cache[key] = zone
        return zone


def _zone_map(cfg: BrokerConfig) -> ZoneMap:
    zones: dict[str, str | None] = dict(cfg.zones)
    for zone in [cfg.zone, *cfg.peer_zones.values(), *(m.zone for m in cfg.mains)]:
        zones.setdefault(zone, None)
    return ZoneMap.from_mapping(zones)


class MainTraffic:
    """The meters a main hands to its Kafka listener, RPC server and WAL file system.
    `topic_name(id)` names a topic by its id (Fetch v13+ requests are booked by topic)."""

    def __init__(
        self,
        cfg: BrokerConfig,
        registry: MetricsRegistry,
        topic_name: Callable[[bytes], str | None] = lambda topic_id: None,
    ) -> None:
        self.node = NodeTraffic(
            registry,
            f"main-{cfg.node_id}",
            cfg.zone,
            data_dir=cfg.data_dir,
            storage_zone=cfg.storage_zone,
        )
        unknown = registry.counter(
            "zonefleet_zone_unknown_values_total",
            "client zone values (client.id tags, rack ids) that name no known zone, ignored",
            ["source"],
        )
        resolver = ZoneResolver(
            _zone_map(cfg), cfg.cidrs, on_unknown=lambda source: unknown.labels(source).inc()
        )
        self.client_zones = ClientZones(resolver)
        self.kafka = KafkaTrafficMeter(
            self.node.record, self.node.record_topics, cfg.zone, self.client_zones, topic_name
        )
        node_zones = dict(cfg.peer_zones)
        node_zones.update((m.node_id, m.zone) for m in cfg.mains)
        self.rpc = RpcTrafficMeter(self.node.record, cfg.zone, node_zones)
        self.ledger = NodeLedger(
            self.node,
            registry,
            object_store_url=cfg.object_store_url,
            data_dir=cfg.data_dir,
            upload_interval_s=cfg.ledger_upload_interval_s,
        )

    def attach_wal(self, fs: Any) -> None:
        """Count every WAL read and write this node makes on `fs`."""
        set_io_hook(fs, self.node.wal_io)

    def s3_request(self, op: str, nbytes: int) -> None:
        """An object-store request of this node (see NodeLedger.s3_request)."""
        self.ledger.s3_request(op, nbytes)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The ledger's flusher and uploads, as tasks of the node's nursery."""
        await self.ledger.run(task_status=task_status)

    async def aclose(self) -> None:
        """The final flush and upload, once the node's other tasks have stopped."""
        await self.ledger.aclose()
