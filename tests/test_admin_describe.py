"""Describe APIs, offsets-for-times, seeking and unknown requests, against `zonefleet up
--zones 3` through zone proxy bootstraps (issue 5: DescribeTopicPartitions, DescribeLogDirs,
DescribeProducers, GetTelemetrySubscriptions, ListOffsets variants, "nothing hangs")."""

from __future__ import annotations

import asyncio
import shutil
import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewTopic, OffsetSpec
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from kafka_wire.codec import build_request, encode_request
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    confluent_admin,
    create_topic,
    produce_confluent,
    running_up_fleet,
    unique_name,
    zone_client_id,
)

PARTITIONS = 6
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REQUEST = 42
UNSUPPORTED_VERSION = 35
KCAT = shutil.which("kcat")


@pytest.fixture(scope="module")
def zone_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneFleet]:
    with running_up_fleet(tmp_path_factory.mktemp("describe")) as (_, fleet):
        yield fleet


def _raw(fleet: ZoneFleet, zone: str) -> RawKafka:
    return RawKafka(fleet.bootstrap(zone))


# -- DescribeTopicPartitions (KIP-966) ---------------------------------------------------------


def _describe_topic_partitions(
    raw: RawKafka, topics: list[str], limit: int, cursor: dict[str, object] | None = None
) -> object:
    return raw.request(
        75,
        0,
        {
            "topics": [{"name": t} for t in topics],
            "response_partition_limit": limit,
            "cursor": cursor,
        },
    )


def test_describe_topic_partitions_pages_and_shows_only_zone_nodes(zone_fleet: ZoneFleet) -> None:
    first, second = sorted([unique_name("dtp"), unique_name("dtp")])
    create_topic(zone_fleet, "az2", first, PARTITIONS)
    create_topic(zone_fleet, "az2", second, 2)
    missing = unique_name("dtp-missing")
    raw = _raw(zone_fleet, "az2")
    try:
        resp = _describe_topic_partitions(raw, [second, first, missing], 4)
        by_name = {t.name: t for t in resp.topics}
        # Topics come sorted; the limit cuts the first topic after 4 partitions.
        assert [t.name for t in resp.topics] == [first]
        assert [p.partition_index for p in by_name[first].partitions] == [0, 1, 2, 3]
        assert resp.next_cursor is not None
        assert (resp.next_cursor.topic_name, resp.next_cursor.partition_index) == (first, 4)
        own = zone_fleet.node_ids("az2")
        for part in by_name[first].partitions:
            assert part.error_code == 0
            assert part.leader_id in own, "a proxy client must see only its zone's nodes"
            assert list(part.replica_nodes) == [part.leader_id]
        assert by_name[first].topic_authorized_operations > 0

        cursor = {"topic_name": first, "partition_index": 4}
        rest = _describe_topic_partitions(raw, [first, second, missing], 100, cursor)
        names = [t.name for t in rest.topics]
        assert names == sorted([first, second, missing])
        parts = {t.name: [p.partition_index for p in t.partitions] for t in rest.topics}
        assert parts[first] == [4, 5] and parts[second] == [0, 1]
        errors = {t.name: t.error_code for t in rest.topics}
        assert errors[missing] == UNKNOWN_TOPIC_OR_PARTITION
        assert rest.next_cursor is None

        bad = _describe_topic_partitions(
            raw, [first], 10, {"topic_name": second, "partition_index": 0}
        )
        assert [t.error_code for t in bad.topics] == [INVALID_REQUEST]
    finally:
        raw.close()


# -- DescribeLogDirs ---------------------------------------------------------------------------


