"""The fleet's zone map for reading VPC Flow Logs: AZ ids to zone names, addresses to zones.

Pure (no Spark, no I/O beyond reading the one TOML file). Two sources, both given to
``--zones``:

- **A fleet TOML** (the file ``zonefleet`` runs from; docs in ``fleet/config.py``), read here
  with tomllib and never through ``fleet`` (the report imports nothing of the brokers'):
  ``[[zones]]`` (``name``, ``az_id``), ``[cidrs]`` (``"10.0.0.0/20" = "us-east-1a"``) or
  ``[[cidrs]]`` (``cidr = ..., zone = ...``), and the ``host`` / ``advertised_host`` of every
  ``[[main_brokers]]`` and ``[[proxies]]`` entry that is an IP address (not loopback, not a
  wildcard), as a host route (/32 or /128) to the node's zone. A zone may be spelled by its
  name or its AZ id; both end up as the ``[[zones]]`` name, as the fleet itself resolves them.
- **A command-line string**: ``ZONE=CIDR[,ZONE=CIDR...]``, where ZONE is a zone name
  (``az1``), an AZ id (``use1-az1``) or both (``az1:use1-az1``). A zone may be named more than
  once, one CIDR each. Only a zone whose AZ id is known (given, or the name itself) matches the
  ``az-id`` of flow-log records; others are placed by address alone.

Addresses resolve by longest prefix, as the fleet's own CIDR map does (DESIGN.md, "Zone
routing rules"). An address no network holds has no zone: the flow-log report counts it as
``unknown``, never as cross-zone.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Network", "Zone", "ZoneMap", "ZoneMapError", "load_zone_map", "parse_zone_spec"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ZoneMapError(ValueError):
    """A zone map that cannot be used; the message names the file or the spec entry."""


@dataclass(frozen=True)
class Zone:
    name: str
    az_id: str | None = None


@dataclass(frozen=True)
class ZoneMap:
    """`zones` by name; `networks` longest prefix first (IPv4 before IPv6 at equal length)."""

    zones: tuple[Zone, ...]
    networks: tuple[tuple[Network, str], ...]

    @classmethod
    def build(cls, zones: Iterable[Zone], networks: Iterable[tuple[Network, str]]) -> ZoneMap:
        by_name: dict[str, Zone] = {}
        for z in zones:
            known = by_name.get(z.name)
            if known is not None and known.az_id and z.az_id and known.az_id != z.az_id:
                raise ZoneMapError(f"zone {z.name} has two AZ ids: {known.az_id}, {z.az_id}")
            by_name[z.name] = Zone(z.name, z.az_id or (known.az_id if known else None))
        seen: dict[Network, str] = {}
        for net, zone in networks:
            if net in seen and seen[net] != zone:
                raise ZoneMapError(f"{net} is mapped to two zones: {seen[net]}, {zone}")
            seen[net] = zone
            by_name.setdefault(zone, Zone(zone))
        ordered = sorted(seen.items(), key=lambda p: (-p[0].prefixlen, p[0].version, str(p[0])))
        return cls(tuple(sorted(by_name.values(), key=lambda z: z.name)), tuple(ordered))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(z.name for z in self.zones)

    def az_ids(self) -> dict[str, str]:
        """Every spelling a record's ``az-id`` may match -> zone name: each AZ id, and each
        name (so a map keyed by AZ ids matches records directly)."""
        out = {z.name: z.name for z in self.zones}
        out.update({z.az_id: z.name for z in self.zones if z.az_id})
        return out

    def zone_of_az_id(self, value: str) -> str | None:
        return self.az_ids().get(value)

    def zone_of_address(self, address: str) -> str | None:
        """The zone of the longest prefix holding `address`, or None (also for a value that is
        not an IP address)."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        for net, zone in self.networks:
            if net.version == ip.version and ip in net:
                return zone
        return None


