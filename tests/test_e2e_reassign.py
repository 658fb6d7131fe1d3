"""Partition reassignment against `zonefleet up --zones 3`, through zone proxy bootstraps:
AlterPartitionReassignments / ListPartitionReassignments (kafka-python KafkaAdminClient),
ElectLeaders (confluent-kafka AdminClient), a move under load (idempotent producer with
acks=all and a consumer group: every acknowledged record consumed exactly once), and a fleet
restart after the move (the new leader and every record stay)."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, ElectionType, KafkaError, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import (
    InvalidReplicationAssignmentError,
    InvalidReplicationFactorError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

from tests.group_members import wait_until
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    SplitFleet,
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    consume_partition,
    create_topic,
    produce_confluent,
    raw_metadata,
    start_up_fleet,
    write_zones_toml,
    zone_client_id,
)

ELECTION_NOT_NEEDED = 84


def _admin(fleet: ZoneFleet, zone: str) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=fleet.bootstrap(zone),
        client_id=zone_client_id(zone),
        request_timeout_ms=30000,
    )


def _leader(
    fleet: ZoneFleet, topic: str, partition: int, skip: set[int] | None = None
) -> tuple[int, int]:
    """(leader node id, leader epoch): a main shows a client its own zone's view, in which it
    appears as the leader of exactly the partitions it leads (tests/zone_fleet.py). Mains in
    `skip` (killed ones) are not asked. Right after a move the source may not have read the
    finished move yet and still claim its older epoch, as a Kafka broker's metadata cache
    may: the highest epoch leads, and no two mains claim the same one."""
    found = []
    for m in fleet.config.mains:
        main = m.broker
        if main.node_id in (skip or set()):
            continue
        raw = RawKafka(f"{main.host}:{main.port}")
        try:
            (described,) = raw_metadata(raw, topic).topics
        finally:
            raw.close()
        part = next(p for p in described.partitions if p.partition_index == partition)
        if part.leader_id == main.node_id:
            found.append((part.leader_id, part.leader_epoch))
    assert len({epoch for _, epoch in found}) == len(found), found
    return max(found, key=lambda claim: claim[1], default=(-1, -1))


def _status(fleet: ZoneFleet, node: int) -> dict[str, Any]:
    m = next(m for m in fleet.config.mains if m.broker.node_id == node)
    return httpx.get(f"http://{m.admin_host}:{m.admin_port}/status", timeout=5).json()  # type: ignore[no-any-return]


def _other_main(fleet: ZoneFleet, node: int) -> int:
    return next(m.broker.node_id for m in fleet.config.mains if m.broker.node_id != node)


def _wait_moved(admin: KafkaAdminClient, fleet: ZoneFleet, topic: str, target: int) -> float:
    """Seconds until the move of partition 0 is no longer listed and a main reports the
    target as its leader."""
    started = time.monotonic()
    while time.monotonic() - started < 60:
        ongoing = admin.list_partition_reassignments({topic: [0]})
        if not ongoing and _leader(fleet, topic, 0)[0] == target:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"the move of {topic}-0 to {target} did not finish in 60 s")


def _uploaded_end(running: dict[str, Any], node: int, topic: str) -> int:
    """Where the objects of partition 0 of `topic` end in main `node`'s manifest (the fleet's
    file:// object store); 0 while the manifest lists none of them."""
    path = Path(running["path"]).parent / "objects" / "manifests" / f"{node}.json"
    if not path.is_file():
        return 0
    streams = json.loads(path.read_text())["streams"]
    ends = [
        r[1] for s in streams if (s["topic"], s["partition"]) == (topic, 0) for r in s["ranges"]
    ]
    return max(ends, default=0)


def _wait_uploaded(running: dict[str, Any], node: int, topic: str, above: int) -> None:
    """Until main `node` has uploaded partition 0 of `topic` beyond offset `above`."""
    wait_until(
        lambda: _uploaded_end(running, node, topic) > above,
        30,
        lambda: f"main {node} uploaded {topic}-0 up to {_uploaded_end(running, node, topic)}",
    )


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reassign")


