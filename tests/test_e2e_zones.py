"""`zonefleet up --zones 3` driven by real clients, one client set per zone, each tagged
`client.id=zone=azN` and bootstrapped from its own zone's proxy (issue 3, items 1, 2 and 7)."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, ConsumerGroupState
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer

from internal_rpc.frames import decode_body
from kafka_wire.codec import build_request, encode_request
from tests.group_members import wait_until
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    Record,
    ZoneFleet,
    aiokafka_round_trip,
    check_exactly_once_in_order,
    confluent_record,
    consume_confluent,
    consume_kafka_python,
    create_topic,
    is_marker,
    kept_admin,
    produce_confluent,
    produce_kafka_python,
    produce_markers,
    raw_metadata,
    running_up_fleet,
    true_leader_zones,
    unique_name,
    zone_client_id,
)

PARTITIONS = 6
N = 3000
KCAT = shutil.which("kcat")


@pytest.fixture(scope="module")
def zone_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneFleet]:
    with running_up_fleet(tmp_path_factory.mktemp("zones")) as (_, fleet):
        yield fleet


# -- 1. metadata -------------------------------------------------------------------------------


def test_az2_client_sees_only_az2_nodes(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("meta")
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    az2 = zone_fleet.bootstrap("az2")
    own = zone_fleet.node_ids("az2")

    # kafka-python: Metadata, with racks.
    admin = KafkaAdminClient(bootstrap_servers=az2, client_id=zone_client_id("az2"))
    try:
        cluster = admin.describe_cluster()
        (described,) = admin.describe_topics([topic])
    finally:
        admin.close()
    brokers = {b["broker_id"]: b for b in cluster["brokers"]}
    assert brokers, cluster
    assert {b["rack"] for b in brokers.values()} == {"az2"}, cluster
    # Exactly az2's nodes: its proxy, and its main once the fleet has one there.
    assert set(brokers) == own, f"az2 client sees nodes {set(brokers)}; az2 has {own}"
    assert [b["port"] for b in brokers.values()].count(int(az2.rsplit(":", 1)[1])) == 1
    parts = described["partitions"]
    assert len(parts) == PARTITIONS
    for p in parts:
        assert p["error_code"] == 0 and p["leader_id"] in brokers, p
        assert set(p["replica_nodes"]) <= set(brokers), p
        assert set(p["isr_nodes"]) <= set(brokers), p
        assert set(p["offline_replicas"]) <= set(brokers), p

    # confluent-kafka: Metadata leaders, and DescribeCluster (rewritten too) with racks.
    cadmin = AdminClient({"bootstrap.servers": az2, "client.id": zone_client_id("az2")})
    meta = cadmin.list_topics(topic, timeout=10)
    assert set(meta.brokers) == set(brokers)
    leaders = {p.leader for p in meta.topics[topic].partitions.values()}
    assert leaders <= set(meta.brokers)
    described_cluster = cadmin.describe_cluster(request_timeout=10).result(timeout=15)
    assert {n.id for n in described_cluster.nodes} == set(brokers)
    assert {n.rack for n in described_cluster.nodes} == {"az2"}

    # Listing every topic: librdkafka 2.x pads this request with 3 bytes Kafka ignores.
    everything = cadmin.list_topics(timeout=10)
    assert topic in everything.topics and set(everything.brokers) == set(brokers)

    # Every other zone sees its own nodes only, too.
    for zone in ("az1", "az3"):
        zmeta = AdminClient(
            {"bootstrap.servers": zone_fleet.bootstrap(zone), "client.id": zone_client_id(zone)}
        ).list_topics(topic, timeout=10)
        assert set(zmeta.brokers) <= zone_fleet.node_ids(zone)
        assert {p.leader for p in zmeta.topics[topic].partitions.values()} <= set(zmeta.brokers)


def test_untagged_client_of_az1_stays_in_az1(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("untagged")
    create_topic(zone_fleet, "az1", topic, PARTITIONS)
    # RawKafka's client.id carries no zone tag: the az1 proxy alone places it in az1.
    raw = RawKafka(zone_fleet.bootstrap("az1"))
    try:
        via_proxy = raw_metadata(raw, topic)
    finally:
        raw.close()
    assert {b.rack for b in via_proxy.brokers} == {"az1"}
    mains = [b for b in via_proxy.brokers if b.node_id < 100]
    assert mains, "the az1 proxy lists no main: nothing to follow"
    # The client follows the metadata to az1's main, and asks it for metadata in turn.
    raw = RawKafka(f"{mains[0].host}:{mains[0].port}")
    try:
        via_main = raw_metadata(raw, topic)
    finally:
        raw.close()
    seen = {(b.node_id, b.rack) for b in via_main.brokers}
    assert {rack for _, rack in seen} == {"az1"}, f"an az1 client was shown {sorted(seen)}"


# -- 2. cross-zone round trip --------------------------------------------------------------------


def test_confluent_producer_in_az2_consumers_in_every_zone(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("ck")
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    # The az2 producer writes across zones: some partitions are led by mains outside az2.
    leader_zones = true_leader_zones(zone_fleet, topic)
    assert len(leader_zones) == PARTITIONS
    assert set(leader_zones.values()) - {"az2"}, leader_zones
    produce_confluent(zone_fleet.bootstrap("az2"), "az2", topic, N, "ck")
    for zone in zone_fleet.zones:
        records = consume_confluent(zone_fleet.bootstrap(zone), zone, topic, PARTITIONS, N)
        check_exactly_once_in_order(records, N, "ck")
        assert len({p for p, _, _ in records}) == PARTITIONS


def test_kafka_python_producer_in_az2_consumers_in_every_zone(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("kp")
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    produce_kafka_python(zone_fleet.bootstrap("az2"), "az2", topic, N, "kp")
    for zone in zone_fleet.zones:
        records = consume_kafka_python(zone_fleet.bootstrap(zone), zone, topic, PARTITIONS)
        check_exactly_once_in_order(records, N, "kp")


def test_aiokafka_producer_in_az2_consumers_in_every_zone(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("ak")
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    by_zone = aiokafka_round_trip(zone_fleet, "az2", topic, PARTITIONS, N, "ak")
    assert set(by_zone) == {"az1", "az2", "az3"}
    for records in by_zone.values():
        check_exactly_once_in_order(records, N, "ak")


def _served(fleet: ZoneFleet, zone: str, topic: str) -> int:
    """The records of `topic` that `zone`'s proxy serves: the sum of the high watermarks its
    Fetch answers show (its mirror of the leading mains)."""
    raw = RawKafka(fleet.bootstrap(zone), client_id=zone_client_id(zone))
    try:
        parts = raw.fetch(topic, dict.fromkeys(range(PARTITIONS), 0))
    finally:
        raw.close()
    return sum(p.high_watermark for p in parts.values() if p.error_code == 0)


def _wait_served(fleet: ZoneFleet, zone: str, topic: str, n: int) -> None:
    """Until `zone`'s proxy serves `n` records of `topic`."""
    wait_until(
        lambda: _served(fleet, zone, topic) >= n,
        30,
        lambda: f"{zone}'s proxy serves {_served(fleet, zone, topic)} of {n} records",
    )


