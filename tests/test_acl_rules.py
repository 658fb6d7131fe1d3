"""ACL validation and matching (kafka_wire/acl/rules.py), against Kafka 4.x's rules."""

from __future__ import annotations

import pytest

from kafka_wire.acl.rules import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    authorize,
    authorized_operations,
    create_error,
    delete_filter_error,
    filter_matches,
    matching,
    resource_matches,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
READ, WRITE, ALL = Operation.READ, Operation.WRITE, Operation.ALL
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(
    rt: int = T,
    name: str = "orders",
    pt: int = LIT,
    principal: str = "User:alice",
    host: str = "*",
    op: int = READ,
    perm: int = ALLOW,
) -> AclBinding:
    return AclBinding(rt, name, pt, principal, host, op, perm)


def flt(
    rt: int = ResourceType.ANY,
    name: str | None = None,
    pt: int = PatternType.ANY,
    principal: str | None = None,
    host: str | None = None,
    op: int = Operation.ANY,
    perm: int = Permission.ANY,
) -> AclFilter:
    return AclFilter(rt, name, pt, principal, host, op, perm)


# -- CreateAcls validation ---------------------------------------------------------------------


def test_a_good_binding_is_accepted() -> None:
    assert create_error(acl()) is None
    assert create_error(acl(rt=C, name="kafka-cluster", op=Operation.ALTER)) is None
    assert create_error(acl(pt=PRE, name="ord", op=Operation.TWO_PHASE_COMMIT)) is None


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (acl(rt=ResourceType.ANY), "Invalid resourceType ANY"),
        (acl(rt=99), "Invalid resourceType UNKNOWN"),
        (acl(pt=PatternType.ANY), "Invalid patternType ANY"),
        (acl(pt=PatternType.MATCH), "Invalid patternType MATCH"),
        (acl(pt=42), "Invalid patternType UNKNOWN"),
        (acl(op=Operation.ANY), "Invalid operation ANY"),
        (acl(op=77), "Invalid operation UNKNOWN"),
        (acl(perm=Permission.ANY), "Invalid permissionType ANY"),
        (acl(perm=9), "Invalid permissionType UNKNOWN"),
        (acl(name=""), "Invalid empty resource name"),
        (acl(rt=C, name="other"), "The only valid name for the CLUSTER resource is kafka-cluster"),
        (
            acl(principal="alice"),
            "Could not parse principal from `alice` (no colon is present separating the "
            "principal type from the principal name)",
        ),
    ],
)
def test_kafka_refuses_these_bindings(binding: AclBinding, message: str) -> None:
    assert create_error(binding) == message


def test_cluster_name_is_checked_before_the_other_fields() -> None:
    # AclApis checks the CLUSTER name and the empty name before the controller's checks.
    assert create_error(acl(rt=C, name="", op=Operation.ANY)) == (
        "The only valid name for the CLUSTER resource is kafka-cluster"
    )
    assert create_error(acl(name="", op=Operation.ANY)) == "Invalid empty resource name"


def test_filters_with_exact_unknown_codes_are_unparseable() -> None:
    assert flt(rt=ResourceType.UNKNOWN).has_unknown()
    assert flt(perm=Permission.UNKNOWN).has_unknown()
    assert not flt().has_unknown()
    assert not flt(rt=99).has_unknown()  # outside the enum: parsed, then reads as UNKNOWN


def test_delete_filter_errors() -> None:
    assert delete_filter_error(flt()) is None
    assert delete_filter_error(flt(rt=99)) == "Unknown patternFilter."
    assert delete_filter_error(flt(pt=9)) == "Unknown patternFilter."
    assert delete_filter_error(flt(op=99)) == "Unknown entryFilter."
    assert delete_filter_error(flt(perm=9)) == "Unknown entryFilter."


# -- filter matching ---------------------------------------------------------------------------


def test_any_filter_matches_everything() -> None:
    acls = [acl(), acl(rt=G, name="g", pt=PRE), acl(rt=C, name="kafka-cluster")]
    assert matching(flt(), acls) == acls


def test_literal_and_prefixed_filters_match_only_their_own_pattern_type() -> None:
    lit, pre = acl(name="orders"), acl(name="orders", pt=PRE)
    assert filter_matches(flt(pt=LIT, name="orders"), lit)
    assert not filter_matches(flt(pt=LIT, name="orders"), pre)
    assert filter_matches(flt(pt=PRE, name="orders"), pre)
    assert not filter_matches(flt(pt=PRE, name="ord"), pre)  # exact name, not a prefix test
    assert filter_matches(flt(pt=PatternType.ANY, name="orders"), pre)
    assert not filter_matches(flt(pt=PatternType.ANY, name="order"), pre)