def test_describe_log_dirs_reports_every_partition_once(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("logdirs")
    create_topic(zone_fleet, "az1", topic, PARTITIONS)
    n = 600
    produce_confluent(zone_fleet.bootstrap("az1"), "az1", topic, n, "ld")
    admin = KafkaAdminClient(
        bootstrap_servers=zone_fleet.bootstrap("az1"), client_id=zone_client_id("az1")
    )
    try:
        resp = admin.describe_log_dirs()
    finally:
        admin.close()
    # One answer per visible broker: the zone's main (its own partitions) and the zone's
    # proxy (every other main's, relayed and merged).
    dirs = [d for broker in resp for d in broker["log_dirs"]]
    seen: Counter[int] = Counter()
    total = 0
    wal_dirs = set()
    for entry in dirs:
        assert entry["error_code"] == 0
        if "/wal/" not in entry["log_dir"]:
            assert entry["log_dir"].endswith(".json"), "objects: named by their manifest"
            continue
        wal_dirs.add(entry["log_dir"])
        assert entry["total_bytes"] > 0 and entry["usable_bytes"] > 0, "a local WAL directory"
        for t in entry["topics"]:
            if t["name"] != topic:
                continue
            for p in t["partitions"]:
                seen[p["partition_index"]] += 1
                total += p["partition_size"]
    assert len(wal_dirs) == 3, f"one WAL log dir per main, got {dirs!r}"
    assert seen == Counter(range(PARTITIONS)), "each partition is reported once, by its leader"
    payload = sum(len(f"ld-{i}") for i in range(n))
    assert total >= payload, "the WAL holds at least the payload of what was produced"


# -- DescribeProducers -------------------------------------------------------------------------


def test_describe_producers_shows_the_idempotent_producer(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("producers")
    create_topic(zone_fleet, "az3", topic, 3)
    counts: Counter[int] = Counter()
    producer = Producer(
        {
            "bootstrap.servers": zone_fleet.bootstrap("az3"),
            "client.id": zone_client_id("az3"),
            "enable.idempotence": True,
            "linger.ms": 0,
        }
    )

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        counts[msg.partition()] += 1  # type: ignore[attr-defined]

    for i in range(90):
        producer.produce(topic, f"p-{i}".encode(), partition=i % 3, on_delivery=delivered)
    assert producer.flush(30) == 0
    raw = _raw(zone_fleet, "az3")
    try:
        resp = raw.request(
            61,
            0,
            {"topics": [{"name": topic, "partition_indexes": [0, 1, 2, 7]}]},
        )
    finally:
        raw.close()
    (t,) = resp.topics
    parts = {p.partition_index: p for p in t.partitions}
    assert parts[7].error_code == UNKNOWN_TOPIC_OR_PARTITION
    producer_ids = set()
    for index in range(3):
        part = parts[index]
        assert part.error_code == 0, part
        (state,) = part.active_producers
        producer_ids.add(state.producer_id)
        # One record per batch (linger 0), so the last sequence is the count less one.
        assert state.last_sequence == counts[index] - 1
        assert state.producer_epoch >= 0 and state.last_timestamp > 0
        assert state.coordinator_epoch == -1 and state.current_txn_start_offset == -1
    assert len(producer_ids) == 1


# -- GetTelemetrySubscriptions and requests nobody implements ---------------------------------


def test_telemetry_subscription_requests_no_metrics(zone_fleet: ZoneFleet) -> None:
    raw = _raw(zone_fleet, "az1")
    try:
        versions = raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        keys = {k.api_key for k in versions.api_keys}
        assert 71 in keys and 72 not in keys, "subscriptions are answered; pushes are not taken"
        fresh = raw.request(71, 0, {"client_instance_id": uuid.UUID(int=0)})
        assert fresh.error_code == 0
        assert fresh.client_instance_id is not None and fresh.client_instance_id.int != 0
        assert list(fresh.requested_metrics) == []
        mine = uuid.uuid4()
        again = raw.request(71, 0, {"client_instance_id": mine})
        assert again.client_instance_id == mine
        assert again.push_interval.total_seconds() >= 60
    finally:
        raw.close()


def _frame(api_key: int, version: int) -> bytes:
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"test"
    return header + b"\x00" * 8


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(9999, 0), (72, 0), (3, 99), (57, 0)],
    ids=["unknown-key", "push-telemetry", "metadata-v99", "update-features"],
)
def test_unimplemented_requests_close_promptly_through_a_proxy(
    zone_fleet: ZoneFleet, api_key: int, version: int
) -> None:
    raw = _raw(zone_fleet, "az2")
    try:
        started = time.monotonic()
        raw.send_frame(_frame(api_key, version))
        assert raw.is_closed(timeout=10.0), "the proxy must answer or close, not hang"
        assert time.monotonic() - started < 10.0
    finally:
        raw.close()
    # The proxy still serves everyone else.
    raw = _raw(zone_fleet, "az2")
    try:
        versions = raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code == 0
    finally:
        raw.close()


