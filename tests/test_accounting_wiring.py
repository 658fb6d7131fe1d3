"""Traffic accounting wired into real nodes: a main in az1 and a proxy in az2 on one shared WAL,
a real client producing through the proxy at ~64 KiB batches (issue 3, test 3), and the
ledger's rows by topic (issue 10): clients producing to two topics through the proxy and
straight to the main, and consuming through the proxy."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from proxy_broker.broker import ProxyBroker
from proxy_broker.config import MainEndpoint, ProxyConfig
from telemetry import TrafficKey, accounting_file, iter_accounting_files, read_traffic_rows

SECRET = b"accounting-test-secret-0123456789"
ZONES: dict[str, str | None] = {"az1": "use1-az1", "az2": "use1-az2", "az3": "use1-az3"}
# Relays that may cross zones: group coordination and admin/metadata, never Produce or Fetch.
GROUP_AND_ADMIN = {
    "ApiVersions",
    "Metadata",
    "CreateTopics",
    "DeleteTopics",
    "DescribeConfigs",
    "DescribeCluster",
    "ListOffsets",
    "InitProducerId",
    "FindCoordinator",
    "JoinGroup",
    "SyncGroup",
    "Heartbeat",
    "LeaveGroup",
    "OffsetCommit",
    "OffsetFetch",
    "DescribeGroups",
    "ListGroups",
    "GetTelemetrySubscriptions",  # librdkafka asks on connecting; a metadata-sized answer
}
ROW_FIELDS = [
    "minute",
    "node",
    "from_zone",
    "to_zone",
    "channel",
    "api",
    "topic",
    "bytes",
    "requests",
    "cross_zone",
]


@dataclass
class Fleet:
    main: MainBroker
    proxy: ProxyBroker
    data_dir: Path
    scope: trio.CancelScope
    stopped: trio.Event

    async def stop(self) -> None:
        """What Ctrl-C does: cancel both nodes and wait until they have shut down."""
        self.scope.cancel()
        await self.stopped.wait()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    wal_url = f"osfs://{tmp_path / 'wal'}"
    data_dir = tmp_path / "data"
    scope, stopped = trio.CancelScope(), trio.Event()

    async def run_nodes(*, task_status: trio.TaskStatus[tuple[MainBroker, ProxyBroker]]) -> None:
        main = MainBroker(
            BrokerConfig(
                node_id=1,
                zone="az1",
                wal_url=wal_url,
                port=0,
                rpc_port=0,
                rpc_secret=SECRET,
                data_dir=data_dir,
                zones=dict(ZONES),
                peer_zones={102: "az2"},
            )
        )
        try:
            with scope:
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
                            zones=dict(ZONES),
                            data_dir=data_dir,
                        )
                    )
                    await nursery.start(proxy.run)
                    task_status.started((main, proxy))
        finally:
            stopped.set()

    async with trio.open_nursery() as nursery:
        main, proxy = await nursery.start(run_nodes)
        yield Fleet(main, proxy, data_dir, scope, stopped)
        await Fleet(main, proxy, data_dir, scope, stopped).stop()


def _produce(bootstrap: str, topic: str, count: int, size: int) -> int:
    """Produces `count` values of `size` bytes in ~64 KiB batches; returns the payload bytes."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "zone=az2"})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=20)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "zone=az2",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 64 * 1024,
            "compression.type": "none",
        }
    )
    value = bytes(range(256)) * (size // 256)
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, partition=i % 2)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    return count * len(value)


async def _mirrored(fleet: Fleet, topic: str, partitions: int, timeout: float = 10.0) -> None:
    """Waits until the proxy's mirror of the main shows the main's WAL end and the high
    watermark of each partition of `topic`: the state stream delivered every delta of them."""
    mirror = fleet.proxy.mirrors[fleet.main.config.node_id]
    store = fleet.main.store

    def hws(node: MainBroker | ProxyBroker) -> list[int | None]:
        find = node.store.partition if isinstance(node, MainBroker) else node.partition
        logs = [find(topic, p) for p in range(partitions)]
        return [log.high_watermark if log is not None else None for log in logs]

    def state() -> tuple[tuple[int, list[int | None]], tuple[int, list[int | None]]]:
        return (mirror.wal_end, hws(fleet.proxy)), (store.wal.end_offset, hws(fleet.main))

    deadline = trio.current_time() + timeout
    while (now := state())[0] != now[1]:
        assert trio.current_time() < deadline, f"the proxy mirrors {now[0]}, the main has {now[1]}"
        await trio.sleep(0.01)


def _sum(
    totals: dict[TrafficKey, tuple[int, int]], channel: str, src: str, dst: str
) -> tuple[int, int]:
    """(bytes, requests) of one channel from `src` to `dst`, over every api."""
    rows = [
        v for k, v in totals.items() if (k.channel, k.from_zone, k.to_zone) == (channel, src, dst)
    ]
    return sum(b for b, _ in rows), sum(r for _, r in rows)