@pytest.fixture(scope="module")
def running(fleet_dir: Path) -> Any:
    """The fleet's process, config path and ZoneFleet (the restart test replaces them)."""
    path, _ = write_zones_toml(fleet_dir)
    # Uploads every second: a moved partition has history in objects and a tail in the WAL.
    text = path.read_text()
    default = "upload_threshold_bytes = 524288000\nupload_interval_s = 60.0\n"
    assert default in text
    path.write_text(
        text.replace(default, "upload_threshold_bytes = 262144\nupload_interval_s = 1.0\n")
    )
    proc, zfleet = start_up_fleet(fleet_dir, config=path)
    holder: dict[str, Any] = {"proc": proc, "fleet": zfleet, "path": path}
    try:
        yield holder
    finally:
        holder["proc"].stop()


@pytest.fixture
def fleet(running: dict[str, Any]) -> ZoneFleet:
    return running["fleet"]  # type: ignore[no-any-return]


def test_admin_answers(fleet: ZoneFleet) -> None:
    zfleet = fleet
    topic = f"admin-{uuid.uuid4().hex[:8]}"
    create_topic(zfleet, "az1", topic, 2)
    admin = _admin(zfleet, "az1")
    try:
        assert admin.list_partition_reassignments() == {}
        leader, _ = _leader(zfleet, topic, 0)
        tp = TopicPartition(topic, 0)
        got = admin.alter_partition_reassignments(
            {
                tp: [999],
                TopicPartition(topic, 1): [leader, _other_main(zfleet, leader)],
                TopicPartition("no-such-topic", 0): [leader],
                TopicPartition(topic, 7): [leader],
            }
        )
        assert got[tp] is InvalidReplicationAssignmentError
        assert got[TopicPartition(topic, 1)] is InvalidReplicationFactorError
        assert got[TopicPartition("no-such-topic", 0)] is UnknownTopicOrPartitionError
        assert got[TopicPartition(topic, 7)] is UnknownTopicOrPartitionError
        # Cancelling with nothing under way is refused as Kafka refuses it.
        assert admin.alter_partition_reassignments({tp: None}) == {
            tp: NoReassignmentInProgressError
        }
        # Naming the current leader changes nothing.
        assert admin.alter_partition_reassignments({tp: [leader]}) == {tp: None}
        assert admin.list_partition_reassignments() == {}
        assert _leader(zfleet, topic, 0) == (leader, 0)
    finally:
        admin.close()
    # ElectLeaders: the one replica leads already (confluent-kafka AdminClient).
    cadmin = AdminClient(
        {"bootstrap.servers": zfleet.bootstrap("az2"), "client.id": zone_client_id("az2")}
    )
    result = cadmin.elect_leaders(ElectionType.PREFERRED, [CTopicPartition(topic, 0)]).result(
        timeout=30
    )
    error = result[CTopicPartition(topic, 0)]
    assert error is not None and error.code() == ELECTION_NOT_NEEDED
    # All partitions: Kafka lists none of those that need no election.
    everything = cadmin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=30)
    assert everything == {}


