"""Kafka ACL bindings and the rules that match them, as Apache Kafka 4.x applies them.

Pure data and functions, no I/O: CreateAcls validation, DescribeAcls / DeleteAcls filter
matching (patterns LITERAL, PREFIXED, MATCH, ANY) and, for enforcement, what the bindings that
cover a resource decide for a request (`decide`, as Kafka's StandardAuthorizer does). `authorize`
applies it by scanning a list; `kafka_wire.acl.authorizer.Authorizer` by an indexed lookup.

Codes are Kafka's wire codes (org.apache.kafka.common.resource / .acl enums). A code outside
an enum reads as UNKNOWN, as Kafka's `fromCode` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "AUTHORIZED_OPERATIONS_OMITTED",
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclFilter",
    "Operation",
    "PatternType",
    "Permission",
    "ResourceType",
    "authorize",
    "authorized_operations",
    "create_error",
    "decide",
    "delete_filter_error",
    "entry_result",
    "filter_matches",
    "matching",
    "resource_matches",
]

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"  # a LITERAL resource name or host that matches every one
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


# The operations each resource type supports (Kafka's AclEntry.supportedOperations). With no
# ACLs enforced a client may do all of them, which is what describe answers report.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DESCRIBE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALTER,
        Operation.DESCRIBE,
    ),
}
# What an authorized-operations field holds when the client did not ask for it.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


def authorized_operations(
    resource: ResourceType,
    requested: bool = True,
    allowed: Callable[[Operation], bool] | None = None,
) -> int:
    """The authorized-operations bit field of a describe answer (bit N: operation code N), or
    the omitted value when the client did not ask for it. Kafka sets the bits of the resource
    type's supported operations that `allowed` grants; without it (no authorizer) all of them."""
    if not requested:
        return AUTHORIZED_OPERATIONS_OMITTED
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource]:
        if allowed is None or allowed(operation):
            bits |= 1 << operation
    return bits


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


