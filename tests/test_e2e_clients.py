"""Real Kafka clients against `zonefleet up`: produce and consume 10,000 messages each."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.fleet_process import FleetProcess

N = 10_000
PARTITIONS = 3


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    futures[name].result(timeout=30)


def check_per_partition_order(records: list[tuple[int, int, bytes]], n: int, prefix: str) -> None:
    """Every message exactly once; within each partition, offsets and sequence increase."""
    values = [v for _, _, v in records]
    assert len(values) == n, f"expected {n} messages, got {len(values)}"
    assert sorted(values) == sorted(f"{prefix}-{i}".encode() for i in range(n))
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for partition, offset, value in records:
        by_partition[partition].append((offset, int(value.rsplit(b"-", 1)[1])))
    for partition, items in by_partition.items():
        offsets = [o for o, _ in items]
        seqs = [s for _, s in items]
        assert offsets == sorted(offsets), f"partition {partition} offsets out of order"
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        assert seqs == sorted(seqs), f"partition {partition} reordered messages"


def consume_confluent(bootstrap: str, topic: str, n: int, timeout: float = 60.0):
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out: list[tuple[int, int, bytes]] = []
    import time

    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(msg.error())
        out.append((msg.partition(), msg.offset(), msg.value()))
    consumer.close()
    return out


def test_confluent_kafka_10k(fleet: FleetProcess) -> None:
    topic = f"ck-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic)
    producer = Producer(
        {
            "bootstrap.servers": fleet.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    errors: list[object] = []
    for i in range(N):
        key = str(i % 17).encode()
        while True:
            try:
                producer.produce(
                    topic,
                    f"ck-{i}".encode(),
                    key,
                    on_delivery=lambda e, m: errors.append(e) if e else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert errors == []
    records = consume_confluent(fleet.bootstrap, topic, N)
    check_per_partition_order(records, N, "ck")


def test_kafka_python_10k(fleet: FleetProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=fleet.bootstrap, acks="all", linger_ms=5)
    futures = [
        producer.send(topic, key=str(i % 13).encode(), value=f"kp-{i}".encode()) for i in range(N)
    ]
    producer.flush(60)
    for f in futures:
        f.get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=fleet.bootstrap,
        auto_offset_reset="earliest",
        group_id=f"g-{uuid.uuid4()}",
        enable_auto_commit=False,
        consumer_timeout_ms=15000,
    )
    records = []
    for msg in consumer:
        records.append((msg.partition, msg.offset, msg.value))
        if len(records) >= N:
            break
    consumer.close()
    check_per_partition_order(records, N, "kp")


def test_aiokafka_10k(fleet: FleetProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"ak-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic)

    async def run() -> list[tuple[int, int, bytes]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=fleet.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=str(i % 11).encode(), value=f"ak-{i}".encode())
                for i in range(N)
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=fleet.bootstrap,
            auto_offset_reset="earliest",
            group_id=f"g-{uuid.uuid4()}",
            enable_auto_commit=False,
        )
        await consumer.start()
        out: list[tuple[int, int, bytes]] = []
        try:
            async with asyncio.timeout(60):
                while len(out) < N:
                    batch = await consumer.getmany(timeout_ms=1000)
                    for tp, msgs in batch.items():
                        out.extend((tp.partition, m.offset, m.value) for m in msgs)
        finally:
            await consumer.stop()
        return out

    records = asyncio.run(run())
    check_per_partition_order(records, N, "ak")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_round_trip(fleet: FleetProcess, codec: str) -> None:
    topic = f"cmp-{codec}-{uuid.uuid4().hex[:6]}"
    create_topic(fleet.bootstrap, topic, partitions=1)
    producer = Producer(
        {
            "bootstrap.servers": fleet.bootstrap,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 20,
        }
    )
    n = 2000
    for i in range(n):
        producer.produce(topic, f"{codec}-{i}".encode() + b"x" * 100)
    assert producer.flush(30) == 0
    records = consume_confluent(fleet.bootstrap, topic, n)
    values = [v for _, _, v in records]
    assert values == [f"{codec}-{i}".encode() + b"x" * 100 for i in range(n)]
