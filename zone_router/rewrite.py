"""Rewrites of broker-naming responses so a client sees only its own zone.

The functions take the plain dicts the brokers build before encoding (kio's latest response
field names) and return new ones; the input is never modified, and parts that need no change
are shared. Endpoints (host, port, rack) always come from the ``Topology``, racks being zone
names, so every response names a node the same way.

Three views, picked by ``client_view``:

- ``zone``: the client's zone Z has a live proxy. Only Z's mains and Z's proxy are listed; a
  partition or coordinator whose main is in Z keeps it, anything else goes to Z's proxy (so
  does what a main of Z leads while the proxy has lost it: ``Topology.down_mains``; such a
  main stays listed, leading nothing).
- ``unknown``: no zone. Every main and live proxy is listed, leaders are the real mains, and
  the live proxies are appended to ``replicas`` so KIP-392 ``preferred_read_replica`` works.
- ``fallback``: Z has no live proxy. Clients get the real mains, and
  ``fallback_cross_zone`` is set so the caller counts the cross-zone traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, TypeVar

from zone_router.topology import Node, Topology

__all__ = [
    "ClientView",
    "Endpoint",
    "LeaderHints",
    "Mode",
    "RewriteResult",
    "client_view",
    "preferred_read_replica",
    "rewrite_describe_cluster",
    "rewrite_find_coordinator",
    "rewrite_leader_hints",
    "rewrite_metadata",
]

Mode = Literal["zone", "unknown", "fallback"]
# KIP-951 node endpoint as the hot codecs take it: (node_id, host, port, rack).
Endpoint = tuple[int, str, int, str | None]
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class ClientView:
    """What one client may see; build it once per connection and topology change."""

    topology: Topology
    zone: str | None
    mode: Mode
    proxy: Node | None

    @property
    def fallback_cross_zone(self) -> bool:
        return self.mode == "fallback"

    def leader_for(self, owner: int) -> int:
        """The node this client should use for something the main ``owner`` leads."""
        if owner < 0 or self.mode != "zone":
            return owner
        node = self.topology.node(owner)
        if (
            node is not None
            and node.role == "main"
            and node.zone == self.zone
            and self.topology.main_up(owner)
        ):
            return owner
        assert self.proxy is not None  # zone mode always has one
        return self.proxy.node_id

    def visible_nodes(self) -> tuple[Node, ...]:
        """The nodes listed to this client, by node id."""
        topo = self.topology
        if self.mode == "zone":
            assert self.proxy is not None
            # A zone main that is down stays listed, leading nothing, at the proxy's address:
            # librdkafka decommissions a broker that Metadata stops naming, yet may still send
            # a cached coordinator's requests to it and then wait forever for a connection;
            # listed at its own address, its clients would retry a dead port. The proxy serves
            # whatever reaches it under that id (it relays to the main, or says it is gone).
            proxy = self.proxy
            listed = [
                m if topo.main_up(m.node_id) else replace(m, host=proxy.host, port=proxy.port)
                for m in topo.mains_in(self.zone)
                if m.node_id not in topo.unlisted
            ]
            nodes = (*listed, proxy)
        elif self.mode == "unknown":
            nodes = (*topo.mains, *topo.live_proxies)
        else:
            nodes = topo.mains
        return tuple(sorted(nodes, key=lambda n: n.node_id))

    def controller_for(self, controller_id: int) -> int:
        """A controller outside the zone, or down, is replaced by the proxy, which relays admin."""
        return self.leader_for(controller_id)

    def passes_through(self, node_id: int) -> bool:
        """A node the topology does not know is kept as-is, except in the zone view."""
        return self.mode != "zone" and self.topology.node(node_id) is None


def client_view(client_zone: str | None, topology: Topology) -> ClientView:
    """The view for a client in ``client_zone`` (name, AZ id, or None for unknown)."""
    zone = topology.zones.canonical(client_zone)
    if zone is None:
        return ClientView(topology, None, "unknown", None)
    proxy = topology.proxy_for(zone)
    if proxy is None:
        return ClientView(topology, zone, "fallback", None)
    return ClientView(topology, zone, "zone", proxy)


@dataclass(frozen=True, slots=True)
class RewriteResult:
    data: dict[str, Any]
    fallback_cross_zone: bool  # the client's zone had no live proxy
    mode: Mode = "zone"


@dataclass(frozen=True, slots=True)
class LeaderHints(Generic[K]):
    current_leader: dict[K, tuple[int, int]]
    node_endpoints: list[Endpoint]
    fallback_cross_zone: bool


def _broker_dicts(
    view: ClientView, original: Iterable[Mapping[str, Any]], id_key: str
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {id_key: n.node_id, "host": n.host, "port": n.port, "rack": n.zone}
        for n in view.visible_nodes()
    ]
    out.extend(dict(b) for b in original if view.passes_through(b.get(id_key, -1)))
    return out


def rewrite_metadata(
    data: Mapping[str, Any],
    client_zone: str | None,
    topology: Topology,
    partition_owner: Callable[[str, int], int] | None = None,
) -> RewriteResult:
    """Rewrites a Metadata response: brokers, controller, and every partition's leader,
    replicas, isr and offline replicas.

    ``partition_owner(topic, partition)`` gives the main that owns a partition (-1 for none);
    without it, the response's own ``leader_id`` is taken as the owner.
    """
    view = client_view(client_zone, topology)
    if not data.get("brokers"):
        # Only a refused request is answered with no brokers (Kafka's error response, e.g.
        # to topic ids before v12); it stays as it is, with no brokers for the client to use.
        return RewriteResult(dict(data), view.fallback_cross_zone, view.mode)
    topics = _rewrite_topics(view, data.get("topics", ()), partition_owner)
    out = {**data, "brokers": _broker_dicts(view, data.get("brokers", ()), "node_id")}
    if "topics" in data:
        out["topics"] = topics
    if "controller_id" in data:
        out["controller_id"] = view.controller_for(data["controller_id"])
    return RewriteResult(out, view.fallback_cross_zone, view.mode)


def _rewrite_topics(
    view: ClientView,
    topics: Iterable[Mapping[str, Any]],
    partition_owner: Callable[[str, int], int] | None = None,
) -> list[Mapping[str, Any]]:
    """Each partition's leader, replicas, isr and offline replicas as the client's zone sees
    them (Metadata and DescribeTopicPartitions list partitions alike)."""
    proxy_ids = [p.node_id for p in view.topology.live_proxies]
    out: list[Mapping[str, Any]] = []
    for topic in topics:
        partitions = topic.get("partitions")
        if not partitions:
            out.append(topic)
            continue
        name = topic.get("name")
        rewritten = []
        for part in partitions:
            owner = part.get("leader_id", -1)
            if partition_owner is not None and name is not None:
                owner = partition_owner(name, part["partition_index"])
            leader = view.leader_for(owner)
            replicas = [leader] if leader >= 0 else []
            if view.mode == "unknown" and leader >= 0:
                replicas += [p for p in proxy_ids if p != leader]
            entry = {
                **part,
                "leader_id": leader,
                "replica_nodes": replicas,
                "isr_nodes": [leader] if leader >= 0 else [],
                "offline_replicas": [],
            }
            if "eligible_leader_replicas" in part:
                entry["eligible_leader_replicas"] = []
                entry["last_known_elr"] = []
            rewritten.append(entry)
        out.append({**topic, "partitions": rewritten})
    return out


def rewrite_describe_topic_partitions(
    data: Mapping[str, Any],
    client_zone: str | None,
    topology: Topology,
    partition_owner: Callable[[str, int], int] | None = None,
) -> RewriteResult:
    """Rewrites a DescribeTopicPartitions response (KIP-966) like Metadata's topics."""
    view = client_view(client_zone, topology)
    out = {**data, "topics": _rewrite_topics(view, data.get("topics", ()), partition_owner)}
    return RewriteResult(out, view.fallback_cross_zone, view.mode)


