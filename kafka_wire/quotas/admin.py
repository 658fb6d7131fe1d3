"""AlterClientQuotas and DescribeClientQuotas without I/O, as Kafka 4.x answers them: the
controller's checks of an alteration (ClientQuotaControlManager) and the filter a broker
applies to the quotas in its metadata image (ClientQuotasImage).

Entities are given as on Kafka's wire: entity type -> name, None for `<default>`. The
accepted combinations are a user and/or a client id, with keys producer_byte_rate and
consumer_byte_rate (whole numbers), request_percentage and controller_mutation_rate; or an
ip alone, with connection_creation_rate (a whole number up to 2^31 - 1). A value must be
greater than 0; removing a key (remove=true; the value is then ignored) is never checked,
and removing one that is not set does nothing.

Where this differs from Kafka: a NaN value is refused (Kafka takes it); an entity named
twice in one request is refused with no change (Kafka applies its first alteration and
still answers an error); a key named twice in one entity is answered with the duplicate-key
message Kafka builds and then overwrites with its duplicate-entity one; and an ip must be a
literal address unless the caller passes `resolves_host` (Kafka resolves names in DNS).
"""

from __future__ import annotations

import enum
import ipaddress
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kafka_wire.errors import ErrorCode
from kafka_wire.quotas.entities import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    QuotaEntity,
    Quotas,
)

__all__ = [
    "AlterOutcome",
    "AlterResult",
    "FilterComponent",
    "InvalidQuotaFilter",
    "MatchType",
    "QuotaAlteration",
    "QuotaFilter",
    "QuotaOp",
    "alter_client_quotas",
    "describe_client_quotas",
    "validate_alteration",
]

WireEntity = Mapping[str, str | None]


class _Kind(enum.Enum):  # ConfigDef types of the quota keys
    LONG = "a LONG"
    INT = "an INT"
    DOUBLE = "a DOUBLE"


_USER_CLIENT_KEYS = {
    PRODUCER_BYTE_RATE: _Kind.LONG,
    CONSUMER_BYTE_RATE: _Kind.LONG,
    REQUEST_PERCENTAGE: _Kind.DOUBLE,
    CONTROLLER_MUTATION_RATE: _Kind.DOUBLE,
}
_IP_KEYS = {CONNECTION_CREATION_RATE: _Kind.INT}
_LIMITS = {_Kind.LONG: float(2**63), _Kind.INT: float(2**31 - 1), _Kind.DOUBLE: math.inf}
_OK: tuple[ErrorCode, str | None] = (ErrorCode.none, None)


@dataclass(frozen=True, slots=True)
class QuotaOp:
    """Set `key` to `value`, or remove it when `value` is None."""

    key: str
    value: float | None

    @classmethod
    def from_wire(cls, key: str, value: float, remove: bool) -> QuotaOp:
        return cls(key, None if remove else value)


@dataclass(frozen=True, slots=True)
class QuotaAlteration:
    """One entry of an AlterClientQuotas request. The request's entity list is read as
    Kafka reads it, into a mapping (a type named twice keeps its last name)."""

    entity: WireEntity
    ops: Sequence[QuotaOp] = ()


@dataclass(frozen=True, slots=True)
class AlterResult:
    entity: WireEntity
    error_code: ErrorCode
    error_message: str | None


@dataclass(frozen=True, slots=True)
class AlterOutcome:
    """One result per distinct entity, in request order, and a new mapping of the quotas
    with every entity that passed applied (equal to the current one when none did)."""

    results: tuple[AlterResult, ...]
    quotas: dict[QuotaEntity, dict[str, float]]


def validate_alteration(
    alteration: QuotaAlteration, *, resolves_host: Callable[[str], bool] | None = None
) -> tuple[ErrorCode, str | None]:
    """Kafka's error code and message for one alteration, (NONE, None) when it may be
    applied. `resolves_host(name)` says whether an ip entity that is not a literal address
    names a host that resolves; without it such a name is refused."""
    entity = alteration.entity
    keys: set[str] = set()
    for op in alteration.ops:
        if op.key in keys:
            return _invalid(
                f"Duplicate quota key {op.key} not updating quota for this entity "
                f"{_entity_text(entity)}"
            )
        keys.add(op.key)
    if not entity:
        return _invalid("Invalid empty client quota entity")
    for kind, name in entity.items():
        if kind not in (USER, CLIENT_ID, IP):
            return _invalid(f"Unhandled client quota entity type: {kind}")
        if name == "":
            return _invalid(f"Empty {kind} not supported")
    if IP in entity:
        if USER in entity or CLIENT_ID in entity:
            # Kafka's text, which lacks the space after "should".
            return _invalid(
                "Invalid quota entity combination, IP entity shouldnot be combined with User "
                "or ClientId"
            )
        ip = entity[IP]
        if ip is not None and not _is_ip_or_host(ip, resolves_host):
            return _invalid(f"{ip} is not a valid IP or resolvable host.")
        valid = _IP_KEYS
    else:
        valid = _USER_CLIENT_KEYS
    for op in alteration.ops:
        if op.value is not None:
            error = _value_error(valid, op.key, op.value)
            if error is not None:
                return _invalid(error)
    return _OK


