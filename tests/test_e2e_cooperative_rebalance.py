"""Cooperative-sticky rebalances with the classic protocol (issue 13): three confluent-kafka
members (one per zone through that zone's proxy, all three behind one proxy, or on a lone main)
go through three change sequences, in each of which every member changes its subscription
several times; each sequence settles within seconds, as on Kafka, and no partition is ever
owned by two members at once.

A change "settles" when the members' assignment callbacks (incremental assign and revoke) add
up to every partition of the topics subscribed, each owned by exactly one member that subscribes
to its topic, and nothing else is owned.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.fleet_process import FleetProcess
from tests.group_members import coordinator_of
from tests.test_e2e_clients import create_topic as lone_create_topic
from tests.zone_fleet import (
    ZoneFleet,
    create_topic,
    produce_confluent,
    running_up_fleet,
    unique_name,
    zone_client_id,
)

log = logging.getLogger(__name__)

PARTITIONS = 4
# Kafka settles each sequence in a few seconds with the client defaults: a rebalance round
# takes up to a heartbeat interval (3 s) for the other members to hear of it, and a sequence
# needs up to three rounds (the change, then the cooperative revoke and reassign).
SETTLE_BOUND_S = 15.0


Owned = frozenset[tuple[str, int]]
# (monotonic time, member, "assign" | "revoke", partitions), from the members' callbacks
Event = tuple[float, str, str, Owned]


class Member(threading.Thread):
    """A cooperative-sticky member that polls in its own thread; `resubscribe` is handed to
    that thread (the member's callbacks then run there too)."""

    def __init__(
        self, name: str, bootstrap: str, zone: str, group: str, events: list[Event]
    ) -> None:
        super().__init__(daemon=True, name=name)
        self.member = name
        self.events = events
        self.owned: set[tuple[str, int]] = set()
        self.subscription: frozenset[str] = frozenset()
        self.lock = threading.Lock()
        self.changes: queue.Queue[list[str]] = queue.Queue()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.read = 0
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": zone_client_id(zone),
                "group.id": group,
                "partition.assignment.strategy": "cooperative-sticky",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )

    def resubscribe(self, topics: Sequence[str]) -> None:
        self.changes.put(list(topics))

    def snapshot(self) -> tuple[frozenset[str], Owned]:
        with self.lock:
            return self.subscription, frozenset(self.owned)

    def _on_assign(self, _consumer: Any, parts: list[TopicPartition]) -> None:
        given = frozenset((p.topic, p.partition) for p in parts)
        self.events.append((time.monotonic(), self.member, "assign", given))
        with self.lock:
            self.owned |= given
        log.info("%s assigned %s", self.member, sorted((p.topic, p.partition) for p in parts))

    def _on_revoke(self, consumer: Any, parts: list[TopicPartition]) -> None:
        # As an application does: commit what it read before a partition goes.
        positions = [p for p in consumer.position(parts) if p.offset >= 0]
        if positions:
            try:
                consumer.commit(offsets=positions, asynchronous=False)
            except Exception as exc:
                log.info("%s commit on revoke failed: %s", self.member, exc)
        taken = frozenset((p.topic, p.partition) for p in parts)
        self.events.append((time.monotonic(), self.member, "revoke", taken))
        with self.lock:
            self.owned -= taken
        log.info("%s revoked %s", self.member, sorted((p.topic, p.partition) for p in parts))

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    topics = self.changes.get_nowait()
                except queue.Empty:
                    pass
                else:
                    self.consumer.subscribe(
                        topics,
                        on_assign=self._on_assign,
                        on_revoke=self._on_revoke,
                        on_lost=self._on_revoke,
                    )
                    with self.lock:  # the client has it: what it owns from now on counts
                        self.subscription = frozenset(topics)
                msg = self.consumer.poll(0.05)
                if msg is not None and msg.error() is None:
                    self.read += 1
            self.consumer.close()
        except BaseException as exc:
            self.error = exc