def test_match_filter_finds_every_pattern_that_applies_to_a_name() -> None:
    acls = [
        acl(name="orders"),
        acl(name="*"),
        acl(name="ord", pt=PRE),
        acl(name="orders-eu", pt=PRE),
        acl(name="other"),
        acl(rt=G, name="orders"),
    ]
    got = matching(flt(rt=T, pt=PatternType.MATCH, name="orders"), acls)
    assert got == [acl(name="orders"), acl(name="*"), acl(name="ord", pt=PRE)]
    # MATCH without a name matches every LITERAL and PREFIXED pattern.
    assert len(matching(flt(pt=PatternType.MATCH), acls)) == len(acls)


def test_wildcard_literal_name_is_matched_literally_by_a_literal_filter() -> None:
    star = acl(name="*")
    assert filter_matches(flt(pt=LIT, name="*"), star)
    assert not filter_matches(flt(pt=LIT, name="orders"), star)


def test_entry_fields() -> None:
    a = acl(principal="User:alice", host="10.0.0.1", op=WRITE, perm=DENY)
    assert filter_matches(flt(principal="User:alice", host="10.0.0.1", op=WRITE, perm=DENY), a)
    assert not filter_matches(flt(principal="User:bob"), a)
    assert not filter_matches(flt(host="*"), a)  # host filter is an exact match
    assert not filter_matches(flt(op=READ), a)
    assert not filter_matches(flt(perm=ALLOW), a)
    assert not filter_matches(flt(rt=G), a)


# -- enforcement -------------------------------------------------------------------------------


def test_resource_patterns() -> None:
    assert resource_matches(acl(name="orders"), T, "orders")
    assert not resource_matches(acl(name="orders"), T, "orders2")
    assert resource_matches(acl(name="*"), T, "anything")
    assert resource_matches(acl(name="ord", pt=PRE), T, "orders")
    assert not resource_matches(acl(name="ord", pt=PRE), T, "or")
    assert not resource_matches(acl(name="orders"), G, "orders")


def test_authorize_allow_deny_and_implied_describe() -> None:
    acls = [
        acl(name="orders", op=READ),
        acl(name="ord", pt=PRE, op=WRITE, principal="User:*"),
        acl(name="orders-secret", op=ALL, perm=DENY, principal="User:alice"),
        acl(name="hosted", host="10.0.0.1", op=READ),
    ]
    alice, bob = "User:alice", "User:bob"
    assert authorize(acls, alice, "1.2.3.4", READ, T, "orders")
    assert not authorize(acls, bob, "1.2.3.4", READ, T, "orders")
    assert authorize(acls, bob, "1.2.3.4", WRITE, T, "orders")  # User:* prefixed
    # READ implies DESCRIBE; nothing at all means no.
    assert authorize(acls, alice, "1.2.3.4", Operation.DESCRIBE, T, "orders")
    assert not authorize(acls, alice, "1.2.3.4", Operation.DELETE, T, "orders")
    # DENY ALL wins over the User:* prefixed WRITE.
    assert not authorize(acls, alice, "1.2.3.4", WRITE, T, "orders-secret")
    assert authorize(acls, bob, "1.2.3.4", WRITE, T, "orders-secret")
    # Host.
    assert authorize(acls, alice, "10.0.0.1", READ, T, "hosted")
    assert not authorize(acls, alice, "10.0.0.2", READ, T, "hosted")


def test_deny_of_read_does_not_deny_describe() -> None:
    acls = [acl(op=Operation.DESCRIBE), acl(op=READ, perm=DENY)]
    assert authorize(acls, "User:alice", "h", Operation.DESCRIBE, T, "orders")
    assert not authorize(acls, "User:alice", "h", READ, T, "orders")


def test_alter_configs_implies_describe_configs() -> None:
    acls = [acl(op=Operation.ALTER_CONFIGS)]
    assert authorize(acls, "User:alice", "h", Operation.DESCRIBE_CONFIGS, T, "orders")
    assert not authorize(acls, "User:alice", "h", Operation.DESCRIBE, T, "orders")


def test_authorized_operations_are_every_supported_operation() -> None:
    # The bit fields Kafka reports with no ACLs in the way (3576: a topic's eight operations).
    assert authorized_operations(ResourceType.TOPIC) == 3576
    assert authorized_operations(ResourceType.GROUP) == (1 << 3) | (1 << 6) | (1 << 8)
    assert authorized_operations(ResourceType.GROUP, requested=False) == -(2**31)
    cluster = authorized_operations(ResourceType.CLUSTER)
    assert cluster & (1 << Operation.CLUSTER_ACTION) and not cluster & (1 << Operation.READ)