def _kcat(*args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"kcat {args} failed: {done.stderr}"
    return done.stdout


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it)")
def test_kcat_produce_in_az2_consume_in_every_zone(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("kc")
    n = 1000
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    lines = "".join(f"{i % 101}:kc-{i}\n" for i in range(n))
    _kcat(
        "-b", zone_fleet.bootstrap("az2"), "-X", "client.id=zone=az2",
        "-X", "enable.idempotence=true", "-X", "acks=all",
        "-t", topic, "-P", "-K:", stdin=lines,
    )  # fmt: skip
    for zone in zone_fleet.zones:
        # -e stops at the end it sees: first, until the zone's proxy serves every record.
        _wait_served(zone_fleet, zone, topic, n)
        out = _kcat(
            "-b", zone_fleet.bootstrap(zone), "-X", f"client.id=zone={zone}",
            "-t", topic, "-C", "-e", "-o", "beginning", "-f", "%p %o %s\n",
        )  # fmt: skip
        records: list[Record] = []
        for line in out.splitlines():
            partition, offset, value = line.split(" ", 2)
            records.append((int(partition), int(offset), value.encode()))
        check_exactly_once_in_order(records, n, "kc")


class _ConfluentMember(threading.Thread):
    """One consumer group member in its own zone, polling until told to stop."""

    def __init__(self, fleet: ZoneFleet, zone: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.zone = zone
        self.group = group
        self.bootstrap = fleet.bootstrap(zone)
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._assigned: set[int] = set()
        self.consumer = Consumer(
            {
                "bootstrap.servers": fleet.bootstrap(zone),
                "client.id": zone_client_id(zone),
                "group.id": group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10000,
            }
        )
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _consumer: Any, parts: list[Any]) -> None:
        self._assigned = {p.partition for p in parts}

    def _on_revoke(self, _consumer: Any, _parts: list[Any]) -> None:
        self._assigned = set()

    def assigned(self) -> set[int]:
        return set(self._assigned)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None:
                    continue
                record = confluent_record(msg)
                if record is not None:
                    self.records.append(record)
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()


class _KafkaPythonMember(threading.Thread):
    def __init__(self, fleet: ZoneFleet, zone: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.zone = zone
        self.group = group
        self.bootstrap = fleet.bootstrap(zone)
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._assigned: set[int] = set()
        self.consumer = KafkaConsumer(
            topic,
            bootstrap_servers=fleet.bootstrap(zone),
            client_id=zone_client_id(zone),
            group_id=group,
            auto_offset_reset="earliest",
        )

    def assigned(self) -> set[int]:
        return set(self._assigned)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for tp, msgs in self.consumer.poll(timeout_ms=100).items():
                    self.records.extend((tp.partition, m.offset, m.value) for m in msgs)
                self._assigned = {tp.partition for tp in self.consumer.assignment()}
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()


def _described(fleet: ZoneFleet, group: str) -> dict[str, set[int]] | None:
    """Client id -> partitions, as DescribeGroups shows the classic group; None unless Stable
    (a rebalance under way)."""
    (future,) = kept_admin(fleet, "az1").describe_consumer_groups([group]).values()
    d = future.result(timeout=30)
    if d.state != ConsumerGroupState.STABLE:
        return None
    return {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in d.members}


def _wait_for_stable_group(fleet: ZoneFleet, members: list[Any], timeout: float = 45.0) -> None:
    """Until the coordinator shows the group Stable with each member (by its zone's client id)
    holding what its client was given, and the shares cover every partition once: no
    rebalance under way and every member's assignment applied."""

    def settled() -> bool:
        for m in members:
            assert m.error is None, m.error
        shares = {zone_client_id(m.zone): m.assigned() for m in members}
        covered = sorted(p for share in shares.values() for p in share)
        if not all(shares.values()) or covered != list(range(PARTITIONS)):
            return False
        return _described(fleet, members[0].group) == shares

    wait_until(
        settled,
        timeout,
        lambda: (
            f"group never settled: {[m.assigned() for m in members]}; "
            f"described {_described(fleet, members[0].group)}"
        ),
    )


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_consumer_group_with_one_member_per_zone(zone_fleet: ZoneFleet, client: str) -> None:
    topic = unique_name(f"grp-{client}")
    group = unique_name("g")
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    member_type = _ConfluentMember if client == "confluent" else _KafkaPythonMember
    members = [member_type(zone_fleet, zone, group, topic) for zone in zone_fleet.zones]
    try:
        for m in members:
            m.start()
        _wait_for_stable_group(zone_fleet, members)
        shares = {m.zone: m.assigned() for m in members}
        produce_confluent(zone_fleet.bootstrap("az2"), "az2", topic, N, "grp")
        deadline = time.monotonic() + 30
        while sum(len(m.records) for m in members) < N:
            assert time.monotonic() < deadline, [len(m.records) for m in members]
            for m in members:
                assert m.error is None, m.error
            time.sleep(0.05)
        # No duplicate still to come: each partition was read up to a marker after its records.
        markers = produce_markers(zone_fleet.bootstrap("az2"), "az2", topic, PARTITIONS)
        deadline = time.monotonic() + 30
        while not markers <= {v for m in members for _, _, v in m.records}:
            assert time.monotonic() < deadline, [len(m.records) for m in members]
            for m in members:
                assert m.error is None, m.error
            time.sleep(0.05)
        final = {m.zone: m.assigned() for m in members}
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(15)
    for m in members:
        assert m.error is None, m.error
        # No rebalance happened meanwhile, and each member read its own partitions only.
        assert final[m.zone] == shares[m.zone]
        assert {p for p, _, _ in m.records} <= shares[m.zone]
        assert m.records, f"member in {m.zone} read nothing"
    records = [r for m in members for r in m.records]
    check_exactly_once_in_order([r for r in records if not is_marker(r[2])], N, "grp")
    assert sorted(r[2] for r in records if is_marker(r[2])) == sorted(markers)
    # Each zone's view of the group coordinator is a node of that zone.
    for zone in zone_fleet.zones:
        admin = AdminClient(
            {"bootstrap.servers": zone_fleet.bootstrap(zone), "client.id": zone_client_id(zone)}
        )
        (description,) = [
            f.result(timeout=15) for f in admin.describe_consumer_groups([group]).values()
        ]
        assert description.coordinator.id in zone_fleet.node_ids(zone)


# -- 7. the internal RPC port refuses strangers ------------------------------------------------


def _refused(host: str, port: int, payload: bytes) -> bytes:
    """Send `payload`, return everything the server sent until it closed the connection."""
    data = bytearray()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(payload)
        started = time.monotonic()
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        assert time.monotonic() - started < 4, "the RPC port kept the connection open"
    return bytes(data)


def _kafka_python_admin_fails(host: str, port: int) -> Exception:
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=f"{host}:{port}",
            client_id="zone=az2",
            request_timeout_ms=3000,
            bootstrap_timeout_ms=2000,
            reconnect_backoff_max_ms=200,
        )
    except Exception as exc:
        return exc
    admin.close()
    raise AssertionError(f"KafkaAdminClient connected to the RPC port {host}:{port}")


def test_internal_rpc_port_refuses_kafka_clients_and_garbage(zone_fleet: ZoneFleet) -> None:
    endpoints = zone_fleet.rpc_endpoints()
    assert endpoints
    api_versions = encode_request(
        18, 3, 1, "zone=az2",
        build_request(18, 3, {"client_software_name": "probe", "client_software_version": "1"}),
    )  # fmt: skip
    with ThreadPoolExecutor(len(endpoints)) as pool:  # each gives up after ~2 s
        errors = list(pool.map(lambda ep: _kafka_python_admin_fails(*ep), endpoints))
    for error in errors:
        assert type(error).__name__ in (
            "NoBrokersAvailable",
            "KafkaConnectionError",
            "KafkaTimeoutError",
        ), error
    for host, port in endpoints:
        # A raw ApiVersions: all it ever gets back is the RPC hello, then the close.
        seen = _refused(host, port, struct.pack(">i", len(api_versions)) + api_versions)
        assert decode_body(seen[4:])["t"] == "hello"
        for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\xff" * 64, b"\x00" * 4096):
            seen = _refused(host, port, garbage)
            assert decode_body(seen[4:])["t"] == "hello"
    # The nodes keep serving: all healthy (proxies keep their state streams), and a produce
    # to partitions on every main still confirms.
    admins = [(m.admin_host, m.admin_port) for m in zone_fleet.config.mains]
    admins += [(p.admin_host, p.admin_port) for p in zone_fleet.config.proxies]
    for host, port in admins:
        health = httpx.get(f"http://{host}:{port}/healthz", timeout=5)
        assert health.status_code == 200, health.text
    topic = unique_name("after-rpc")
    create_topic(zone_fleet, "az2", topic, PARTITIONS)
    produce_confluent(zone_fleet.bootstrap("az2"), "az2", topic, 300, "after")
    records = consume_confluent(zone_fleet.bootstrap("az3"), "az3", topic, PARTITIONS, 300)
    check_exactly_once_in_order(records, 300, "after")
