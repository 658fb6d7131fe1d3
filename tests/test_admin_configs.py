"""Topic and broker configs through a zone proxy of `zonefleet up --zones 3`: DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs with real clients, every main seeing the change, the
brokers using it at once (max.message.bytes, message.timestamp.type, cleanup.policy=compact's
keyless-record refusal with record errors), and the changes surviving a restart."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AIOConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AIOConfigResourceType
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType as KafkaConfigResourceType
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode

from fleet.config import local_fleet_toml
from kafka_wire.record_batch import COMPRESSION_GZIP, build_batch
from main_broker.topic_config import TOPIC_CONFIG_KEYS
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    create_topic,
    start_up_fleet,
    true_leader_zones,
    zone_client_id,
)

ZONE = "az1"


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("admin-configs")


@pytest.fixture(scope="module")
def zone_fleet(fleet_dir: Path) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    proc, fleet = start_up_fleet(fleet_dir)
    try:
        yield proc, fleet
    finally:
        proc.stop()


def _admin(bootstrap: str, zone: str = ZONE) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "client.id": zone_client_id(zone)})


def _mains(fleet: ZoneFleet) -> list[str]:
    out = []
    for main in fleet.config.mains:
        host, port = main.broker.advertised
        out.append(f"{host}:{port}")
    return out


def _topic() -> str:
    return f"cfg-{uuid.uuid4().hex[:10]}"


def _describe(admin: AdminClient, topic: str, **kwargs: Any) -> dict[str, Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries: dict[str, Any] = admin.describe_configs([resource], **kwargs)[resource].result(30)
    return entries


def _incremental(admin: AdminClient, topic: str, *ops: tuple[str, str | None, Any]) -> None:
    entries = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(30)


def _incremental_error(admin: AdminClient, resource: ConfigResource, **kwargs: Any) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        admin.incremental_alter_configs([resource], **kwargs)[resource].result(30)
    error: KafkaError = info.value.args[0]
    return error


def _wait_value(bootstrap: str, topic: str, key: str, value: str | None) -> None:
    admin = _admin(bootstrap)
    deadline = time.monotonic() + 15
    while True:
        entry = _describe(admin, topic)[key]
        if entry.value == value:
            return
        assert time.monotonic() < deadline, f"{bootstrap}: {key}={entry.value}, not {value}"
        time.sleep(0.1)


# -- DescribeConfigs ---------------------------------------------------------------------------


def test_describe_topic_every_key_with_sources_and_synonyms(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    admin = _admin(fleet.bootstrap(ZONE))
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "3600000"})])[topic].result(
        30
    )
    entries = _describe(admin, topic)  # librdkafka asks for synonyms
    assert set(entries) == set(TOPIC_CONFIG_KEYS)
    retention = entries["retention.ms"]
    assert retention.value == "3600000"
    assert retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not retention.is_default and not retention.is_read_only and not retention.is_sensitive
    synonyms = {name: s.source for name, s in retention.synonyms.items()}
    assert synonyms == {
        "retention.ms": ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
        "log.retention.ms": ConfigSource.DEFAULT_CONFIG.value,
    }
    policy = entries["cleanup.policy"]
    assert policy.value == "delete" and policy.source == ConfigSource.DEFAULT_CONFIG.value
    # Filtering by key.
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": ""})
    raw = RawKafka(fleet.bootstrap(ZONE))
    try:
        resp = raw.request(
            32,
            4,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": topic,
                        "configuration_keys": ["max.message.bytes", "cleanup.policy"],
                    }
                ],
                "include_synonyms": False,
                "include_documentation": True,
            },
        )
    finally:
        raw.close()
    del resource
    configs = {c.name: c for c in resp.results[0].configs}
    assert set(configs) == {"max.message.bytes", "cleanup.policy"}
    assert configs["cleanup.policy"].config_type == 7  # LIST
    assert configs["max.message.bytes"].config_type == 3  # INT
    assert configs["max.message.bytes"].documentation


def test_describe_broker_configs(zone_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = zone_fleet
    admin = _admin(fleet.bootstrap(ZONE))
    node = next(iter(admin.list_topics(timeout=10).brokers))
    resource = ConfigResource(ResourceType.BROKER, str(node))
    entries = admin.describe_configs([resource])[resource].result(30)
    assert entries["broker.id"].value == str(node)
    assert entries["broker.id"].is_read_only
    assert entries["broker.id"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert entries["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["log.cleanup.policy"].value == "delete"


def test_describe_broker_listeners_dirs_and_defaults_of_each_node(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    """The keys tools read, for each broker id a client sees (its zone's proxy and main),
    with that node's own values: what Metadata names it by, its WAL directory."""
    _, fleet = zone_fleet
    admin = _admin(fleet.bootstrap(ZONE))
    brokers = admin.list_topics(timeout=10).brokers
    assert len(brokers) == 2
    wal_root = fleet.config.mains[0].broker.wal_url.rstrip("/")
    for node_id, broker in brokers.items():
        resource = ConfigResource(ResourceType.BROKER, str(node_id))
        entries = admin.describe_configs([resource])[resource].result(30)
        endpoint = f"PLAINTEXT://{broker.host}:{broker.port}"
        assert entries["advertised.listeners"].value == endpoint
        assert entries["listeners"].value == endpoint
        writer = "proxy" if node_id > 100 else "main"
        assert entries["log.dirs"].value == f"{wal_root}/{writer}-{node_id}"
        assert entries["num.partitions"].value == "1"
        assert entries["default.replication.factor"].value == "1"
        assert entries["group.min.session.timeout.ms"].value == "6000"
        assert entries["group.max.session.timeout.ms"].value == "1800000"
        assert entries["broker.id"].value == str(node_id)
        assert entries["advertised.listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value


def test_group_session_timeout_bounds_from_the_fleet_toml(tmp_path: Path) -> None:
    """group.min/max.session.timeout.ms set in the TOML: described, and a JoinGroup outside
    them refused with INVALID_SESSION_TIMEOUT, as Kafka does."""
    port = free_port_block(2)
    text = local_fleet_toml(tmp_path / "data", port, zone="az1").replace(
        'zone = "az1"\nhost',
        'zone = "az1"\ngroup_min_session_timeout_ms = 10000\n'
        "group_max_session_timeout_ms = 20000\nhost",
    )
    config = tmp_path / "fleet.toml"
    config.write_text(text)
    proc = FleetProcess(tmp_path / "data", port, ["--config", str(config)]).start()
    try:
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        resource = ConfigResource(ResourceType.BROKER, "1")
        entries = admin.describe_configs([resource])[resource].result(30)
        assert entries["group.min.session.timeout.ms"].value == "10000"
        assert entries["group.max.session.timeout.ms"].value == "20000"
        raw = RawKafka(bootstrap)
        try:
            codes = {}
            for timeout in (6000, 15000, 30000):
                resp = raw.request(
                    11,
                    5,
                    {
                        "group_id": f"g-{uuid.uuid4().hex[:8]}",
                        "session_timeout": datetime.timedelta(milliseconds=timeout),
                        "rebalance_timeout": datetime.timedelta(seconds=30),
                        "member_id": "",
                        "group_instance_id": None,
                        "protocol_type": "consumer",
                        "protocols": [{"name": "range", "metadata": b""}],
                    },
                )
                codes[timeout] = resp.error_code
        finally:
            raw.close()
        assert codes[6000] == ErrorCode.invalid_session_timeout
        assert codes[30000] == ErrorCode.invalid_session_timeout
        assert codes[15000] == ErrorCode.member_id_required  # accepted: the v4+ first step
        # A stock consumer asking below the minimum fails as against Kafka.
        topic = _topic()
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"g-{uuid.uuid4().hex[:8]}",
                "session.timeout.ms": 6000,
            }
        )
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 20
            error = None
            while time.monotonic() < deadline:
                try:
                    msg = consumer.poll(0.5)
                except KafkaException as exc:
                    error = exc.args[0]
                else:
                    error = msg.error() if msg is not None else None
                if error is not None and error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
                    break
            assert error is not None and error.code() == KafkaError.INVALID_SESSION_TIMEOUT
        finally:
            consumer.close()
    finally:
        proc.stop()


