"""ACLs enforced in the zone proxies (issue 15), with confluent-kafka over SASL.

One 3-zone fleet for the module, SASL_PLAINTEXT listeners on the proxies, `[security]
authorizer = true` with `super_users = ["User:admin"]` (admin logs in with PLAIN). admin
creates the topics, SCRAM user alice and the ACLs through a proxy; alice then gets Kafka's
error codes: TOPIC_AUTHORIZATION_FAILED on produce (nothing written), GROUP_AUTHORIZATION_FAILED
for a group she may not read, a Metadata answer without the topics she may not see, a DENY
that beats a prefixed ALLOW, and an ACL removed stops her on every proxy within the refresh
bound (docs/security.md). The admin APIs are checked per resource too: CreateTopics without
CREATE, DescribeConfigs without DESCRIBE_CONFIGS, CreateAcls without ALTER on the cluster,
ListGroups showing only the groups she may describe, her authorized operations on groups and
topics, and a transactional producer with and without WRITE on its transactional id. Each
wait is for an observable outcome, not a fixed time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
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
GROUP_ADMIN, TXN_OK, TXN_NO = f"g-admin-{SUFFIX}", f"tx-ok-{SUFFIX}", f"tx-no-{SUFFIX}"


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
    _acl(ResourceType.TOPIC, "orders-", PREFIXED, AclOperation.DESCRIBE_CONFIGS, ALLOW),
    _acl(ResourceType.TRANSACTIONAL_ID, TXN_OK, LITERAL, AclOperation.WRITE, ALLOW),
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


def _refused(future: Any, timeout: float = 30) -> int:
    """The error code a librdkafka admin future failed with."""
    with pytest.raises(KafkaException) as failed:
        future.result(timeout=timeout)
    return int(failed.value.args[0].code())


def test_alice_cannot_grant_herself_anything(acl_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    """CreateAcls needs ALTER on the cluster: alice's is refused in the proxy and stores
    nothing."""
    _, fleet = acl_fleet
    alice = AdminClient(_conf(fleet, "az1", "alice"))
    grant = _acl(ResourceType.TOPIC, SECRET, LITERAL, AclOperation.ALL, ALLOW)
    for future in alice.create_acls([grant]).values():
        assert _refused(future) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    admin = AdminClient(_conf(fleet, "az1", "admin"))
    mine = AclBindingFilter(
        ResourceType.TOPIC, SECRET, ResourcePatternType.ANY, None, None,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip
    assert admin.describe_acls(mine).result(timeout=30) == []


def test_create_topics_needs_create(acl_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = acl_fleet
    alice = AdminClient(_conf(fleet, "az2", "alice"))
    wanted = f"orders-new-{SUFFIX}"
    for future in alice.create_topics([NewTopic(wanted, 1, 1)]).values():
        assert _refused(future) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin = AdminClient(_conf(fleet, "az2", "admin"))
    assert wanted not in admin.list_topics(timeout=10).topics


def test_describe_configs_needs_describe_configs(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    alice = AdminClient(_conf(fleet, "az3", "alice"))
    # DESCRIBE_CONFIGS on orders-*, none on secret-*.
    (mine,) = alice.describe_configs([ConfigResource(ResourceType.TOPIC, ORDERS)]).values()
    assert "retention.ms" in mine.result(timeout=30)
    (other,) = alice.describe_configs([ConfigResource(ResourceType.TOPIC, SECRET)]).values()
    assert _refused(other) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _join_group(conf: dict[str, Any], group: str) -> None:
    """A member of `group` on orders that commits an offset, then leaves."""
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([ORDERS])
    deadline = time.monotonic() + 40
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.5)
    assert consumer.assignment(), f"{group} never got an assignment"
    consumer.commit(offsets=[TopicPartition(ORDERS, 0, 0)], asynchronous=False)
    consumer.close()


def test_alice_lists_and_describes_only_her_groups(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    _join_group(_conf(fleet, "az1", "admin"), GROUP_ADMIN)
    _join_group(_conf(fleet, "az1", "alice"), GROUP_OK)
    admin = AdminClient(_conf(fleet, "az1", "admin"))
    everyone = {g.group_id for g in admin.list_consumer_groups().result(timeout=30).valid}
    assert {GROUP_ADMIN, GROUP_OK} <= everyone
    for zone in fleet.zones:
        alice = AdminClient(_conf(fleet, zone, "alice"))
        listed = {g.group_id for g in alice.list_consumer_groups().result(timeout=30).valid}
        assert GROUP_OK in listed and GROUP_ADMIN not in listed, (zone, listed)
    alice = AdminClient(_conf(fleet, "az2", "alice"))
    described = alice.describe_consumer_groups(
        [GROUP_OK, GROUP_ADMIN], include_authorized_operations=True
    )
    # READ on her group: READ and DESCRIBE, not DELETE.
    ops = described[GROUP_OK].result(timeout=30).authorized_operations
    assert set(ops) == {AclOperation.READ, AclOperation.DESCRIBE}
    assert _refused(described[GROUP_ADMIN]) == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_describe_topics_shows_her_operations(acl_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = acl_fleet
    alice = AdminClient(_conf(fleet, "az1", "alice"))
    described = alice.describe_topics(
        TopicCollection([ORDERS, SECRET]), include_authorized_operations=True
    )
    ops = set(described[ORDERS].result(timeout=30).authorized_operations)
    # WRITE on orders-* may have been removed by then: the rest is hers for good.
    kept = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS}
    assert kept <= ops <= kept | {AclOperation.WRITE}
    assert _refused(described[SECRET]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin = AdminClient(_conf(fleet, "az1", "admin"))
    everything = admin.describe_topics(
        TopicCollection([ORDERS]), include_authorized_operations=True
    )
    assert AclOperation.ALTER_CONFIGS in everything[ORDERS].result(timeout=30).authorized_operations


def _transaction(conf: dict[str, Any], txn_id: str, topic: str) -> None:
    producer = Producer({**conf, "transactional.id": txn_id, "transaction.timeout.ms": 10000})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"in-txn")
    producer.commit_transaction(30)


def test_a_transactional_producer_needs_write_on_its_transactional_id(
    acl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = acl_fleet
    # Her own transactional id: the transaction APIs pass (InitProducerId, FindCoordinator,
    # AddPartitionsToTxn, EndTxn) and the records land. orders-x is denied outright; the
    # prefixed WRITE on orders- may have been removed by then, so write to one she keeps.
    admin = AdminClient(_conf(fleet, "az2", "admin"))
    granted = _acl(ResourceType.TOPIC, ORDERS, LITERAL, AclOperation.WRITE, ALLOW)
    for future in admin.create_acls([granted]).values():
        future.result(timeout=30)
    alice = _conf(fleet, "az2", "alice")
    deadline = time.monotonic() + 40
    while True:
        try:
            _transaction(alice, TXN_OK, ORDERS)
            break
        except KafkaException:  # her WRITE on orders is not on every proxy yet
            assert time.monotonic() < deadline, "alice's transaction never committed"
    with pytest.raises(KafkaException) as failed:
        _transaction(alice, TXN_NO, ORDERS)
    assert failed.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_no_check_failed_on_the_way(acl_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    """Every refusal above was an answer: no request handler failed in a proxy."""
    proc, _ = acl_fleet
    output = "".join(proc.output)
    assert "request handler failed" not in output
    assert "Traceback" not in output
