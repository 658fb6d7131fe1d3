"""kafka_wire.acl.Authorizer against Kafka 4.x's StandardAuthorizer rules, and the indexed lookup
against the plain scan (`rules.authorize`) over many bindings."""

from __future__ import annotations

import random

import pytest

from kafka_wire.acl import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_NAME,
    AclBinding,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    authorize,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
O = Operation  # noqa: E741
ALLOW, DENY = Permission.ALLOW, Permission.DENY
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(
    name: str = "orders",
    op: int = O.READ,
    perm: int = ALLOW,
    principal: str = ALICE,
    host: str = "*",
    pt: int = LIT,
    rt: int = T,
) -> AclBinding:
    return AclBinding(rt, name, pt, principal, host, op, perm)


def bits(*ops: Operation) -> int:
    return sum(1 << op for op in ops)


def test_super_users_may_do_anything_even_when_denied() -> None:
    az = Authorizer([acl(op=O.ALL, perm=DENY, principal="User:*")], frozenset({"User:admin"}))
    assert az.authorize("User:admin", HOST, O.DELETE, T, "orders")
    assert az.authorize("User:admin", HOST, O.ALTER, C, CLUSTER_NAME)
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")
    # Kafka compares "Type:name": another principal type of the same name is no super user.
    assert not az.authorize("Group:admin", HOST, O.READ, T, "orders")


def test_deny_beats_allow() -> None:
    az = Authorizer([acl(op=O.ALL), acl(op=O.WRITE, perm=DENY)])
    assert az.authorize(ALICE, HOST, O.READ, T, "orders")
    assert not az.authorize(ALICE, HOST, O.WRITE, T, "orders")
    # A prefixed DENY shadows a literal ALLOW, and a wildcard DENY everything.
    az = Authorizer([acl(), acl(name="ord", pt=PRE, perm=DENY)])
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")
    az = Authorizer([acl(), acl(name="*", perm=DENY, principal="User:*")])
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")


def test_literal_prefixed_and_wildcard_patterns() -> None:
    az = Authorizer(
        [
            acl(name="orders"),
            acl(name="pay", pt=PRE, op=O.WRITE),
            acl(name="*", op=O.DESCRIBE_CONFIGS),
            acl(name="grp-", pt=PRE, rt=G),
        ]
    )
    assert az.authorize(ALICE, HOST, O.READ, T, "orders")
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders2")  # literal is exact
    assert az.authorize(ALICE, HOST, O.WRITE, T, "payments")
    assert az.authorize(ALICE, HOST, O.WRITE, T, "pay")  # a prefix covers itself
    assert not az.authorize(ALICE, HOST, O.WRITE, T, "pa")
    assert not az.authorize(ALICE, HOST, O.WRITE, T, "orders")
    assert az.authorize(ALICE, HOST, O.DESCRIBE_CONFIGS, T, "anything")
    assert az.authorize(ALICE, HOST, O.READ, G, "grp-1")
    assert not az.authorize(ALICE, HOST, O.READ, T, "grp-1")  # the type is part of the key
    # A PREFIXED "*" is no wildcard: it covers names that start with "*".
    az = Authorizer([acl(name="*", pt=PRE)])
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")
    assert az.authorize(ALICE, HOST, O.READ, T, "*x")


def test_principal_and_host_wildcards() -> None:
    az = Authorizer(
        [
            acl(principal="User:*", op=O.WRITE),
            acl(host="10.0.0.9", op=O.DELETE),
            acl(host="*", op=O.ALTER, principal=BOB),
        ]
    )
    assert az.authorize(ALICE, HOST, O.WRITE, T, "orders")
    assert az.authorize(BOB, "192.168.1.1", O.WRITE, T, "orders")
    assert az.authorize(ALICE, "10.0.0.9", O.DELETE, T, "orders")
    assert not az.authorize(ALICE, HOST, O.DELETE, T, "orders")
    assert az.authorize(BOB, "1.2.3.4", O.ALTER, T, "orders")
    assert not az.authorize(ALICE, HOST, O.ALTER, T, "orders")