# -- IncrementalAlterConfigs / AlterConfigs ----------------------------------------------------


def test_incremental_alter_set_append_subtract_delete_seen_by_every_main(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 2)
    admin = _admin(fleet.bootstrap(ZONE))
    _incremental(
        admin,
        topic,
        ("retention.ms", "120000", AlterConfigOpType.SET),
        ("cleanup.policy", "compact", AlterConfigOpType.APPEND),
    )
    entries = _describe(admin, topic)
    assert entries["retention.ms"].value == "120000"
    assert entries["cleanup.policy"].value == "delete,compact"
    for bootstrap in _mains(fleet):
        _wait_value(bootstrap, topic, "cleanup.policy", "delete,compact")
        _wait_value(bootstrap, topic, "retention.ms", "120000")
    _incremental(
        admin,
        topic,
        ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT),
        ("retention.ms", None, AlterConfigOpType.DELETE),
    )
    entries = _describe(admin, topic)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["retention.ms"].value == "604800000"
    assert entries["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    for bootstrap in _mains(fleet):
        _wait_value(bootstrap, topic, "retention.ms", "604800000")


def test_incremental_alter_refusals_and_validate_only(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    admin = _admin(fleet.bootstrap(ZONE))

    def resource(name: str, value: str | None, op: Any) -> ConfigResource:
        entry = ConfigEntry(name, value, incremental_operation=op)
        return ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])

    error = _incremental_error(admin, resource("retention.ms", "-5", AlterConfigOpType.SET))
    assert error.code() == KafkaError.INVALID_CONFIG and "retention.ms" in error.str()
    error = _incremental_error(admin, resource("no.such.key", "1", AlterConfigOpType.SET))
    assert error.code() == KafkaError.INVALID_CONFIG and "no.such.key" in error.str()
    error = _incremental_error(admin, resource("retention.ms", "1", AlterConfigOpType.APPEND))
    assert error.code() == KafkaError.INVALID_CONFIG and "append" in error.str()
    missing = ConfigResource(
        ResourceType.TOPIC,
        f"{topic}-missing",
        incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    error = _incremental_error(admin, missing)
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    only = resource("retention.ms", "5000", AlterConfigOpType.SET)
    admin.incremental_alter_configs([only], validate_only=True)[only].result(30)
    assert _describe(admin, topic)["retention.ms"].value == "604800000"
    # Broker configs are static: changing one is refused as Kafka refuses a read-only config.
    node = next(iter(admin.list_topics(timeout=10).brokers))
    broker = ConfigResource(
        ResourceType.BROKER,
        str(node),
        incremental_configs=[
            ConfigEntry("log.retention.ms", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    error = _incremental_error(admin, broker)
    assert error.code() == KafkaError.INVALID_REQUEST
    assert "Cannot update these configs dynamically" in error.str()


def test_kafka_standard_topic_configs_and_an_empty_cleanup_policy(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    """Kafka's standard topic configs (cleaner settings, deprecated ones, ones with no meaning
    here) through a proxy: CreateTopics, AlterConfigs and IncrementalAlterConfigs take them,
    DescribeConfigs shows them with their type; the last cleanup.policy may be subtracted."""
    _, fleet = zone_fleet
    topic = _topic()
    admin = _admin(fleet.bootstrap(ZONE))
    configs = {
        "min.cleanable.dirty.ratio": "0.1",
        "delete.retention.ms": "1000",
        "file.delete.delay.ms": "0",
        "message.format.version": "3.0-IV1",
        "min.compaction.lag.ms": "10",
        "max.compaction.lag.ms": "100000",
        "segment.jitter.ms": "5",
    }
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(30)
    entries = _describe(admin, topic, request_timeout=30)
    for name, value in configs.items():
        assert entries[name].value == value, name
        assert entries[name].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    _incremental(
        admin,
        topic,
        ("min.cleanable.dirty.ratio", "0.75", AlterConfigOpType.SET),
        ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT),
    )
    entries = _describe(admin, topic)
    assert entries["min.cleanable.dirty.ratio"].value == "0.75"
    assert entries["cleanup.policy"].value == ""
    bad = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "min.cleanable.dirty.ratio", "2", incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    assert _incremental_error(admin, bad).code() == KafkaError.INVALID_CONFIG
    replace = ConfigResource(
        ResourceType.TOPIC, topic, set_config={"delete.retention.ms": "5", "flush.ms": "7"}
    )
    with pytest.warns(DeprecationWarning, match="alter_configs"):
        admin.alter_configs([replace])[replace].result(30)
    entries = _describe(admin, topic)
    assert (entries["delete.retention.ms"].value, entries["flush.ms"].value) == ("5", "7")
    assert entries["min.cleanable.dirty.ratio"].value == "0.5"  # back to the default
    # Types and documentation (DescribeConfigs v4: config_type DOUBLE = 6).
    raw = RawKafka(fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE))
    try:
        resp = raw.request(
            32,
            4,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": topic,
                        "configuration_keys": ["min.cleanable.dirty.ratio", "file.delete.delay.ms"],
                    }
                ],
                "include_synonyms": False,
                "include_documentation": True,
            },
        )
    finally:
        raw.close()
    described = {c.name: c for c in resp.results[0].configs}
    assert described["min.cleanable.dirty.ratio"].config_type == 6  # DOUBLE
    assert "no effect" in described["file.delete.delay.ms"].documentation


