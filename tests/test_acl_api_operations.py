"""The table of ACL checks per Kafka API (kafka_wire/acl/api_operations.py)."""

from __future__ import annotations

import pytest
from kio.schema.index import api_key_map

from kafka_wire.acl import (
    API_ACLS,
    Check,
    NameFrom,
    OnDeny,
    Operation,
    ResourceType,
    Rule,
    When,
    checks_for,
    denial_error,
)
from kafka_wire.errors import ErrorCode

T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
O = Operation  # noqa: E741


def rules(api_key: int, when: When | None = None) -> set[tuple[int, int, NameFrom]]:
    return {
        (r.resource_type, r.operation, r.name_from)
        for check in checks_for(api_key)
        if when is None or check.when == when
        for r in check.any_of
    }


def test_every_api_kio_knows_has_an_entry_named_as_kio_names_it() -> None:
    assert set(API_ACLS) == set(api_key_map)
    for key, entry in API_ACLS.items():
        assert entry.api_key == key
        assert entry.name == api_key_map[key]


def test_only_the_unauthenticated_and_owner_checked_apis_have_no_check() -> None:
    unchecked = {entry.name for entry in API_ACLS.values() if not entry.checks}
    assert unchecked == {
        "api_versions",
        "sasl_handshake",
        "sasl_authenticate",
        "get_telemetry_subscriptions",
        "push_telemetry",
        "renew_delegation_token",
        "expire_delegation_token",
    }


def test_every_check_is_well_formed() -> None:
    for entry in API_ACLS.values():
        for check in entry.checks:
            assert check.any_of, entry.name
            assert isinstance(check.error, ErrorCode)
            for rule in check.any_of:
                assert isinstance(rule, Rule)
                if rule.name_from is NameFrom.CLUSTER:
                    assert rule.resource_type == C, entry.name


def test_an_unknown_api_key_has_no_entry() -> None:
    with pytest.raises(KeyError):
        checks_for(10_000)


def test_denial_errors_by_resource_type() -> None:
    assert denial_error(T) == ErrorCode.topic_authorization_failed == 29
    assert denial_error(G) == ErrorCode.group_authorization_failed == 30
    assert denial_error(C) == ErrorCode.cluster_authorization_failed == 31
    assert denial_error(X) == ErrorCode.transactional_id_authorization_failed == 53


def test_produce() -> None:
    assert rules(0) == {(X, O.WRITE, NameFrom.TRANSACTIONAL_ID), (T, O.WRITE, NameFrom.TOPICS)}
    txn, topic = checks_for(0)
    assert txn.when is When.TRANSACTIONAL and txn.on_deny is OnDeny.FAIL_REQUEST
    assert txn.error == ErrorCode.transactional_id_authorization_failed
    assert topic.on_deny is OnDeny.FAIL_RESOURCE
    assert topic.error == ErrorCode.topic_authorization_failed
    # KIP-679: no IDEMPOTENT_WRITE at produce time.
    assert all(r[1] != O.IDEMPOTENT_WRITE for r in rules(0))


def test_fetch_and_list_offsets() -> None:
    assert rules(1, When.FROM_CLIENT) == {(T, O.READ, NameFrom.TOPICS)}
    (follower,) = [c for c in checks_for(1) if c.when is When.FROM_BROKER]
    assert follower.any_of == (Rule(C, O.CLUSTER_ACTION, NameFrom.CLUSTER),)
    assert follower.error == ErrorCode.topic_authorization_failed
    assert rules(2) == {(T, O.DESCRIBE, NameFrom.TOPICS)}


def test_init_producer_id() -> None:
    assert rules(22, When.TRANSACTIONAL) == {(X, O.WRITE, NameFrom.TRANSACTIONAL_ID)}
    (idempotent,) = [c for c in checks_for(22) if c.when is When.NOT_TRANSACTIONAL]
    assert idempotent.any_of == (
        Rule(C, O.IDEMPOTENT_WRITE, NameFrom.CLUSTER),
        Rule(T, O.WRITE, NameFrom.ANY_OF_TYPE),
    )
    assert idempotent.error == ErrorCode.cluster_authorization_failed


