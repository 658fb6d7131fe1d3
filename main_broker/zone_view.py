"""What a client that connects straight to a main sees: its own zone's nodes only.

A main's listener is not bound to a zone, so the client's zone comes from its client.id tag or
the CIDR map (the same resolution traffic accounting uses), and else is the main's own zone.
Requests a proxy relays are rewritten by that proxy instead, so they pass through untouched.
"""

from __future__ import annotations

from typing import Any

from main_broker.config import BrokerConfig
from zone_router import (
    Node,
    Topology,
    ZoneMap,
    rewrite_describe_cluster,
    rewrite_find_coordinator,
    rewrite_metadata,
)

API_METADATA, API_FIND_COORDINATOR, API_DESCRIBE_CLUSTER = 3, 10, 60
ROUTED_APIS = frozenset({API_METADATA, API_FIND_COORDINATOR, API_DESCRIBE_CLUSTER})
RELAY_LISTENER_PREFIX = "relay:"


class MainZoneView:
    def __init__(self, cfg: BrokerConfig) -> None:
        zones: dict[str, str | None] = dict(cfg.zones)
        nodes = [Node(m.node_id, m.zone, "main", m.host, m.port) for m in cfg.mains]
        if not nodes:
            host, port = cfg.advertised
            nodes = [Node(cfg.node_id, cfg.zone, "main", host, port)]
        nodes += cfg.zone_proxies
        for node in nodes:
            zones.setdefault(node.zone, None)
        self.topology = Topology(ZoneMap.from_mapping(zones), nodes)

    @staticmethod
    def applies(cfg: BrokerConfig) -> bool:
        return bool(cfg.zone_proxies)

    def rewrite(self, api_key: int, data: dict[str, Any], zone: str | None) -> dict[str, Any]:
        if api_key == API_METADATA:
            return rewrite_metadata(data, zone, self.topology).data
        if api_key == API_FIND_COORDINATOR:
            return rewrite_find_coordinator(data, zone, self.topology).data
        return rewrite_describe_cluster(data, zone, self.topology).data