class Watch:
    """Whether the group's members have settled on what they subscribe to."""

    def __init__(self, members: Sequence[Member]) -> None:
        self.members = members

    def settled(self, expected: dict[str, frozenset[str]]) -> bool:
        owners: dict[tuple[str, int], str] = {}
        for m in self.members:
            subscription, owned = m.snapshot()
            if subscription != expected[m.member]:
                return False
            for tp in owned:
                if tp in owners or tp[0] not in subscription:
                    return False
                owners[tp] = m.member
        wanted = {
            (topic, p) for subs in expected.values() for topic in subs for p in range(PARTITIONS)
        }
        return set(owners) == wanted

    def wait_settled(self, expected: dict[str, frozenset[str]], timeout: float) -> None:
        started = time.monotonic()
        while not self.settled(expected):
            for m in self.members:
                assert m.error is None, f"{m.member}: {m.error!r}"
            if time.monotonic() - started > timeout:
                state = {m.member: m.snapshot() for m in self.members}
                raise AssertionError(f"not settled after {timeout} s: {state}")
            time.sleep(0.02)


@pytest.fixture(scope="module")
def zone_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    with running_up_fleet(tmp_path_factory.mktemp("coop")) as running:
        yield running


def test_through_zone_proxies(zone_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = zone_fleet
    topics = [unique_name(f"coop-{t}") for t in "abc"]
    for topic in topics:
        create_topic(fleet, "az1", topic, PARTITIONS)
        produce_confluent(fleet.bootstrap("az1"), "az1", topic, 2000, topic)
    group = unique_name("coop-group")
    events: list[Event] = []
    members = [
        Member(f"m{i}", fleet.bootstrap(zone), zone, group, events)
        for i, zone in enumerate(fleet.zones)
    ]
    _change_subscriptions(members, topics)


def test_on_a_lone_main(fleet: FleetProcess) -> None:
    topics = [unique_name(f"coop-{t}") for t in "abc"]
    for topic in topics:
        lone_create_topic(fleet.bootstrap, topic, partitions=PARTITIONS)
        produce_confluent(fleet.bootstrap, "az1", topic, 2000, topic)
    group = unique_name("coop-group")
    events: list[Event] = []
    members = [Member(f"m{i}", fleet.bootstrap, "az1", group, events) for i in range(3)]
    _change_subscriptions(members, topics)


def check_exclusive_ownership(events: list[Event]) -> None:
    """No partition is ever held by two members at once: each assignment of a partition comes
    after its previous holder revoked (or lost) it."""
    holder: dict[tuple[str, int], str] = {}
    for _, member, kind, parts in sorted(events):
        for tp in parts:
            if kind == "assign":
                assert holder.get(tp) in (None, member), (
                    f"{tp} given to {member}: {holder[tp]} holds it"
                )
                holder[tp] = member
            elif holder.get(tp) == member:
                del holder[tp]


def _change_subscriptions(members: list[Member], topics: list[str]) -> None:
    """The group forms on topic a; then three change sequences, in each of which every member
    changes its subscription several times in a row (to each topic alone, then to its plan's
    topics). Each sequence is timed from its first change until the group has settled."""
    a, b, c = topics
    plans: list[list[list[str]]] = [
        [[a], [a], [a]],
        [[a, b], [a, b], [a]],
        [[b, c], [a, c], [a, b, c]],
        [[c], [c], [b]],
    ]
    watch = Watch(members)
    for m in members:
        m.start()
    times: list[float] = []
    try:
        for n, plan in enumerate(plans):
            expected = {m.member: frozenset(t) for m, t in zip(members, plan, strict=True)}
            started = time.monotonic()
            for m, subscription in zip(members, plan, strict=True):
                for t in topics if n else ():
                    m.resubscribe([t])
                m.resubscribe(subscription)
            watch.wait_settled(expected, timeout=120)
            times.append(time.monotonic() - started)
            log.info("plan %s settled in %.2f s", plan, times[-1])
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(30)
    for m in members:
        assert m.error is None, f"{m.member}: {m.error!r}"
    check_exclusive_ownership(members[0].events)
    for took in times[1:]:
        assert took < SETTLE_BOUND_S, f"a change sequence took {took:.1f} s: {times}"


def test_through_one_zone_proxy(zone_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    """All three members behind az1's proxy, which relays their group requests to a
    coordinator in another zone."""
    _, fleet = zone_fleet
    topics = [unique_name(f"coop-{t}") for t in "abc"]
    for topic in topics:
        create_topic(fleet, "az1", topic, PARTITIONS)
    az1_mains = {m.broker.node_id for m in fleet.config.mains if m.broker.zone == "az1"}
    group = unique_name("coop-group")
    while coordinator_of(fleet, group) in az1_mains:
        group = unique_name("coop-group")
    events: list[Event] = []
    members = [Member(f"m{i}", fleet.bootstrap("az1"), "az1", group, events) for i in range(3)]
    _change_subscriptions(members, topics)