def test_implied_operations() -> None:
    for op in (O.READ, O.WRITE, O.DELETE, O.ALTER):
        assert Authorizer([acl(op=op)]).authorize(ALICE, HOST, O.DESCRIBE, T, "orders")
    assert not Authorizer([acl(op=O.CREATE)]).authorize(ALICE, HOST, O.DESCRIBE, T, "orders")
    assert not Authorizer([acl(op=O.DESCRIBE)]).authorize(ALICE, HOST, O.READ, T, "orders")
    az = Authorizer([acl(op=O.ALTER_CONFIGS)])
    assert az.authorize(ALICE, HOST, O.DESCRIBE_CONFIGS, T, "orders")
    assert not az.authorize(ALICE, HOST, O.DESCRIBE, T, "orders")
    az = Authorizer([acl(op=O.ALL)])
    assert all(az.authorize(ALICE, HOST, op, T, "orders") for op in O if op > O.ALL)
    # Implication widens ALLOWs only: a DENY of READ leaves DESCRIBE, a DENY of ALL denies all.
    az = Authorizer([acl(op=O.ALL), acl(op=O.READ, perm=DENY)])
    assert az.authorize(ALICE, HOST, O.DESCRIBE, T, "orders")
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")
    az = Authorizer([acl(op=O.ALL), acl(op=O.ALL, perm=DENY)])
    assert not any(az.authorize(ALICE, HOST, op, T, "orders") for op in O if op > O.ALL)


@pytest.mark.parametrize("default", [False, True])
def test_no_acl_found_takes_the_default(default: bool) -> None:
    az = Authorizer([acl(principal=BOB)], allow_everyone_if_no_acl_found=default)
    # No binding covers "payments": the default decides.
    assert az.authorize(ALICE, HOST, O.WRITE, T, "payments") is default
    assert az.authorize(ALICE, HOST, O.READ, G, "orders") is default
    # Bob's binding covers "orders", so Alice finds an ACL (just not one for her): denied.
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")
    # A binding for another host or operation still counts as found.
    az = Authorizer([acl(host="10.9.9.9")], allow_everyone_if_no_acl_found=default)
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")
    az = Authorizer([acl(name="ord", pt=PRE, op=O.WRITE)], allow_everyone_if_no_acl_found=default)
    assert not az.authorize(ALICE, HOST, O.READ, T, "orders")


def test_new_bindings_make_a_new_authorizer_with_an_empty_cache() -> None:
    az = Authorizer([acl()], frozenset({"User:admin"}), allow_everyone_if_no_acl_found=True)
    assert az.authorize(ALICE, HOST, O.READ, T, "orders")  # cached now
    revoked = az.with_bindings([acl(perm=DENY)])
    assert not revoked.authorize(ALICE, HOST, O.READ, T, "orders")
    assert az.authorize(ALICE, HOST, O.READ, T, "orders")  # the old one is unchanged
    assert revoked.super_users == frozenset({"User:admin"})
    assert revoked.allow_everyone_if_no_acl_found
    assert revoked.authorize(ALICE, HOST, O.READ, T, "other")


def test_the_cache_stays_bounded_and_keeps_answers() -> None:
    az = Authorizer([acl(name="t1", pt=PRE)], cache_size=8)
    for round_ in range(3):
        for i in range(20):
            assert az.authorize(ALICE, HOST, O.READ, T, f"t{i}") is str(i).startswith("1"), round_
    assert len(az._cache) == 8


def _random_bindings(rng: random.Random, n: int) -> list[AclBinding]:
    principals = [f"User:u{i}" for i in range(20)] + ["User:*"]
    hosts = ["*", "*", "*", "10.0.0.1", "10.0.0.2"]
    ops = [O.READ, O.WRITE, O.DESCRIBE, O.ALL, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS, O.DELETE]
    out = []
    for _ in range(n):
        rt = rng.choice([T, T, T, G])
        r = rng.random()
        if r < 0.01:
            name, pt = "*", LIT
        elif r < 0.4:
            name, pt = f"app{rng.randrange(50)}-" + "x" * rng.randrange(4), PRE
        else:
            name, pt = f"app{rng.randrange(50)}-{rng.randrange(200)}", LIT
        perm = DENY if rng.random() < 0.1 else ALLOW
        out.append(
            AclBinding(
                rt, name, pt, rng.choice(principals), rng.choice(hosts), rng.choice(ops), perm
            )
        )
    return out


