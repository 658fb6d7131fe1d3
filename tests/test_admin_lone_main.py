"""Topic admin on a lone main (no cluster metadata document: topics, configs, partition counts
and log starts live in its WAL), with real clients: CreatePartitions, IncrementalAlterConfigs
that retention uses at once, DeleteRecords recorded in the object manifest, a compacted topic's
keyless-record refusal, and everything back after a restart."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from main_broker.broker import MainBroker
from main_broker.cluster.view import LoneMain
from main_broker.config import BrokerConfig
from main_broker.objects.upload import stream_key
from shared_wal import WalConfig
from tests.ports import free_port

HOUR = 3_600_000


def _config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        node_id=1,
        zone="az1",
        wal_url=f"osfs://{tmp_path / 'wal'}",
        port=free_port(),
        object_store_url=f"file://{tmp_path / 'objects'}",
        wal=WalConfig(segment_bytes=64 * 1024),
        # The test decides what each upload holds (`upload_once`): never on its own.
        upload_threshold_bytes=1 << 40,
        upload_interval_s=3600.0,
        retention_check_interval_s=0.1,
        retention_delete_delay_s=0.2,
    )


def _admin_calls(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("t", 2, 1)])["t"].result(30)
    admin.create_partitions([NewPartitions("t", 4)])["t"].result(30)
    assert len(admin.list_topics("t", timeout=10).topics["t"].partitions) == 4


def _alter(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


def _describe(bootstrap: str, topic: str) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries: dict[str, Any] = admin.describe_configs([resource])[resource].result(30)
    return entries


def _produce(
    bootstrap: str, partition: int, n: int, timestamp: int = 0, key: bytes | None = b"k"
) -> list[KafkaError | None]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    errors: list[KafkaError | None] = []
    for i in range(n):
        producer.produce(
            "t",
            b"v%d" % i,
            key=key,
            partition=partition,
            timestamp=timestamp,
            on_delivery=lambda e, m: errors.append(e),
        )
    assert producer.flush(30) == 0
    return errors


def _produce_one_batch(bootstrap: str, partition: int, n: int, timestamp: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500})
    for i in range(n):
        producer.produce("t", b"b%d" % i, key=b"k", partition=partition, timestamp=timestamp)
    assert producer.flush(30) == 0


def _offset_for_time(bootstrap: str, partition: int, timestamp: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    try:
        (found,) = consumer.offsets_for_times([TopicPartition("t", partition, timestamp)], 30)
    finally:
        consumer.close()
    offset: int = found.offset
    return offset


def _delete_records(bootstrap: str, partition: int, offset: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition("t", partition, offset)
    low: int = admin.delete_records([tp])[tp].result(30).low_watermark
    return low


def _earliest(bootstrap: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition("t", partition)
    offset: int = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset
    return offset


async def _until(check: Any, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.05)


async def test_lone_main_topic_admin_durable_in_its_wal(tmp_path: Path) -> None:
    old = int(time.time() * 1000) - 2 * HOUR
    config = _config(tmp_path)
    broker = MainBroker(config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        tier = broker.objects
        assert tier is not None and isinstance(broker.cluster, LoneMain)
        await trio.to_thread.run_sync(_admin_calls, bootstrap)
        p0 = broker.store.partition("t", 0)
        assert p0 is not None
        # Old records in an object: the default retention (7 days) keeps them ...
        assert await trio.to_thread.run_sync(_produce, bootstrap, 0, 100, old) == [None] * 100
        assert await tier.upload_once() > 0
        await trio.sleep(0.5)
        assert p0.log_start_offset == 0
        # ... one hour drops them, at once.
        await trio.to_thread.run_sync(_alter, bootstrap, "t", "retention.ms", str(HOUR))
        await _until(lambda: p0.log_start_offset == 100)
        # DeleteRecords on a new partition, and on one whose objects hold the offset.
        assert await trio.to_thread.run_sync(_produce, bootstrap, 3, 10) == [None] * 10
        assert await trio.to_thread.run_sync(_delete_records, bootstrap, 3, 6) == 6
        assert await trio.to_thread.run_sync(_produce, bootstrap, 0, 50) == [None] * 50
        assert await tier.upload_once() > 0
        assert await trio.to_thread.run_sync(_delete_records, bootstrap, 0, 120) == 120
        assert await trio.to_thread.run_sync(_earliest, bootstrap, 0) == 120
        key = stream_key(p0)
        await _until(lambda: tier.manifests.manifest.streams[key].log_start == 120)
        # DeleteRecords inside a batch: a timestamp search never answers below the start.
        stamp = int(time.time() * 1000) - 1000
        await trio.to_thread.run_sync(_produce_one_batch, bootstrap, 2, 10, stamp)
        assert await trio.to_thread.run_sync(_delete_records, bootstrap, 2, 5) == 5
        assert await trio.to_thread.run_sync(_offset_for_time, bootstrap, 2, stamp) == 5
        # A compacted topic refuses keyless records (direct to the main).
        await trio.to_thread.run_sync(_alter, bootstrap, "t", "cleanup.policy", "compact")
        errors = await trio.to_thread.run_sync(_produce, bootstrap, 1, 1, 0, None)
        assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
        nursery.cancel_scope.cancel()

    restarted = MainBroker(_config(tmp_path))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(restarted.run)
        bootstrap = f"127.0.0.1:{port}"
        topic = restarted.store.topics["t"]
        assert len(topic.partitions) == 4
        assert topic.configs == {"retention.ms": str(HOUR), "cleanup.policy": "compact"}
        entries = await trio.to_thread.run_sync(_describe, bootstrap, "t")
        assert entries["cleanup.policy"].value == "compact"
        assert entries["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        assert await trio.to_thread.run_sync(_earliest, bootstrap, 0) == 120
        assert await trio.to_thread.run_sync(_earliest, bootstrap, 3) == 6
        errors = await trio.to_thread.run_sync(_produce, bootstrap, 2, 1, 0, None)
        assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
        nursery.cancel_scope.cancel()
