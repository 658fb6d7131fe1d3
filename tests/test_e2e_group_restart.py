"""Classic consumer groups outlive a restart of their coordinating main (membership on the WAL,
main_broker/groups/persistence.py), with real clients through zone proxies.

One `zonefleet up --zones 3` for the module; `restart_main` SIGTERMs the group's coordinator and
`up` starts it again on the same WAL. The members of before keep heartbeating: no new
assignment, the same generation and member ids, every record read once. A member that does
not come back (killed -9 with the coordinator down) expires one session timeout after the
coordinator recovered, and the other member takes its partitions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kio.schema.errors import ErrorCode

from tests.fleet_process import FleetProcess
from tests.group_members import (
    STATS,
    ChildMember,
    ConfluentMember,
    Event,
    check_exclusive_ownership,
    coordinator_of,
    main_bootstraps,
    restart_main,
    stop_all,
    values_read,
    wait_heartbeats,
    wait_kafka_python_heartbeats,
    wait_until,
)
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    create_topic,
    produce_confluent,
    running_up_fleet,
    unique_name,
    zone_client_id,
)

PARTITIONS = 4
# Longer than a main's restart, so that only a member that is really gone expires.
SESSION_MS = 30_000


@pytest.fixture(scope="module")
def fleet_proc(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    with running_up_fleet(tmp_path_factory.mktemp("group-restart")) as running:
        yield running


def _members(fleet: ZoneFleet, group: str) -> tuple[str, dict[str, tuple[str, str | None, bytes]]]:
    """(state, member id -> (client id, group instance id, assignment)) as DescribeGroups on
    the coordinating main shows."""
    raw = RawKafka(main_bootstraps(fleet)[coordinator_of(fleet, group)])
    try:
        resp = raw.request(15, 5, {"groups": [group], "include_authorized_operations": False})
    finally:
        raw.close()
    (g,) = resp.groups
    assert g.error_code == ErrorCode.none
    return g.group_state, {
        m.member_id: (m.client_id, m.group_instance_id, bytes(m.member_assignment))
        for m in g.members
    }


def _generation(fleet: ZoneFleet, group: str, member_id: str) -> int:
    """The group's generation, as the coordinator checks it: the one a Heartbeat of this
    member is not refused with ILLEGAL_GENERATION for (DescribeGroups does not show it)."""
    raw = RawKafka(main_bootstraps(fleet)[coordinator_of(fleet, group)])
    try:
        for generation in range(1, 100):
            resp = raw.request(
                12,
                4,
                {
                    "group_id": group,
                    "generation_id": generation,
                    "member_id": member_id,
                    "group_instance_id": None,
                },
            )
            if resp.error_code != ErrorCode.illegal_generation:
                assert resp.error_code in (ErrorCode.none, ErrorCode.rebalance_in_progress)
                return generation
    finally:
        raw.close()
    raise AssertionError(f"no generation of {group} knows {member_id}")


def _restart_coordinator(proc: FleetProcess, fleet: ZoneFleet, group: str) -> float:
    """Restart the group's coordinating main; the monotonic time it answered again."""
    return restart_main(proc, fleet, coordinator_of(fleet, group))


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_confluent_members_keep_their_generation_and_assignment(
    fleet_proc: tuple[FleetProcess, ZoneFleet], static: bool
) -> None:
    proc, fleet = fleet_proc
    topic, group = unique_name("gr"), unique_name("gr")
    create_topic(fleet, "az1", topic, PARTITIONS)
    events: list[Event] = []
    members = [
        ConfluentMember(
            f"m-{z}",
            fleet.bootstrap(z),
            z,
            group,
            [topic],
            events,
            **{"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000},
            **STATS,
            # KIP-345 static members come back with their instance ids.
            **({"group.instance.id": f"{group}-{z}"} if static else {}),
        )
        for z in ("az1", "az3")
    ]
    for m in members:
        m.start()
    try:
        wait_until(
            lambda: all(len(m.assigned()) == PARTITIONS // 2 for m in members),
            60,
            lambda: f"{[m.assigned() for m in members]}",
        )
        produce_confluent(fleet.bootstrap("az2"), "az2", topic, 400, "a")
        wait_until(
            lambda: len(values_read(members)) >= 400, 60, lambda: f"{len(values_read(members))}"
        )
        state, before = _members(fleet, group)
        assert state == "Stable" and len(before) == 2
        instances = {i for _, i, _ in before.values()}
        assert instances == ({f"{group}-az1", f"{group}-az3"} if static else {None})
        generation = _generation(fleet, group, next(iter(before)))
        events_before = list(events)

        _restart_coordinator(proc, fleet, group)
        # Right after recovery the coordinator knows the group as it was.
        assert _members(fleet, group) == ("Stable", before)
        assert {_generation(fleet, group, mid) for mid in before} == {generation}

        produce_confluent(fleet.bootstrap("az2"), "az2", topic, 400, "b")
        wait_until(
            lambda: len(values_read(members)) >= 800,
            90,
            lambda: f"{len(values_read(members))} read; {[m.assigned() for m in members]}",
        )
        # Some heartbeats later: still the same members and generation.
        wait_heartbeats(members, 3)
        assert _members(fleet, group) == ("Stable", before)
        assert {_generation(fleet, group, mid) for mid in before} == {generation}
        assert events == events_before, "the restart caused a rebalance"
    finally:
        stop_all(members)
    for m in members:
        assert m.error is None, m.error
    check_exclusive_ownership(events)
    values = values_read(members)
    expected = {f"{p}-{i}".encode() for p in "ab" for i in range(400)}
    assert sorted(values) == sorted(expected)  # each read once


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.calls: list[tuple[str, set[int]]] = []

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.calls.append(("revoke", {tp.partition for tp in revoked}))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.calls.append(("assign", {tp.partition for tp in assigned}))


def test_kafka_python_member_keeps_its_generation(
    fleet_proc: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = fleet_proc
    topic, group = unique_name("grk"), unique_name("grk")
    create_topic(fleet, "az2", topic, PARTITIONS)
    consumer = KafkaConsumer(
        bootstrap_servers=fleet.bootstrap("az2"),
        client_id=zone_client_id("az2"),
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=1000,
    )
    listener = _Listener()
    consumer.subscribe([topic], listener=listener)
    read: list[bytes] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def consume() -> None:
        try:
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=200).values():
                    read.extend(r.value for r in records)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        produce_confluent(fleet.bootstrap("az1"), "az1", topic, 300, "a")
        wait_until(lambda: len(read) >= 300, 60, lambda: f"{len(read)} read")
        # (kafka-python's eager protocol revokes nothing before its first assignment.)
        calls = list(listener.calls)
        assert calls[-1] == ("assign", set(range(PARTITIONS)))
        generation = consumer._coordinator._generation.generation_id
        member_id = consumer._coordinator._generation.member_id
        assert _generation(fleet, group, member_id) == generation

        _restart_coordinator(proc, fleet, group)
        produce_confluent(fleet.bootstrap("az1"), "az1", topic, 300, "b")
        wait_until(lambda: len(read) >= 600, 90, lambda: f"{len(read)} read")
        wait_kafka_python_heartbeats(consumer, 3)  # by the restarted coordinator
        assert listener.calls == calls, "the restart caused a rebalance"
        assert consumer._coordinator._generation.generation_id == generation
        assert consumer._coordinator._generation.member_id == member_id
        assert _generation(fleet, group, member_id) == generation
        assert _members(fleet, group)[0] == "Stable"
    finally:
        stop.set()
        thread.join(10)
        consumer.close(autocommit=False)
    assert not failure, failure
    expected = {f"{p}-{i}".encode() for p in "ab" for i in range(300)}
    assert sorted(read) == sorted(expected)  # each read once


def test_a_member_that_does_not_come_back_expires_after_its_session(
    fleet_proc: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = fleet_proc
    session_ms = 10_000
    topic, group = unique_name("grx"), unique_name("grx")
    create_topic(fleet, "az3", topic, PARTITIONS)
    events: list[Event] = []
    survivor = ConfluentMember(
        "survivor",
        fleet.bootstrap("az1"),
        "az1",
        group,
        [topic],
        events,
        **{"session.timeout.ms": session_ms},
    )
    survivor.start()
    wait_until(lambda: len(survivor.assigned()) == PARTITIONS, 60, lambda: f"{survivor.assigned()}")
    child = ChildMember(
        fleet.bootstrap("az2"), "az2", group, topic, **{"session.timeout.ms": session_ms}
    )
    try:
        wait_until(
            lambda: len(survivor.assigned()) == PARTITIONS // 2 and child.holds_partitions(),
            60,
            lambda: f"survivor {survivor.assigned()}, child {child.lines}",
        )
        state, before = _members(fleet, group)
        assert state == "Stable" and len(before) == 2
        (survivor_id,) = [m for m, (c, _, _) in before.items() if c == zone_client_id("az1")]
        generation = _generation(fleet, group, survivor_id)
        taken = len(events)

        child.kill()  # gone for good, no LeaveGroup
        recovered = _restart_coordinator(proc, fleet, group)
        # Restored with both members: the dead one is still there until its session ends.
        assert _members(fleet, group) == ("Stable", before)
        wait_until(
            lambda: survivor.assigned() == set(range(PARTITIONS)),
            session_ms / 1000 + 60,
            lambda: f"survivor holds {survivor.assigned()}",
        )
        # Not at once (as when the group was forgotten): one session after the recovery.
        moved_at = min(t for t, _, kind, _ in events[taken:] if kind in ("assign", "revoke"))
        assert moved_at >= recovered + session_ms / 1000 - 3, (moved_at - recovered, events)
        state, after = _members(fleet, group)
        assert (state, list(after)) == ("Stable", [survivor_id])
        assert _generation(fleet, group, survivor_id) == generation + 1
        produce_confluent(fleet.bootstrap("az2"), "az2", topic, 200, "x")
        wait_until(
            lambda: {f"x-{i}".encode() for i in range(200)} <= set(values_read([survivor])),
            60,
            lambda: f"{len(values_read([survivor]))} read",
        )
    finally:
        child.kill()
        stop_all([survivor])
    assert survivor.error is None, survivor.error
    check_exclusive_ownership(events)