def alter_client_quotas(
    current: Quotas,
    alterations: Iterable[QuotaAlteration],
    *,
    resolves_host: Callable[[str], bool] | None = None,
) -> AlterOutcome:
    """Checks each alteration and applies those that pass to a copy of `current` (what the
    controller does; with validate_only the caller keeps `current`). An entity that loses its
    last key is gone."""
    seen: dict[frozenset[tuple[str, str | None]], int] = {}
    results: list[AlterResult] = []
    passed: dict[int, QuotaAlteration] = {}  # result index -> alteration to apply
    for alteration in alterations:
        identity = frozenset(alteration.entity.items())
        if identity in seen:
            index = seen[identity]
            duplicate = f"Ignoring duplicate entity {_entity_text(alteration.entity)}"
            results[index] = AlterResult(alteration.entity, *_invalid(duplicate))
            passed.pop(index, None)
            continue
        seen[identity] = len(results)
        code, message = validate_alteration(alteration, resolves_host=resolves_host)
        if code == ErrorCode.none:
            passed[len(results)] = alteration
        results.append(AlterResult(alteration.entity, code, message))
    quotas = {entity: dict(values) for entity, values in current.items()}
    for alteration in passed.values():
        entity = QuotaEntity.from_kafka(alteration.entity)
        values = quotas.setdefault(entity, {})
        for op in alteration.ops:
            if op.value is None:
                values.pop(op.key, None)
            else:
                values[op.key] = op.value
        if not values:
            del quotas[entity]
    return AlterOutcome(tuple(results), quotas)


class MatchType(enum.IntEnum):
    """A DescribeClientQuotas filter component's match_type."""

    EXACT = 0  # the entity names `match`
    DEFAULT = 1  # the entity is the `<default>` of that type
    SPECIFIED = 2  # the entity has that type, any name or the default


@dataclass(frozen=True, slots=True)
class FilterComponent:
    entity_type: str
    match_type: int
    match: str | None = None


class InvalidQuotaFilter(Exception):
    """A DescribeClientQuotas filter Kafka refuses: the response's error code and message,
    with no entries."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@dataclass(frozen=True, slots=True)
class QuotaFilter:
    """A checked DescribeClientQuotas filter: `exact` type -> name (None: the default) the
    entity must have, `specified` types it must have with any name; `strict`: and no other
    type."""

    exact: Mapping[str, str | None] = field(default_factory=dict)
    specified: frozenset[str] = frozenset()
    strict: bool = False

    @classmethod
    def parse(cls, components: Iterable[FilterComponent], strict: bool) -> QuotaFilter:
        """Checks a request's components as Kafka does; InvalidQuotaFilter if refused."""
        exact: dict[str, str | None] = {}
        specified: set[str] = set()
        for component in components:
            kind = component.entity_type
            if not kind:
                raise InvalidQuotaFilter(ErrorCode.invalid_request, "Invalid empty entity type.")
            if kind in exact or kind in specified:
                raise InvalidQuotaFilter(
                    ErrorCode.invalid_request,
                    f"Entity type {kind} cannot appear more than once in the filter.",
                )
            if kind not in (USER, CLIENT_ID, IP):
                raise InvalidQuotaFilter(
                    ErrorCode.unsupported_version, f"Unsupported entity type {kind}"
                )
            if component.match_type == MatchType.EXACT:
                if component.match is None:
                    raise InvalidQuotaFilter(
                        ErrorCode.invalid_request,
                        "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                    )
                exact[kind] = component.match
            elif component.match_type in (MatchType.DEFAULT, MatchType.SPECIFIED):
                if component.match is not None:
                    name = MatchType(component.match_type).name
                    raise InvalidQuotaFilter(
                        ErrorCode.invalid_request,
                        f"Request specified MATCH_TYPE_{name}, but also specified a match string.",
                    )
                if component.match_type == MatchType.DEFAULT:
                    exact[kind] = None
                else:
                    specified.add(kind)
            else:
                raise InvalidQuotaFilter(
                    ErrorCode.invalid_request, f"Unknown match type {component.match_type}"
                )
        named = exact.keys() | specified
        if IP in named and (USER in named or CLIENT_ID in named):
            raise InvalidQuotaFilter(
                ErrorCode.invalid_request,
                "Invalid entity filter component combination. IP filter component should not "
                "be used with user or clientId filter component.",
            )
        return cls(exact, frozenset(specified), strict)

    def matches(self, entity: QuotaEntity) -> bool:
        entries = entity.to_kafka()
        if self.strict and len(entries) != len(self.exact) + len(self.specified):
            return False
        for kind, name in self.exact.items():
            if kind not in entries or entries[kind] != name:
                return False
        return all(kind in entries for kind in self.specified)


def describe_client_quotas(
    quotas: Quotas, quota_filter: QuotaFilter
) -> list[tuple[QuotaEntity, dict[str, float]]]:
    """The entities the filter matches, with all their quotas."""
    return [
        (entity, dict(values)) for entity, values in quotas.items() if quota_filter.matches(entity)
    ]


def _invalid(message: str) -> tuple[ErrorCode, str | None]:
    return ErrorCode.invalid_request, message


def _entity_text(entity: WireEntity) -> str:
    # ClientQuotaEntity.toString, a null name (the default) printed as Java prints it
    inner = ", ".join(f"{kind}={'null' if name is None else name}" for kind, name in entity.items())
    return f"ClientQuotaEntity(entries={{{inner}}})"


def _is_ip_or_host(name: str, resolves_host: Callable[[str], bool] | None) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return resolves_host is not None and resolves_host(name)


def _value_error(valid: Mapping[str, _Kind], key: str, value: float) -> str | None:
    kind = valid.get(key)
    if kind is None:
        return f"Invalid configuration key {key}"
    if not value > 0.0:  # NaN too
        return f"Quota {key} must be greater than 0"
    if value > _LIMITS[kind]:
        return f"Proposed value for {key} is too large for {kind.value}."
    if kind is not _Kind.DOUBLE and abs(math.fmod(value, 1.0)) > 1e-6:
        return f"{key} cannot be a fractional value."
    return None
