"""The KIP-848 consumer group protocol end to end (issue 5): librdkafka with
`group.protocol=consumer` against `zonefleet up --zones 3`, one member per zone through that
zone's proxy, and raw ConsumerGroupHeartbeat / ConsumerGroupDescribe / OffsetCommit v9 requests
for the error answers.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupType
from kio.schema.errors import ErrorCode

from tests.fleet_process import FleetProcess
from tests.group_members import (
    ConfluentMember,
    Event,
    check_exclusive_ownership,
    stop_all,
    wait_until,
)
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    create_topic,
    is_marker,
    kept_admin,
    produce_confluent,
    produce_markers,
    running_up_fleet,
    unique_name,
    write_zones_toml,
    zone_client_id,
)

PARTITIONS = 6
KIP848 = {"group.protocol": "consumer"}


SESSION_TIMEOUT_MS = 6000


@pytest.fixture(scope="module")
def fleet_proc(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    """`zonefleet up --config` of the `up --zones 3` TOML, with short KIP-848 sessions."""
    data_dir = tmp_path_factory.mktemp("kip848")
    path, _ = write_zones_toml(data_dir)
    text, count = re.subn(
        r"(?m)^(rpc_port = \d+)$",
        f"\\1\ngroup_consumer_session_timeout_ms = {SESSION_TIMEOUT_MS}"
        "\ngroup_consumer_heartbeat_interval_ms = 500",
        path.read_text(),
    )
    assert count == 3
    path.write_text(text)
    with running_up_fleet(data_dir, config=path) as running:
        yield running


@pytest.fixture(scope="module")
def zone_fleet(fleet_proc: tuple[FleetProcess, ZoneFleet]) -> ZoneFleet:
    return fleet_proc[1]


def _describe(fleet: ZoneFleet, zone: str, group: str) -> Any:
    return kept_admin(fleet, zone).describe_consumer_groups([group])[group].result(timeout=30)


def _values(members: list[ConfluentMember]) -> list[bytes]:
    return [v for m in members for _, _, v in m.records]


def _group(fleet: ZoneFleet, group: str) -> Any:
    """The group as its coordinator describes it (a raw ConsumerGroupDescribe)."""
    raw = RawKafka(fleet.bootstrap("az1"))
    try:
        request = {"group_ids": [group], "include_authorized_operations": False}
        (described,) = raw.request(69, 1, request).groups
    finally:
        raw.close()
    assert described.error_code == ErrorCode.none, described
    return described


def _partitions(assignment: Any) -> set[int]:
    return {p for tp in assignment.topic_partitions for p in tp.partitions}


def _wait_stable(fleet: ZoneFleet, group: str) -> None:
    """Until every member of the group holds its target assignment at the group's epoch (the
    coordinator's Stable): no assignment change is pending for any of them."""
    wait_until(
        lambda: _group(fleet, group).group_state == "Stable",
        60,
        lambda: f"{_group(fleet, group)}",
    )