def test_alter_configs_replaces_the_set(zone_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    admin = _admin(fleet.bootstrap(ZONE))
    _incremental(admin, topic, ("retention.bytes", "1000000", AlterConfigOpType.SET))
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"segment.ms": "100000"})
    # AlterConfigs (33), not incremental: deprecated in the clients, still sent by tools.
    with pytest.warns(DeprecationWarning, match="alter_configs"):
        admin.alter_configs([resource])[resource].result(30)
    entries = _describe(admin, topic)
    assert entries["segment.ms"].value == "100000"
    # AlterConfigs replaced the whole set: retention.bytes is back to its default.
    assert entries["retention.bytes"].value == "-1"
    assert entries["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    bad = ConfigResource(ResourceType.TOPIC, topic, set_config={"max.message.bytes": "-2"})
    with pytest.raises(KafkaException) as info, pytest.warns(DeprecationWarning):
        admin.alter_configs([bad])[bad].result(30)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    # kafka-python's AlterConfigs keeps the other modified keys itself (it describes first).
    client = KafkaAdminClient(
        bootstrap_servers=fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
    )
    try:
        client.alter_configs(
            [
                KafkaConfigResource(
                    KafkaConfigResourceType.TOPIC, topic, configs={"retention.ms": "86400000"}
                )
            ],
            incremental=False,
        )
    finally:
        client.close()
    entries = _describe(admin, topic)
    assert entries["retention.ms"].value == "86400000"
    assert entries["segment.ms"].value == "100000"


def test_aiokafka_alter_and_describe(zone_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)

    async def run() -> Any:
        aio = AIOKafkaAdminClient(
            bootstrap_servers=fleet.bootstrap(ZONE), client_id=zone_client_id(ZONE)
        )
        await aio.start()
        try:
            await aio.alter_configs(
                [
                    AIOConfigResource(
                        AIOConfigResourceType.TOPIC, topic, configs={"retention.ms": "7000"}
                    )
                ]
            )
            return await aio.describe_configs(
                [AIOConfigResource(AIOConfigResourceType.TOPIC, topic)]
            )
        finally:
            await aio.close()

    responses = asyncio.run(run())
    values = {
        entry[0]: entry[1]
        for response in responses
        for resource in response.resources
        for entry in resource[4]
    }
    assert values["retention.ms"] == "7000"


# -- the brokers use the configs ---------------------------------------------------------------


def _produce_errors(
    bootstrap: str, topic: str, values: list[tuple[bytes | None, bytes]], **conf: Any
) -> list[KafkaError | None]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": zone_client_id(ZONE),
            "linger.ms": 0,
            "message.max.bytes": 10_000_000,
            **conf,
        }
    )
    errors: list[KafkaError | None] = []
    for key, value in values:
        producer.produce(
            topic, value, key=key, partition=0, on_delivery=lambda e, m: errors.append(e)
        )
    assert producer.flush(30) == 0
    return errors


