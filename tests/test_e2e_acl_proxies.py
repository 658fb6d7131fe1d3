"""ACLs enforced in the zone proxies (issue 15), with confluent-kafka over SASL.

One 3-zone fleet for the module, SASL_PLAINTEXT listeners on the proxies, `[security]
authorizer = true` with `super_users = ["User:admin"]` (admin logs in with PLAIN). admin
creates the topics, SCRAM user alice and the ACLs through a proxy; alice then gets Kafka's
error codes: TOPIC_AUTHORIZATION_FAILED on produce (nothing written), GROUP_AUTHORIZATION_FAILED
for a group she may not read, a Metadata answer without the topics she may not see, a DENY
that beats a prefixed ALLOW, and an ACL removed stops her on every proxy within the refresh
bound (docs/security.md). Each wait is for an observable outcome, not a fixed time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.fleet_process import FleetProcess
from tests.test_e2e_sasl_proxies import sasl_bootstrap, write_sasl_config
from tests.zone_fleet import ZoneFleet, running_up_fleet

ADMIN_PW = "admin-pw-acl"
ALICE_PW = "alice-pw-acl"
SUFFIX = uuid.uuid4().hex[:6]
ORDERS, SECRET, DENIED = f"orders-{SUFFIX}", f"secret-{SUFFIX}", f"orders-x-{SUFFIX}"
GROUP_OK, GROUP_NO = f"g-ok-{SUFFIX}", f"g-no-{SUFFIX}"


def _conf(fleet: ZoneFleet, zone: str, user: str, **extra: Any) -> dict[str, Any]:
    mech, pw = ("PLAIN", ADMIN_PW) if user == "admin" else ("SCRAM-SHA-512", ALICE_PW)
    return {
        "bootstrap.servers": sasl_bootstrap(fleet, zone),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mech,
        "sasl.username": user,
        "sasl.password": pw,
        **extra,
    }


def _acl(rtype: ResourceType, name: str, pattern: ResourcePatternType,
         op: AclOperation, perm: AclPermissionType) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, "User:alice", "*", op, perm)


ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ACLS = [
    # orders-* writable and readable by prefix, but orders-x-* is denied outright.
    _acl(ResourceType.TOPIC, "orders-", PREFIXED, AclOperation.WRITE, ALLOW),
    _acl(ResourceType.TOPIC, "orders-", PREFIXED, AclOperation.READ, ALLOW),
    _acl(ResourceType.TOPIC, DENIED, LITERAL, AclOperation.ALL, DENY),
    _acl(ResourceType.GROUP, GROUP_OK, LITERAL, AclOperation.READ, ALLOW),
]


@pytest.fixture(scope="module")
def acl_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    data_dir = tmp_path_factory.mktemp("acl") / "fleet"
    data_dir.mkdir(parents=True)
    config = write_sasl_config(
        data_dir,
        {"admin": ADMIN_PW},
        'authorizer = true\nsuper_users = ["User:admin"]\n',
    )
    with running_up_fleet(data_dir, config) as (proc, fleet):
        admin = AdminClient(_conf(fleet, "az1", "admin"))
        for future in admin.create_topics(
            [NewTopic(t, 2, 1) for t in (ORDERS, SECRET, DENIED)]
        ).values():
            future.result(timeout=30)
        upsert = UserScramCredentialUpsertion(
            "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), ALICE_PW.encode()
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        for future in admin.create_acls(ACLS).values():
            future.result(timeout=30)
        yield proc, fleet


def _produce(conf: dict[str, Any], topic: str, n: int = 3) -> list[KafkaError | None]:
    outcomes: list[KafkaError | None] = []
    producer = Producer({**conf, "message.timeout.ms": 20000})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(30)
    return outcomes


def _until(check: Callable[[], bool], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what


def _end_offsets(fleet: ZoneFleet, topic: str) -> list[int]:
    consumer = Consumer(_conf(fleet, "az1", "admin", **{"group.id": f"admin-{uuid.uuid4()}"}))
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(2)
        ]
    finally:
        consumer.close()


def test_produce_needs_write_and_a_deny_beats_a_prefixed_allow(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    alice = _conf(fleet, "az2", "alice")
    # The ACLs reach every proxy within the refresh bound: wait for alice's first write.
    _until(lambda: _produce(alice, ORDERS, 1) == [None], "alice never got WRITE on orders-*")
    assert _produce(alice, ORDERS) == [None, None, None]
    for topic in (SECRET, DENIED):
        errors = _produce(alice, topic)
        assert [e.code() if e else None for e in errors] == [
            KafkaError.TOPIC_AUTHORIZATION_FAILED
        ] * 3, (topic, errors)
        assert _end_offsets(fleet, topic) == [0, 0], f"{topic}: a denied produce wrote"


def test_metadata_hides_topics_alice_may_not_describe(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    for zone in fleet.zones:
        admin = AdminClient(_conf(fleet, zone, "alice"))
        _until(
            lambda admin=admin: ORDERS in admin.list_topics(timeout=10).topics,  # type: ignore[misc]
            "orders never visible to alice",
        )
        topics = admin.list_topics(timeout=10).topics
        assert SECRET not in topics and DENIED not in topics
        named = admin.list_topics(SECRET, timeout=10).topics[SECRET]
        assert named.error is not None
        assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_group_alice_may_not_read_is_refused(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    errors: list[KafkaError] = []
    consumer = Consumer(
        _conf(fleet, "az3", "alice", **{"group.id": GROUP_NO, "error_cb": errors.append})
    )
    consumer.subscribe([ORDERS])
    deadline = time.monotonic() + 40
    seen: list[int] = []
    while time.monotonic() < deadline and KafkaError.GROUP_AUTHORIZATION_FAILED not in seen:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is not None:
            seen.append(msg.error().code())
        seen.extend(e.code() for e in errors)
    consumer.close()
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in seen, seen
    # The group she may read works: she reads what she wrote.
    ok = Consumer(
        _conf(fleet, "az3", "alice", **{"group.id": GROUP_OK, "auto.offset.reset": "earliest"})
    )
    ok.subscribe([ORDERS])
    got = None
    deadline = time.monotonic() + 40
    while got is None and time.monotonic() < deadline:
        msg = ok.poll(0.5)
        if msg is not None and msg.error() is None:
            got = msg.value()
    ok.close()
    assert got is not None and got.startswith(b"v")


def test_a_removed_acl_stops_writes_on_every_proxy(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    for zone in fleet.zones:
        alice = _conf(fleet, zone, "alice")
        _until(lambda a=alice: _produce(a, ORDERS, 1) == [None], f"{zone}: no WRITE yet")  # type: ignore[misc]
    admin = AdminClient(_conf(fleet, "az1", "admin"))
    write = AclBindingFilter(
        ResourceType.TOPIC, "orders-", PREFIXED, "User:alice", "*", AclOperation.WRITE, ALLOW
    )
    removed_at = time.monotonic()
    for future in admin.delete_acls([write]).values():
        assert len(future.result(timeout=30)) == 1
    for zone in fleet.zones:
        alice = _conf(fleet, zone, "alice")

        def refused(a: dict[str, Any] = alice) -> bool:
            errors = _produce(a, ORDERS, 1)
            return errors[0] is not None and (
                errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
            )

        _until(refused, f"{zone}: alice still writes after the ACL went")
    # The documented bound: one refresh (5 s) plus a read, with the producers' own time.
    assert time.monotonic() - removed_at < 30


def test_alice_cannot_grant_herself_anything(acl_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    """CreateAcls is for super users only (until per-resource checks cover it): alice's
    closes her connection and stores nothing."""
    proc, fleet = acl_fleet
    alice = AdminClient(_conf(fleet, "az1", "alice", **{"socket.timeout.ms": 5000}))
    grant = _acl(ResourceType.TOPIC, SECRET, LITERAL, AclOperation.ALL, ALLOW)
    with pytest.raises(Exception):  # noqa: B017 - librdkafka reports the closed connection
        for future in alice.create_acls([grant]).values():
            future.result(timeout=15)
    admin = AdminClient(_conf(fleet, "az1", "admin"))
    mine = AclBindingFilter(
        ResourceType.TOPIC, SECRET, ResourcePatternType.ANY, None, None,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip
    assert admin.describe_acls(mine).result(timeout=30) == []
    assert "is for super users only" in "".join(proc.output)
