"""Which zone a client is in: listener, then client.id marker, then CIDR, then rack_id."""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from zone_router.client_id import parse_client_id_markers
from zone_router.zones import ZoneMap

__all__ = ["OTHER_UNKNOWN", "CidrZoneMap", "Source", "ZoneDecision", "ZoneResolver"]

log = logging.getLogger("zonefleet.zone_router")

Source = Literal["listener", "client_id", "cidr", "rack", "unknown"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Unknown values come from clients, so the tracked set is bounded; the rest share one key.
OTHER_UNKNOWN: Final = "<other>"
_MAX_KEY_CHARS: Final = 64


@dataclass(frozen=True, slots=True)
class ZoneDecision:
    """The client's zone (canonical name, or None) and where it came from."""

    zone: str | None
    source: Source


class CidrZoneMap:
    """Longest-prefix match of client addresses to zones, IPv4 and IPv6.

    Networks are kept per prefix length, so a lookup costs one dict probe per distinct
    prefix length rather than one per network.
    """

    def __init__(self, zones: ZoneMap, cidrs: Mapping[str, str]) -> None:
        self._tables: dict[int, dict[int, dict[int, str]]] = {4: {}, 6: {}}
        for cidr, zone_value in cidrs.items():
            try:
                net = ipaddress.ip_network(cidr.strip(), strict=True)
            except ValueError as exc:
                raise ValueError(f"bad CIDR {cidr!r} in the zone map: {exc}") from exc
            zone = zones.canonical(zone_value)
            if zone is None:
                raise ValueError(f"CIDR {cidr!r} maps to unknown zone {zone_value!r}")
            by_net = self._tables[net.version].setdefault(net.prefixlen, {})
            key = int(net.network_address)
            if by_net.get(key, zone) != zone:
                raise ValueError(f"CIDR {cidr!r} is mapped to two zones")
            by_net[key] = zone
        self._lengths = {
            version: sorted(table, reverse=True) for version, table in self._tables.items()
        }

    def lookup(self, host: str | None) -> str | None:
        """The zone of the longest matching prefix; None for no match or a malformed host."""
        addr = _parse_host(host)
        if addr is None:
            return None
        bits = 32 if addr.version == 4 else 128
        value = int(addr)
        table = self._tables[addr.version]
        for length in self._lengths[addr.version]:
            mask = ((1 << length) - 1) << (bits - length)
            zone = table[length].get(value & mask)
            if zone is not None:
                return zone
        return None

    def __len__(self) -> int:
        return sum(len(t) for table in self._tables.values() for t in table.values())


def _parse_host(host: str | None) -> IPAddress | None:
    if not host:
        return None
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        # Dual-stack sockets report IPv4 peers as ::ffff:a.b.c.d.
        mapped = addr.ipv4_mapped
        if mapped is not None:
            return mapped
    return addr


class ZoneResolver:
    """Resolves client zones and counts values that name no known zone.

    ``unknown_values`` counts each unknown value (case-folded, truncated; after
    ``max_tracked_unknown`` distinct values the rest count under ``OTHER_UNKNOWN``) and
    ``unknown_by_source`` counts them per source. Each tracked value is logged once.
    """

    def __init__(
        self,
        zones: ZoneMap,
        cidrs: Mapping[str, str] | None = None,
        *,
        max_tracked_unknown: int = 1024,
        on_unknown: Callable[[str], None] | None = None,
    ) -> None:
        self.zones = zones
        self.on_unknown = on_unknown  # called with the source of every unknown value
        self.cidrs = CidrZoneMap(zones, cidrs or {})
        self.unknown_values: Counter[str] = Counter()
        self.unknown_by_source: Counter[str] = Counter()
        self._max_tracked = max_tracked_unknown
        self._logged: set[str] = set()

    def resolve(
        self,
        *,
        listener_zone: str | None,
        client_id: str | None,
        client_host: str | None,
        rack_id: str | None = None,
    ) -> ZoneDecision:
        """First known zone of: listener, client.id markers in order, CIDR, Fetch rack_id."""
        if listener_zone:
            zone = self._known(listener_zone, "listener")
            if zone is not None:
                return ZoneDecision(zone, "listener")
        for _marker, value in parse_client_id_markers(client_id):
            zone = self._known(value, "client_id")
            if zone is not None:
                return ZoneDecision(zone, "client_id")
        zone = self.cidrs.lookup(client_host)
        if zone is not None:
            return ZoneDecision(zone, "cidr")
        if rack_id:
            zone = self._known(rack_id, "rack")
            if zone is not None:
                return ZoneDecision(zone, "rack")
        return ZoneDecision(None, "unknown")

    def _known(self, value: str, source: Source) -> str | None:
        zone = self.zones.canonical(value)
        if zone is None:
            self._count_unknown(value, source)
        return zone

    def _count_unknown(self, value: str, source: Source) -> None:
        key = value.strip().casefold()[:_MAX_KEY_CHARS]
        if key not in self.unknown_values and len(self.unknown_values) >= self._max_tracked:
            key = OTHER_UNKNOWN
        self.unknown_values[key] += 1
        self.unknown_by_source[source] += 1
        if self.on_unknown is not None:
            self.on_unknown(source)
        if key not in self._logged:
            self._logged.add(key)
            if key == OTHER_UNKNOWN:
                log.warning(
                    "more than %d distinct unknown zone values; counting the rest as %s",
                    self._max_tracked,
                    OTHER_UNKNOWN,
                )
            else:
                log.warning(
                    "ignoring %s value %r: it names no known zone (zone names or AZ ids: %s)",
                    source,
                    key,
                    ", ".join(self.zones.names),
                )
