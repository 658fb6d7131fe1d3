"""Failover (issue 14): a killed main's partitions move in seconds and stock clients follow;
a paused main whose partitions moved is fenced through the shared WAL.

Every node runs as its own process from one TOML, at the default timings. Times are printed,
not asserted (bench/failover.py measures them); what is asserted is that clients of three
libraries carry on without a restart, that nothing acknowledged is lost or duplicated, and
that a main resumed after SIGSTOP neither acknowledges nor serves anything once another main
took its partitions over.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

from kafka_wire.codec import build_request, decode_response, encode_request
from kafka_wire.record_batch import build_batch
from tests.raw_kafka import RawKafka, fetch_v12
from tests.zone_fleet import (
    SplitFleet,
    ZoneFleet,
    consume_confluent,
    create_topic,
    raw_metadata,
    zone_client_id,
)

PARTITIONS = 3
PER_CLIENT = 1500
NOT_LEADER_OR_FOLLOWER = 6
EXIT_FENCED = 3


@pytest.fixture(scope="module")
def split_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SplitFleet]:
    fleet = SplitFleet(tmp_path_factory.mktemp("failover") / "fleet").start()
    try:
        yield fleet
    finally:
        fleet.close()


def _leaders(fleet: ZoneFleet, topic: str, skip: set[int]) -> dict[int, tuple[int, int]]:
    """partition -> (leader, epoch) as the mains not in `skip` claim it (highest epoch)."""
    best: dict[int, tuple[int, int]] = {}
    for m in fleet.config.mains:
        main = m.broker
        if main.node_id in skip:
            continue
        raw = RawKafka(f"{main.host}:{main.port}")
        try:
            (described,) = raw_metadata(raw, topic).topics
        finally:
            raw.close()
        for p in described.partitions:
            if (
                p.leader_id == main.node_id
                and p.leader_epoch >= best.get(p.partition_index, (-1, -1))[1]
            ):
                best[p.partition_index] = (main.node_id, p.leader_epoch)
    return best


def _controller(fleet: ZoneFleet) -> int:
    for m in fleet.config.mains:
        status = httpx.get(f"http://{m.admin_host}:{m.admin_port}/status", timeout=5).json()
        if status["cluster"]["controller"]["active"]:
            return m.broker.node_id
    raise AssertionError("no main holds the controller lease")


def _wait_moved(fleet: ZoneFleet, topic: str, partition: int, source: int, epoch: int) -> float:
    started = time.monotonic()
    while True:
        leader, new_epoch = _leaders(fleet, topic, {source}).get(partition, (-1, -1))
        if leader not in (-1, source) and new_epoch > epoch:
            return time.monotonic() - started
        assert time.monotonic() - started < 120, f"{topic}-{partition} never left main {source}"
        time.sleep(0.05)


def _wait_healthy_again(fleet: SplitFleet, node: int) -> None:
    main = next(m for m in fleet.mains if m.node_id == node)
    main.launch().wait_healthy(120)


# -- the clients ------------------------------------------------------------------------------


class _Client(threading.Thread):
    """Produces `<name>-<i>` to partition i % PARTITIONS at a steady pace and reads every
    partition from the start, with one library, through one zone's proxy."""

    def __init__(self, fleet: ZoneFleet, zone: str, topic: str, name: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = fleet.bootstrap(zone)
        self.zone, self.topic, self.name = zone, topic, name
        self.acked: set[bytes] = set()
        self.read: list[tuple[int, bytes]] = []
        self.errors: list[str] = []
        self.done = threading.Event()
        self.expected = PER_CLIENT

    def value(self, i: int) -> bytes:
        return f"{self.name}-{i}".encode()

    def all_read(self) -> bool:
        """Every client's records: the consumer reads on past its own producer's end."""
        return len({v for _, v in self.read}) >= self.expected


class _ConfluentClient(_Client):
    def run(self) -> None:
        conf = {"bootstrap.servers": self.bootstrap, "client.id": zone_client_id(self.zone)}
        producer = Producer(
            {**conf, "enable.idempotence": True, "acks": "all", "message.timeout.ms": 120000}
        )
        consumer = Consumer({**conf, "group.id": f"c-{uuid.uuid4().hex[:6]}"})
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(3)])

        def delivered(err: Any, msg: Any) -> None:
            (self.errors.append(str(err)) if err else self.acked.add(msg.value()))

        try:
            for i in range(PER_CLIENT):
                producer.produce(
                    self.topic, self.value(i), partition=i % PARTITIONS, on_delivery=delivered
                )
                producer.poll(0.004)
                self._read(consumer, 0)
            while producer.flush(0.1):
                self._read(consumer, 0)
            deadline = time.monotonic() + 120
            while not self.all_read() and time.monotonic() < deadline:
                self._read(consumer, 0.2)
        finally:
            consumer.close()
            self.done.set()

    def _read(self, consumer: Consumer, timeout: float) -> None:
        msg = consumer.poll(timeout)
        if msg is not None and msg.error() is None:
            self.read.append((msg.partition(), msg.value()))


