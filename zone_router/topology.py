"""The fleet's nodes, their zones and which proxies are live."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from zone_router.zones import ZoneMap

__all__ = ["Node", "Role", "Topology"]

Role = Literal["main", "proxy"]


@dataclass(frozen=True, slots=True)
class Node:
    """A broker as clients reach it. ``zone`` may be a name or an AZ id on input."""

    node_id: int
    zone: str
    role: Role
    host: str
    port: int
    # Named listeners besides the default one: (name, host, port), as advertised.
    listeners: tuple[tuple[str, str, int], ...] = ()


class Topology:
    """Every main and proxy, with node zones canonicalised to zone names.

    ``live_proxies=None`` means every proxy is live; ids in it that are not proxies are
    ignored, so a stale liveness set cannot turn a main into a proxy. ``down_mains`` are mains
    a zone proxy has lost its state stream from: its zone's clients reach their partitions
    through the proxy until they are back (the proxy answers NOT_LEADER_OR_FOLLOWER with
    hints until another main takes them over).
    """

    def __init__(
        self,
        zones: ZoneMap,
        nodes: Iterable[Node],
        live_proxies: Iterable[int] | None = None,
        down_mains: Iterable[int] = (),
        unlisted: Iterable[int] = (),
    ) -> None:
        self.zones = zones
        self.down_mains = frozenset(down_mains)
        # Mains without the listener this topology is for (`for_listener`): listed to nobody,
        # their partitions reached through the zone proxy.
        self.unlisted = frozenset(unlisted)
        self._by_listener: dict[str, Topology] = {}
        self._proxied: Topology | None = None
        self._nodes: dict[int, Node] = {}
        for node in nodes:
            if node.role not in ("main", "proxy"):
                raise ValueError(f"node {node.node_id}: unknown role {node.role!r}")
            zone = zones.canonical(node.zone)
            if zone is None:
                raise ValueError(f"node {node.node_id}: unknown zone {node.zone!r}")
            if node.node_id in self._nodes:
                raise ValueError(f"node id {node.node_id} is listed twice")
            self._nodes[node.node_id] = dataclasses.replace(node, zone=zone)
        ordered = sorted(self._nodes.values(), key=lambda n: n.node_id)
        self.mains: tuple[Node, ...] = tuple(n for n in ordered if n.role == "main")
        all_proxies = [n for n in ordered if n.role == "proxy"]
        live = None if live_proxies is None else set(live_proxies)
        self.live_proxies: tuple[Node, ...] = tuple(
            n for n in all_proxies if live is None or n.node_id in live
        )
        self._live_ids = frozenset(p.node_id for p in self.live_proxies)
        self._proxy_by_zone: dict[str, Node] = {}
        for proxy in self.live_proxies:
            # One proxy per zone is the design; with more, the lowest id wins, stably.
            self._proxy_by_zone.setdefault(proxy.zone, proxy)

    def with_live_proxies(self, live_proxies: Iterable[int] | None) -> Topology:
        """The same nodes with another liveness set."""
        return Topology(
            self.zones, self._nodes.values(), live_proxies, self.down_mains, self.unlisted
        )

    def with_down_mains(self, down_mains: Iterable[int]) -> Topology:
        """The same nodes with another set of mains that are down."""
        live = [p.node_id for p in self.live_proxies]
        return Topology(self.zones, self._nodes.values(), live, down_mains, self.unlisted)

    def proxied(self) -> Topology:
        """Every main reached through its zone's proxy, as if down: listed at the proxy's
        address, leading nothing in the zone view. What a client under a quota sees, so that
        one node per zone meters all of its traffic."""
        if self._proxied is None:
            self._proxied = self.with_down_mains(m.node_id for m in self.mains)
        return self._proxied

    def for_listener(self, name: str) -> Topology:
        """The topology as a client of listener `name` sees it: each node at its address on
        that listener. A name no node lists as a named listener is the default listener
        (this topology). Mains without the listener are `unlisted`; proxies without it are not
        live for its clients."""
        cached = self._by_listener.get(name)
        if cached is not None:
            return cached
        if not any(lst[0] == name for n in self._nodes.values() for lst in n.listeners):
            return self
        nodes: list[Node] = []
        unlisted: list[int] = []
        missing: set[int] = set()
        for node in self._nodes.values():
            endpoint = next((lst for lst in node.listeners if lst[0] == name), None)
            if endpoint is None:
                if node.role == "main":
                    unlisted.append(node.node_id)
                else:
                    missing.add(node.node_id)
                nodes.append(dataclasses.replace(node, listeners=()))
            else:
                nodes.append(
                    dataclasses.replace(node, host=endpoint[1], port=endpoint[2], listeners=())
                )
        live = [p.node_id for p in self.live_proxies if p.node_id not in missing]
        topo = Topology(self.zones, nodes, live, self.down_mains, unlisted)
        self._by_listener[name] = topo
        return topo

    def main_up(self, node_id: int) -> bool:
        return node_id not in self.down_mains and node_id not in self.unlisted

    def node(self, node_id: int) -> Node | None:
        return self._nodes.get(node_id)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(sorted(self._nodes.values(), key=lambda n: n.node_id))

    def zone_of(self, node_id: int) -> str | None:
        node = self._nodes.get(node_id)
        return node.zone if node is not None else None

    def proxy_for(self, zone: str | None) -> Node | None:
        """The live proxy of a zone (given by name or AZ id), or None."""
        name = self.zones.canonical(zone)
        return self._proxy_by_zone.get(name) if name is not None else None

    def mains_in(self, zone: str | None) -> tuple[Node, ...]:
        name = self.zones.canonical(zone)
        return tuple(n for n in self.mains if n.zone == name) if name is not None else ()

    def mains_behind(self, node_id: int) -> tuple[int, ...]:
        """The mains a node stands for in its zone's view: a main, itself; a zone proxy, the
        mains of the other zones (it poses as the leader of their partitions and the
        coordinator of their groups); an unknown id, none."""
        node = self._nodes.get(node_id)
        if node is None:
            return ()
        if node.role == "main":
            return (node_id,)
        return tuple(m.node_id for m in self.mains if m.zone != node.zone)

    def is_live(self, node_id: int) -> bool:
        """Mains are always listed; proxies only when live."""
        node = self._nodes.get(node_id)
        if node is None:
            return False
        return node.role == "main" or node_id in self._live_ids

    def __repr__(self) -> str:
        live = [p.node_id for p in self.live_proxies]
        return f"Topology(nodes={list(self.nodes)!r}, live_proxies={live!r})"
