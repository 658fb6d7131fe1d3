"""Topic admin through a zone proxy of `zonefleet up --zones 3`: CreatePartitions, DeleteRecords
and CreateTopics validation, with confluent-kafka's AdminClient, kafka-python's
KafkaAdminClient and aiokafka's AIOKafkaAdminClient."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AIONewPartitions
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaNewTopic
from kio.schema.errors import ErrorCode

from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    confluent_admin,
    consume_partition,
    create_topic,
    running_up_fleet,
    true_leader_zones,
    zone_client_id,
)

ZONE = "az1"


@pytest.fixture(scope="module")
def zone_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZoneFleet]:
    with running_up_fleet(tmp_path_factory.mktemp("admin-topics")) as (_, fleet):
        yield fleet


def _admin(fleet: ZoneFleet, zone: str = ZONE) -> AdminClient:
    return confluent_admin(fleet, zone)


def _topic() -> str:
    return f"adm-{uuid.uuid4().hex[:10]}"


def _partition_count(admin: AdminClient, topic: str) -> int:
    return len(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def _error(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=30)
    error: KafkaError = info.value.args[0]
    return error


def _produce(bootstrap: str, zone: str, topic: str, partition: int, values: list[bytes]) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": zone_client_id(zone), "linger.ms": 0}
    )
    failures: list[Any] = []
    for value in values:
        producer.produce(
            topic,
            value,
            partition=partition,
            on_delivery=lambda err, msg: failures.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert not failures, failures


def _wait_partitions(fleet: ZoneFleet, topic: str, count: int) -> None:
    """Every zone's proxy shows `count` partitions (metadata from the cluster document)."""
    deadline = time.monotonic() + 20
    for zone in fleet.zones:
        admin = _admin(fleet, zone)
        while _partition_count(admin, topic) != count:
            assert time.monotonic() < deadline, f"{zone} never showed {count} partitions"
            time.sleep(0.2)


# -- CreatePartitions --------------------------------------------------------------------------


def test_create_partitions_places_new_partitions_that_serve_through_proxies(
    zone_fleet: ZoneFleet,
) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 2)
    admin = _admin(zone_fleet)
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(timeout=30)
    _wait_partitions(zone_fleet, topic, 6)
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    # The new partitions are placed on the mains (round-robin), not all on one.
    raw = RawKafka(zone_fleet.bootstrap(ZONE))
    try:
        resp = raw.request(3, 12, {"topics": [{"name": topic, "topic_id": None}]})
    finally:
        raw.close()
    assert sorted(p.partition_index for p in resp.topics[0].partitions) == list(range(6))
    assert len(meta.partitions) == 6
    # Produce to and consume every new partition, through another zone's proxy.
    other = zone_fleet.zones[1]
    for partition in range(2, 6):
        values = [f"p{partition}-{i}".encode() for i in range(5)]
        _produce(zone_fleet.bootstrap(other), other, topic, partition, values)
    for partition in range(2, 6):
        got = _consume(zone_fleet.bootstrap(other), other, topic, partition, 5)
        assert got == [f"p{partition}-{i}".encode() for i in range(5)]


def _consume(bootstrap: str, zone: str, topic: str, partition: int, n: int) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": zone_client_id(zone),
            "group.id": f"g-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            continue
        value = msg.value()
        assert value is not None
        out.append(value)
    consumer.close()
    return out


