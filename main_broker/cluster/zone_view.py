"""What a client that connects straight to a main sees: its own zone's nodes only.

A main's listener is not bound to a zone, so the client's zone comes from its client.id tag or
the CIDR map (the same resolution traffic accounting uses), and else is the main's own zone.
Requests a proxy relays are rewritten by that proxy instead, so they pass through untouched.

The KIP-951 leader hints of Produce and Fetch go through the same view, so a client told "not
the leader" is sent where its Metadata would send it: the partition's main when that is in the
client's zone, else the zone's proxy. Without zone proxies (or for relays) the hints name the
real leader.

A zone whose proxy has no state subscription to this main is taken to have no live proxy: its
clients get the real mains (the fallback, whose traffic the accounting books as cross-zone)
until the proxy subscribes again. Liveness is per main, from its own subscribers; a main that
has just started counts the proxies it has not heard from yet as live for
`proxy_resubscribe_grace_s`, the time they take to re-subscribe after its restart.

KIP-392 ``preferred_read_replica`` is left unset: an untagged client is put in this main's zone,
so no direct client is of unknown zone, and a client follows a preferred replica only when its
Metadata lists that node, which a zone view never does for another zone's proxy.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Hashable, Mapping
from typing import Any, TypeVar

from main_broker.config import BrokerConfig
from zone_router import (
    LeaderHints,
    Node,
    Topology,
    ZoneMap,
    rewrite_describe_cluster,
    rewrite_describe_topic_partitions,
    rewrite_find_coordinator,
    rewrite_leader_hints,
    rewrite_metadata,
)

API_METADATA, API_FIND_COORDINATOR, API_DESCRIBE_CLUSTER = 3, 10, 60
API_DESCRIBE_TOPIC_PARTITIONS = 75
ROUTED_APIS = frozenset(
    {API_METADATA, API_FIND_COORDINATOR, API_DESCRIBE_CLUSTER, API_DESCRIBE_TOPIC_PARTITIONS}
)
RELAY_LISTENER_PREFIX = "relay:"
K = TypeVar("K", bound=Hashable)

log = logging.getLogger("zonefleet.main_broker.zone_view")


class MainZoneView:
    def __init__(self, cfg: BrokerConfig, live_proxies: Collection[int] = ()) -> None:
        zones: dict[str, str | None] = dict(cfg.zones)
        nodes = [Node(m.node_id, m.zone, "main", m.host, m.port) for m in cfg.mains]
        if not nodes:
            host, port = cfg.advertised
            nodes = [Node(cfg.node_id, cfg.zone, "main", host, port)]
        nodes += cfg.zone_proxies
        for node in nodes:
            zones.setdefault(node.zone, None)
        self._all = Topology(ZoneMap.from_mapping(zones), nodes)
        self.topology = self._all.with_live_proxies(live_proxies)
        self._proxy_zones = {p.node_id: p.zone for p in cfg.zone_proxies}
        # Zone views only exist where there are zone proxies to send clients to.
        self.routes = self.applies(cfg)

    def set_live_proxies(self, live: Collection[int]) -> None:
        """The proxies that hold a state subscription to this main now."""
        before = {p.node_id for p in self.topology.live_proxies}
        self.topology = self._all.with_live_proxies(live)
        after = {p.node_id for p in self.topology.live_proxies}
        for node in sorted(before - after):
            log.warning(
                "zone proxy %d (%s) is gone: its zone's clients get the real mains (cross-zone)",
                node,
                self._proxy_zones.get(node),
            )
        for node in sorted(after - before):
            log.info("zone proxy %d (%s) is live", node, self._proxy_zones.get(node))

    @staticmethod
    def applies(cfg: BrokerConfig) -> bool:
        return bool(cfg.zone_proxies)

    def rewrite(self, api_key: int, data: dict[str, Any], zone: str | None) -> dict[str, Any]:
        if api_key == API_METADATA:
            return rewrite_metadata(data, zone, self.topology).data
        if api_key == API_FIND_COORDINATOR:
            return rewrite_find_coordinator(data, zone, self.topology).data
        if api_key == API_DESCRIBE_TOPIC_PARTITIONS:
            return rewrite_describe_topic_partitions(data, zone, self.topology).data
        return rewrite_describe_cluster(data, zone, self.topology).data

    def leader_hints(
        self, current_leader: Mapping[K, tuple[int, int]], zone: str | None
    ) -> LeaderHints[K]:
        """KIP-951 hints for a client of ``zone`` (None: the real leaders)."""
        return rewrite_leader_hints(current_leader, (), zone, self.topology)