def test_groups() -> None:
    for key in (11, 12, 13, 14):  # JoinGroup, Heartbeat, LeaveGroup, SyncGroup
        assert checks_for(key) == (
            Check((Rule(G, O.READ, NameFrom.GROUP_ID),), on_deny=OnDeny.FAIL_REQUEST),
        )
    assert rules(8) == {(G, O.READ, NameFrom.GROUP_ID), (T, O.READ, NameFrom.TOPICS)}
    assert (G, O.DESCRIBE, NameFrom.GROUP_IDS) in rules(9)
    assert rules(15) == {(G, O.DESCRIBE, NameFrom.GROUP_IDS)}
    assert rules(42) == {(G, O.DELETE, NameFrom.GROUP_IDS)}
    (list_groups,) = checks_for(16)
    assert list_groups.on_deny is OnDeny.FILTER
    assert [r.resource_type for r in list_groups.any_of] == [C, G]
    assert rules(47) == {(G, O.DELETE, NameFrom.GROUP_ID), (T, O.READ, NameFrom.TOPICS)}
    assert rules(68) >= {(G, O.READ, NameFrom.GROUP_ID), (T, O.DESCRIBE, NameFrom.TOPICS)}


def test_transactions() -> None:
    assert rules(25) == {(X, O.WRITE, NameFrom.TRANSACTIONAL_ID), (G, O.READ, NameFrom.GROUP_ID)}
    assert rules(26) == {(X, O.WRITE, NameFrom.TRANSACTIONAL_ID)}
    assert rules(28) == {
        (X, O.WRITE, NameFrom.TRANSACTIONAL_ID),
        (G, O.READ, NameFrom.GROUP_ID),
        (T, O.READ, NameFrom.TOPICS),
    }
    assert rules(24, When.FROM_CLIENT) == {(X, O.WRITE, NameFrom.TRANSACTIONAL_IDS)}
    assert (T, O.WRITE, NameFrom.TOPICS) in rules(24)
    assert rules(10, When.KEY_TRANSACTION) == {(X, O.DESCRIBE, NameFrom.COORDINATOR_KEYS)}
    assert rules(10, When.KEY_GROUP) == {(G, O.DESCRIBE, NameFrom.COORDINATOR_KEYS)}


def test_admin_apis() -> None:
    cluster = NameFrom.CLUSTER
    assert rules(29) == {(C, O.DESCRIBE, cluster)}
    assert rules(30) == rules(31) == {(C, O.ALTER, cluster)}
    assert rules(19) >= {(C, O.CREATE, cluster), (T, O.CREATE, NameFrom.TOPICS)}
    (create,) = [c for c in checks_for(19) if c.when is When.ALWAYS]
    assert create.error == ErrorCode.topic_authorization_failed  # the topic's, not the cluster's
    assert rules(20) == {(T, O.DELETE, NameFrom.TOPICS)}
    assert rules(21) == {(T, O.DELETE, NameFrom.TOPICS)}
    assert rules(37) == {(T, O.ALTER, NameFrom.TOPICS)}
    assert rules(32, When.CONFIG_TOPIC) == {(T, O.DESCRIBE_CONFIGS, NameFrom.CONFIG_RESOURCES)}
    assert rules(32, When.CONFIG_BROKER) == {(C, O.DESCRIBE_CONFIGS, NameFrom.CONFIG_RESOURCES)}
    for key in (33, 44):
        assert rules(key, When.CONFIG_TOPIC) == {(T, O.ALTER_CONFIGS, NameFrom.CONFIG_RESOURCES)}
    assert rules(48) == {(C, O.DESCRIBE_CONFIGS, cluster)}
    assert rules(49) == {(C, O.ALTER_CONFIGS, cluster)}
    assert rules(50) == {(C, O.DESCRIBE, cluster)}
    assert rules(51) == {(C, O.ALTER, cluster)}
    assert rules(43) == rules(45) == {(C, O.ALTER, cluster)}
    assert rules(46) == {(C, O.DESCRIBE, cluster)}
    assert rules(61) == {(T, O.READ, NameFrom.TOPICS)}
    assert (X, O.DESCRIBE, NameFrom.TRANSACTIONAL_IDS) in rules(65)
    assert rules(66) == {(X, O.DESCRIBE, NameFrom.LISTED_TRANSACTIONAL_IDS)}
    assert (T, O.DESCRIBE, NameFrom.TOPICS) in rules(75)


def test_metadata_and_describe_cluster() -> None:
    assert rules(3, When.ALWAYS) == {
        (T, O.DESCRIBE, NameFrom.TOPICS),
        (T, O.DESCRIBE, NameFrom.LISTED_TOPICS),
    }
    assert rules(3, When.AUTO_CREATE) == {
        (C, O.CREATE, NameFrom.CLUSTER),
        (T, O.CREATE, NameFrom.TOPICS),
    }
    (describe_cluster,) = checks_for(60)
    assert describe_cluster.when is When.OPERATIONS_REQUESTED
    assert describe_cluster.on_deny is OnDeny.NO_OPERATIONS
    assert describe_cluster.any_of == (Rule(C, O.DESCRIBE, NameFrom.CLUSTER),)