def test_create_partitions_errors_and_validate_only(zone_fleet: ZoneFleet) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 3)
    admin = _admin(zone_fleet)
    fs = admin.create_partitions([NewPartitions(topic, 5)], validate_only=True)
    fs[topic].result(timeout=30)
    assert _partition_count(admin, topic) == 3  # validate_only changed nothing
    error = _error(admin.create_partitions([NewPartitions(topic, 2)])[topic])
    assert error.code() == KafkaError.INVALID_PARTITIONS
    assert "currently has 3 partition(s); 2 would not be an increase" in error.str()
    error = _error(admin.create_partitions([NewPartitions(topic, 3)])[topic])
    assert error.code() == KafkaError.INVALID_PARTITIONS
    assert "already has 3 partition(s)" in error.str()
    error = _error(
        admin.create_partitions([NewPartitions(f"{topic}-missing", 4)])[f"{topic}-missing"]
    )
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_create_partitions_with_manual_assignments(zone_fleet: ZoneFleet) -> None:
    """An assignment's first broker leads the new partition when it is a main; an unknown
    broker id is INVALID_REPLICA_ASSIGNMENT."""
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    admin = _admin(zone_fleet)
    main = zone_fleet.config.mains[-1].broker
    bad = admin.create_partitions([NewPartitions(topic, 3, [[main.node_id], [999]])])
    assert _error(bad[topic]).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    wrong = admin.create_partitions([NewPartitions(topic, 3, [[main.node_id]])])
    assert _error(wrong[topic]).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assignment = [[main.node_id], [main.node_id]]
    admin.create_partitions([NewPartitions(topic, 3, assignment)])[topic].result(timeout=30)
    _wait_partitions(zone_fleet, topic, 3)
    deadline = time.monotonic() + 10
    while (zones := true_leader_zones(zone_fleet, topic)).get(2) != main.zone:
        assert time.monotonic() < deadline, zones
        time.sleep(0.2)
    assert zones[1] == zones[2] == main.zone


def _wait_true_zone(fleet: ZoneFleet, topic: str, partition: int, wanted: Any) -> str:
    deadline = time.monotonic() + 30
    while True:
        zone = true_leader_zones(fleet, topic).get(partition)
        if zone is not None and wanted(zone):
            return zone
        assert time.monotonic() < deadline, (partition, zone)
        time.sleep(0.2)


def test_replica_assignments_may_name_the_ids_of_the_zone_view(zone_fleet: ZoneFleet) -> None:
    """Clients assign replicas among the brokers Metadata showed them: their zone's main and
    proxy. The proxy's id stands for a main of another zone (docs/compatibility.md), with
    CreatePartitions and AlterPartitionReassignments alike."""
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    admin = _admin(zone_fleet)
    shown = set(admin.list_topics(timeout=10).brokers)
    proxy = next(p.proxy.node_id for p in zone_fleet.config.proxies if p.proxy.zone == ZONE)
    local = next(m.broker.node_id for m in zone_fleet.config.mains if m.broker.zone == ZONE)
    assert shown == {proxy, local}
    new = NewPartitions(topic, 4, [[proxy], [local], [local]])
    admin.create_partitions([new])[topic].result(timeout=30)
    _wait_partitions(zone_fleet, topic, 4)
    assert _wait_true_zone(zone_fleet, topic, 1, lambda z: z != ZONE) != ZONE
    assert _wait_true_zone(zone_fleet, topic, 2, lambda z: z == ZONE) == ZONE
    leaders = {
        i: p.leader
        for i, p in admin.list_topics(topic, timeout=10).topics[topic].partitions.items()
    }
    assert (leaders[1], leaders[2]) == (proxy, local)
    # AlterPartitionReassignments to the proxy: partition 2 leaves this zone's main for
    # another zone's; partition 1, already behind the proxy, stays where it is.
    before = true_leader_zones(zone_fleet, topic)[1]
    client = KafkaAdminClient(
        bootstrap_servers=zone_fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
    )
    try:
        result = client.alter_partition_reassignments(
            {KafkaTopicPartition(topic, 2): [proxy], KafkaTopicPartition(topic, 1): [proxy]}
        )
        assert all(error is None for error in result.values()), result
        _wait_true_zone(zone_fleet, topic, 2, lambda z: z != ZONE)
        assert true_leader_zones(zone_fleet, topic)[1] == before
        # And back with the main's own id.
        result = client.alter_partition_reassignments({KafkaTopicPartition(topic, 2): [local]})
        assert all(error is None for error in result.values()), result
        _wait_true_zone(zone_fleet, topic, 2, lambda z: z == ZONE)
    finally:
        client.close()