def test_three_zones_consume_exactly_once_then_one_member_leaves(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic, group = unique_name("k848"), unique_name("k848")
    create_topic(fleet, "az1", topic, PARTITIONS)
    events: list[Event] = []
    members = [
        ConfluentMember(f"m-{zone}", fleet.bootstrap(zone), zone, group, [topic], events, **KIP848)
        for zone in fleet.zones
    ]
    for m in members:
        m.start()
    try:
        wait_until(
            lambda: (
                sorted(p for m in members for p in m.assigned()) == list(range(PARTITIONS))
                and all(len(m.assigned()) == 2 for m in members)
            ),
            60,
            lambda: f"{[m.assigned() for m in members]}",
        )
        d = _describe(fleet, "az2", group)
        assert d.type == ConsumerGroupType.CONSUMER and d.state == ConsumerGroupState.STABLE
        assert d.partition_assignor == "uniform" and len(d.members) == 3
        listed = kept_admin(fleet, "az3").list_consumer_groups(types={ConsumerGroupType.CONSUMER})
        assert group in {g.group_id for g in listed.result(timeout=30).valid}

        n = 1200
        produce_confluent(fleet.bootstrap("az2"), "az2", topic, n, "a")
        wait_until(lambda: len(_values(members)) >= n, 60, lambda: f"{len(_values(members))}")
        for m in members:
            assert {p for p, _, _ in m.records} <= m.assigned(), "read outside its share"
        # One member leaves (it commits, then its heartbeat with epoch -1 leaves the group):
        # the other two take its partitions over while records keep flowing.
        leaver = members[1]
        producer = threading.Thread(
            target=produce_confluent,
            args=(fleet.bootstrap("az3"), "az3", topic, n, "b"),
            daemon=True,
        )
        producer.start()
        leaver.stop.set()
        leaver.join(30)
        stay = [members[0], members[2]]
        wait_until(
            lambda: sorted(p for m in stay for p in m.assigned()) == list(range(PARTITIONS)),
            60,
            lambda: f"{[m.assigned() for m in stay]}",
        )
        producer.join(60)
        wait_until(lambda: len(_values(members)) >= 2 * n, 60, lambda: f"{len(_values(members))}")
        # No duplicate still to come: the group settled, and each partition was read up to a
        # marker written after every record.
        _wait_stable(fleet, group)
        markers = produce_markers(fleet.bootstrap("az1"), "az1", topic, PARTITIONS)
        wait_until(lambda: markers <= set(_values(members)), 60, lambda: f"{len(_values(members))}")
        d = _describe(fleet, "az1", group)
        assert len(d.members) == 2
    finally:
        stop_all(members)
    for m in members:
        assert m.error is None, m.error
        assert not m.errors, m.errors
    check_exclusive_ownership(events)
    values = [v for v in _values(members) if not is_marker(v)]
    assert len(values) == len(set(values)) == 2 * n
    assert set(values) == {f"{p}-{i}".encode() for p in "ab" for i in range(n)}
    assert sorted(v for v in _values(members) if is_marker(v)) == sorted(markers)


def test_range_assignor_and_static_member_returns_to_its_partitions(
    zone_fleet: ZoneFleet,
) -> None:
    fleet = zone_fleet
    topic, group = unique_name("range"), unique_name("range")
    create_topic(fleet, "az2", topic, PARTITIONS)
    events: list[Event] = []
    conf = {**KIP848, "group.remote.assignor": "range"}

    def member(name: str, zone: str, instance: str) -> ConfluentMember:
        return ConfluentMember(
            name,
            fleet.bootstrap(zone),
            zone,
            group,
            [topic],
            events,
            **conf,
            **{"group.instance.id": instance},
        )

    a, b = member("a", "az1", "inst-a"), member("b", "az2", "inst-b")
    members = [a, b]
    for m in members:
        m.start()
    try:
        wait_until(
            lambda: len(a.assigned()) == 3 and len(b.assigned()) == 3,
            60,
            lambda: f"{a.assigned()} {b.assigned()}",
        )
        d = _describe(fleet, "az1", group)
        assert d.partition_assignor == "range"
        # Range: contiguous halves.
        assert sorted([sorted(a.assigned()), sorted(b.assigned())]) == [[0, 1, 2], [3, 4, 5]]
        a_parts, b_parts = a.assigned(), b.assigned()
        b_events = [e for e in events if e[1] == "b"]
        # a's process stops (a static member leaves with epoch -2: it keeps its partitions) and
        # a new process with the same instance id takes them back; b is not disturbed.
        a.stop.set()
        a.join(30)
        a2 = member("a2", "az3", "inst-a")
        members.append(a2)
        a2.start()
        wait_until(lambda: a2.assigned() == a_parts, 60, lambda: f"{a2.assigned()}")
        _wait_stable(fleet, group)  # b heard of any change the rejoin made
        assert b.assigned() == b_parts
        assert [e for e in events if e[1] == "b"] == b_events
        # A second live process with b's instance id is refused (UNRELEASED_INSTANCE_ID).
        raw = RawKafka(fleet.bootstrap("az1"))
        resp = raw.request(68, 1, _join_request(group, topic, instance_id="inst-b"))
        assert resp.error_code == ErrorCode.unreleased_instance_id
        raw.close()
    finally:
        stop_all(members)
    check_exclusive_ownership(events)


def _join_request(group: str, topic: str, **extra: Any) -> dict[str, Any]:
    return {
        "group_id": group,
        "member_id": uuid.uuid4().hex,
        "member_epoch": 0,
        "rebalance_timeout": 30000,
        "subscribed_topic_names": [topic],
        "topic_partitions": [],
        **extra,
    }


def _join_until_assigned(raw: RawKafka, group: str, topic: str) -> tuple[str, int, Any]:
    """Join, then heartbeat until the assignment names the topic (the coordinator may learn of
    a topic just created a moment later): (member id, epoch, topic partitions)."""
    request = _join_request(group, topic)
    resp = raw.request(68, 1, request)
    deadline = time.monotonic() + 15
    while True:
        assert resp.error_code == ErrorCode.none, resp
        got = resp.assignment.topic_partitions if resp.assignment else ()
        if got:
            return resp.member_id, resp.member_epoch, got
        assert time.monotonic() < deadline, "the member never got the topic's partitions"
        time.sleep(0.2)
        beat = {**request, "member_epoch": resp.member_epoch, "rebalance_timeout": -1}
        beat["subscribed_topic_names"] = beat["topic_partitions"] = None
        resp = raw.request(68, 1, beat)


def test_raw_heartbeats_epochs_and_offset_commits(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic, group = unique_name("raw"), unique_name("raw")
    create_topic(fleet, "az1", topic, 2)
    raw = RawKafka(fleet.bootstrap("az2"))
    try:
        member, epoch, (tps,) = _join_until_assigned(raw, group, topic)
        assert epoch >= 1 and sorted(tps.partitions) == [0, 1]
        topic_id = tps.topic_id

        def beat(epoch: int, owned: list[int] | None = None, member_id: str = member) -> Any:
            return raw.request(
                68,
                1,
                {
                    "group_id": group,
                    "member_id": member_id,
                    "member_epoch": epoch,
                    "rebalance_timeout": -1,
                    "topic_partitions": None
                    if owned is None
                    else [{"topic_id": topic_id, "partitions": owned}],
                },
            )

        ok = beat(epoch, [0, 1])
        assert ok.error_code == ErrorCode.none and ok.assignment is None
        assert ok.heartbeat_interval.total_seconds() > 0
        assert beat(epoch + 1).error_code == ErrorCode.fenced_member_epoch
        assert beat(epoch, member_id="nobody").error_code == ErrorCode.unknown_member_id

        def commit(epoch: int, member_id: str = member) -> int:
            resp = raw.request(
                8,
                9,
                {
                    "group_id": group,
                    "generation_id_or_member_epoch": epoch,
                    "member_id": member_id,
                    "topics": [
                        {
                            "name": topic,
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "committed_offset": 0,
                                    "committed_metadata": "x",
                                }
                            ],
                        }
                    ],
                },
            )
            return int(resp.topics[0].partitions[0].error_code)

        assert commit(epoch) == ErrorCode.none
        assert commit(epoch - 1) == ErrorCode.stale_member_epoch
        assert commit(epoch, "nobody") == ErrorCode.unknown_member_id

        desc = raw.request(
            69,
            1,
            {"group_ids": [group, unique_name("nope")], "include_authorized_operations": False},
        )
        found, missing = desc.groups
        assert found.error_code == ErrorCode.none and found.group_state == "Stable"
        assert [m.member_id for m in found.members] == [member]
        assert found.members[0].member_epoch == epoch
        assert sorted(found.members[0].assignment.topic_partitions[0].partitions) == [0, 1]
        assert found.members[0].assignment.topic_partitions[0].topic_name == topic
        assert found.authorized_operations == -(2**31)
        assert missing.error_code == ErrorCode.group_id_not_found

        # A classic JoinGroup for the consumer group's id is refused.
        join_classic = raw.request(
            11,
            9,
            {
                "group_id": group,
                "session_timeout": 10000,
                "rebalance_timeout": 10000,
                "member_id": "",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        )
        assert join_classic.error_code == ErrorCode.inconsistent_group_protocol

        left = beat(-1)
        assert left.error_code == ErrorCode.none and left.member_epoch == -1
        # ListGroups goes to every broker of the client's zone view (its zone's proxy and
        # main), each listing the groups it coordinates in that view, as clients send it.
        main = next(m.broker for m in fleet.config.mains if m.broker.zone == "az2")
        found_groups: set[tuple[str, str, str]] = set()
        for bootstrap in (fleet.bootstrap("az2"), f"{main.host}:{main.port}"):
            conn = RawKafka(bootstrap)
            try:
                listed = conn.request(
                    16, 5, {"states_filter": ["Empty"], "types_filter": ["consumer"]}
                )
            finally:
                conn.close()
            found_groups |= {(g.group_id, g.group_state, g.group_type) for g in listed.groups}
        assert (group, "Empty", "consumer") in found_groups
        deleted = raw.request(42, 2, {"groups_names": [group]})
        assert [r.error_code for r in deleted.results] == [ErrorCode.none]
    finally:
        raw.close()


def test_a_silent_member_is_dropped_after_its_session_timeout(zone_fleet: ZoneFleet) -> None:
    fleet = zone_fleet
    topic, group = unique_name("silent"), unique_name("silent")
    create_topic(fleet, "az1", topic, 3)
    raw = RawKafka(fleet.bootstrap("az1"))
    silent, _epoch, got = _join_until_assigned(raw, group, topic)
    raw.close()
    assert sorted(got[0].partitions) == [0, 1, 2]
    joined = time.monotonic()
    events: list[Event] = []
    m = ConfluentMember("m", fleet.bootstrap("az2"), "az2", group, [topic], events, **KIP848)
    m.start()
    try:
        # The silent member still holds every partition: nothing may go to m yet, although
        # the coordinator has m in the group with a share in its target assignment.
        others: list[Any] = []

        def in_target() -> bool:
            others[:] = [x for x in _group(fleet, group).members if x.member_id != silent]
            return bool(others) and bool(_partitions(others[0].target_assignment))

        wait_until(in_target, 30, lambda: f"{_group(fleet, group)}")
        assert _partitions(others[0].assignment) == set()
        assert m.assigned() == set()
        wait_until(lambda: m.assigned() == {0, 1, 2}, 30, lambda: f"{m.assigned()}")
        assert time.monotonic() - joined >= SESSION_TIMEOUT_MS / 1000 - 0.5
        d = _describe(fleet, "az3", group)
        assert [member.client_id for member in d.members] == [zone_client_id("az2")]
    finally:
        stop_all([m])
    assert m.error is None and not m.errors