def test_api_versions_too_new_gets_unsupported_version_through_a_proxy(
    zone_fleet: ZoneFleet,
) -> None:
    raw = _raw(zone_fleet, "az3")
    try:
        body = encode_request(18, 3, 11, "t", build_request(18, 3, {}))
        raw.send_frame(struct.pack(">hh", 18, 99) + body[4:])
        frame = raw.recv_frame()
        assert frame is not None
        correlation_id, error_code = struct.unpack_from(">ih", frame)
        assert (correlation_id, error_code) == (11, UNSUPPORTED_VERSION)
    finally:
        raw.close()


# -- ListOffsets variants and seeking with three clients --------------------------------------

T0 = 1_700_000_000_000
STEP_MS = 1000
N_TIMED = 20


@pytest.fixture(scope="module")
def timed_topic(zone_fleet: ZoneFleet) -> str:
    """One partition of N_TIMED records with CreateTime T0, T0+1s, ... (one per batch)."""
    topic = unique_name("times")
    create_topic(zone_fleet, "az2", topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": zone_fleet.bootstrap("az2"),
            "client.id": zone_client_id("az2"),
            "enable.idempotence": True,
            "linger.ms": 0,
        }
    )
    for i in range(N_TIMED):
        producer.produce(topic, f"t-{i}".encode(), partition=0, timestamp=T0 + i * STEP_MS)
        producer.flush(10)
    assert producer.flush(30) == 0
    return topic