def load_zone_map(spec: str) -> ZoneMap:
    """`spec` is a fleet TOML file (a path that exists or ends in ``.toml``) or a
    ``ZONE=CIDR,...`` string."""
    if spec.endswith(".toml") or Path(spec).is_file():
        return zone_map_from_toml(Path(spec))
    return parse_zone_spec(spec)


def parse_zone_spec(text: str) -> ZoneMap:
    zones: list[Zone] = []
    networks: list[tuple[Network, str]] = []
    for n, entry in enumerate((e.strip() for e in text.split(",")), 1):
        if not entry:
            continue
        key, sep, cidr = entry.partition("=")
        name, _, az_id = key.strip().partition(":")
        if not sep or not name or not cidr.strip():
            raise ZoneMapError(
                f"--zones entry {n} {entry!r}: expected ZONE=CIDR (ZONE a name, an AZ id, or "
                "name:az-id), e.g. az1:use1-az1=10.1.0.0/16"
            )
        zones.append(Zone(name, az_id or None))
        networks.append((_network(cidr.strip(), f"--zones entry {n} {entry!r}"), name))
    if not networks:
        raise ZoneMapError("--zones names no network (expected ZONE=CIDR,...)")
    return ZoneMap.build(zones, networks)


def zone_map_from_toml(path: Path) -> ZoneMap:
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ZoneMapError(f"{path}: cannot read the fleet TOML: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ZoneMapError(f"{path}: not TOML: {exc}") from None
    return zone_map_from_doc(doc, str(path))


def zone_map_from_doc(doc: dict[str, Any], source: str) -> ZoneMap:
    """The zone map of a parsed fleet TOML document (`source` names it in errors)."""
    declared: list[Zone] = []
    for n, raw in enumerate(doc.get("zones", []), 1):
        if not isinstance(raw, dict) or "name" not in raw:
            raise ZoneMapError(f"{source}: [[zones]] entry {n} needs a name")
        az_id = raw.get("az_id")
        declared.append(Zone(str(raw["name"]), str(az_id) if az_id else None))

    def canonical(value: Any, what: str) -> str:
        value = str(value)
        if not declared:
            return value
        for z in declared:
            if value in (z.name, z.az_id):
                return z.name
        known = ", ".join(z.name for z in declared)
        raise ZoneMapError(f"{source}: {what} names unknown zone {value!r} (zones: {known})")

    networks: list[tuple[Network, str]] = []
    raw_cidrs = doc.get("cidrs", {})
    if isinstance(raw_cidrs, dict):
        pairs = [(str(k), v) for k, v in raw_cidrs.items()]
    else:
        try:
            pairs = [(str(e["cidr"]), e["zone"]) for e in raw_cidrs]
        except (KeyError, TypeError):
            raise ZoneMapError(f"{source}: each [[cidrs]] entry needs cidr and zone") from None
    for cidr, zone in pairs:
        what = f"[cidrs] {cidr!r}"
        networks.append((_network(cidr, f"{source}: {what}"), canonical(zone, what)))
    for section in ("main_brokers", "proxies"):
        for raw in doc.get(section, []):
            zone = raw.get("zone") if isinstance(raw, dict) else None
            if zone is None or str(zone) == "auto":
                continue  # found at start-up from EC2 metadata: not knowable from the file
            what = f"[[{section}]] node {raw.get('node_id')}"
            for key in ("host", "advertised_host"):
                host = _host_route(raw.get(key))
                if host is not None:
                    networks.append((host, canonical(zone, what)))
    try:
        return ZoneMap.build(declared, networks)
    except ZoneMapError as exc:
        raise ZoneMapError(f"{source}: {exc}") from None


def _network(text: str, what: str) -> Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ZoneMapError(f"{what}: {text!r} is not a CIDR block") from None


def _host_route(value: Any) -> Network | None:
    if value is None:
        return None
    try:
        ip = ipaddress.ip_address(str(value))
    except ValueError:
        return None  # a DNS name: not an address a flow log records
    if ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast:
        return None
    return ipaddress.ip_network(ip)