def test_create_partitions_kafka_python_and_aiokafka(zone_fleet: ZoneFleet) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    client = KafkaAdminClient(
        bootstrap_servers=zone_fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
    )
    try:
        client.create_partitions({topic: 3})
    finally:
        client.close()
    _wait_partitions(zone_fleet, topic, 3)

    async def grow() -> None:
        aio = AIOKafkaAdminClient(
            bootstrap_servers=zone_fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
        )
        await aio.start()
        try:
            await aio.create_partitions({topic: AIONewPartitions(total_count=4)})
        finally:
            await aio.close()

    asyncio.run(grow())
    _wait_partitions(zone_fleet, topic, 4)


# -- DeleteRecords -----------------------------------------------------------------------------


def _earliest(admin: AdminClient, topic: str, partition: int = 0) -> int:
    tp = TopicPartition(topic, partition)
    result = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout=30)
    offset: int = result.offset
    return offset


def test_delete_records_moves_log_start_through_a_proxy(zone_fleet: ZoneFleet) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    bootstrap = zone_fleet.bootstrap(ZONE)
    _produce(bootstrap, ZONE, topic, 0, [f"v{i}".encode() for i in range(20)])
    admin = _admin(zone_fleet)
    tp = TopicPartition(topic, 0, 12)
    deleted = admin.delete_records([tp])[tp].result(timeout=30)
    assert deleted.low_watermark == 12
    for zone in zone_fleet.zones:  # every proxy mirrors the leader's new log start
        deadline = time.monotonic() + 10
        while _earliest(_admin(zone_fleet, zone), topic) != 12:
            assert time.monotonic() < deadline, zone
            time.sleep(0.1)
        raw = RawKafka(zone_fleet.bootstrap(zone))
        try:
            assert raw.fetch(topic, {0: 5})[0].error_code == ErrorCode.offset_out_of_range
            assert raw.fetch(topic, {0: 12})[0].error_code == ErrorCode.none
        finally:
            raw.close()
    got = consume_partition(bootstrap, topic, -2, 8, zone_client_id(ZONE))
    assert [offset for offset, _ in got] == list(range(12, 20))
    # An offset below the log start changes nothing; -1 is the high watermark.
    tp = TopicPartition(topic, 0, 3)
    assert admin.delete_records([tp])[tp].result(timeout=30).low_watermark == 12
    tp = TopicPartition(topic, 0, -1)
    assert admin.delete_records([tp])[tp].result(timeout=30).low_watermark == 20
    assert _earliest(admin, topic) == 20


def test_delete_records_above_the_high_watermark_is_out_of_range(zone_fleet: ZoneFleet) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    _produce(zone_fleet.bootstrap(ZONE), ZONE, topic, 0, [b"a", b"b"])
    raw = RawKafka(zone_fleet.bootstrap(ZONE))
    try:
        resp = raw.request(
            21,
            2,
            {
                "topics": [{"name": topic, "partitions": [{"partition_index": 0, "offset": 3}]}],
                "timeout": 30000,
            },
        )
    finally:
        raw.close()
    part = resp.topics[0].partitions[0]
    assert part.error_code == ErrorCode.offset_out_of_range


def test_delete_records_only_on_the_leader(zone_fleet: ZoneFleet) -> None:
    """A main that does not lead the partition answers NOT_LEADER_OR_FOLLOWER; the proxy
    sends each partition to its leader."""
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 3)
    for partition in range(3):
        _produce(zone_fleet.bootstrap(ZONE), ZONE, topic, partition, [b"x"] * 4)
    admin = _admin(zone_fleet)
    tps = [TopicPartition(topic, p, 2) for p in range(3)]
    results = admin.delete_records(tps)
    assert [results[tp].result(timeout=30).low_watermark for tp in tps] == [2, 2, 2]
    answers = []
    for main in zone_fleet.config.mains:
        host, port = main.broker.advertised
        raw = RawKafka(f"{host}:{port}")
        try:
            resp = raw.request(
                21,
                2,
                {
                    "topics": [
                        {"name": topic, "partitions": [{"partition_index": 0, "offset": 3}]}
                    ],
                    "timeout": 30000,
                },
            )
        finally:
            raw.close()
        answers.append(resp.topics[0].partitions[0].error_code)
    assert sorted(answers) == sorted(
        [ErrorCode.none] + [ErrorCode.not_leader_or_follower] * (len(answers) - 1)
    )