class _Load:
    """An idempotent acks=all producer (zone az2) and a consumer group member (az3) on
    partition 0 of `topic`, in threads, until `finish`."""

    def __init__(self, fleet: ZoneFleet, topic: str) -> None:
        self.fleet = fleet
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[Any] = []
        self.consumed: list[tuple[int, bytes]] = []
        self.read: set[bytes] = set()  # the values consumed (a rewind delivers some again)
        self.errors: list[Any] = []  # the consumer's, other than EOF (it stops at the first)
        self.rebalances: list[str] = []  # the group's assignments and revocations, in order
        self.stop = threading.Event()
        self.produced = threading.Event()
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def start(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def _produce(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.fleet.bootstrap("az2"),
                "client.id": zone_client_id("az2"),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 60000,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            (self.failed.append(err) if err is not None else self.acked.append(msg.value()))

        try:
            i = 0
            while not self.stop.is_set():
                producer.produce(self.topic, f"r-{i}".encode(), on_delivery=delivered)
                i += 1
                producer.poll(0)
                if i % 50 == 0:
                    time.sleep(0.01)
            assert producer.flush(60) == 0
        finally:
            self.produced.set()

    def _consume(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.fleet.bootstrap("az3"),
                "client.id": zone_client_id("az3"),
                "group.id": f"g-{self.topic}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(
            [self.topic],
            on_assign=lambda _c, parts: self.rebalances.append(f"assigned {len(parts)}"),
            on_revoke=lambda _c, parts: self.rebalances.append(f"revoked {len(parts)}"),
        )
        idle_since: float | None = None
        try:
            while True:
                msg = consumer.poll(0.2)
                error = msg.error() if msg is not None else None
                if msg is None or (error is not None and error.code() == KafkaError._PARTITION_EOF):
                    if self.produced.is_set():
                        idle_since = idle_since or time.monotonic()
                        caught_up = len(self.read) >= len(self.acked)
                        if caught_up or time.monotonic() - idle_since > 20:
                            return
                    continue
                if error is not None:
                    self.errors.append(error)
                    return
                idle_since = None
                self.consumed.append((msg.offset(), msg.value()))
                self.read.add(msg.value())
        finally:
            consumer.close()

    def wait(self, acked: int, read: int = 0, timeout: float = 60) -> None:
        """Until at least `acked` records were acknowledged and `read` distinct ones consumed."""
        wait_until(
            lambda: len(self.acked) >= acked and len(self.read) >= read,
            timeout,
            lambda: (
                f"{len(self.acked)} of {acked} acknowledged, {len(self.read)} of {read} read; "
                f"failed {self.failed[:3]}, errors {self.errors[:3]}"
            ),
        )

    def finish(self) -> None:
        """Stop producing; once the consumer caught up, check that every acknowledged record
        was consumed exactly once, at dense offsets from 0."""
        self.stop.set()
        for t in self.threads:
            t.join(120)
        assert not self.failed, self.failed[:3]
        values = [v for _, v in self.consumed]
        seen: dict[bytes, int] = {}
        twice = [(seen[v], o, v) for o, v in self.consumed if seen.setdefault(v, o) != o]
        assert not twice, f"{len(twice)} records consumed twice, e.g. {twice[:3]}"
        unread = len(set(self.acked) - set(values))
        assert not unread and not self.errors, self._left_behind(unread)
        assert set(values) == set(self.acked), "consumed records that were never acknowledged"
        offsets = [o for o, _ in self.consumed]
        assert offsets == list(range(len(offsets))), f"offsets not dense from 0: {self._jumps()}"

    def _jumps(self) -> str:
        """Where the consumer's offsets did not go on by one (a rewind or a skip), and the
        group's rebalances (a rewind to the committed offset follows one)."""
        pairs = zip(self.consumed, self.consumed[1:], strict=False)
        jumps = [(a, b) for (a, _), (b, _) in pairs if b != a + 1]
        return f"{len(jumps)} jumps (from, to) {jumps[:5]}, rebalances {self.rebalances}"

    def _left_behind(self, unread: int) -> str:
        """Tells a read path that stalls from records that are gone: the consumer's next offset
        fetched raw (error, HW, log start, bytes) and the partition read again from the start
        by a fresh consumer, from the leading main and through each zone's proxy."""
        at = self.consumed[-1][0] + 1 if self.consumed else 0
        leader, epoch = _leader(self.fleet, self.topic, 0)
        main = next(m for m in self.fleet.config.mains if m.broker.node_id == leader)
        handoff = _status(self.fleet, leader)["cluster"]["reassignment"]
        lines = [
            f"{unread} of {len(self.acked)} acknowledged records unread; the consumer stopped "
            f"at {at} after {len(self.consumed)} deliveries, {self._jumps()} (errors "
            f"{self.errors[:3]}); leader {leader} epoch {epoch}: {handoff}"
        ]
        targets = [(f"main {leader}", f"{main.broker.host}:{main.broker.port}", main.broker.zone)]
        targets += [(f"proxy {z}", self.fleet.bootstrap(z), z) for z in self.fleet.zones]
        for name, bootstrap, zone in targets:
            raw = RawKafka(bootstrap)
            try:
                got = raw.fetch(self.topic, {0: at}, epoch)[0]
            finally:
                raw.close()
            read = consume_partition(
                bootstrap, self.topic, OFFSET_BEGINNING, len(self.acked), zone_client_id(zone)
            )
            lines.append(
                f"{name}: at {at} error {got.error_code} hw {got.high_watermark} log start "
                f"{got.log_start_offset} {len(got.records or b'')} B; read again: {len(read)} "
                f"records, last offset {read[-1][0] if read else None}"
            )
        return "\n".join(lines)


def _move(fleet: ZoneFleet, topic: str, target: int) -> float:
    """AlterPartitionReassignments through az1's proxy; seconds until the move finished."""
    admin = _admin(fleet, "az1")
    try:
        got = admin.alter_partition_reassignments({TopicPartition(topic, 0): [target]})
        assert got == {TopicPartition(topic, 0): None}
        return _wait_moved(admin, fleet, topic, target)
    finally:
        admin.close()


def test_every_version_on_the_wire(fleet: ZoneFleet) -> None:
    """Each advertised version of the three APIs, raw, through a zone proxy and directly to a
    main: the fields Kafka sets, for a partition that needs nothing done."""
    topic = f"wire-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az3", topic, 1)
    leader, _ = _leader(fleet, topic, 0)
    main = fleet.config.mains[0].broker
    for bootstrap in (fleet.bootstrap("az3"), f"{main.host}:{main.port}"):
        raw = RawKafka(bootstrap)
        try:
            for version in (0, 1):
                resp = raw.request(
                    45,
                    version,
                    {
                        "timeout": 30000,
                        "topics": [
                            {
                                "name": topic,
                                "partitions": [
                                    {"partition_index": 0, "replicas": [leader]},
                                    {"partition_index": 3, "replicas": [leader]},
                                    {"partition_index": 0, "replicas": None},
                                ],
                            }
                        ],
                    },
                )
                assert resp.error_code == 0 and resp.error_message is None
                codes = [(p.error_code, p.error_message) for p in resp.responses[0].partitions]
                assert codes[0] == (0, None)
                assert codes[1][0] == 3 and codes[1][1]  # UNKNOWN_TOPIC_OR_PARTITION, why
                assert codes[2][0] == 85  # NO_REASSIGNMENT_IN_PROGRESS
            listed = raw.request(46, 0, {"timeout": 30000, "topics": None})
            assert (listed.error_code, list(listed.topics)) == (0, [])
            for version in (0, 1, 2):
                elected = raw.request(
                    43,
                    version,
                    {
                        "election_type": 0,
                        "topic_partitions": [{"topic": topic, "partitions": [0, 9]}],
                        "timeout": 30000,
                    },
                )
                if version >= 1:
                    assert elected.error_code == 0
                (result,) = elected.replica_election_results
                rows = [(r.partition_id, r.error_code) for r in result.partition_result]
                assert rows == [(0, ELECTION_NOT_NEEDED), (9, 3)]
        finally:
            raw.close()


def test_move_under_load(running: dict[str, Any]) -> None:
    zfleet: ZoneFleet = running["fleet"]
    topic = f"move-{uuid.uuid4().hex[:8]}"
    create_topic(zfleet, "az1", topic, 1)
    source, epoch = _leader(zfleet, topic, 0)
    assert epoch == 0
    target = _other_main(zfleet, source)
    load = _Load(zfleet, topic).start()
    try:
        # Under load: records acknowledged and consumed, the older ones in the source's objects
        # and the newer ones in its WAL.
        load.wait(acked=500, read=100)
        _wait_uploaded(running, source, topic, 0)
        load.wait(acked=len(load.acked) + 200)
        before = len(load.acked)
        took = _move(zfleet, topic, target)
        handoff = _status(zfleet, target)["cluster"]["reassignment"]
        print(f"\nmove of {topic}-0 from main {source} to {target}: {took:.2f} s, {handoff}")
        assert handoff["completed"] >= 1 and handoff["last_duration_s"] < 10
        m = next(m for m in zfleet.config.mains if m.broker.node_id == target)
        metrics = httpx.get(f"http://{m.admin_host}:{m.admin_port}/metrics", timeout=5).text
        assert f"zonefleet_reassignment_takeovers {handoff['completed']}" in metrics
        assert "zonefleet_reassignments_under_way 0" in metrics
        # Produce and consume go on with the new leader.
        moved = len(load.acked)
        load.wait(acked=moved + 500, read=moved + 100)
        after = len(load.acked)
    finally:
        load.finish()
    assert before > 0 and after > before, (before, after)
    assert _leader(zfleet, topic, 0) == (target, 1)
    assert took < 15, took
    # Every zone's clients see the new epoch, whichever main their proxy relays Metadata to.
    for zone in zfleet.zones:
        raw = RawKafka(zfleet.bootstrap(zone))
        try:
            (described,) = raw_metadata(raw, topic).topics
        finally:
            raw.close()
        assert described.partitions[0].leader_epoch == 1, zone
    # The stream moved from the source's manifest to the target's.
    manifests = Path(running["path"]).parent / "objects" / "manifests"
    named = f'"topic":"{topic}"'
    deadline = time.monotonic() + 10
    while named in (manifests / f"{source}.json").read_text():
        assert time.monotonic() < deadline, "the source still lists the moved stream"
        time.sleep(0.2)
    assert named in (manifests / f"{target}.json").read_text()
    took_over = [line for line in running["proc"].output if f"took {topic}-0 over" in line]
    print(took_over, len(load.acked))


def test_move_there_and_back_under_load(running: dict[str, Any]) -> None:
    """A→B→C→A: each target takes over a log that a takeover started (its WAL's takeover
    record), and A gets back a partition whose old copy it still holds."""
    fleet: ZoneFleet = running["fleet"]
    topic = f"back-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az1", topic, 1)
    a, _ = _leader(fleet, topic, 0)
    b, c = (m.broker.node_id for m in fleet.config.mains if m.broker.node_id != a)
    load = _Load(fleet, topic).start()
    counts = []
    moved = 0  # acknowledged when the last move finished
    try:
        # Before each move, the leader acknowledged records of its own and uploaded some.
        for epoch, (leader, target) in enumerate(((a, b), (b, c), (c, a)), start=1):
            load.wait(acked=moved + 300)
            _wait_uploaded(running, leader, topic, moved)
            counts.append(len(load.acked))
            assert _move(fleet, topic, target) < 15
            assert _leader(fleet, topic, 0) == (target, epoch)
            moved = len(load.acked)
        load.wait(acked=moved + 300)
        counts.append(len(load.acked))
    finally:
        try:
            load.finish()
        except AssertionError:
            # The fleet's account of the moves and whatever it warned of meanwhile.
            output = running["proc"].output
            print("".join(x for x in output if topic in x or "WARNING" in x or "ERROR" in x))
            raise
    assert counts == sorted(set(counts)), counts  # produce went on between the moves
    # Every zone reads the whole log back from the start: a proxy's mirror of a main that led
    # the partition before once skipped from its old batches to the taken-over ones.
    acked = len(load.acked)
    for zone in fleet.zones:
        got = consume_confluent(fleet.bootstrap(zone), zone, topic, 1, acked, timeout=60)
        assert [o for _, o, _ in got] == list(range(acked)), zone
        assert {v for _, _, v in got} == set(load.acked), zone