def test_max_message_bytes_applies_at_once_direct_and_through_a_proxy(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    admin = _admin(fleet.bootstrap(ZONE))
    big = [(None, b"x" * 5000)]
    assert _produce_errors(fleet.bootstrap(ZONE), topic, big) == [None]
    _incremental(admin, topic, ("max.message.bytes", "2000", AlterConfigOpType.SET))
    for bootstrap in [fleet.bootstrap(z) for z in fleet.zones]:
        errors = _produce_errors(bootstrap, topic, big)
        assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    leader = _leader_bootstrap(fleet, topic)
    errors = _produce_errors(leader, topic, big)
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert _produce_errors(leader, topic, [(None, b"small")]) == [None]


def _leader_bootstrap(fleet: ZoneFleet, topic: str) -> str:
    zone = true_leader_zones(fleet, topic)[0]
    main = next(m.broker for m in fleet.config.mains if m.broker.zone == zone)
    return f"{main.host}:{main.port}"


def test_log_append_time_applies_at_once(zone_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    admin = _admin(fleet.bootstrap(ZONE))
    _incremental(admin, topic, ("message.timestamp.type", "LogAppendTime", AlterConfigOpType.SET))
    producer = Producer({"bootstrap.servers": fleet.bootstrap(ZONE), "linger.ms": 0})
    producer.produce(topic, b"old", partition=0, timestamp=1_000_000)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": fleet.bootstrap(ZONE),
            "group.id": f"g-{uuid.uuid4()}",
            "client.id": zone_client_id(ZONE),
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + 30
    msg = None
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            break
    consumer.close()
    assert msg is not None and msg.error() is None
    kind, stamp = msg.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert abs(stamp - time.time() * 1000) < 60_000


def _raw_produce(bootstrap: str, topic: str, batch: bytes) -> Any:
    raw = RawKafka(bootstrap)
    try:
        resp = raw.request(
            0,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": 30000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
            },
        )
    finally:
        raw.close()
    return resp.responses[0].partition_responses[0]


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_compacted_topic_refuses_keyless_records(
    zone_fleet: tuple[FleetProcess, ZoneFleet], compression: str
) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    _incremental(
        _admin(fleet.bootstrap(ZONE)), topic, ("cleanup.policy", "compact", AlterConfigOpType.SET)
    )
    errors = _produce_errors(
        fleet.bootstrap(ZONE),
        topic,
        [(b"k", b"v"), (None, b"no key")],
        **{"compression.type": compression, "linger.ms": 100, "batch.num.messages": 1},
    )
    assert errors[0] is None
    assert errors[1] is not None and errors[1].code() == KafkaError.INVALID_RECORD


def test_keyless_record_errors_direct_and_through_a_proxy(
    zone_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    _incremental(
        _admin(fleet.bootstrap(ZONE)), topic, ("cleanup.policy", "compact", AlterConfigOpType.SET)
    )
    now = int(time.time() * 1000)
    for compression in (0, COMPRESSION_GZIP):
        batch = build_batch(
            [(b"a", b"1"), (None, b"2"), (b"c", b"3"), (None, b"4")],
            timestamp_ms=now,
            compression=compression,
        )
        for bootstrap in (fleet.bootstrap(z) for z in fleet.zones):
            part = _raw_produce(bootstrap, topic, batch)
            assert part.error_code == ErrorCode.invalid_record
            assert [e.batch_index for e in part.record_errors] == [1, 3]
            message = (
                f"Compacted topic cannot accept message without key in topic partition {topic}"
            )
            assert all(e.batch_index_error_message == f"{message}-0." for e in part.record_errors)
            assert "2 record errors" in part.error_message
        part = _raw_produce(_leader_bootstrap(fleet, topic), topic, batch)
        assert part.error_code == ErrorCode.invalid_record
        assert [e.batch_index for e in part.record_errors] == [1, 3]
    keyed = build_batch([(b"a", b"1")], timestamp_ms=now)
    assert _raw_produce(fleet.bootstrap(ZONE), topic, keyed).error_code == ErrorCode.none


# -- durability ----------------------------------------------------------------------------------


def test_configs_partitions_and_log_start_survive_a_restart(
    zone_fleet: tuple[FleetProcess, ZoneFleet], fleet_dir: Path
) -> None:
    """Last in the module: it restarts the module's fleet."""
    from confluent_kafka.admin import NewPartitions

    proc, fleet = zone_fleet
    topic = _topic()
    create_topic(fleet, ZONE, topic, 1)
    admin = _admin(fleet.bootstrap(ZONE))
    _incremental(admin, topic, ("retention.ms", "99000", AlterConfigOpType.SET))
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    _produce_errors(fleet.bootstrap(ZONE), topic, [(None, b"v")] * 6)
    tp = TopicPartition(topic, 0, 4)
    assert admin.delete_records([tp])[tp].result(30).low_watermark == 4
    assert proc.stop() == 0
    proc2, fleet2 = start_up_fleet(fleet_dir, fleet_dir / "fleet.toml")
    try:
        admin2 = _admin(fleet2.bootstrap(ZONE))
        assert _describe(admin2, topic)["retention.ms"].value == "99000"
        assert len(admin2.list_topics(topic, timeout=10).topics[topic].partitions) == 3
        from confluent_kafka.admin import OffsetSpec

        tp0 = TopicPartition(topic, 0)
        deadline = time.monotonic() + 20
        while True:
            try:
                earliest = admin2.list_offsets({tp0: OffsetSpec.earliest()})[tp0].result(30)
                if earliest.offset == 4:
                    break
            except KafkaException:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        proc2.stop()