def test_confluent_offsets_for_times_and_offset_specs(
    zone_fleet: ZoneFleet, timed_topic: str
) -> None:
    az = "az1"
    consumer = Consumer(
        {
            "bootstrap.servers": zone_fleet.bootstrap(az),
            "client.id": zone_client_id(az),
            "group.id": unique_name("g"),
        }
    )
    try:
        (found,) = consumer.offsets_for_times(
            [TopicPartition(timed_topic, 0, T0 + 5 * STEP_MS + 1)], timeout=20
        )
        assert found.offset == 6, "the first record at or after the timestamp"
        (past,) = consumer.offsets_for_times(
            [TopicPartition(timed_topic, 0, T0 + 999 * STEP_MS)], timeout=20
        )
        assert past.offset in (-1, N_TIMED), "past the last timestamp: no offset (end)"
        assert consumer.get_watermark_offsets(TopicPartition(timed_topic, 0), timeout=20) == (
            0,
            N_TIMED,
        )
    finally:
        consumer.close()
    admin = confluent_admin(zone_fleet, az)
    tp = TopicPartition(timed_topic, 0)
    specs = {
        "earliest": OffsetSpec.earliest(),
        "latest": OffsetSpec.latest(),
        "max": OffsetSpec.max_timestamp(),
        "at": OffsetSpec.for_timestamp(T0 + 3 * STEP_MS),
    }
    got = {}
    for name, spec in specs.items():
        got[name] = admin.list_offsets({tp: spec})[tp].result(timeout=20)
    assert got["earliest"].offset == 0
    assert got["latest"].offset == N_TIMED
    assert got["max"].offset == N_TIMED - 1
    assert got["max"].timestamp == T0 + (N_TIMED - 1) * STEP_MS
    assert (got["at"].offset, got["at"].timestamp) == (3, T0 + 3 * STEP_MS)


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test installs it)")
def test_kcat_queries_offsets_by_timestamp_through_a_proxy(
    zone_fleet: ZoneFleet, timed_topic: str
) -> None:
    assert KCAT is not None
    answers = {}
    for ts in (T0 + 4 * STEP_MS, T0 + 4 * STEP_MS + 1, -2, -1):
        done = subprocess.run(
            [KCAT, "-b", zone_fleet.bootstrap("az1"), "-X", "client.id=zone=az1", "-Q", "-t",
             f"{timed_topic}:0:{ts}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answers[ts] = int(done.stdout.split("offset")[1].split()[0])
    assert answers == {T0 + 4 * STEP_MS: 4, T0 + 4 * STEP_MS + 1: 5, -2: 0, -1: N_TIMED}


def test_earliest_local_offset_is_the_wal_start(zone_fleet: ZoneFleet, timed_topic: str) -> None:
    raw = _raw(zone_fleet, "az3")
    try:
        answers = {}
        for spec in (-2, -4):
            part = {"partition_index": 0, "timestamp": spec, "current_leader_epoch": -1}
            request = {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [{"name": timed_topic, "partitions": [part]}],
            }
            (answer,) = raw.request(2, 8, request).topics[0].partitions
            assert answer.error_code == 0
            answers[spec] = answer.offset
    finally:
        raw.close()
    # The WAL trims whole segments only, and these records sit in its first, open segment.
    assert answers == {-2: 0, -4: 0}


def test_kafka_python_offsets_for_times_and_seeking(
    zone_fleet: ZoneFleet, timed_topic: str
) -> None:
    az = "az3"
    consumer = KafkaConsumer(
        bootstrap_servers=zone_fleet.bootstrap(az), client_id=zone_client_id(az)
    )
    tp = KafkaTopicPartition(timed_topic, 0)
    try:
        found = consumer.offsets_for_times({tp: T0 + 7 * STEP_MS})[tp]
        assert found is not None
        assert (found.offset, found.timestamp) == (7, T0 + 7 * STEP_MS)
        assert consumer.offsets_for_times({tp: T0 + 999 * STEP_MS})[tp] is None
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: N_TIMED}
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == N_TIMED
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == 0
        consumer.seek(tp, found.offset)
        records = consumer.poll(timeout_ms=10_000)[tp]
        assert records[0].offset == 7 and records[0].timestamp == T0 + 7 * STEP_MS
    finally:
        consumer.close()


def test_aiokafka_offsets_for_times_and_seeking(zone_fleet: ZoneFleet, timed_topic: str) -> None:
    async def check() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=zone_fleet.bootstrap("az2"), client_id=zone_client_id("az2")
        )
        await consumer.start()
        tp = AIOTopicPartition(timed_topic, 0)
        try:
            found = (await consumer.offsets_for_times({tp: T0 + 11 * STEP_MS - 1}))[tp]
            assert found is not None and found.offset == 11
            assert await consumer.beginning_offsets([tp]) == {tp: 0}
            assert await consumer.end_offsets([tp]) == {tp: N_TIMED}
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            assert await consumer.position(tp) == N_TIMED
            await consumer.seek_to_beginning(tp)
            assert await consumer.position(tp) == 0
            consumer.seek(tp, 11)
            record = await asyncio.wait_for(consumer.getone(), 10)
            assert (record.offset, record.timestamp) == (11, T0 + 11 * STEP_MS)
        finally:
            await consumer.stop()

    asyncio.run(check())


def test_log_append_time_is_stamped_and_searchable_through_a_proxy(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("lat")
    az = "az1"
    admin = confluent_admin(zone_fleet, az)
    new = NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([new])[topic].result(timeout=30)
    before = int(time.time() * 1000)
    producer = Producer(
        {"bootstrap.servers": zone_fleet.bootstrap(az), "client.id": zone_client_id(az)}
    )
    for i in range(10):
        producer.produce(topic, f"l-{i}".encode(), partition=0, timestamp=T0)  # ignored
    assert producer.flush(30) == 0
    after = int(time.time() * 1000)
    consumer = Consumer(
        {
            "bootstrap.servers": zone_fleet.bootstrap("az2"),
            "client.id": zone_client_id("az2"),
            "group.id": unique_name("g"),
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    stamps = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(stamps) < 10 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                continue
            assert msg.error() is None, msg.error()
            stamps.append(msg.timestamp())
        (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, before)], timeout=20)
    finally:
        consumer.close()
    assert len(stamps) == 10
    for kind, ts in stamps:
        assert kind == TIMESTAMP_LOG_APPEND_TIME
        assert before - 1000 <= ts <= after + 1000, "the broker's clock, not the producer's"
    assert found.offset == 0
