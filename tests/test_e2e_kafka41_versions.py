"""The API versions Kafka 4.1 offers (issue 13): Fetch v17-18, Produce v12-13, ListOffsets
v9-10, Metadata v13, OffsetCommit and OffsetFetch v10, DescribeGroups v6, ApiVersions v4,
DescribeCluster v2 and AlterReplicaLogDirs v1-2, with the client that speaks each
(confluent-kafka's librdkafka negotiates the newest it knows) and kio-encoded requests over a
socket for the versions clients do not send, on a lone main and through a zone proxy.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from kio.schema.errors import ErrorCode

from kafka_wire.record_batch import build_batch
from main_broker.broker import advertised_versions
from tests.fleet_process import FleetProcess
from tests.raw_kafka import RawKafka
from tests.test_e2e_clients import create_topic
from tests.zone_fleet import ZoneFleet, running_up_fleet, unique_name
from tests.zone_fleet import create_topic as create_zone_topic

KAFKA_41 = {  # api key -> the highest version Kafka 4.1 offers
    0: 13,
    1: 18,
    2: 10,
    3: 13,
    8: 10,
    9: 10,
    15: 6,
    18: 4,
    34: 2,
    60: 2,
}


def test_advertised_up_to_kafka_41() -> None:
    versions = advertised_versions()
    for key, high in KAFKA_41.items():
        assert versions[key][1] == high, (key, versions[key])
    assert versions[34] == (1, 2)


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(n):
        producer.produce(topic, f"v-{i}".encode(), partition=0)
    assert producer.flush(30) == 0


class _ProtocolLog(logging.Handler):
    """librdkafka's protocol debug lines: which version of each request it sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: dict[str, set[int]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        for name, version in re.findall(r"Sent (\w+)Request \(v(\d+)", record.getMessage()):
            self.sent.setdefault(name, set()).add(int(version))