async def test_no_payload_crosses_zones(fleet: Fleet) -> None:
    topic = f"acct-{uuid.uuid4().hex[:8]}"
    payload = await trio.to_thread.run_sync(
        _produce, f"127.0.0.1:{fleet.proxy.bound_port}", topic, 16_000, 1024
    )
    await _mirrored(fleet, topic, 2)  # the last state-stream deltas arrived
    proxy = fleet.proxy.traffic.node.accounting.totals()
    main = fleet.main.traffic.node.accounting.totals()

    # Kafka clients only ever talked to their own zone's listener.
    for totals in (proxy, main):
        for key in totals:
            if key.channel == "kafka-client":
                assert not key.cross_zone, key
    kafka_in = sum(
        b for k, (b, _) in proxy.items() if k.channel == "kafka-client" and k.api == "Produce"
    )
    assert kafka_in > payload  # the payload came in on the az2 listener...
    wal_out = sum(b for k, (b, _) in proxy.items() if k.channel == "wal-write")
    assert wal_out > payload  # ...went to the shared WAL (the regional pseudo-zone)...
    assert all(k.to_zone == "regional" for k in proxy if k.channel == "wal-write")
    # ...and the main read it from there, not from the proxy: after its LINKs, off the produce
    # path, so wait for its reads of the linked batches to have caught up.
    main_store = fleet.main.store
    plogs = [main_store.partition(topic, p) for p in range(2)]
    linked = sum(len(plog.entries) for plog in plogs if plog is not None)
    with trio.fail_after(10):
        while main_store.linked_payloads.read < linked:
            await trio.sleep(0.01)
    main = fleet.main.traffic.node.accounting.totals()
    main_wal_in = sum(b for k, (b, _) in main.items() if k.channel == "wal-read")
    assert main_wal_in > payload

    # Relays that crossed zones carry only group and admin APIs.
    relayed = {k.api for k in proxy if k.channel == "relay" and k.cross_zone}
    assert relayed and relayed <= GROUP_AND_ADMIN, relayed

    # Each node books what it sends: confirms in the proxy's ledger, their answers in the main's.
    # Requests count confirmed partitions, so bytes/requests is bytes per partition.
    req_bytes, parts = _sum(proxy, "confirm-rpc", "az2", "az1")
    resp_bytes, resp_parts = _sum(main, "confirm-rpc", "az1", "az2")
    assert _sum(main, "confirm-rpc", "az2", "az1") == (0, 0)
    assert parts == resp_parts and parts >= 16_000 * 1024 // (64 * 1024)
    print(
        f"\nconfirm-rpc: {parts} partitions confirmed, {req_bytes / parts:.1f} B/partition "
        f"out, {resp_bytes / parts:.1f} B/partition back"
    )
    assert req_bytes / parts <= 200
    assert resp_bytes / parts <= 200
    assert _sum(main, "state-stream", "az1", "az2")[0] > 0

    # Every byte is in exactly one ledger, so the fleet's cross-zone bytes are the sum.
    by_channel: dict[str, int] = defaultdict(int)
    for totals in (proxy, main):
        for k, (b, _) in totals.items():
            if k.cross_zone:
                by_channel[k.channel] += b
    cross = sum(by_channel.values())
    ratio = cross / payload
    print(
        f"cross-zone bytes {cross} / payload {payload} = {ratio:.4%} "
        f"({dict(sorted(by_channel.items()))})"
    )
    assert ratio <= 0.005

    # A clean shutdown flushes the open minute: the JSONL ledgers then hold every count.
    await fleet.stop()
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert accounting_file(fleet.data_dir, "main-1", day).is_file()
    files = list(iter_accounting_files(fleet.data_dir))
    assert {f.name for f in files} == {"main-1.jsonl", "proxy-102.jsonl"}
    ledgers = {
        "proxy-102": fleet.proxy.traffic.node.accounting,
        "main-1": fleet.main.traffic.node.accounting,
    }
    for name, ledger in ledgers.items():
        final = ledger.totals()
        # Every dt= directory: a run across midnight UTC writes to two days.
        rows = [row for f in files if f.stem == name for row in read_traffic_rows(f)]
        assert rows and all(list(row) == ROW_FIELDS for row in rows)
        assert {row["node"] for row in rows} == {name}
        summed: dict[TrafficKey, tuple[int, int]] = defaultdict(lambda: (0, 0))
        for row in rows:
            key = TrafficKey(row["from_zone"], row["to_zone"], row["channel"], row["api"])
            assert row["cross_zone"] == key.cross_zone
            nbytes, requests = summed[key]
            summed[key] = (nbytes + row["bytes"], requests + row["requests"])
        assert summed == final