@pytest.mark.parametrize("zone", ["az1", "az2"])
def test_one_poll_after_delete_records_gets_what_the_proxy_leads(
    zone_fleet: ZoneFleet, zone: str
) -> None:
    """Right after produce and DeleteRecords, one kafka-python poll of the partitions the
    zone's proxy leads gets every remaining record: a proxy's answer holds all it reports,
    as a Kafka leader's does, even while its mirrors still tail the mains' WAL."""
    topic = _topic()
    create_topic(zone_fleet, zone, topic, 6)
    admin = _admin(zone_fleet, zone)
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    proxy = next(p.proxy.node_id for p in zone_fleet.config.proxies if p.proxy.zone == zone)
    proxied = sorted(i for i, m in partitions.items() if m.leader == proxy)
    assert proxied
    producer = KafkaProducer(
        bootstrap_servers=zone_fleet.bootstrap(zone), client_id=zone_client_id(zone)
    )
    for i in range(100 * len(proxied)):
        producer.send(topic, b"v" * 100, partition=proxied[i % len(proxied)])
    producer.flush()
    producer.close()
    deleted = admin.delete_records([TopicPartition(topic, p, 5) for p in proxied])
    for future in deleted.values():
        assert future.result(timeout=30).low_watermark == 5
    consumer = KafkaConsumer(
        bootstrap_servers=zone_fleet.bootstrap(zone),
        client_id=zone_client_id(zone),
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([KafkaTopicPartition(topic, p) for p in proxied])
        consumer.seek_to_beginning()
        polled = consumer.poll(timeout_ms=2000)
    finally:
        consumer.close()
    got = {tp.partition: [r.offset for r in records] for tp, records in polled.items()}
    assert got == {p: list(range(5, 100)) for p in proxied}


def test_a_partition_beyond_the_count_is_unknown_at_once(zone_fleet: ZoneFleet) -> None:
    """ListOffsets (offsets_for_times) for a partition the topic does not have: every broker
    of a zone view answers UNKNOWN_TOPIC_OR_PARTITION at once, for that partition only, also
    in a request a proxy splits over several mains; confluent-kafka fails fast. (kafka-python
    and aiokafka never send it: their clients wait for Metadata to list the partition, up to
    their timeout, against Kafka too.)"""
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 3)
    admin = _admin(zone_fleet)
    request = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": i, "timestamp": 0, "current_leader_epoch": -1}
                    for i in (0, 1, 2, 5)
                ],
            }
        ],
    }
    for node_id, broker in admin.list_topics(timeout=10).brokers.items():
        raw = RawKafka(f"{broker.host}:{broker.port}", client_id=zone_client_id(ZONE))
        try:
            resp = raw.request(2, 8, request)
        finally:
            raw.close()
        codes = {p.partition_index: p.error_code for t in resp.topics for p in t.partitions}
        assert codes[5] == ErrorCode.unknown_topic_or_partition, (node_id, codes)
        assert set(codes) == {0, 1, 2, 5}
    consumer = Consumer(
        {
            "bootstrap.servers": zone_fleet.bootstrap(ZONE),
            "client.id": zone_client_id(ZONE),
            "group.id": _topic(),
        }
    )
    try:
        started = time.monotonic()
        with pytest.raises(KafkaException) as info:
            consumer.offsets_for_times([TopicPartition(topic, 5, 0)], 15)
        assert info.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
        assert time.monotonic() - started < 5
    finally:
        consumer.close()