def _debug_logger() -> tuple[logging.Logger, _ProtocolLog]:
    logger = logging.getLogger(f"rdkafka-{uuid.uuid4().hex[:6]}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = _ProtocolLog()
    logger.addHandler(handler)
    return logger, handler


def test_confluent_kafka_with_the_newest_versions_it_knows(
    fleet: FleetProcess,
) -> None:
    topic = unique_name("v41")
    create_topic(fleet.bootstrap, topic, partitions=1)
    logger, sent = _debug_logger()
    producer = Producer(
        {"bootstrap.servers": fleet.bootstrap, "debug": "protocol", "logger": logger}
    )
    for i in range(20):
        producer.produce(topic, f"v-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": fleet.bootstrap,
            "group.id": unique_name("v41"),
            "auto.offset.reset": "earliest",
            "debug": "protocol",
            "logger": logger,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
            if len(values) == 20:
                break
    finally:
        consumer.close()
    assert values == [f"v-{i}".encode() for i in range(20)]
    # librdkafka 2.16 knows Metadata v13 (and stops at Produce v10 and Fetch v16, whose
    # newer versions the raw requests below send).
    assert 13 in sent.sent["Metadata"], sent.sent


def _metadata(raw: RawKafka, topic: str) -> Any:
    resp = raw.request(
        3,
        13,
        {
            "topics": [{"name": topic, "topic_id": None}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    assert resp.error_code == ErrorCode.none  # v13's top-level error code
    return resp.topics[0]


def _fetch(raw: RawKafka, version: int, topic_id: uuid.UUID, high_watermark: int) -> Any:
    partition: dict[str, Any] = {
        "partition": 0,
        "current_leader_epoch": -1,
        "fetch_offset": 0,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1 << 20,
        # v17 (KIP-853) and v18 (KIP-1166) add tagged fields a follower fills; a consumer's
        # fetch may carry them too and they change nothing for it.
        "replica_directory_id": uuid.uuid4(),
    }
    if version >= 18:
        partition["high_watermark"] = high_watermark
    resp = raw.request(
        1,
        version,
        {
            "replica_state": {"replica_id": -1, "replica_epoch": -1},
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic_id": topic_id, "partitions": [partition]}],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    (topic,) = resp.responses
    assert topic.topic_id == topic_id
    (part,) = topic.partitions
    return part


def _check_raw_fetches(bootstrap: str, topic: str, n: int) -> None:
    raw = RawKafka(bootstrap)
    try:
        described = _metadata(raw, topic)
        for version in (16, 17, 18):
            # A proxy serves the records once its mirror has replayed them.
            deadline = time.monotonic() + 30
            while True:
                part = _fetch(raw, version, described.topic_id, -1)
                assert part.error_code == ErrorCode.none
                if part.records or time.monotonic() > deadline:
                    break
            assert part.high_watermark == n
            assert part.records, f"Fetch v{version} returned no records"
    finally:
        raw.close()


def test_fetch_v17_and_v18_from_a_main(fleet: FleetProcess) -> None:
    topic = unique_name("v41f")
    create_topic(fleet.bootstrap, topic, partitions=1)
    _produce(fleet.bootstrap, topic, 10)
    _check_raw_fetches(fleet.bootstrap, topic, 10)


@pytest.fixture(scope="module")
def zone_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneFleet]:
    with running_up_fleet(tmp_path_factory.mktemp("v41")) as (_, fleet):
        yield fleet


def test_fetch_v17_and_v18_through_every_zone_proxy(zone_fleet: ZoneFleet) -> None:
    topic = unique_name("v41z")
    create_zone_topic(zone_fleet, "az1", topic, 1)
    _produce(zone_fleet.bootstrap("az1"), topic, 10)
    for zone in zone_fleet.zones:
        _check_raw_fetches(zone_fleet.bootstrap(zone), topic, 10)


def _list_offset(raw: RawKafka, version: int, topic: str, timestamp: int) -> Any:
    data: dict[str, Any] = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": 0, "timestamp": timestamp, "current_leader_epoch": -1}
                ],
            }
        ],
    }
    if version >= 10:
        data["timeout_ms"] = 30_000
    return raw.request(2, version, data).topics[0].partitions[0]


def test_list_offsets_v9_latest_tiered_and_v10(fleet: FleetProcess) -> None:
    topic = unique_name("v41l")
    create_topic(fleet.bootstrap, topic, partitions=1)
    _produce(fleet.bootstrap, topic, 5)
    raw = RawKafka(fleet.bootstrap)
    try:
        # The lone main of `up --zones 1` has no object store: tiering is off, and Kafka
        # answers -1 (with leader epoch -1) for the last tiered offset.
        tiered = _list_offset(raw, 9, topic, -5)
        assert (tiered.error_code, tiered.offset, tiered.leader_epoch) == (0, -1, -1)
        # Before v9 the timestamp is not known.
        assert _list_offset(raw, 8, topic, -5).error_code == ErrorCode.invalid_request
        for version in (9, 10):
            latest = _list_offset(raw, version, topic, -1)
            assert (latest.error_code, latest.offset) == (0, 5)
            earliest = _list_offset(raw, version, topic, -2)
            assert (earliest.error_code, earliest.offset) == (0, 0)
            at = _list_offset(raw, version, topic, 0)  # the first record at or after t=0
            assert (at.error_code, at.offset) == (0, 0)
    finally:
        raw.close()


def test_list_offsets_v9_latest_tiered_with_objects(zone_fleet: ZoneFleet) -> None:
    """`up --zones 3` has an object store: the last tiered offset is below the log end."""
    topic = unique_name("v41t")
    create_zone_topic(zone_fleet, "az1", topic, 1)
    _produce(zone_fleet.bootstrap("az1"), topic, 5)
    raw = RawKafka(zone_fleet.bootstrap("az1"))
    try:
        tiered = _list_offset(raw, 10, topic, -5)
        assert tiered.error_code == ErrorCode.none
        assert -1 <= tiered.offset < 5
    finally:
        raw.close()


def test_describe_groups_v6_unknown_group(fleet: FleetProcess) -> None:
    raw = RawKafka(fleet.bootstrap)
    group = unique_name("nobody")
    try:
        for version, code in ((5, ErrorCode.none), (6, ErrorCode.group_id_not_found)):
            resp = raw.request(
                15, version, {"groups": [group], "include_authorized_operations": False}
            )
            (described,) = resp.groups
            assert (described.error_code, described.group_state) == (code, "Dead")
        assert described.error_message == f"Group {group} not found."
    finally:
        raw.close()


def test_api_versions_v4_and_describe_cluster_v2(fleet: FleetProcess) -> None:
    raw = RawKafka(fleet.bootstrap)
    try:
        resp = raw.request(18, 4, {"client_software_name": "raw", "client_software_version": "1.0"})
        assert resp.error_code == ErrorCode.none
        keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert keys == advertised_versions()
        for include_fenced in (False, True):
            cluster = raw.request(
                60,
                2,
                {
                    "include_cluster_authorized_operations": False,
                    "endpoint_type": 1,
                    "include_fenced_brokers": include_fenced,
                },
            )
            assert cluster.error_code == ErrorCode.none
            assert cluster.brokers and not any(b.is_fenced for b in cluster.brokers)
    finally:
        raw.close()


def test_alter_replica_log_dirs(fleet: FleetProcess) -> None:
    topic = unique_name("v41d")
    create_topic(fleet.bootstrap, topic, partitions=2)
    raw = RawKafka(fleet.bootstrap)
    try:
        dirs = raw.request(35, 4, {"topics": None}).results
        paths = [d.log_dir for d in dirs]
        assert paths
        for version in (1, 2):
            resp = raw.request(
                34,
                version,
                {
                    "dirs": [
                        {"path": paths[0], "topics": [{"name": topic, "partitions": [0, 1]}]},
                        {"path": "/no/such/dir", "topics": [{"name": topic, "partitions": [5]}]},
                        {"path": paths[-1], "topics": [{"name": "nope", "partitions": [0]}]},
                    ]
                },
            )
            errors = {
                (r.topic_name, p.partition_index): p.error_code
                for r in resp.results
                for p in r.partitions
            }
            assert errors == {
                (topic, 0): ErrorCode.none,  # already there: nothing to move
                (topic, 1): ErrorCode.none,
                (topic, 5): ErrorCode.log_dir_not_found,
                ("nope", 0): ErrorCode.unknown_topic_or_partition,
            }
    finally:
        raw.close()


def _produce_raw(raw: RawKafka, version: int, topic: dict[str, Any]) -> Any:
    batch = build_batch([(None, b"a"), (None, b"b")], timestamp_ms=int(time.time() * 1000))
    resp = raw.request(
        0,
        version,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [{**topic, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )
    (answered,) = resp.responses
    (part,) = answered.partition_responses
    return answered, part


def test_produce_v12_and_v13_to_a_main_and_through_a_proxy(
    fleet: FleetProcess, zone_fleet: ZoneFleet
) -> None:
    """Produce v12 is v11 for a producer outside a transaction; v13 names topics by id
    (librdkafka 2.16 stops at v10). Through a proxy the partition's main is in another zone."""
    for bootstrap, make in (
        (fleet.bootstrap, lambda t: create_topic(fleet.bootstrap, t, partitions=1)),
        (zone_fleet.bootstrap("az2"), lambda t: create_zone_topic(zone_fleet, "az1", t, 1)),
    ):
        topic = unique_name("v41p")
        make(topic)
        raw = RawKafka(bootstrap)
        try:
            topic_id = _metadata(raw, topic).topic_id
            for version, base in ((11, 0), (12, 2)):
                answered, part = _produce_raw(raw, version, {"name": topic})
                assert answered.name == topic
                assert (part.error_code, part.base_offset) == (ErrorCode.none, base)
            answered, part = _produce_raw(raw, 13, {"topic_id": topic_id})
            assert answered.topic_id == topic_id
            assert (part.error_code, part.base_offset) == (ErrorCode.none, 4)
            unknown = uuid.uuid4()
            answered, part = _produce_raw(raw, 13, {"topic_id": unknown})
            assert answered.topic_id == unknown
            assert (part.error_code, part.base_offset) == (ErrorCode.unknown_topic_id, -1)
            # The records produced by id are there to read.
            assert _list_offset(raw, 10, topic, -1).offset == 6
        finally:
            raw.close()


def test_offset_commit_and_fetch_v10_name_topics_by_id(
    fleet: FleetProcess, zone_fleet: ZoneFleet
) -> None:
    """v10 (KIP-848) names topics by id in requests and answers; an unknown id is
    UNKNOWN_TOPIC_ID. On a main and through a proxy (which relays to the group's coordinator)."""
    for bootstrap, make in (
        (fleet.bootstrap, lambda t: create_topic(fleet.bootstrap, t, partitions=2)),
        (zone_fleet.bootstrap("az3"), lambda t: create_zone_topic(zone_fleet, "az1", t, 2)),
    ):
        topic, group = unique_name("v41o"), unique_name("v41o")
        make(topic)
        raw = RawKafka(bootstrap)
        try:
            topic_id, unknown = _metadata(raw, topic).topic_id, uuid.uuid4()
            deadline = time.monotonic() + 30
            while True:  # until the group's coordinator has read the new topic
                commit = raw.request(
                    8,
                    10,
                    {
                        "group_id": group,
                        "generation_id_or_member_epoch": -1,
                        "member_id": "",
                        "group_instance_id": None,
                        "topics": [
                            {
                                "topic_id": topic_id,
                                "partitions": [
                                    {
                                        "partition_index": p,
                                        "committed_offset": 10 + p,
                                        "committed_leader_epoch": -1,
                                        "committed_metadata": "m",
                                    }
                                    for p in (0, 1)
                                ],
                            },
                            {
                                "topic_id": unknown,
                                "partitions": [
                                    {
                                        "partition_index": 0,
                                        "committed_offset": 1,
                                        "committed_leader_epoch": -1,
                                        "committed_metadata": None,
                                    }
                                ],
                            },
                        ],
                    },
                )
                errors = {
                    (t.topic_id, p.partition_index): p.error_code
                    for t in commit.topics
                    for p in t.partitions
                }
                if errors.get((topic_id, 0)) != ErrorCode.unknown_topic_or_partition:
                    break
                assert time.monotonic() < deadline, errors
            assert errors == {
                (topic_id, 0): ErrorCode.none,
                (topic_id, 1): ErrorCode.none,
                (unknown, 0): ErrorCode.unknown_topic_id,
            }
            fetched = raw.request(
                9,
                10,
                {
                    "groups": [
                        {
                            "group_id": group,
                            "member_id": None,
                            "member_epoch": -1,
                            "topics": [
                                {"topic_id": topic_id, "partition_indexes": [0, 1]},
                                {"topic_id": unknown, "partition_indexes": [0]},
                            ],
                        }
                    ],
                    "require_stable": False,
                },
            )
            (answer,) = fetched.groups
            assert answer.error_code == ErrorCode.none
            offsets = {
                (t.topic_id, p.partition_index): (p.error_code, p.committed_offset)
                for t in answer.topics
                for p in t.partitions
            }
            assert offsets == {
                (topic_id, 0): (ErrorCode.none, 10),
                (topic_id, 1): (ErrorCode.none, 11),
                (unknown, 0): (ErrorCode.unknown_topic_id, -1),
            }
        finally:
            raw.close()


def test_alter_replica_log_dirs_through_a_proxy(zone_fleet: ZoneFleet) -> None:
    """The proxy splits the moves by partition leader (the mains of the other zones, whose
    log dirs its DescribeLogDirs lists) and joins the answers."""
    topic = unique_name("v41d")
    create_zone_topic(zone_fleet, "az1", topic, 6)
    raw = RawKafka(zone_fleet.bootstrap("az1"))
    try:
        deadline = time.monotonic() + 30
        while True:  # until the other zones' mains report their partitions of the new topic
            dirs = raw.request(35, 4, {"topics": [{"topic": topic, "partitions": list(range(6))}]})
            # Each main lists its partitions under its WAL dir and its objects "dir".
            home: dict[int, str] = {}
            for d in dirs.results:
                for t in d.topics:
                    for p in t.partitions:
                        if t.name == topic:
                            home.setdefault(p.partition_index, d.log_dir)
            if len(set(home.values())) >= 2 or time.monotonic() > deadline:
                break
        assert len(set(home.values())) >= 2, f"partitions of two mains: {home}"
        moves: dict[str, list[int]] = {}
        for index, path in home.items():
            moves.setdefault(path, []).append(index)
        # As Kafka, a request names each partition once (a later dir replaces an earlier one).
        here = [
            {"path": d, "topics": [{"name": topic, "partitions": ps}]} for d, ps in moves.items()
        ]
        nowhere = [{"path": "/nope", "topics": [{"name": topic, "partitions": sorted(home)}]}]
        for dirs_asked, expected in (
            (here, ErrorCode.none),
            (nowhere, ErrorCode.log_dir_not_found),
        ):
            resp = raw.request(34, 2, {"dirs": dirs_asked})
            errors: dict[int, int] = {}
            for result in resp.results:
                assert result.topic_name == topic
                for p in result.partitions:
                    assert p.partition_index not in errors
                    errors[p.partition_index] = p.error_code
            assert errors == dict.fromkeys(home, expected)
    finally:
        raw.close()
