"""Client quota entities, and which configured quota applies to a client (KIP-55).

A quota is configured for an entity: a user, a client id, a user and a client id, or an IP
address (connection rate only), each either an explicit name or the `<default>` entry of its
kind (`DEFAULT`). For a client's user and client id, `resolve` walks Kafka's eight levels in
order and takes the first that holds the key; each key (`producer_byte_rate`,
`consumer_byte_rate`, `request_percentage`) is looked up on its own, so a client may take its
produce quota from one level and its fetch quota from another:

    1. users/<user>/clients/<client-id>      5. users/<default>/clients/<default>
    2. users/<user>/clients/<default>        6. users/<default>
    3. users/<user>                          7. clients/<client-id>
    4. users/<default>/clients/<client-id>   8. clients/<default>

As in Kafka (ClientQuotaManager's default callback), an empty client id takes part in no
level that names a client id, `<default>` ones included: only levels 3 and 6 can apply to
it. A client that did not authenticate is the user ANONYMOUS (KafkaPrincipal.ANONYMOUS).

Usage is measured per `SensorKey`, Kafka's quota metric tags: the client's own user and
client id, as far as the level that applied names them. Levels 1, 2, 4 and 5 measure each
(user, client id) pair, levels 3 and 6 each user across all its client ids, levels 7 and 8
each client id across all users. So a `<default>` quota is a budget per user or per client
id, never one budget that all defaulted clients share.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ANONYMOUS",
    "CLIENT_ID",
    "CLIENT_QUOTA_KEYS",
    "CONNECTION_CREATION_RATE",
    "CONSUMER_BYTE_RATE",
    "CONTROLLER_MUTATION_RATE",
    "DEFAULT",
    "IP",
    "PRODUCER_BYTE_RATE",
    "REQUEST_PERCENTAGE",
    "USER",
    "Default",
    "Name",
    "QuotaEntity",
    "Quotas",
    "ResolvedQuota",
    "SensorKey",
    "precedence",
    "resolve",
    "resolve_key",
]


class Default(enum.Enum):
    """The `<default>` entry of a kind of entity (null on Kafka's wire and in its records)."""

    DEFAULT = "<default>"

    def __repr__(self) -> str:
        return "DEFAULT"

    def __str__(self) -> str:
        return "<default>"


DEFAULT: Final = Default.DEFAULT
Name = str | Literal[Default.DEFAULT]

# Entity types (org.apache.kafka.common.quota.ClientQuotaEntity).
USER: Final = "user"
CLIENT_ID: Final = "client-id"
IP: Final = "ip"

# Quota keys (QuotaConfig).
PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
CONTROLLER_MUTATION_RATE: Final = "controller_mutation_rate"
CONNECTION_CREATION_RATE: Final = "connection_creation_rate"
#: The keys a broker enforces per client (ClientQuotaManager's quota types).
CLIENT_QUOTA_KEYS: Final = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)

#: The user of a client that did not authenticate (KafkaPrincipal.ANONYMOUS's name).
ANONYMOUS: Final = "ANONYMOUS"


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """What a quota is configured for. None: the entity does not name that kind; `DEFAULT`:
    its `<default>` entry. Any combination can be built; `validate_alteration` (admin) says
    which ones Kafka accepts: user and/or client id, or ip alone."""

    user: Name | None = None
    client_id: Name | None = None
    ip: Name | None = None

    @classmethod
    def from_kafka(cls, entries: Mapping[str, str | None]) -> QuotaEntity:
        """From Kafka's form: entity type -> name, None for `<default>` (ClientQuotaEntity,
        the requests' entity lists). An unknown type raises ValueError."""
        unknown = set(entries) - {USER, CLIENT_ID, IP}
        if unknown:
            raise ValueError(f"unknown quota entity types {sorted(unknown)}")
        names = {kind: DEFAULT if name is None else name for kind, name in entries.items()}
        return cls(names.get(USER), names.get(CLIENT_ID), names.get(IP))

    def to_kafka(self) -> dict[str, str | None]:
        """Kafka's form, in the order user, client-id, ip."""
        out: dict[str, str | None] = {}
        for kind, name in ((USER, self.user), (CLIENT_ID, self.client_id), (IP, self.ip)):
            if name is not None:
                out[kind] = None if name is DEFAULT else name
        return out

    def __str__(self) -> str:
        parts = [
            f"{path}/{name}"
            for path, name in (("users", self.user), ("clients", self.client_id), ("ips", self.ip))
            if name is not None
        ]
        return "/".join(parts) or "(no entity)"


#: The configured quotas: entity -> {quota key: value}. What AlterClientQuotas changes.
Quotas = Mapping[QuotaEntity, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class SensorKey:
    """Whose usage one rate measures (Kafka's quota metric tags): None where the level that
    applied does not name that kind."""

    user: str | None
    client_id: str | None


@dataclass(frozen=True, slots=True)
class ResolvedQuota:
    """The quota of one key for one client: its value and the entity it was configured for,
    both None when no level holds the key (no limit), and the sensor that measures it."""

    key: str
    value: float | None
    entity: QuotaEntity | None
    sensor: SensorKey


def precedence(user: str | None, client_id: str | None) -> tuple[QuotaEntity, ...]:
    """The entities that can hold a client's quota, most specific first: the eight levels,
    less those that need a user or client id the client has not got (an empty one).
    `user` None is ANONYMOUS."""
    return tuple(entity for entity, _ in _levels(user, client_id))


def resolve_key(quotas: Quotas, key: str, user: str | None, client_id: str | None) -> ResolvedQuota:
    """The quota of `key` for a client with this user (None: not authenticated) and client id
    (None or empty: none sent)."""
    levels = _levels(user, client_id)
    for entity, sensor in levels:
        values = quotas.get(entity)
        if values is not None and key in values:
            return ResolvedQuota(key, values[key], entity, sensor)
    # No limit; Kafka still measures such a client, by its client id.
    return ResolvedQuota(key, None, None, SensorKey(None, client_id or None))


def resolve(quotas: Quotas, user: str | None, client_id: str | None) -> dict[str, ResolvedQuota]:
    """`resolve_key` for each key in CLIENT_QUOTA_KEYS."""
    return {key: resolve_key(quotas, key, user, client_id) for key in CLIENT_QUOTA_KEYS}


def _levels(user: str | None, client_id: str | None) -> list[tuple[QuotaEntity, SensorKey]]:
    name = ANONYMOUS if user is None else user
    both = SensorKey(name or None, client_id or None)
    by_user = SensorKey(name or None, None)
    by_client = SensorKey(None, client_id or None)
    # (entity, the sensor it is measured by, whether it needs a user, a client id)
    table = (
        (QuotaEntity(name, client_id), both, True, True),
        (QuotaEntity(name, DEFAULT), both, True, True),
        (QuotaEntity(name), by_user, True, False),
        (QuotaEntity(DEFAULT, client_id), both, True, True),
        (QuotaEntity(DEFAULT, DEFAULT), both, True, True),
        (QuotaEntity(DEFAULT), by_user, True, False),
        (QuotaEntity(None, client_id), by_client, False, True),
        (QuotaEntity(None, DEFAULT), by_client, False, True),
    )
    return [
        (entity, sensor)
        for entity, sensor, needs_user, needs_client in table
        if (name or not needs_user) and (client_id or not needs_client)
    ]
