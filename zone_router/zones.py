"""Zone names and AZ ids from the fleet config, mapped to each other both ways."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = ["Zone", "ZoneMap"]


def _key(value: str) -> str:
    return value.strip().casefold()


@dataclass(frozen=True, slots=True)
class Zone:
    """One availability zone: its account-local name (``us-east-1a``) and stable AZ id."""

    name: str
    az_id: str | None = None


class ZoneMap:
    """Accepts a zone name or an AZ id, case-insensitively; the canonical form is the name."""

    def __init__(self, zones: Iterable[Zone]) -> None:
        self._zones: dict[str, Zone] = {}
        self._lookup: dict[str, str] = {}
        for zone in zones:
            name = zone.name.strip()
            az_id = zone.az_id.strip() if zone.az_id is not None else None
            if not name or az_id == "":
                raise ValueError(f"zone name and AZ id must not be empty: {zone!r}")
            if name in self._zones:
                raise ValueError(f"zone {name!r} is listed twice")
            zone = Zone(name, az_id)
            for alias in {_key(name), _key(az_id) if az_id else _key(name)}:
                owner = self._lookup.get(alias)
                if owner is not None:
                    # A value naming two zones would route clients by luck.
                    raise ValueError(f"{alias!r} names both zone {owner!r} and zone {name!r}")
                self._lookup[alias] = name
            self._zones[name] = zone

    @classmethod
    def from_mapping(cls, names_to_ids: Mapping[str, str | None]) -> ZoneMap:
        """Builds the map from ``{"us-east-1a": "use1-az1", ...}``."""
        return cls(Zone(name, az_id) for name, az_id in names_to_ids.items())

    def canonical(self, value: str | None) -> str | None:
        """The zone name that ``value`` (a name or an AZ id) stands for, or None."""
        if value is None:
            return None
        return self._lookup.get(_key(value))

    def az_id(self, value: str) -> str | None:
        """The AZ id of a zone given by name or id; None if unknown or not configured."""
        name = self.canonical(value)
        return self._zones[name].az_id if name is not None else None

    def zone(self, value: str) -> Zone | None:
        name = self.canonical(value)
        return self._zones[name] if name is not None else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._zones)

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and self.canonical(value) is not None

    def __iter__(self) -> Iterator[Zone]:
        return iter(self._zones.values())

    def __len__(self) -> int:
        return len(self._zones)

    def __repr__(self) -> str:
        return f"ZoneMap({list(self._zones.values())!r})"