def _produce_two_topics(
    bootstrap: str, client_id: str, sizes: dict[str, int], count: int
) -> dict[str, int]:
    """Produces `count` values to each topic of `sizes` (value bytes per topic), interleaved so
    that requests carry both topics; returns the payload bytes per topic."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 16 * 1024,
            "compression.type": "none",
        }
    )
    sent: dict[str, int] = defaultdict(int)
    for i in range(count):
        for topic, size in sizes.items():
            while True:
                try:
                    producer.produce(topic, bytes([i % 256]) * size, partition=i % 2)
                    break
                except BufferError:
                    producer.poll(0.05)
            sent[topic] += size
    assert producer.flush(60) == 0
    return dict(sent)


def _consume(bootstrap: str, client_id: str, counts: dict[str, int]) -> dict[str, int]:
    """Reads `counts` records from each topic (both partitions, from the start); returns the
    value bytes read per topic."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": f"acct-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in counts for p in (0, 1)])
    got: dict[str, int] = defaultdict(int)
    seen: dict[str, int] = defaultdict(int)
    deadline = time.monotonic() + 60
    try:
        while any(seen[t] < n for t, n in counts.items()) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            topic = message.topic()
            seen[topic] += 1
            got[topic] += len(message.value() or b"")
    finally:
        consumer.close()
    assert dict(seen) == counts
    return dict(got)


async def test_topic_rows_split_frames_without_changing_totals(fleet: Fleet) -> None:
    tag = uuid.uuid4().hex[:8]
    sizes = {f"orders-{tag}": 1000, f"clicks-{tag}": 300}
    proxy_bootstrap = f"127.0.0.1:{fleet.proxy.bound_port}"
    main_bootstrap = f"127.0.0.1:{fleet.main.bound_port}"

    def work() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        admin = AdminClient({"bootstrap.servers": proxy_bootstrap, "client.id": "zone=az2"})
        for future in admin.create_topics([NewTopic(t, 2, 1) for t in sizes]).values():
            future.result(timeout=20)
        via_proxy = _produce_two_topics(proxy_bootstrap, "zone=az2", sizes, 2000)
        direct = _produce_two_topics(main_bootstrap, "zone=az1", sizes, 1000)
        read = _consume(proxy_bootstrap, "zone=az2", {t: 3000 for t in sizes})
        return via_proxy, direct, read

    via_proxy, direct, read = await trio.to_thread.run_sync(work)
    await fleet.stop()
    files = list(iter_accounting_files(fleet.data_dir))
    for name, ledger, zone in (
        ("proxy-102", fleet.proxy.traffic.node.accounting, "az2"),
        ("main-1", fleet.main.traffic.node.accounting, "az1"),
    ):
        final = ledger.totals()
        rows = [row for f in files if f.stem == name for row in read_traffic_rows(f)]
        assert rows and all(list(row) == ROW_FIELDS for row in rows)
        # The topic rows of a key add up to its Prometheus counters, so a plain sum over all
        # rows is the node's total, as it was before rows had topics.
        summed: dict[TrafficKey, tuple[int, int]] = defaultdict(lambda: (0, 0))
        for row in rows:
            key = TrafficKey(row["from_zone"], row["to_zone"], row["channel"], row["api"])
            nbytes, requests = summed[key]
            summed[key] = (nbytes + row["bytes"], requests + row["requests"])
        assert summed == final
        assert sum(row["bytes"] for row in rows) == sum(b for b, _ in final.values())
        # Only Produce and Fetch from Kafka clients have topics, and every one of their frames
        # named a topic this node knows (Fetch v13+ by id).
        by_topic: dict[tuple[str, str, str], int] = defaultdict(int)
        for row in rows:
            topical = row["channel"] == "kafka-client" and row["api"] in ("Produce", "Fetch")
            assert (row["topic"] != "") == topical, row
            if topical:
                by_topic[(row["from_zone"], row["api"], row["topic"])] += row["bytes"]
        produced = via_proxy if name == "proxy-102" else direct
        for topic, payload in produced.items():
            assert by_topic[(zone, "Produce", topic)] >= payload, (name, topic)
            # The answers are small, but each topic had its share of them.
            assert 0 < by_topic[(zone, "Produce", topic)] - payload
        print(f"\n{name}: " + ", ".join(f"{k}={v}" for k, v in sorted(by_topic.items())))
    # The consumer read every record of both topics through the proxy: Fetch responses
    # (from the proxy's zone to the client's, also az2) carry at least their payload.
    proxy_rows = [row for f in files if f.stem == "proxy-102" for row in read_traffic_rows(f)]
    for topic, payload in read.items():
        fetched = sum(
            row["bytes"]
            for row in proxy_rows
            if (row["api"], row["topic"], row["from_zone"]) == ("Fetch", topic, "az2")
        )
        assert fetched >= payload == via_proxy[topic] + direct[topic]