class _KafkaPythonClient(_Client):
    def run(self) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=zone_client_id(self.zone),
            enable_idempotence=True,
            acks="all",
            delivery_timeout_ms=120000,
        )
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=zone_client_id(self.zone),
            enable_auto_commit=False,
        )
        tps = [KafkaTopicPartition(self.topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)

        def delivered(value: bytes) -> Any:
            return lambda _meta: self.acked.add(value)

        try:
            for i in range(PER_CLIENT):
                future = producer.send(self.topic, self.value(i), partition=i % PARTITIONS)
                future.add_callback(delivered(self.value(i)))
                future.add_errback(lambda exc: self.errors.append(repr(exc)))
                if i % 20 == 0:
                    self._read(consumer, 0)
                time.sleep(0.004)
            producer.flush(120)
            deadline = time.monotonic() + 120
            while not self.all_read() and time.monotonic() < deadline:
                self._read(consumer, 200)
        finally:
            producer.close()
            consumer.close()
            self.done.set()

    def _read(self, consumer: KafkaConsumer, timeout_ms: int) -> None:
        for tp, msgs in consumer.poll(timeout_ms=timeout_ms).items():
            self.read.extend((tp.partition, m.value) for m in msgs)


class _AiokafkaClient(_Client):
    def run(self) -> None:
        try:
            asyncio.run(self._run())
        finally:
            self.done.set()

    async def _run(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=zone_client_id(self.zone),
            enable_idempotence=True,
            acks="all",
            request_timeout_ms=120000,
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=zone_client_id(self.zone),
            enable_auto_commit=False,
        )
        await producer.start()
        await consumer.start()
        tps = [AIOTopicPartition(self.topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)

        async def read() -> None:
            while True:
                for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                    self.read.extend((tp.partition, m.value) for m in msgs)

        async def send(i: int) -> None:
            try:
                await (await producer.send(self.topic, self.value(i), partition=i % PARTITIONS))
            except Exception as exc:  # recorded: the test fails on any
                self.errors.append(repr(exc))
            else:
                self.acked.add(self.value(i))

        reader = asyncio.create_task(read())
        try:
            sends = []
            for i in range(PER_CLIENT):
                sends.append(asyncio.create_task(send(i)))
                await asyncio.sleep(0.004)
            await asyncio.gather(*sends)
            deadline = time.monotonic() + 120
            while not self.all_read() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            reader.cancel()
            await producer.stop()
            await consumer.stop()


def test_clients_follow_a_killed_controller_main(split_fleet: SplitFleet) -> None:
    """kill -9 of the main holding the controller lease while confluent-kafka (az1),
    kafka-python (az2) and aiokafka (az3) produce and consume through their zones' proxies:
    its lease is taken at once, its partitions move, and each client goes on by itself."""
    fleet = split_fleet.fleet
    topic = f"follow-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az1", topic, PARTITIONS)
    victim = _controller(fleet)
    before = _leaders(fleet, topic, set())
    moved = sorted(p for p, (leader, _) in before.items() if leader == victim)
    assert moved, before
    clients: list[_Client] = [
        _ConfluentClient(fleet, "az1", topic, "confluent"),
        _KafkaPythonClient(fleet, "az2", topic, "kafka-python"),
        _AiokafkaClient(fleet, "az3", topic, "aiokafka"),
    ]
    for client in clients:
        client.expected = len(clients) * PER_CLIENT
        client.start()
    deadline = time.monotonic() + 60
    while any(len(c.acked) < PER_CLIENT // 4 for c in clients):
        assert time.monotonic() < deadline, [len(c.acked) for c in clients]
        time.sleep(0.02)
    next(m for m in split_fleet.mains if m.node_id == victim).kill()
    took = {p: _wait_moved(fleet, topic, p, victim, before[p][1]) for p in moved}
    print(f"\ncontroller main {victim} killed; partitions {took} s to a new leader")
    for client in clients:
        assert client.done.wait(300), f"{client.name} never finished"
    _wait_healthy_again(split_fleet, victim)
    for client in clients:
        assert not client.errors, (client.name, client.errors[:3])
        assert len(client.acked) == PER_CLIENT, (client.name, len(client.acked))
        values = [v for _, v in client.read]
        # Each client read every client's records through its own zone's proxy, once each.
        everything = set().union(*(c.acked for c in clients))
        assert everything <= set(values), (client.name, len(everything - set(values)))
        assert len(values) == len(set(values)), f"{client.name} read a record twice"
    everything = set().union(*(c.acked for c in clients))
    for zone in fleet.zones:
        got = _read_everything(fleet, zone, topic, 3 * PER_CLIENT)
        values = [v for _, _, v in got]
        gaps = _offset_gaps(got)
        assert set(values) == everything, (zone, sorted(everything - set(values))[:5], gaps)
        assert len(values) == len(set(values)), (zone, "read twice", gaps)
        for client in clients:
            for p in range(PARTITIONS):
                seqs = [
                    int(v.rsplit(b"-", 1)[1])
                    for part, _, v in got
                    if part == p and v.startswith(client.name.encode() + b"-")
                ]
                assert seqs == sorted(seqs), (zone, client.name, p)


def _read_everything(fleet: ZoneFleet, zone: str, topic: str, n: int) -> list[Any]:
    """Every partition from the start to its end, or what came within the deadline."""
    try:
        return consume_confluent(fleet.bootstrap(zone), zone, topic, PARTITIONS, n, timeout=60)
    except AssertionError:
        consumer = Consumer(
            {
                "bootstrap.servers": fleet.bootstrap(zone),
                "client.id": zone_client_id(zone),
                "group.id": f"diag-{uuid.uuid4().hex[:6]}",
            }
        )
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append((msg.partition(), msg.offset(), msg.value()))
        consumer.close()
        return out


def _offset_gaps(got: list[Any]) -> dict[int, list[int]]:
    by_partition: dict[int, list[int]] = {}
    for partition, offset, _ in got:
        by_partition.setdefault(partition, []).append(offset)
    gaps = {}
    for partition, offsets in by_partition.items():
        offsets.sort()
        missing = sorted(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))
        if missing or offsets[0] != 0:
            gaps[partition] = [offsets[0], offsets[-1], *missing[:10]]
    return gaps


def _queued_request(sock_owner: RawKafka, api_key: int, version: int, data: dict[str, Any]) -> int:
    sock_owner.correlation_id += 1
    req = build_request(api_key, version, data)
    body = encode_request(api_key, version, sock_owner.correlation_id, "paused-test", req)
    sock_owner.send_frame(body)
    return sock_owner.correlation_id


def test_a_paused_main_is_fenced_when_it_resumes(split_fleet: SplitFleet) -> None:
    """SIGSTOP of a (non-controller) main leading a partition under acks=all produce: its
    partition moves while it is stopped; a produce and a fetch sent straight to it while it is
    stopped are answered, after SIGCONT, with neither an acknowledgment nor the old data, and
    the main stops (exit 3: fenced); restarted, it lifts the fence. Nothing acknowledged is
    lost or duplicated, through every zone."""
    fleet = split_fleet.fleet
    topic = f"paused-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az1", topic, PARTITIONS)
    controller = _controller(fleet)
    before = _leaders(fleet, topic, set())
    partition, (victim, epoch) = next(
        (p, claim) for p, claim in sorted(before.items()) if claim[0] != controller
    )
    main = next(m for m in split_fleet.mains if m.node_id == victim)
    victim_cfg = next(m.broker for m in fleet.config.mains if m.broker.node_id == victim)
    producer = _ConfluentClient(fleet, "az2", topic, "paused")
    producer.start()
    deadline = time.monotonic() + 60
    while len(producer.acked) < PER_CLIENT // 4:
        assert time.monotonic() < deadline, len(producer.acked)
        time.sleep(0.02)
    assert main.proc is not None
    direct = RawKafka(f"{victim_cfg.host}:{victim_cfg.port}", timeout=60)
    main.proc.send_signal(signal.SIGSTOP)
    try:
        took = _wait_moved(fleet, topic, partition, victim, epoch)
        print(f"\nmain {victim} paused; {topic}-{partition} moved {took:.2f} s later")
        stale = b"written-to-a-paused-main"
        batch = build_batch([(None, stale)], timestamp_ms=int(time.time() * 1000))
        produce_id = _queued_request(
            direct,
            0,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": 5000,
                "topic_data": [
                    {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
                ],
            },
        )
        fetch_id = _queued_request(
            direct, 1, 12, fetch_v12(topic, {partition: 0}, partition_bytes=1 << 20)
        )
    finally:
        main.proc.send_signal(signal.SIGCONT)
    # Whatever comes back is a refusal; the connection may also just close as it stops.
    frame = direct.recv_frame()
    if frame is not None:
        cid, resp = decode_response(0, 9, frame)
        assert cid == produce_id
        (part,) = resp.responses[0].partition_responses
        assert part.error_code != 0, "a fenced main acknowledged a produce"
        frame = direct.recv_frame()
    if frame is not None:
        cid, resp = decode_response(1, 12, frame)
        assert cid == fetch_id
        (part,) = resp.responses[0].partitions
        assert part.error_code == NOT_LEADER_OR_FOLLOWER and not part.records, part
    direct.close()
    assert main.proc.wait(60) == EXIT_FENCED, main.log_tail()
    assert "was fenced by main" in main.log_path.read_text()
    assert producer.done.wait(300)
    main.launch().wait_healthy(120)
    assert "lifted the fence on WAL" in main.log_tail(200)
    assert not producer.errors, producer.errors[:3]
    assert len(producer.acked) == PER_CLIENT
    for zone in fleet.zones:
        got = consume_confluent(fleet.bootstrap(zone), zone, topic, PARTITIONS, PER_CLIENT)
        values = [v for _, _, v in got]
        assert len(values) == len(set(values)) == PER_CLIENT, zone
        assert set(values) == producer.acked and stale not in values, zone
