"""`Authorizer`: Kafka's ACL decisions over an indexed, immutable set of bindings.

The decision itself is `rules.decide` (Kafka's StandardAuthorizerData: super users first, then
a DENY that applies wins, an ALLOW that applies allows, and a resource no binding covers gets
allow.everyone.if.no.acl.found). What this module adds is finding the covering bindings without
a scan, because every request checks one or more resources and a fleet may hold many ACLs:

- LITERAL bindings, the "*" wildcard among them, sit in a dict keyed by (type, name);
- PREFIXED bindings sit in a dict per resource type keyed by the prefix, next to the distinct
  prefix lengths present, so a name costs one probe per length, not one per binding;
- decisions are memoized in a bounded LRU keyed by (principal, host, operation, type, name).

An `Authorizer` never changes: new bindings make a new one (`with_bindings`), which starts with
an empty cache, so no decision outlives the bindings it was made from. Pure: no I/O, no trio.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

from kafka_wire.acl.rules import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    authorized_operations,
    decide,
)

__all__ = ["DEFAULT_CACHE_SIZE", "Authorizer"]

#: Decisions kept per Authorizer; a miss costs a few dict probes, so this bounds memory only.
DEFAULT_CACHE_SIZE: Final = 65_536

# The resource name Kafka's Authorizer.authorizeByResourceType first authorizes, so that super
# users and allow.everyone.if.no.acl.found pass, whatever DENY bindings say.
_HARDCODED_NAME: Final = "hardcode"

_Key = tuple[str, str, int, int, str | None]


class Authorizer:
    """Kafka's ACL authorizer over a fixed set of bindings; see the module docstring."""

    __slots__ = (
        "_allow_if_none",
        "_bindings",
        "_by_type",
        "_cache",
        "_cache_size",
        "_literal",
        "_prefix_lengths",
        "_prefixed",
        "_super_users",
    )

    def __init__(
        self,
        bindings: Iterable[AclBinding] = (),
        super_users: frozenset[str] = frozenset(),
        allow_everyone_if_no_acl_found: bool = False,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        # A set: the same binding twice decides nothing more (Kafka stores each ACL once).
        self._bindings: frozenset[AclBinding] = frozenset(bindings)
        self._super_users = super_users
        self._allow_if_none = allow_everyone_if_no_acl_found
        self._cache_size = cache_size
        self._cache: OrderedDict[_Key, bool] = OrderedDict()
        literal: dict[tuple[int, str], list[AclBinding]] = {}
        prefixed: dict[int, dict[str, list[AclBinding]]] = {}
        by_type: dict[int, list[AclBinding]] = {}
        for b in sorted(self._bindings):  # sorted: the same bindings index the same way
            by_type.setdefault(b.resource_type, []).append(b)
            if b.pattern_type == PatternType.LITERAL:
                literal.setdefault((b.resource_type, b.name), []).append(b)
            elif b.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault(b.resource_type, {}).setdefault(b.name, []).append(b)
        self._literal = {k: tuple(v) for k, v in literal.items()}
        self._prefixed = {
            rt: {p: tuple(v) for p, v in by_prefix.items()} for rt, by_prefix in prefixed.items()
        }
        self._prefix_lengths = {
            rt: tuple(sorted({len(p) for p in by_prefix})) for rt, by_prefix in prefixed.items()
        }
        self._by_type = {rt: tuple(v) for rt, v in by_type.items()}

    def with_bindings(self, bindings: Iterable[AclBinding]) -> Authorizer:
        """The same configuration over new bindings, with an empty decision cache."""
        return Authorizer(bindings, self._super_users, self._allow_if_none, self._cache_size)

    @property
    def bindings(self) -> frozenset[AclBinding]:
        return self._bindings

    @property
    def super_users(self) -> frozenset[str]:
        return self._super_users

    @property
    def allow_everyone_if_no_acl_found(self) -> bool:
        return self._allow_if_none

    def covering(self, resource_type: int, name: str) -> list[AclBinding]:
        """The bindings whose pattern covers the resource: LITERAL of its name or of "*",
        and PREFIXED ones that the name starts with."""
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self._literal.get((resource_type, WILDCARD), ()))
        by_prefix = self._prefixed.get(resource_type)
        if by_prefix:
            for length in self._prefix_lengths[resource_type]:
                if length > len(name):
                    break
                found.extend(by_prefix.get(name[:length], ()))
        return found

    def authorize(
        self, principal: str, host: str, operation: int, resource_type: int, name: str
    ) -> bool:
        """Whether `principal` ("User:alice") from `host` (its IP address as text) may do
        `operation` on the resource (`rules.decide`; super users always may)."""
        key: _Key = (principal, host, operation, resource_type, name)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        if principal in self._super_users:
            allowed = True
        else:
            covering = self.covering(resource_type, name)
            allowed = decide(covering, principal, host, operation, self._allow_if_none)
        self._remember(key, allowed)
        return allowed

    def authorize_any(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Whether some resource of the type may get `operation`, as Kafka's
        Authorizer.authorizeByResourceType decides (an idempotent producer without a
        transactional id needs WRITE on any topic, KIP-679): an ALLOW of the operation or ALL,
        literal or prefixed, that no DENY of a literal of the same name or of a prefix of its
        name shadows; a DENY of the literal "*" denies all. Operations imply nothing here."""
        key: _Key = (principal, host, operation, resource_type, None)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        allowed = self.authorize(
            principal, host, operation, resource_type, _HARDCODED_NAME
        ) or self._any_allowed(principal, host, operation, resource_type)
        self._remember(key, allowed)
        return allowed

    def _any_allowed(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[AclBinding] = []
        for b in self._by_type.get(resource_type, ()):
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.host != WILDCARD and b.host != host:
                continue
            if b.operation != operation and b.operation != Operation.ALL:
                continue
            if b.permission == Permission.DENY:
                if b.pattern_type == PatternType.LITERAL:
                    if b.name == WILDCARD:
                        return False
                    deny_literal.add(b.name)
                else:
                    deny_prefixed.add(b.name)
            elif b.permission == Permission.ALLOW:
                if b.pattern_type == PatternType.LITERAL and b.name == WILDCARD:
                    return True
                allows.append(b)
        for b in allows:
            if b.pattern_type == PatternType.LITERAL and b.name in deny_literal:
                continue
            if any(b.name[:n] in deny_prefixed for n in range(1, len(b.name) + 1)):
                continue
            return True
        return False

    def authorized_operations(
        self,
        principal: str,
        host: str,
        resource_type: ResourceType,
        name: str,
        requested: bool = True,
    ) -> int:
        """The authorized-operations bit field (bit N: operation code N) of the resource for
        this principal, as Kafka answers Metadata, DescribeGroups, DescribeCluster and
        DescribeTopicPartitions; the omitted value when the client did not ask for it."""
        return authorized_operations(
            resource_type,
            requested,
            lambda op: self.authorize(principal, host, op, resource_type, name),
        )

    def filter_authorized(
        self,
        principal: str,
        host: str,
        operation: int,
        resource_type: int,
        names: Iterable[str],
    ) -> list[str]:
        """The names, in order, whose resource the principal may do `operation` on."""
        return [n for n in names if self.authorize(principal, host, operation, resource_type, n)]

    def filter_visible(self, principal: str, host: str, topics: Iterable[str]) -> list[str]:
        """The topics, in order, that the principal may DESCRIBE: what a Metadata request for
        all topics lists (Kafka leaves the others out rather than erring)."""
        return self.filter_authorized(
            principal, host, Operation.DESCRIBE, ResourceType.TOPIC, topics
        )

    def _remember(self, key: _Key, allowed: bool) -> None:
        self._cache[key] = allowed
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def __repr__(self) -> str:
        return (
            f"Authorizer({len(self._bindings)} bindings, {len(self._super_users)} super users, "
            f"allow_everyone_if_no_acl_found={self._allow_if_none})"
        )