@pytest.mark.parametrize("default", [False, True])
def test_ten_thousand_bindings_decide_as_the_scan_does(default: bool) -> None:
    rng = random.Random(20240611)
    bindings = _random_bindings(rng, 10_000)
    az = Authorizer(bindings, frozenset({"User:u0"}), allow_everyone_if_no_acl_found=default)
    allowed = denied = 0
    for _ in range(1_000):
        principal = f"User:u{rng.randrange(22)}"  # u20 and u21 have no binding of their own
        host = rng.choice(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        op = rng.choice([O.READ, O.WRITE, O.DESCRIBE, O.DESCRIBE_CONFIGS, O.DELETE, O.ALTER])
        rt = rng.choice([T, G])
        name = rng.choice(
            [f"app{rng.randrange(60)}-{rng.randrange(220)}", f"app{rng.randrange(60)}-xx", "zz"]
        )
        expected = principal == "User:u0" or authorize(
            bindings, principal, host, op, rt, name, default
        )
        got = az.authorize(principal, host, op, rt, name)
        assert got is expected, (principal, host, op, rt, name)
        assert az.authorize(principal, host, op, rt, name) is expected  # from the cache
        allowed += got
        denied += not got
    # Both outcomes are exercised, not one by accident.
    assert allowed > 50 and denied > 50


def test_authorized_operations_reflect_the_principal() -> None:
    az = Authorizer(
        [
            acl(op=O.READ),
            acl(op=O.ALTER_CONFIGS),
            acl(op=O.DELETE, perm=DENY),
            acl(name="g", rt=G, op=O.ALL),
            acl(name=CLUSTER_NAME, rt=C, op=O.IDEMPOTENT_WRITE),
        ],
        frozenset({"User:admin"}),
    )
    assert az.authorized_operations(ALICE, HOST, T, "orders") == bits(
        O.READ, O.DESCRIBE, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS
    )
    assert az.authorized_operations(BOB, HOST, T, "orders") == 0
    assert az.authorized_operations(ALICE, HOST, G, "g") == bits(O.READ, O.DESCRIBE, O.DELETE)
    assert az.authorized_operations(ALICE, HOST, C, CLUSTER_NAME) == bits(O.IDEMPOTENT_WRITE)
    assert az.authorized_operations("User:admin", HOST, T, "orders") == bits(
        O.READ, O.WRITE, O.CREATE, O.DESCRIBE, O.DELETE, O.ALTER, O.DESCRIBE_CONFIGS,
        O.ALTER_CONFIGS,
    )  # fmt: skip
    assert (
        az.authorized_operations(ALICE, HOST, T, "orders", requested=False)
        == AUTHORIZED_OPERATIONS_OMITTED
    )


def test_filter_visible_keeps_the_topics_the_principal_may_describe_in_order() -> None:
    az = Authorizer([acl(name="b", op=O.WRITE), acl(name="a", pt=PRE), acl(name="c", perm=DENY)])
    assert az.filter_visible(ALICE, HOST, ["c", "b", "x", "a1", "a2"]) == ["b", "a1", "a2"]
    assert az.filter_visible(BOB, HOST, ["b", "a1"]) == []


def test_authorize_any_as_kafka_authorizes_by_resource_type() -> None:
    def any_write(bindings: list[AclBinding], default: bool = False) -> bool:
        az = Authorizer(bindings, frozenset({"User:admin"}), default)
        return az.authorize_any(ALICE, HOST, O.WRITE, T)

    assert any_write([acl(name="orders", op=O.WRITE)])
    assert any_write([acl(name="ord", pt=PRE, op=O.ALL)])
    assert not any_write([acl(name="orders", op=O.READ)])
    assert not any_write([acl(op=O.WRITE), acl(op=O.WRITE, perm=DENY)])
    assert not any_write([acl(op=O.WRITE), acl(name="or", pt=PRE, op=O.WRITE, perm=DENY)])
    assert any_write([acl(op=O.WRITE), acl(name="x", pt=PRE, op=O.WRITE, perm=DENY)])
    assert not any_write([acl(op=O.WRITE), acl(name="*", op=O.WRITE, perm=DENY)])
    assert any_write([], default=True)
    assert not any_write([])
    az = Authorizer([acl(name="*", op=O.ALL, perm=DENY)], frozenset({"User:admin"}))
    assert az.authorize_any("User:admin", HOST, O.WRITE, T)
