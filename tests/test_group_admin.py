"""Group and group-offset APIs through zone proxies, with real clients (issue 5, "Groups").

One `zonefleet up --zones 3` for the module; every client uses a zone proxy's bootstrap (raw
requests that must reach one main go to that main's own port). Covered: DeleteGroups and
OffsetDelete (errors, and durability across restarts of the coordinating mains), ListGroups
filters, DescribeGroups authorized operations, commit metadata and leader epochs, static
membership, cooperative-sticky rebalancing, consumer lag, and the same offset scenarios with
confluent-kafka, kafka-python and aiokafka.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata as AIOOffsetAndMetadata
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AclOperation, OffsetSpec
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KTopicPartition
from kafka.structs import OffsetAndMetadata as KOffsetAndMetadata
from kio.schema.errors import ErrorCode

from tests.fleet_process import FleetProcess
from tests.group_members import (
    STATS,
    ConfluentMember,
    Event,
    check_exclusive_ownership,
    coordinator_of,
    main_bootstraps,
    restart_main,
    stop_all,
    wait_heartbeats,
    wait_kafka_python_heartbeats,
    wait_until,
)
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    check_exactly_once_in_order,
    create_topic,
    is_marker,
    kept_admin,
    produce_confluent,
    produce_markers,
    running_up_fleet,
    unique_name,
    zone_client_id,
)

INT32_MIN = -(2**31)


@pytest.fixture(scope="module")
def fleet_proc(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    with running_up_fleet(tmp_path_factory.mktemp("groups")) as running:
        yield running


@pytest.fixture(scope="module")
def zone_fleet(fleet_proc: tuple[FleetProcess, ZoneFleet]) -> ZoneFleet:
    return fleet_proc[1]


def _error_code(future: object) -> int:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=30)  # type: ignore[attr-defined]
    return int(info.value.args[0].code())


def _commit_standalone(
    fleet: ZoneFleet, zone: str, group: str, offsets: dict[tuple[str, int], int]
) -> None:
    """Commit for a group nobody is a member of (generation -1), as admin tools do. The
    group's coordinator may learn of a topic just created a moment later: then it retries."""
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
    )
    deadline = time.monotonic() + 15
    while True:
        (future,) = kept_admin(fleet, zone).alter_consumer_group_offsets([request]).values()
        try:
            result = future.result(timeout=30)
        except KafkaException as exc:
            code = exc.args[0].code()
            assert code == KafkaError.UNKNOWN_TOPIC_OR_PART and time.monotonic() < deadline, exc
            time.sleep(0.2)
            continue
        errors = [tp.error for tp in result.topic_partitions if tp.error is not None]
        if not errors:
            return
        unknown = all(e.code() == KafkaError.UNKNOWN_TOPIC_OR_PART for e in errors)
        assert unknown and time.monotonic() < deadline, result.topic_partitions
        time.sleep(0.2)


def _committed(fleet: ZoneFleet, zone: str, group: str) -> dict[tuple[str, int], int]:
    request = ConsumerGroupTopicPartitions(group)
    (future,) = kept_admin(fleet, zone).list_consumer_group_offsets([request]).values()
    return {
        (tp.topic, tp.partition): tp.offset for tp in future.result(timeout=30).topic_partitions
    }


def _one_group_per_main(fleet: ZoneFleet, prefix: str) -> dict[int, str]:
    groups: dict[int, str] = {}
    while len(groups) < len(main_bootstraps(fleet)):
        g = unique_name(prefix)
        groups.setdefault(coordinator_of(fleet, g), g)
    return groups


def _wait_settled(fleet: ZoneFleet, group: str, members: dict[str, ConfluentMember]) -> None:
    """Until DescribeGroups shows the classic group Stable with each member (by instance id)
    holding what its client was given: no rebalance under way, every callback run."""

    def held() -> dict[str | None, set[int]] | None:
        (future,) = kept_admin(fleet, "az1").describe_consumer_groups([group]).values()
        d = future.result(timeout=30)
        if d.state != ConsumerGroupState.STABLE:
            return None
        return {
            m.group_instance_id: {tp.partition for tp in m.assignment.topic_partitions}
            for m in d.members
        }

    wait_until(
        lambda: held() == {i: m.assigned() for i, m in members.items()},
        45,
        lambda: f"described {held()}, clients {[m.assigned() for m in members.values()]}",
    )


