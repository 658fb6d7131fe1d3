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

A client of one of this main's named listeners (SASL_SSL, ...) gets every node at its address
on that listener, with or without zone proxies (`Topology.for_listener`: a proxy without a
listener of that name is not live for that client, so give every main the same names).

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
    place_partitions,
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


Listeners = tuple[tuple[str, str, int], ...]  # (name, advertised host, advertised port)


def fleet_topology(cfg: BrokerConfig, own_listeners: Listeners | None = None) -> Topology:
    """Every main and zone proxy of the fleet, all taken as live, with their named listeners
    (this main's: `own_listeners` once bound, else as configured)."""
    zones: dict[str, str | None] = dict(cfg.zones)
    own = own_listeners
    if own is None:
        own = tuple((lst.name, *lst.advertised()) for lst in cfg.listeners)
    nodes = [
        Node(
            m.node_id,
            m.zone,
            "main",
            m.host,
            m.port,
            own if m.node_id == cfg.node_id else m.listeners,
        )
        for m in cfg.mains
    ]
    if not nodes:
        host, port = cfg.advertised
        nodes = [Node(cfg.node_id, cfg.zone, "main", host, port, own)]
    nodes += cfg.zone_proxies
    for node in nodes:
        zones.setdefault(node.zone, None)
    return Topology(ZoneMap.from_mapping(zones), nodes)


class NotAMain(ValueError):
    """A replica id that stands for no single main; the message names the ids to use."""


def main_for_replica(
    topology: Topology,
    node_id: int,
    mains: Collection[int],
    topic: str,
    partition: int,
    current: int | None = None,
) -> int:
    """The main that a broker id in a client's replica assignment of `topic`:`partition`
    stands for.

    Clients name the brokers their zone view lists: their zone's mains and its proxy. A main
    is itself. A proxy stands for the mains of the other zones (it poses as the leader of
    their partitions): the one of them that already leads the partition (`current`), else
    one placed as CreateTopics places partitions over them; either way the client's view
    then shows the proxy as the leader, as it asked. A proxy that stands for no main raises
    NotAMain, whose message names the ids to use. Ids the fleet does not know are returned
    as they are, for the caller's own checks.
    """
    if node_id in mains:
        return node_id
    node = topology.node(node_id)
    if node is None or node.role != "proxy":
        return node_id
    behind = [m for m in topology.mains_behind(node_id) if m in mains]
    if current is not None and current in behind:
        return current
    if not behind:
        raise NotAMain(
            f"Broker {node_id} is the zone proxy of {node.zone}, which stands for no main "
            f"broker here: name a main broker (one of {sorted(mains)}) in a replica assignment."
        )
    return place_partitions(topic, 1, behind, first=partition)[0]


class MainZoneView:
    def __init__(
        self,
        cfg: BrokerConfig,
        live_proxies: Collection[int] = (),
        own_listeners: Listeners | None = None,
    ) -> None:
        self._all = fleet_topology(cfg, own_listeners)
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

    def for_listener(self, listener: str | None) -> Topology:
        """The topology a client of this main's named listener sees (None: the default)."""
        return self.topology if listener is None else self.topology.for_listener(listener)

    def rewrite(
        self, api_key: int, data: dict[str, Any], zone: str | None, listener: str | None = None
    ) -> dict[str, Any]:
        """The answer for a client of ``zone`` (None: every node) on ``listener``."""
        topology = self.for_listener(listener)
        if api_key == API_METADATA:
            return rewrite_metadata(data, zone, topology).data
        if api_key == API_FIND_COORDINATOR:
            return rewrite_find_coordinator(data, zone, topology).data
        if api_key == API_DESCRIBE_TOPIC_PARTITIONS:
            return rewrite_describe_topic_partitions(data, zone, topology).data
        return rewrite_describe_cluster(data, zone, topology).data

    def leader_hints(
        self,
        current_leader: Mapping[K, tuple[int, int]],
        zone: str | None,
        listener: str | None = None,
    ) -> LeaderHints[K]:
        """KIP-951 hints for a client of ``zone`` (None: the real leaders) on ``listener``."""
        return rewrite_leader_hints(current_leader, (), zone, self.for_listener(listener))
