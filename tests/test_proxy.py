"""A main in az1 and a proxy in az2 sharing one WAL directory, with real clients in az2."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from proxy_broker.broker import ProxyBroker
from proxy_broker.config import MainEndpoint, ProxyConfig
from shared_wal import RecordType

SECRET = b"proxy-test-secret-0123456789"


class Fleet:
    def __init__(self, main: MainBroker, proxy: ProxyBroker) -> None:
        self.main = main
        self.proxy = proxy

    @property
    def proxy_bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.bound_port}"


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    wal_url = f"osfs://{tmp_path / 'wal'}"
    main = MainBroker(
        BrokerConfig(node_id=1, zone="az1", wal_url=wal_url, port=0, rpc_port=0, rpc_secret=SECRET)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(main.run)
        assert main.bound_port and main.rpc_port
        endpoint = MainEndpoint(1, "az1", "127.0.0.1", main.bound_port, main.rpc_port)
        proxy = ProxyBroker(
            ProxyConfig(
                node_id=102,
                zone="az2",
                wal_url=wal_url,
                rpc_secret=SECRET,
                mains=[endpoint],
                port=0,
            )
        )
        await nursery.start(proxy.run)
        yield Fleet(main, proxy)
        nursery.cancel_scope.cancel()


def _round_trip(bootstrap: str, topic: str, n: int) -> tuple[list[bytes], list[int], object]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "zone=az2"})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=20)
    meta = admin.list_topics(topic, timeout=10)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "zone=az2",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
        }
    )
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), key=str(i % 7).encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "zone=az2",
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (len(eof) < 2 or len(values) < n):
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                eof.add(msg.partition())
            continue
        values.append(msg.value())
    consumer.close()
    leaders = [p.leader for p in meta.topics[topic].partitions.values()]
    return values, leaders, meta


async def test_produce_and_consume_through_the_proxy(fleet: Fleet) -> None:
    topic = f"px-{uuid.uuid4().hex[:8]}"
    values, leaders, meta = await trio.to_thread.run_sync(
        _round_trip, fleet.proxy_bootstrap, topic, 2000
    )
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(2000))
    # The az2 client sees only the az2 proxy as broker and leader.
    assert leaders == [102, 102]
    assert set(meta.brokers) == {102}  # type: ignore[attr-defined]
    # The main holds LINK records only: the payload went through the shared WAL.
    types = [r.type for r in fleet.main.store.reader.iter_records()]
    assert RecordType.LINK in types and RecordType.DATA not in types
    assert (
        fleet.main.store.partition(topic, 0).high_watermark
        + fleet.main.store.partition(  # type: ignore[union-attr]
            topic, 1
        ).high_watermark
        == 2000
    )  # type: ignore[union-attr]