# -- DeleteGroups and OffsetDelete ------------------------------------------------------------


def test_delete_groups_errors_and_durable_deletion(
    fleet_proc: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = fleet_proc
    topic = unique_name("del")
    create_topic(fleet, "az1", topic, 3)
    produce_confluent(fleet.bootstrap("az1"), "az1", topic, 30, "del")
    # One group on every main: a single DeleteGroups is split by coordinator and merged.
    groups = _one_group_per_main(fleet, "dg")
    for g in groups.values():
        _commit_standalone(fleet, "az2", g, {(topic, 0): 5, (topic, 1): 7})
    kept = unique_name("kept")
    _commit_standalone(fleet, "az2", kept, {(topic, 2): 9})
    live = ConfluentMember("live", fleet.bootstrap("az3"), "az3", unique_name("live"), [topic])
    live.start()
    try:
        wait_until(lambda: live.assigned() == {0, 1, 2}, 45, lambda: f"{live.assigned()}")
        missing = unique_name("missing")
        futures = kept_admin(fleet, "az2").delete_consumer_groups([*groups.values(), missing])
        # (The future map is confluent's own: it resolves the futures it still holds.)
        assert _error_code(futures[missing]) == KafkaError.GROUP_ID_NOT_FOUND
        assert [futures[g].result(timeout=30) for g in groups.values()] == [None] * len(groups)
        (busy,) = kept_admin(fleet, "az1").delete_consumer_groups([live.group]).values()
        assert _error_code(busy) == KafkaError.NON_EMPTY_GROUP
    finally:
        stop_all([live])
    for g in groups.values():
        assert _committed(fleet, "az3", g) == {}
    # NOT_COORDINATOR from a main that does not coordinate the group (asked directly).
    other = next(n for n in main_bootstraps(fleet) if n != coordinator_of(fleet, kept))
    raw = RawKafka(main_bootstraps(fleet)[other])
    resp = raw.request(42, 2, {"groups_names": [kept, ""]})
    raw.close()
    assert [(r.group_id, r.error_code) for r in resp.results] == [
        (kept, ErrorCode.not_coordinator),
        ("", ErrorCode.invalid_group_id),
    ]
    # Durable: after restarting every main the deleted groups stay deleted, the other stays.
    for node in sorted(main_bootstraps(fleet)):
        restart_main(proc, fleet, node)
    assert _committed(fleet, "az1", kept) == {(topic, 2): 9}
    for g in groups.values():
        assert _committed(fleet, "az1", g) == {}
        (again,) = kept_admin(fleet, "az1").delete_consumer_groups([g]).values()
        assert _error_code(again) == KafkaError.GROUP_ID_NOT_FOUND


def test_offset_delete_refuses_subscribed_topics_and_is_durable(
    fleet_proc: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = fleet_proc
    subscribed, other = unique_name("od-sub"), unique_name("od-other")
    for t in (subscribed, other):
        create_topic(fleet, "az2", t, 2)
    group = unique_name("od")
    _commit_standalone(fleet, "az1", group, {(subscribed, 0): 3, (other, 0): 4, (other, 1): 6})
    member = ConfluentMember("m", fleet.bootstrap("az2"), "az2", group, [subscribed])
    member.start()
    admin = KafkaAdminClient(
        bootstrap_servers=fleet.bootstrap("az3"), client_id=zone_client_id("az3")
    )
    try:
        wait_until(lambda: member.assigned() == {0, 1}, 45, lambda: f"{member.assigned()}")
        result = admin.delete_group_offsets(
            group, [KTopicPartition(subscribed, 0), KTopicPartition(other, 0)]
        )
        errors = {tp.topic: err.errno for tp, err in result.items()}
        assert errors == {
            subscribed: ErrorCode.group_subscribed_to_topic,
            other: ErrorCode.none,
        }
    finally:
        stop_all([member])
    assert _committed(fleet, "az1", group) == {(subscribed, 0): 3, (other, 1): 6}
    # Unknown group and a group with members of a non-consumer protocol: raw OffsetDelete.
    raw = RawKafka(fleet.bootstrap("az1"))
    resp = raw.request(
        47,
        0,
        {
            "group_id": unique_name("none"),
            "topics": [{"name": other, "partitions": [{"partition_index": 1}]}],
        },
    )
    assert resp.error_code == ErrorCode.group_id_not_found
    raw.close()
    restart_main(proc, fleet, coordinator_of(fleet, group))
    assert _committed(fleet, "az2", group) == {(subscribed, 0): 3, (other, 1): 6}
    admin.close()


# -- ListGroups and DescribeGroups ------------------------------------------------------------


def test_each_broker_of_a_zone_view_lists_only_the_groups_it_coordinates(
    zone_fleet: ZoneFleet,
) -> None:
    """Admin clients send ListGroups to every broker Metadata shows (the zone's proxy and its
    main): a group is listed once, by the node FindCoordinator names in that view."""
    fleet = zone_fleet
    topic = unique_name("lg-once")
    create_topic(fleet, "az1", topic, 1)
    groups = _one_group_per_main(fleet, "lg-once")
    for group in groups.values():
        _commit_standalone(fleet, "az1", group, {(topic, 0): 1})
    for zone in fleet.zones:
        admin = kept_admin(fleet, zone)
        brokers = admin.list_topics(timeout=10).brokers
        listed: dict[str, list[int]] = {}
        for node_id, broker in brokers.items():
            raw = RawKafka(f"{broker.host}:{broker.port}", client_id=zone_client_id(zone))
            try:
                resp = raw.request(16, 4, {"states_filter": []})
            finally:
                raw.close()
            assert resp.error_code == ErrorCode.none
            for g in resp.groups:
                if g.group_id in groups.values():
                    listed.setdefault(g.group_id, []).append(node_id)
        for group in groups.values():
            raw = RawKafka(fleet.bootstrap(zone), client_id=zone_client_id(zone))
            try:
                found = raw.request(10, 4, {"key_type": 0, "coordinator_keys": [group]})
            finally:
                raw.close()
            assert listed.get(group) == [found.coordinators[0].node_id], (zone, group, listed)
        # kafka-python asks every broker too, and gets each group once.
        kp = KafkaAdminClient(
            bootstrap_servers=fleet.bootstrap(zone), client_id=zone_client_id(zone)
        )
        try:
            names = [g["group_id"] for g in kp.list_groups() if g["group_id"] in groups.values()]
        finally:
            kp.close()
        assert sorted(names) == sorted(groups.values()), (zone, names)


def test_list_groups_filters_and_describe_authorized_operations(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic = unique_name("lg")
    create_topic(fleet, "az1", topic, 2)
    stable, empty = unique_name("stable"), unique_name("empty")
    _commit_standalone(fleet, "az3", empty, {(topic, 0): 1})
    member = ConfluentMember("m", fleet.bootstrap("az1"), "az1", stable, [topic])
    member.start()
    try:
        wait_until(lambda: member.assigned() == {0, 1}, 45, lambda: f"{member.assigned()}")
        admin = kept_admin(fleet, "az2")

        def listed(**kw: object) -> dict[str, tuple[ConsumerGroupState, ConsumerGroupType]]:
            result = admin.list_consumer_groups(**kw).result(timeout=30)
            assert not result.errors
            return {
                g.group_id: (g.state, g.type) for g in result.valid if g.group_id in (stable, empty)
            }

        assert listed() == {
            stable: (ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC),
            empty: (ConsumerGroupState.EMPTY, ConsumerGroupType.CLASSIC),
        }
        assert set(listed(states={ConsumerGroupState.STABLE})) == {stable}
        assert set(listed(states={ConsumerGroupState.EMPTY})) == {empty}
        assert listed(types={ConsumerGroupType.CONSUMER}) == {}
        assert set(listed(types={ConsumerGroupType.CLASSIC})) == {stable, empty}
        kp = KafkaAdminClient(bootstrap_servers=fleet.bootstrap("az3"))
        names = {g["group_id"] for g in kp.list_groups(states_filter=["Stable"])}
        assert stable in names and empty not in names
        kp.close()

        with_ops = admin.describe_consumer_groups([stable], include_authorized_operations=True)
        d = with_ops[stable].result(timeout=30)
        assert d.state == ConsumerGroupState.STABLE
        assert set(d.authorized_operations) == {
            AclOperation.READ,
            AclOperation.DELETE,
            AclOperation.DESCRIBE,
        }
        assert [
            sorted(tp.partition for tp in m.assignment.topic_partitions) for m in d.members
        ] == [[0, 1]]
        without = admin.describe_consumer_groups([stable])[stable].result(timeout=30)
        assert without.authorized_operations is None
        # On the wire: INT32_MIN unless asked for.
        raw = RawKafka(fleet.bootstrap("az2"))
        for include, ops in ((False, INT32_MIN), (True, (1 << 3) | (1 << 6) | (1 << 8))):
            resp = raw.request(
                15, 5, {"groups": [stable], "include_authorized_operations": include}
            )
            assert [g.authorized_operations for g in resp.groups] == [ops]
        raw.close()
    finally:
        stop_all([member])


# -- commit metadata and leader epochs ----------------------------------------------------------


def test_commit_metadata_and_leader_epoch_with_every_client(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic = unique_name("meta")
    create_topic(fleet, "az1", topic, 3)
    produce_confluent(fleet.bootstrap("az1"), "az1", topic, 30, "meta")

    # confluent-kafka: commit with metadata and leader epoch, read back by another client.
    group = unique_name("meta-ck")
    c = Consumer({"bootstrap.servers": fleet.bootstrap("az1"), "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 4, "ck-meta", 0)], asynchronous=False)
    (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
    assert (tp.offset, tp.metadata, tp.leader_epoch) == (4, "ck-meta", 0)
    c.close()
    kp = KafkaAdminClient(bootstrap_servers=fleet.bootstrap("az2"))
    seen = kp.list_group_offsets(group)[group]
    assert seen[KTopicPartition(topic, 0)].offset == 4
    # confluent-kafka sends its metadata string with the C terminator; it is kept as sent.
    assert seen[KTopicPartition(topic, 0)].metadata == "ck-meta\x00"

    # kafka-python: OffsetAndMetadata with metadata and leader epoch.
    group = unique_name("meta-kp")
    kc = KafkaConsumer(bootstrap_servers=fleet.bootstrap("az2"), group_id=group)
    kc.commit({KTopicPartition(topic, 1): KOffsetAndMetadata(7, "kp-meta", 0)})
    got = kp.list_group_offsets(group)[group][KTopicPartition(topic, 1)]
    assert (got.offset, got.metadata, got.leader_epoch) == (7, "kp-meta", 0)
    kc.close()
    kp.close()
    ck_view = Consumer({"bootstrap.servers": fleet.bootstrap("az3"), "group.id": group})
    (tp,) = ck_view.committed([TopicPartition(topic, 1)], timeout=30)
    assert (tp.offset, tp.metadata, tp.leader_epoch) == (7, "kp-meta", 0)
    ck_view.close()

    # aiokafka: commit with metadata, read back through its admin client.
    group = unique_name("meta-aio")

    async def aio() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=fleet.bootstrap("az3"), group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            tp = AIOTopicPartition(topic, 2)
            consumer.assign([tp])  # aiokafka commits only for assigned partitions
            await consumer.commit({tp: AIOOffsetAndMetadata(9, "aio-meta")})
            assert await consumer.committed(tp) == 9
        finally:
            await consumer.stop()
        admin = AIOKafkaAdminClient(bootstrap_servers=fleet.bootstrap("az1"))
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group)
            assert offsets[AIOTopicPartition(topic, 2)].offset == 9
            assert offsets[AIOTopicPartition(topic, 2)].metadata == "aio-meta"
        finally:
            await admin.close()

    asyncio.run(aio())


# -- static membership (KIP-345) ----------------------------------------------------------------


def test_static_member_restart_without_rebalance_and_fenced_duplicate(
    zone_fleet: ZoneFleet,
) -> None:
    fleet = zone_fleet
    topic = unique_name("static")
    create_topic(fleet, "az1", topic, 4)
    group = unique_name("static")
    events: list[Event] = []
    static = {
        "session.timeout.ms": 20000,
        "heartbeat.interval.ms": 500,
        "partition.assignment.strategy": "range",
        **STATS,
    }
    a = ConfluentMember(
        "a",
        fleet.bootstrap("az1"),
        "az1",
        group,
        [topic],
        events,
        **static,
        **{"group.instance.id": "inst-a"},
    )
    b = ConfluentMember(
        "b",
        fleet.bootstrap("az2"),
        "az2",
        group,
        [topic],
        events,
        **static,
        **{"group.instance.id": "inst-b"},
    )
    members = [a, b]
    for m in members:
        m.start()
    try:
        wait_until(
            lambda: sorted(a.assigned() | b.assigned()) == [0, 1, 2, 3] and len(a.assigned()) == 2,
            45,
            lambda: f"{a.assigned()} {b.assigned()}",
        )
        _wait_settled(fleet, group, {"inst-a": a, "inst-b": b})
        a_parts, b_parts = a.assigned(), b.assigned()
        b_events = len([e for e in events if e[1] == "b"])
        # a restarts: a static member's close sends no LeaveGroup; the new process rejoins
        # with the same instance id and gets the same partitions, and b never rebalances.
        a.stop.set()
        a.join(30)
        a2 = ConfluentMember(
            "a2",
            fleet.bootstrap("az1"),
            "az1",
            group,
            [topic],
            events,
            **static,
            **{"group.instance.id": "inst-a"},
        )
        members.append(a2)
        a2.start()
        wait_until(lambda: a2.assigned() == a_parts, 45, lambda: f"{a2.assigned()}")
        wait_heartbeats([b], 3)  # b would have been told of a rebalance
        assert b.assigned() == b_parts
        assert len([e for e in events if e[1] == "b"]) == b_events, events
        # A duplicate of a live instance: the newcomer takes over, the old one is fenced.
        dup = ConfluentMember(
            "dup",
            fleet.bootstrap("az3"),
            "az3",
            group,
            [topic],
            events,
            **static,
            **{"group.instance.id": "inst-b"},
        )
        members.append(dup)
        dup.start()
        wait_until(
            lambda: any(
                e.code() == KafkaError.FENCED_INSTANCE_ID or "FENCED" in e.str().upper()
                for e in b.errors
            ),
            60,
            lambda: f"b errors {b.errors}",
        )
        wait_until(lambda: dup.assigned() == b_parts, 45, lambda: f"{dup.assigned()}")
    finally:
        stop_all(members)


def _stable_generation(consumer: Any) -> int:
    """kafka-python's view of its group generation (None while it rebalances: a failure)."""
    generation = consumer._coordinator.generation_if_stable()
    assert generation is not None, "the member is rebalancing"
    return int(generation.generation_id)


def test_static_member_restart_keeps_generation_with_kafka_python(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic, group = unique_name("kp-static"), unique_name("kp-static")
    create_topic(fleet, "az1", topic, 4)

    def member(zone: str, instance: str) -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=fleet.bootstrap(zone),
            client_id=zone_client_id(zone),
            group_id=group,
            group_instance_id=instance,
            session_timeout_ms=20000,
            heartbeat_interval_ms=500,
            enable_auto_commit=False,
        )

    def parts(c: KafkaConsumer) -> set[int]:
        return {tp.partition for tp in c.assignment()}

    a, b = member("az1", "kp-a"), member("az2", "kp-b")
    stop = threading.Event()

    def keep_polling(c: KafkaConsumer) -> None:
        while not stop.is_set():
            c.poll(timeout_ms=100)

    poller = threading.Thread(target=keep_polling, args=(b,), daemon=True)
    poller.start()
    try:
        deadline = time.monotonic() + 45
        while not (len(parts(a)) == 2 and len(parts(b)) == 2):
            assert time.monotonic() < deadline, f"{parts(a)} {parts(b)}"
            a.poll(timeout_ms=100)
        a_parts, b_parts = parts(a), parts(b)
        generation = _stable_generation(b)
        a.close(autocommit=False)  # a static member leaves no LeaveGroup behind
        a2 = member("az3", "kp-a")
        deadline = time.monotonic() + 45
        while not parts(a2):
            assert time.monotonic() < deadline, "the restarted member got nothing"
            a2.poll(timeout_ms=100)
        wait_kafka_python_heartbeats(b, 3)  # b would have been told of a rebalance
        assert parts(a2) == a_parts and parts(b) == b_parts
        assert _stable_generation(a2) == generation
        assert _stable_generation(b) == generation
        a2.close(autocommit=False)
    finally:
        stop.set()
        poller.join(10)
        b.close(autocommit=False)


def _count_heartbeats(consumer: AIOKafkaConsumer) -> list[bool]:
    """The answers to an aiokafka consumer's heartbeats from now on, as they come (True: not
    refused; a REBALANCE_IN_PROGRESS one is True too, and aiokafka then rejoins)."""
    answered: list[bool] = []
    coordinator = consumer._coordinator
    do_heartbeat = coordinator._do_heartbeat

    async def counted() -> bool:
        ok = bool(await do_heartbeat())
        answered.append(ok)
        return ok

    coordinator._do_heartbeat = counted
    return answered


def test_static_member_restart_keeps_generation_with_aiokafka(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic, group = unique_name("aio-static"), unique_name("aio-static")
    create_topic(fleet, "az1", topic, 4)

    def member(zone: str, instance: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=fleet.bootstrap(zone),
            client_id=zone_client_id(zone),
            group_id=group,
            group_instance_id=instance,
            session_timeout_ms=20000,
            heartbeat_interval_ms=500,
            enable_auto_commit=False,
        )

    def parts(c: AIOKafkaConsumer) -> set[int]:
        return {tp.partition for tp in c.assignment()}

    async def poll_until(members: list[AIOKafkaConsumer], done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 45
        while not done():
            assert time.monotonic() < deadline, [parts(m) for m in members]
            await asyncio.gather(*(m.getmany(timeout_ms=100) for m in members))

    async def scenario() -> None:
        a, b = member("az1", "aio-a"), member("az2", "aio-b")
        await a.start()
        await b.start()
        answered = _count_heartbeats(b)
        await poll_until([a, b], lambda: len(parts(a)) == 2 and len(parts(b)) == 2)
        a_parts, b_parts = parts(a), parts(b)
        generation = b._coordinator.generation
        await a.stop()  # a static member leaves no LeaveGroup behind
        a2 = member("az3", "aio-a")
        await a2.start()
        try:
            await poll_until([a2, b], lambda: bool(parts(a2)))
            # b would have been told of a rebalance.
            seen = sum(answered)
            await poll_until([a2, b], lambda: sum(answered) >= seen + 3)
            assert parts(a2) == a_parts and parts(b) == b_parts
            assert a2._coordinator.generation == b._coordinator.generation == generation
        finally:
            await a2.stop()
            await b.stop()

    asyncio.run(scenario())


# -- cooperative incremental rebalancing --------------------------------------------------------


def test_cooperative_sticky_members_join_and_leave_while_records_flow(
    zone_fleet: ZoneFleet,
) -> None:
    fleet = zone_fleet
    topic = unique_name("coop")
    partitions, n = 6, 3000
    create_topic(fleet, "az1", topic, partitions)
    group = unique_name("coop")
    events: list[Event] = []
    coop = {
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 10000,
    }

    def member(name: str, zone: str) -> ConfluentMember:
        return ConfluentMember(name, fleet.bootstrap(zone), zone, group, [topic], events, **coop)

    members = [member("m1", "az1")]
    members[0].start()
    try:
        wait_until(lambda: len(members[0].assigned()) == partitions, 45, lambda: "m1 assigned")
        producer_done: list[bool] = []

        def produce() -> None:
            for i in range(3):
                produce_confluent(fleet.bootstrap("az2"), "az2", topic, n // 3, f"coop{i}")
            producer_done.append(True)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        # m2 joins, and once it holds its half, m3.
        members.append(member("m2", "az2"))
        members[-1].start()
        wait_until(
            lambda: all(len(m.assigned()) == 3 for m in members),
            60,
            lambda: f"{[m.assigned() for m in members]}",
        )
        members.append(member("m3", "az3"))
        members[-1].start()
        wait_until(
            lambda: all(len(m.assigned()) == 2 for m in members),
            60,
            lambda: f"{[m.assigned() for m in members]}",
        )
        # m2 leaves (commits what it read before its partitions go).
        members[1].stop.set()
        members[1].join(30)
        wait_until(
            lambda: all(len(m.assigned()) == 3 for m in (members[0], members[2])),
            60,
            lambda: f"{[m.assigned() for m in members]}",
        )
        t.join(120)
        assert producer_done
        total = n // 3 * 3

        def read() -> int:
            return sum(len(m.records) for m in members)

        wait_until(lambda: read() >= total, 60, lambda: f"{read()} of {total}")
        # No duplicate still to come: each partition was read up to a marker after its records.
        markers = produce_markers(fleet.bootstrap("az2"), "az2", topic, partitions)
        wait_until(
            lambda: markers <= {v for m in members for _, _, v in m.records},
            60,
            lambda: f"{read()} of {total} and the markers",
        )
    finally:
        stop_all(members)
    for m in members:
        assert m.error is None, m.error
        assert not m.errors, m.errors
    check_exclusive_ownership(events)
    # Every partition's records reached exactly one member at a time, in order; over the
    # whole run every record arrived once.
    everything = [r for m in members for r in m.records]
    assert sorted(v for _, _, v in everything if is_marker(v)) == sorted(markers)
    records = [r for r in everything if not is_marker(r[2])]
    by_value = {v for _, _, v in records}
    assert len(records) == len(by_value) == total
    for i in range(3):
        mine = [r for r in records if r[2].startswith(f"coop{i}-".encode())]
        assert len(mine) == n // 3
    # Offsets per partition are dense across the members' shares.
    for p in range(partitions):
        offsets = sorted(o for q, o, _ in records if q == p)
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))


# -- consumer lag --------------------------------------------------------------------------------


def test_consumer_lag_through_a_proxy(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic = unique_name("lag")
    create_topic(fleet, "az1", topic, 3)
    produce_confluent(fleet.bootstrap("az1"), "az1", topic, 90, "lag")
    group = unique_name("lag")
    admin = kept_admin(fleet, "az3")

    def log_ends() -> dict[tuple[str, int], int]:
        ends = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(3)})
        return {(tp.topic, tp.partition): f.result(timeout=30).offset for tp, f in ends.items()}

    end = log_ends()
    assert sum(end.values()) == 90
    # The group read half of partition 0, all of partition 1 and nothing of partition 2.
    committed = {(topic, 0): end[(topic, 0)] // 2, (topic, 1): end[(topic, 1)]}
    _commit_standalone(fleet, "az2", group, committed)
    offsets = _committed(fleet, "az3", group)
    assert offsets == committed
    lag = {key: end[key] - offsets.get(key, 0) for key in end}
    assert lag == {
        (topic, 0): end[(topic, 0)] - end[(topic, 0)] // 2,
        (topic, 1): 0,
        (topic, 2): end[(topic, 2)],
    }
    # More records: the lag grows by exactly as many.
    produce_confluent(fleet.bootstrap("az2"), "az2", topic, 30, "lag2")
    later = log_ends()
    assert sum(later[k] - offsets.get(k, 0) for k in later) == sum(lag.values()) + 30


# -- mixed clients: the same group and offset scenario --------------------------------------------


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_group_scenario_with_each_client(zone_fleet: ZoneFleet, client: str) -> None:
    """Consume in a group, commit, read the commit back, describe the group, delete it."""
    fleet = zone_fleet
    zone = "az2"
    topic = unique_name(f"mix-{client}")
    create_topic(fleet, "az1", topic, 2)
    produce_confluent(fleet.bootstrap("az1"), "az1", topic, 40, "mix")
    group = unique_name(f"mix-{client}")
    bootstrap = fleet.bootstrap(zone)
    read: list[tuple[int, int, bytes]] = []
    if client == "confluent":
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([topic])
        deadline = time.monotonic() + 45
        while len(read) < 40 and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                read.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[arg-type]
        c.commit(asynchronous=False)
        committed = {tp.partition: tp.offset for tp in c.committed(c.assignment(), timeout=30)}
        d = kept_admin(fleet, zone).describe_consumer_groups([group])[group].result(timeout=30)
        assert d.state == ConsumerGroupState.STABLE and len(d.members) == 1
        c.close()
    elif client == "kafka-python":
        kc = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        deadline = time.monotonic() + 45
        while len(read) < 40 and time.monotonic() < deadline:
            for tp, msgs in kc.poll(timeout_ms=200).items():
                read.extend((tp.partition, m.offset, m.value) for m in msgs)
        kc.commit()
        committed = {p: kc.committed(KTopicPartition(topic, p)) for p in range(2)}
        kp = KafkaAdminClient(bootstrap_servers=bootstrap)
        desc = kp.describe_groups([group])[group]
        assert desc["group_state"] == "Stable" and len(desc["members"]) == 1
        kc.close()
        kp.close()
    else:

        async def aio() -> dict[int, int]:
            consumer = AIOKafkaConsumer(
                topic,
                bootstrap_servers=bootstrap,
                group_id=group,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
            await consumer.start()
            try:
                deadline = time.monotonic() + 45
                while len(read) < 40 and time.monotonic() < deadline:
                    batches = await consumer.getmany(timeout_ms=200)
                    for tp, msgs in batches.items():
                        read.extend((tp.partition, m.offset, m.value) for m in msgs)
                await consumer.commit()
                out = {p: await consumer.committed(AIOTopicPartition(topic, p)) for p in range(2)}
                admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
                await admin.start()
                try:
                    (desc,) = await admin.describe_consumer_groups([group])
                    (g,) = desc.to_object()["groups"]
                    assert g["state"] == "Stable" and len(g["members"]) == 1
                finally:
                    await admin.close()
            finally:
                await consumer.stop()
            return out  # type: ignore[return-value]

        committed = asyncio.run(aio())
    check_exactly_once_in_order(read, 40, "mix")
    ends = {p: max(o for q, o, _ in read if q == p) + 1 for p in range(2)}
    assert committed == ends
    # Another client sees the same commits, and the (now empty) group can be deleted.
    assert _committed(fleet, "az3", group) == {(topic, p): o for p, o in ends.items()}
    wait_until(
        lambda: (
            kept_admin(fleet, "az1")
            .describe_consumer_groups([group])[group]
            .result(timeout=30)
            .state
            == ConsumerGroupState.EMPTY
        ),
        30,
        lambda: "group never became empty",
    )
    if client == "kafka-python":
        kp = KafkaAdminClient(bootstrap_servers=fleet.bootstrap("az1"))
        assert kp.delete_groups([group]) == {group: "OK"}
        kp.close()
    else:
        (f,) = kept_admin(fleet, "az1").delete_consumer_groups([group]).values()
        assert f.result(timeout=30) is None
    assert _committed(fleet, "az1", group) == {}