def test_delete_records_kafka_python_and_aiokafka(zone_fleet: ZoneFleet) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    _produce(zone_fleet.bootstrap(ZONE), ZONE, topic, 0, [b"v"] * 10)
    client = KafkaAdminClient(
        bootstrap_servers=zone_fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
    )
    try:
        from kafka import TopicPartition as KafkaTopicPartition

        result = client.delete_records({KafkaTopicPartition(topic, 0): 4})
    finally:
        client.close()
    assert _low_watermarks(result) == [4]

    async def delete() -> dict[AIOTopicPartition, int]:
        aio = AIOKafkaAdminClient(
            bootstrap_servers=zone_fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
        )
        await aio.start()
        try:
            return await aio.delete_records({AIOTopicPartition(topic, 0): RecordsToDelete(7)})
        finally:
            await aio.close()

    assert list(asyncio.run(delete()).values()) == [7]
    assert _earliest(_admin(zone_fleet), topic) == 7


def _low_watermarks(result: Any) -> list[int]:
    values = result.values() if isinstance(result, dict) else result
    out = []
    for item in values:
        if isinstance(item, dict):
            out.append(int(item["low_watermark"]))
        elif isinstance(item, int):
            out.append(item)
        else:
            out.append(int(getattr(item, "low_watermark", item)))
    return out


# -- CreateTopics validation -------------------------------------------------------------------


def test_create_topics_validation(zone_fleet: ZoneFleet) -> None:
    admin = _admin(zone_fleet)
    bad_config = _topic()
    error = _error(
        admin.create_topics([NewTopic(bad_config, 1, 1, config={"no.such.key": "1"})])[bad_config]
    )
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "no.such.key" in error.str()
    bad_value = _topic()
    error = _error(
        admin.create_topics([NewTopic(bad_value, 1, 1, config={"retention.ms": "soon"})])[bad_value]
    )
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "retention.ms" in error.str()
    only = _topic()
    admin.create_topics([NewTopic(only, 2, 1)], validate_only=True)[only].result(timeout=30)
    assert only not in admin.list_topics(timeout=10).topics
    # Partition counts and replication factors librdkafka would refuse locally, raw.
    raw = RawKafka(zone_fleet.bootstrap(ZONE))
    try:
        codes = {}
        for label, partitions, factor in (
            ("zero", 0, 1),
            ("negative", -3, 1),
            ("many", 100_000, 1),
            ("rf0", 1, 0),
            ("rf9", 1, 9),
        ):
            resp = raw.request(
                19,
                7,
                {
                    "topics": [
                        {
                            "name": f"{only}-{label}",
                            "num_partitions": partitions,
                            "replication_factor": factor,
                            "assignments": [],
                            "configs": [],
                        }
                    ],
                    "timeout": 30000,
                    "validate_only": False,
                },
            )
            result = resp.topics[0]
            assert result.error_message, label
            codes[label] = result.error_code
    finally:
        raw.close()
    assert codes == {
        "zero": ErrorCode.invalid_partitions,
        "negative": ErrorCode.invalid_partitions,
        "many": ErrorCode.invalid_partitions,
        "rf0": ErrorCode.invalid_replication_factor,
        "rf9": ErrorCode.invalid_replication_factor,
    }
    names = admin.list_topics(timeout=10).topics
    assert not [n for n in names if n.startswith(only)]


def test_create_topics_kafka_python_validate_only_and_existing(zone_fleet: ZoneFleet) -> None:
    topic = _topic()
    create_topic(zone_fleet, ZONE, topic, 1)
    client = KafkaAdminClient(
        bootstrap_servers=zone_fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
    )
    try:
        fresh = _topic()
        client.create_topics([KafkaNewTopic(fresh, 2, 1)], validate_only=True)
        assert fresh not in client.list_topics()
        from kafka.errors import TopicAlreadyExistsError

        with pytest.raises(TopicAlreadyExistsError):
            client.create_topics([KafkaNewTopic(topic, 1, 1)])
    finally:
        client.close()