def test_restart_keeps_the_new_leader_and_records(running: dict[str, Any], fleet_dir: Path) -> None:
    """A partition moved with history in the source's objects, a tail in its WAL and records
    the target appended; then the whole fleet restarts."""
    zfleet: ZoneFleet = running["fleet"]
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    create_topic(zfleet, "az1", topic, 1)
    source, _ = _leader(zfleet, topic, 0)
    target = _other_main(zfleet, source)
    produce_confluent(zfleet.bootstrap("az2"), "az2", topic, 500, "r")
    _wait_uploaded(running, source, topic, 0)
    produce_confluent(zfleet.bootstrap("az3"), "az3", topic, 500, "r", start=500)
    assert _move(zfleet, topic, target) < 15
    produce_confluent(zfleet.bootstrap("az1"), "az1", topic, 500, "r", start=1000)
    count = 1500
    assert running["proc"].stop() == 0
    proc, zfleet = start_up_fleet(fleet_dir, config=running["path"])
    running["proc"], running["fleet"] = proc, zfleet
    assert _leader(zfleet, topic, 0) == (target, 1)
    for zone in zfleet.zones:
        got = consume_confluent(zfleet.bootstrap(zone), zone, topic, 1, count)
        values = [v for _, _, v in got]
        assert len(values) == len(set(values)) == count, (zone, len(values), count)
        assert [o for _, o, _ in got] == list(range(count))
        check_exactly_once_in_order(got, count, "r")
    # Produce goes to the new leader after the restart too.
    producer = Producer(
        {
            "bootstrap.servers": zfleet.bootstrap("az1"),
            "client.id": zone_client_id("az1"),
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    for i in range(100):
        producer.produce(topic, f"after-{i}".encode())
    assert producer.flush(30) == 0
    got = consume_confluent(zfleet.bootstrap("az3"), "az3", topic, 1, count + 100)
    assert len(got) == count + 100


@pytest.fixture(params=["by_request", "by_controller"])
def split_fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SplitFleet]:
    fleet = SplitFleet(tmp_path / "fleet")
    # A short session: a dead main is noticed (and its partition taken over) in seconds;
    # uploads every second, so the dead main's history is partly in objects. by_request: the
    # controller leaves dead mains alone, the test moves the partition.
    auto = "true" if request.param == "by_controller" else "false"
    text = fleet.path.read_text()
    text, n = re.subn(
        r"(?m)^\[metadata\]\n",
        "[metadata]\nregistration_interval_s = 1.0\nsession_timeout_s = 4.0\n"
        f"reassign_dead_mains = {auto}\n",
        text,
    )
    assert n == 1
    fleet.path.write_text(text.replace("upload_interval_s = 60.0", "upload_interval_s = 1.0"))
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.close()


def test_move_off_a_killed_main(split_fleet: SplitFleet, request: pytest.FixtureRequest) -> None:
    """kill -9 of the leading main under acks=all produce; the partition is reassigned to a
    live main (by an AlterPartitionReassignments request, or by the controller on its own),
    which takes it over from the dead main's WAL without a seal (after the session timeout):
    every acknowledged record is read exactly once through every zone, and produce goes on."""
    by_controller = request.node.callspec.params["split_fleet"] == "by_controller"
    zfleet = split_fleet.fleet
    topic = f"dead-{uuid.uuid4().hex[:8]}"
    create_topic(zfleet, "az1", topic, 1)
    source, _ = _leader(zfleet, topic, 0)
    live = [m.broker.node_id for m in zfleet.config.mains if m.broker.node_id != source]
    target = live[0]  # the request's choice; the controller picks the least loaded
    live_zone = next(m.broker.zone for m in zfleet.config.mains if m.broker.node_id == target)
    producer = Producer(
        {
            "bootstrap.servers": zfleet.bootstrap(live_zone),
            "client.id": zone_client_id(live_zone),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "message.timeout.ms": 120000,
        }
    )
    acked: list[bytes] = []
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        (failed.append(err) if err is not None else acked.append(msg.value()))

    def produce(start: int, n: int) -> None:
        for i in range(start, start + n):
            producer.produce(topic, f"d-{i}".encode(), on_delivery=delivered)
            producer.poll(0)
            if i % 100 == 0:
                time.sleep(0.01)

    # With the controller, a second topic too: the dead main leads two of its six partitions,
    # so one live main takes over two of the dead main's partitions at once (one WAL scan).
    wide = f"wide-{uuid.uuid4().hex[:8]}"
    if by_controller:
        create_topic(zfleet, live_zone, wide, 6)
        produce_confluent(zfleet.bootstrap(live_zone), live_zone, wide, 600, "w")
    produce(0, 3000)
    deadline = time.monotonic() + 30
    while len(acked) < 1500:  # kill with some acknowledged and some in flight
        assert time.monotonic() < deadline, len(acked)
        producer.poll(0.01)
    killed_at = len(acked)
    next(m for m in split_fleet.mains if m.node_id == source).kill()
    killed = time.monotonic()
    produce(3000, 500)  # in flight while the leader is gone: retried until it moves
    admin = KafkaAdminClient(
        bootstrap_servers=zfleet.bootstrap(live_zone),
        client_id=zone_client_id(live_zone),
        request_timeout_ms=30000,
    )
    try:
        if not by_controller:
            tp = TopicPartition(topic, 0)
            assert admin.alter_partition_reassignments({tp: [target]}) == {tp: None}
            # Listed while under way (the target waits out the fence window), as Kafka lists
            # a move: target and source, adding the target, removing the source.
            assert admin.list_partition_reassignments() == {
                tp: {
                    "replicas": [target, source],
                    "adding_replicas": [target],
                    "removing_replicas": [source],
                }
            }
            # A move not finished yet can be cancelled; then requested again.
            assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
            assert admin.list_partition_reassignments() == {}
            assert admin.alter_partition_reassignments({tp: [target]}) == {tp: None}
        while True:
            assert time.monotonic() - killed < 90, "the partition never left the dead main"
            if not admin.list_partition_reassignments():
                leader, epoch = _leader(zfleet, topic, 0, skip={source})
                if leader in live:
                    assert epoch == 1
                    break
            time.sleep(0.2)
        took = time.monotonic() - killed
    finally:
        admin.close()
    print(f"\nmain {source} killed, partition led by {leader} {took:.2f} s later")
    produce(3500, 500)
    assert producer.flush(120) == 0
    assert not failed, failed[:3]
    assert killed_at > 0 and len(acked) == 4000
    for zone in zfleet.zones:
        got = consume_confluent(zfleet.bootstrap(zone), zone, topic, 1, len(acked), timeout=60)
        values = [v for _, _, v in got]
        assert len(values) == len(set(values)), f"{zone}: a record was read twice"
        assert set(values) == set(acked), (zone, len(set(acked) - set(values)))
        assert [o for _, o, _ in got] == list(range(len(got)))
    if by_controller:
        leaders = {p: _leader(zfleet, wide, p, skip={source})[0] for p in range(6)}
        assert set(leaders.values()) <= set(live), leaders
        got = consume_confluent(zfleet.bootstrap(live_zone), live_zone, wide, 6, 600, timeout=60)
        check_exactly_once_in_order(got, 600, "w")


def test_a_takeover_uploads_the_tail_it_copied(tmp_path: Path) -> None:
    """The tail a takeover copies (what the dead main had not uploaded yet) goes to objects at
    once, not at the next upload interval (an hour here): otherwise the partition's next
    takeover would scan and copy it again, and failover would grow with every move."""
    fleet = SplitFleet(tmp_path / "fleet")
    text = fleet.path.read_text()
    assert "upload_interval_s = 60.0" in text
    fleet.path.write_text(text.replace("upload_interval_s = 60.0", "upload_interval_s = 3600.0"))
    fleet.start()
    try:
        zfleet = fleet.fleet
        topic = f"tail-{uuid.uuid4().hex[:8]}"
        create_topic(zfleet, "az1", topic, 1)
        source, _ = _leader(zfleet, topic, 0)
        live = {m.broker.node_id for m in zfleet.config.mains} - {source}
        zone = next(m.broker.zone for m in zfleet.config.mains if m.broker.node_id in live)
        produce_confluent(zfleet.bootstrap(zone), zone, topic, 400, "t")
        manifests = tmp_path / "fleet" / "objects" / "manifests"
        named = f'"topic":"{topic}"'
        assert not any(named in p.read_text() for p in manifests.glob("*.json"))
        next(m for m in fleet.mains if m.node_id == source).kill()
        leader = [-1]

        def moved() -> bool:
            leader[0] = _leader(zfleet, topic, 0, skip={source})[0]
            return leader[0] in live

        wait_until(moved, 60, lambda: f"{topic} still led by {leader[0]}")
        target = manifests / f"{leader[0]}.json"
        wait_until(
            lambda: target.exists() and named in target.read_text(),
            30,
            lambda: f"main {leader[0]} has not uploaded the tail it took over",
        )
        records = consume_confluent(zfleet.bootstrap(zone), zone, topic, 1, 400)
        check_exactly_once_in_order(records, 400, "t")
    finally:
        fleet.close()