def _name(enum: type[IntEnum], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return "UNKNOWN"


def _known(enum: type[IntEnum], code: int) -> bool:
    try:
        return enum(code).name != "UNKNOWN"
    except ValueError:
        return False


@dataclass(frozen=True, order=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry (wire codes)."""

    resource_type: int
    name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls / DeleteAcls filter; None matches any name, principal or host."""

    resource_type: int
    name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def has_unknown(self) -> bool:
        """A field that is exactly the UNKNOWN code (0): Kafka cannot parse such a request
        (IllegalArgumentException while parsing) and closes the connection."""
        codes = (self.resource_type, self.pattern_type, self.operation, self.permission)
        return 0 in codes


def create_error(b: AclBinding) -> str | None:
    """Why Kafka refuses to create `b` (INVALID_REQUEST), or None; the broker's checks
    (AclApis) come first, then the controller's (AclControlManager.validateNewAcl)."""
    if b.resource_type == ResourceType.CLUSTER and b.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not b.name:
        return "Invalid empty resource name"
    if not _known(ResourceType, b.resource_type) or b.resource_type == ResourceType.ANY:
        return f"Invalid resourceType {_name(ResourceType, b.resource_type)}"
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {_name(PatternType, b.pattern_type)}"
    if not _known(Operation, b.operation) or b.operation == Operation.ANY:
        return f"Invalid operation {_name(Operation, b.operation)}"
    if b.permission not in (Permission.DENY, Permission.ALLOW):
        return f"Invalid permissionType {_name(Permission, b.permission)}"
    if ":" not in b.principal:
        return (
            f"Could not parse principal from `{b.principal}` (no colon is present separating "
            "the principal type from the principal name)"
        )
    return None


def delete_filter_error(f: AclFilter) -> str | None:
    """Why Kafka refuses a DeleteAcls filter (INVALID_REQUEST), or None: a code outside its
    enum reads as UNKNOWN (AclControlManager.validateFilter)."""
    if not _known(ResourceType, f.resource_type) or not _known(PatternType, f.pattern_type):
        return "Unknown patternFilter."
    if not _known(Operation, f.operation) or not _known(Permission, f.permission):
        return "Unknown entryFilter."
    return None


def _pattern_matches(f: AclFilter, b: AclBinding) -> bool:
    # ResourcePatternFilter.matches
    if f.resource_type != ResourceType.ANY and f.resource_type != b.resource_type:
        return False
    if f.pattern_type not in (PatternType.ANY, PatternType.MATCH, b.pattern_type):
        return False
    if f.name is None:
        return True
    if f.pattern_type in (PatternType.ANY, b.pattern_type):
        return f.name == b.name
    # MATCH: the stored patterns that would apply to a resource called f.name.
    if b.pattern_type == PatternType.LITERAL:
        return f.name == b.name or b.name == WILDCARD
    if b.pattern_type == PatternType.PREFIXED:
        return f.name.startswith(b.name)
    return False


def _entry_matches(f: AclFilter, b: AclBinding) -> bool:
    # AccessControlEntryFilter.matches
    if f.principal is not None and f.principal != b.principal:
        return False
    if f.host is not None and f.host != b.host:
        return False
    if f.operation != Operation.ANY and f.operation != b.operation:
        return False
    return f.permission == Permission.ANY or f.permission == b.permission


def filter_matches(f: AclFilter, b: AclBinding) -> bool:
    return _pattern_matches(f, b) and _entry_matches(f, b)


def matching(f: AclFilter, acls: Iterable[AclBinding]) -> list[AclBinding]:
    return [b for b in acls if filter_matches(f, b)]


# -- enforcement ------------------------------------------------------------------------------

# Allowing any of these operations also allows DESCRIBE (and ALTER_CONFIGS allows
# DESCRIBE_CONFIGS), as Kafka's authorizer does.
_IMPLIES: dict[int, frozenset[int]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}


def resource_matches(b: AclBinding, resource_type: int, name: str) -> bool:
    """Whether the binding's pattern covers the resource: a LITERAL of that name or of '*',
    or a PREFIXED that the name starts with."""
    if b.resource_type != resource_type:
        return False
    if b.pattern_type == PatternType.LITERAL:
        return b.name == name or b.name == WILDCARD
    if b.pattern_type == PatternType.PREFIXED:
        return name.startswith(b.name)
    return False


def entry_result(b: AclBinding, principal: str, host: str, operation: int) -> int | None:
    """What one binding, whose pattern already covers the resource, says about `operation` by
    `principal` from `host`: Permission.ALLOW, Permission.DENY, or None when it does not apply
    (Kafka's StandardAuthorizerData.findResult). A binding for "User:*" applies to every
    principal and one for host "*" to every host."""
    if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
        return None
    if b.host != WILDCARD and b.host != host:
        return None
    if b.operation != Operation.ALL:
        if b.permission == Permission.ALLOW:
            # Implication only widens ALLOWs: a DENY of READ does not deny DESCRIBE.
            if b.operation not in _IMPLIES.get(operation, (operation,)):
                return None
        elif b.operation != operation:
            return None
    if b.permission in (Permission.ALLOW, Permission.DENY):
        return b.permission
    return None


def decide(
    covering: Iterable[AclBinding],
    principal: str,
    host: str,
    operation: int,
    no_acl_found: bool = False,
) -> bool:
    """Kafka's decision from the bindings whose pattern covers the resource (any principal,
    host or operation): a DENY that applies wins, else an ALLOW that applies allows; when no
    binding covers the resource at all, `no_acl_found` (allow.everyone.if.no.acl.found);
    when some do but none applies, not allowed."""
    any_covering = False
    allowed = False
    for b in covering:
        any_covering = True
        result = entry_result(b, principal, host, operation)
        if result == Permission.DENY:
            return False
        if result == Permission.ALLOW:
            allowed = True
    return allowed if any_covering else no_acl_found


def authorize(
    acls: Iterable[AclBinding],
    principal: str,
    host: str,
    operation: int,
    resource_type: int,
    name: str,
    no_acl_found: bool = False,
) -> bool:
    """Whether `principal` ("Type:name") from `host` may do `operation` on the resource, by a
    scan of `acls` (see `decide`; no super users here). For many bindings or many decisions use
    `kafka_wire.acl.Authorizer`, which indexes them and caches its answers."""
    covering = (b for b in acls if resource_matches(b, resource_type, name))
    return decide(covering, principal, host, operation, no_acl_found)