def _coordinator(view: ClientView, entry: Mapping[str, Any]) -> dict[str, Any]:
    if entry.get("error_code", 0) != 0 or entry.get("node_id", -1) < 0:
        return dict(entry)
    node = view.topology.node(view.leader_for(entry["node_id"]))
    if node is None:
        return dict(entry)
    return {**entry, "node_id": node.node_id, "host": node.host, "port": node.port}


def rewrite_find_coordinator(
    data: Mapping[str, Any], client_zone: str | None, topology: Topology
) -> RewriteResult:
    """Points each coordinator at the client's zone: a main in Z stays, any other goes to Z's
    proxy (which relays group traffic to the owning main). Handles v4+ ``coordinators`` and
    the v0-3 top-level node_id/host/port; entries with an error are left alone."""
    view = client_view(client_zone, topology)
    if "coordinators" in data:
        out = {**data, "coordinators": [_coordinator(view, c) for c in data["coordinators"]]}
    else:
        out = _coordinator(view, data)
    return RewriteResult(out, view.fallback_cross_zone, view.mode)


def rewrite_describe_cluster(
    data: Mapping[str, Any], client_zone: str | None, topology: Topology
) -> RewriteResult:
    """Lists the client's visible brokers and a visible controller; errors are left alone."""
    view = client_view(client_zone, topology)
    if data.get("error_code", 0) != 0:
        return RewriteResult(dict(data), view.fallback_cross_zone, view.mode)
    brokers = _broker_dicts(view, data.get("brokers", ()), "broker_id")
    for broker in brokers:
        broker.setdefault("is_fenced", False)
    out = {**data, "brokers": brokers}
    if "controller_id" in data:
        out["controller_id"] = view.controller_for(data["controller_id"])
    return RewriteResult(out, view.fallback_cross_zone, view.mode)


def rewrite_leader_hints(
    current_leader: Mapping[K, tuple[int, int]],
    node_endpoints: Iterable[Endpoint],
    client_zone: str | None,
    topology: Topology,
) -> LeaderHints[K]:
    """Rewrites KIP-951 hints of a Produce or Fetch response.

    ``current_leader`` maps any partition key (e.g. (topic, partition)) to (leader_id,
    leader_epoch); epochs are kept. ``node_endpoints`` is rebuilt for exactly the leaders
    named, from the topology; an original endpoint is used only for a node it does not know.
    """
    view = client_view(client_zone, topology)
    leaders = {
        key: (view.leader_for(leader_id), epoch)
        for key, (leader_id, epoch) in current_leader.items()
    }
    originals = {e[0]: e for e in node_endpoints}
    endpoints: list[Endpoint] = []
    for node_id in sorted({leader for leader, _ in leaders.values() if leader >= 0}):
        node = topology.node(node_id)
        if node is not None:
            endpoints.append((node.node_id, node.host, node.port, node.zone))
        elif node_id in originals:
            endpoints.append(originals[node_id])
    return LeaderHints(leaders, endpoints, view.fallback_cross_zone)


def preferred_read_replica(owner: int, client_zone: str | None, topology: Topology) -> int:
    """KIP-392 answer for a Fetch served by main ``owner``: the live proxy of the client's
    zone when the owner sits elsewhere, else -1 (keep reading from the leader)."""
    zone = topology.zones.canonical(client_zone)
    if zone is None or topology.zone_of(owner) == zone:
        return -1
    proxy = topology.proxy_for(zone)
    return proxy.node_id if proxy is not None else -1
