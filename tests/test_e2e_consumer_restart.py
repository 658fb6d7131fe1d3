"""KIP-848 consumer groups outlive a restart of their coordinating main (consumer_group records
on the WAL, main_broker/groups/consumer_persistence.py), with librdkafka `group.protocol=consumer`
members through zone proxies.

The fleet is test_consumer_protocol's (`zonefleet up --zones 3`, 6 s KIP-848 sessions, 500 ms
heartbeats); `restart_main` SIGTERMs the group's coordinator and `up` starts it again on the
same WAL. The members of before keep heartbeating with their epochs: no revocation, no new
assignment, no stall of a session timeout, every record read once. A member killed -9 with
the coordinator down expires one session after the recovery, and the survivor takes its
partitions.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from tests.fleet_process import FleetProcess
from tests.group_members import (
    ChildMember,
    ConfluentMember,
    Event,
    check_exclusive_ownership,
    coordinator_of,
    main_bootstraps,
    restart_main,
    stop_all,
    values_read,
    wait_until,
)
from tests.raw_kafka import RawKafka
from tests.test_consumer_protocol import KIP848, SESSION_TIMEOUT_MS, fleet_proc  # noqa: F401
from tests.zone_fleet import (
    ZoneFleet,
    create_topic,
    produce_confluent,
    unique_name,
    zone_client_id,
)

PARTITIONS = 4
SESSION_S = SESSION_TIMEOUT_MS / 1000
# librdkafka backs off reconnecting to a broker up to 10 s: a member that tried a few times
# while its coordinator was down might not heartbeat again within the fleet's 6 s session.
MEMBER = {**KIP848, "reconnect.backoff.max.ms": 500}


def _group(fleet: ZoneFleet, group: str) -> tuple[str, int, dict[str, tuple[str, int, Any]]]:
    """(state, group epoch, member id -> (client id, member epoch, assigned partitions)) as
    ConsumerGroupDescribe on the coordinating main shows."""
    raw = RawKafka(main_bootstraps(fleet)[coordinator_of(fleet, group)])
    try:
        resp = raw.request(69, 1, {"group_ids": [group], "include_authorized_operations": False})
    finally:
        raw.close()
    (g,) = resp.groups
    assert g.error_code == ErrorCode.none, g
    return (
        g.group_state,
        g.group_epoch,
        {
            m.member_id: (
                m.client_id,
                m.member_epoch,
                sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions),
            )
            for m in g.members
        },
    )


def test_members_keep_their_epochs_and_partitions(
    fleet_proc: tuple[FleetProcess, ZoneFleet],  # noqa: F811
) -> None:
    proc, fleet = fleet_proc
    topic, group = unique_name("kr"), unique_name("kr")
    create_topic(fleet, "az1", topic, PARTITIONS)
    events: list[Event] = []
    members = [
        ConfluentMember(f"m-{z}", fleet.bootstrap(z), z, group, [topic], events, **MEMBER)
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
        wait_until(
            lambda: _group(fleet, group)[0] == "Stable", 30, lambda: f"{_group(fleet, group)}"
        )
        before = _group(fleet, group)
        assert len(before[2]) == 2
        events_before = list(events)

        restart_main(proc, fleet, coordinator_of(fleet, group))
        # Right after recovery the coordinator knows the group as it was.
        assert _group(fleet, group) == before
        produce_confluent(fleet.bootstrap("az2"), "az2", topic, 400, "b")
        produced = time.monotonic()
        # No stall of a session timeout (a group that had to be rebuilt from rejoins would
        # hand out no partition for one).
        wait_until(
            lambda: len(values_read(members)) >= 800,
            SESSION_S - 1,
            lambda: f"{len(values_read(members))} read; {[m.assigned() for m in members]}",
        )
        assert time.monotonic() - produced < SESSION_S - 1
        # Past a session after the recovery: both members heartbeat on with their epochs.
        time.sleep(SESSION_S + 1)
        assert _group(fleet, group) == before
        assert events == events_before, "the restart caused a revocation or a new assignment"
    finally:
        stop_all(members)
    for m in members:
        assert m.error is None, m.error
    check_exclusive_ownership(events)
    values = values_read(members)
    expected = {f"{p}-{i}".encode() for p in "ab" for i in range(400)}
    assert sorted(values) == sorted(expected)  # each read once


def test_a_member_killed_before_the_restart_expires_one_session_after_recovery(
    fleet_proc: tuple[FleetProcess, ZoneFleet],  # noqa: F811
) -> None:
    proc, fleet = fleet_proc
    topic, group = unique_name("kx"), unique_name("kx")
    create_topic(fleet, "az3", topic, PARTITIONS)
    events: list[Event] = []
    survivor = ConfluentMember(
        "survivor", fleet.bootstrap("az1"), "az1", group, [topic], events, **MEMBER
    )
    survivor.start()
    wait_until(lambda: len(survivor.assigned()) == PARTITIONS, 60, lambda: f"{survivor.assigned()}")
    child = ChildMember(
        fleet.bootstrap("az2"), "az2", group, topic, **{"group.protocol": "consumer"}
    )
    try:
        wait_until(
            lambda: len(survivor.assigned()) == PARTITIONS // 2 and child.holds_partitions(),
            60,
            lambda: f"survivor {survivor.assigned()}, child {child.lines}",
        )
        wait_until(
            lambda: _group(fleet, group)[0] == "Stable", 30, lambda: f"{_group(fleet, group)}"
        )
        state, epoch, before = _group(fleet, group)
        assert len(before) == 2
        (survivor_id,) = [m for m, (c, _, _) in before.items() if c == zone_client_id("az1")]
        taken = len(events)

        child.kill()  # gone for good, no leave heartbeat
        recovered = restart_main(proc, fleet, coordinator_of(fleet, group))
        # Restored with both members: the dead one is there until its session ends.
        assert _group(fleet, group) == (state, epoch, before)
        wait_until(
            lambda: survivor.assigned() == set(range(PARTITIONS)),
            SESSION_S + 30,
            lambda: f"survivor holds {survivor.assigned()}",
        )
        # Not at once (as when the group was forgotten): one session after the recovery.
        moved_at = min(t for t, _, kind, _ in events[taken:] if kind in ("assign", "revoke"))
        assert moved_at >= recovered + SESSION_S - 1.5, (moved_at - recovered, events)
        # No revocation of the survivor's own partitions: it only gained the dead one's.
        assert [kind for _, _, kind, _ in events[taken:]] == ["assign"], events[taken:]
        state, _, after = _group(fleet, group)
        assert list(after) == [survivor_id] and after[survivor_id][2] == list(range(PARTITIONS))
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
