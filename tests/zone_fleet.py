"""Start a zone fleet as a user would, for the end-to-end zone tests.

Two shapes: `zonefleet up --zones N` in one process (`start_up_fleet`), and one
`zonefleet main-broker` / `zonefleet proxy` process per node from one TOML (`SplitFleet`).
Ports are never assumed: they are read back from the fleet TOML.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

from fleet.config import FleetConfig, load_fleet_config, local_zones_fleet_toml
from main_broker.config import BrokerConfig
from shared_wal import WalConfig
from tests.fleet_process import ZONEFLEET, FleetProcess
from tests.ports import free_port, free_port_block
from tests.raw_kafka import RawKafka

ZONES = 3
# `up --zones N` uses ports up to base+10*N+4; keep a margin.
PORT_BLOCK = 10 * ZONES + 10


def zone_client_id(zone: str) -> str:
    return f"zone={zone}"


@dataclass
class ZoneFleet:
    """What a test needs of a running fleet: its config and each zone's bootstrap."""

    config: FleetConfig

    def bootstrap(self, zone: str) -> str:
        node = next(p.proxy for p in self.config.proxies if p.proxy.zone == zone)
        host, port = node.advertised
        return f"{host}:{port}"

    @property
    def zones(self) -> list[str]:
        return [p.proxy.zone for p in self.config.proxies]

    def rpc_endpoints(self) -> list[tuple[str, int]]:
        return [(m.broker.host, m.broker.rpc_port) for m in self.config.mains if m.broker.rpc_port]

    def node_ids(self, zone: str) -> set[int]:
        ids = {m.broker.node_id for m in self.config.mains if m.broker.zone == zone}
        return ids | {p.proxy.node_id for p in self.config.proxies if p.proxy.zone == zone}

    def all_node_ids(self) -> set[int]:
        return {m.broker.node_id for m in self.config.mains} | {
            p.proxy.node_id for p in self.config.proxies
        }


def write_zones_toml(
    data_dir: Path, zones: int = ZONES, wal_url: str | None = None
) -> tuple[Path, FleetConfig]:
    """The `up --zones N` fleet TOML on free ports, optionally with another shared WAL URL."""
    data_dir.mkdir(parents=True, exist_ok=True)
    text = local_zones_fleet_toml(
        data_dir, free_port_block(PORT_BLOCK), zones, secrets.token_hex(32)
    )
    if wal_url is not None:
        text, count = re.subn(r'(?m)^\[wal\]\nurl = ".*"$', f'[wal]\nurl = "{wal_url}"', text)
        assert count == 1, "the generated fleet TOML has no [wal] url line"
    path = data_dir / "fleet.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path, load_fleet_config(path, discover=None)


def start_up_fleet(data_dir: Path, config: Path | None = None) -> tuple[FleetProcess, ZoneFleet]:
    """`zonefleet up --zones 3` (or `up --config F`) as a subprocess; stop the FleetProcess."""
    if config is None:
        extra = ["--zones", str(ZONES)]
        proc = FleetProcess(data_dir, free_port_block(PORT_BLOCK), extra)
    else:
        proc = FleetProcess(data_dir, None, ["--config", str(config)])
    proc.start()
    try:
        fleet = ZoneFleet(load_fleet_config(config or data_dir / "fleet.toml", discover=None))
        for zone in fleet.zones:
            assert proc.zones[zone] == fleet.bootstrap(zone), proc.output
    except BaseException:
        proc.kill()
        raise
    return proc, fleet


@contextlib.contextmanager
def running_up_fleet(
    data_dir: Path, config: Path | None = None
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    """`start_up_fleet`, stopped on exit; a stop that is not clean fails the test."""
    proc, fleet = start_up_fleet(data_dir, config)
    try:
        yield proc, fleet
    finally:
        code = proc.stop()
        assert code == 0, "zonefleet up did not stop cleanly:\n" + "".join(proc.output[-40:])


def _healthy(host: str, port: int) -> bool:
    try:
        return httpx.get(f"http://{host}:{port}/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


class NodeProcess:
    """One `zonefleet main-broker` or `zonefleet proxy` process; its output goes to a file."""

    def __init__(self, role: str, config: Path, node_id: int, admin: tuple[str, int]) -> None:
        self.role = role
        self.config = config
        self.node_id = node_id
        self.admin = admin
        self.log_path = config.parent / f"{role}-{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> NodeProcess:
        cmd = [ZONEFLEET, self.role, "--config", str(self.config), "--node-id", str(self.node_id)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return self

    def wait_healthy(self, timeout: float = 60.0) -> NodeProcess:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.role} {self.node_id} exited:\n{self.log_tail()}")
            if _healthy(*self.admin):
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.role} {self.node_id} did not become healthy:\n{self.log_tail()}")

    def start(self, timeout: float = 60.0) -> NodeProcess:
        """Start and wait until its admin /healthz says ok."""
        return self.launch().wait_healthy(timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class SplitFleet:
    """Every node of one fleet TOML as its own process; `close` stops them all."""

    def __init__(self, data_dir: Path) -> None:
        self.path, config = write_zones_toml(data_dir)
        self.fleet = ZoneFleet(config)
        self.mains = [
            NodeProcess("main-broker", self.path, m.broker.node_id, (m.admin_host, m.admin_port))
            for m in config.mains
        ]
        self.proxies = {
            p.proxy.zone: NodeProcess(
                "proxy", self.path, p.proxy.node_id, (p.admin_host, p.admin_port)
            )
            for p in config.proxies
        }

    def start(self) -> SplitFleet:
        try:
            # Mains first: proxies sync from them as they start.
            for group in (self.mains, list(self.proxies.values())):
                for node in group:
                    node.launch()
                for node in group:
                    node.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for node in [*self.proxies.values(), *self.mains]:
            node.stop()


# -- clients, one set per zone ----------------------------------------------------------------

Record = tuple[int, int, bytes]  # partition, offset, value


def object_main_config(wal_dir: Path, url: str, wal: WalConfig, **settings: Any) -> BrokerConfig:
    """Main 1 of zone az1 alone, with its cluster metadata and objects in the store at `url`;
    `settings` are the test's upload, retention or compaction settings."""
    return BrokerConfig(
        node_id=1,
        zone="az1",
        wal_url=f"osfs://{wal_dir}",
        # A clustered main names itself in metadata by its configured port.
        port=free_port(),
        metadata_url=url,
        metadata_poll_s=0.2,
        object_store_url=url,
        wal=wal,
        **settings,
    )


def raw_metadata(raw: RawKafka, topic: str) -> Any:
    """Metadata v9 for one topic on this one connection."""
    return raw.request(
        3,
        9,
        {
            "topics": [{"name": topic}],
            "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False,
        },
    )


def true_leader_zones(fleet: ZoneFleet, topic: str) -> dict[int, str]:
    """Partition -> zone of the main that really leads it. A main shows a client its own
    zone's view, in which it appears as the leader of exactly the partitions it leads."""
    out: dict[int, str] = {}
    for m in fleet.config.mains:
        main = m.broker
        raw = RawKafka(f"{main.host}:{main.port}")
        try:
            (described,) = raw_metadata(raw, topic).topics
        finally:
            raw.close()
        for p in described.partitions:
            if p.leader_id == main.node_id:
                out[p.partition_index] = main.zone
    return out


def unique_name(prefix: str) -> str:
    """A topic or group name no other test of the same fleet uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def confluent_admin(fleet: ZoneFleet, zone: str, **extra: Any) -> AdminClient:
    """A confluent-kafka AdminClient of `zone`, bootstrapped from its proxy."""
    config = {"bootstrap.servers": fleet.bootstrap(zone), "client.id": zone_client_id(zone)}
    return AdminClient({**config, **extra})


_KEPT_ADMINS: dict[tuple[Path, str], AdminClient] = {}


def kept_admin(fleet: ZoneFleet, zone: str = "az1") -> AdminClient:
    """`confluent_admin`, one per fleet and zone, kept for the session: a client that is
    collected never resolves its futures."""
    key = (fleet.config.data_dir, zone)
    if key not in _KEPT_ADMINS:
        _KEPT_ADMINS[key] = confluent_admin(fleet, zone)
    return _KEPT_ADMINS[key]


def create_topic(fleet: ZoneFleet, zone: str, topic: str, partitions: int) -> None:
    admin = confluent_admin(fleet, zone)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def confluent_record(msg: Message) -> Record | None:
    """The record of a polled message; None for a partition EOF; any other error fails."""
    error = msg.error()
    if error is not None:
        assert error.code() == KafkaError._PARTITION_EOF, error
        return None
    partition, offset, value = msg.partition(), msg.offset(), msg.value()
    assert partition is not None and offset is not None and value is not None
    return partition, offset, value


def check_exactly_once_in_order(records: list[Record], n: int, prefix: str) -> None:
    """Values `prefix-0..n-1` each exactly once; per partition, offsets dense and the
    producer's sequence increasing."""
    values = [v for _, _, v in records]
    counts = Counter(values)
    dups = [v for v, c in counts.items() if c > 1]
    assert not dups, f"{len(dups)} records seen more than once, e.g. {dups[:3]}"
    assert set(values) == {f"{prefix}-{i}".encode() for i in range(n)}, (
        f"expected {n} records, got {len(values)}"
    )
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for partition, offset, value in records:
        by_partition[partition].append((offset, int(value.rsplit(b"-", 1)[1])))
    for partition, items in by_partition.items():
        offsets = [o for o, _ in items]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
            f"partition {partition}: offsets not dense and increasing"
        )
        seqs = [s for _, s in items]
        assert seqs == sorted(seqs), f"partition {partition}: records reordered"


def produce_confluent(
    bootstrap: str, zone: str, topic: str, n: int, prefix: str, start: int = 0, **extra: Any
) -> None:
    """Values `prefix-start..start+n-1`, idempotent and acks=all; `extra` sets the producer."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": zone_client_id(zone),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            **extra,
        }
    )
    errors: list[object] = []
    for i in range(start, start + n):
        producer.produce(
            topic,
            f"{prefix}-{i}".encode(),
            str(i % 101).encode(),
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []


def produce_markers(bootstrap: str, zone: str, topic: str, partitions: int) -> set[bytes]:
    """One record `marker-<p>` at the end of each partition p (idempotent, acks=all); returns
    the values. Makes "nothing more arrives" observable: a consumer reads a partition in offset
    order, so once it read the marker, a duplicate of an earlier record (a rewind) would have
    come before it."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": zone_client_id(zone),
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    errors: list[object] = []
    for p in range(partitions):
        producer.produce(
            topic,
            f"marker-{p}".encode(),
            partition=p,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert errors == []
    return {f"marker-{p}".encode() for p in range(partitions)}


def is_marker(value: bytes) -> bool:
    return value.startswith(b"marker-")


def consume_confluent(
    bootstrap: str,
    zone: str,
    topic: str,
    partitions: int,
    n: int,
    timeout: float = 30.0,
    isolation: str = "read_uncommitted",
) -> list[Record]:
    """Read every partition from the beginning until `n` records and EOF on all of them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": zone_client_id(zone),
            "group.id": f"assign-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[Record] = []
    at_eof = dict.fromkeys(range(partitions), False)
    deadline = time.monotonic() + timeout
    try:
        while not (len(out) >= n and all(at_eof.values())):
            assert time.monotonic() < deadline, f"{zone}: {len(out)} of {n} records"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            record = confluent_record(msg)
            if record is None:
                at_eof[msg.partition() or 0] = True
                continue
            at_eof[record[0]] = False
            out.append(record)
    finally:
        consumer.close()
    return out


def consume_partition(
    bootstrap: str, topic: str, offset: int, expect: int, client_id: str = ""
) -> list[tuple[int, bytes]]:
    """Partition 0 of `topic` from `offset` (OFFSET_BEGINNING: the log start, by ListOffsets)
    until EOF with at least `expect` records, or 30 s: (offset, value) pairs."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, offset)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF and len(out) >= expect:
                break
            continue
        at, value = msg.offset(), msg.value()
        assert at is not None and value is not None
        out.append((at, value))
    consumer.close()
    return out


def produce_kafka_python(bootstrap: str, zone: str, topic: str, n: int, prefix: str) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=zone_client_id(zone),
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
    )
    try:
        futures = [
            producer.send(topic, key=str(i % 101).encode(), value=f"{prefix}-{i}".encode())
            for i in range(n)
        ]
        producer.flush(30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close()


def consume_kafka_python(
    bootstrap: str, zone: str, topic: str, partitions: int, timeout: float = 30.0
) -> list[Record]:
    """Read every partition from the beginning up to its end offset (ListOffsets)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, client_id=zone_client_id(zone), enable_auto_commit=False
    )
    tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    out: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{zone}: stuck at {len(out)} records"
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                out.extend((tp.partition, m.offset, m.value) for m in msgs)
    finally:
        consumer.close()
    return out


async def _aiokafka_round_trip(
    fleet: ZoneFleet, producer_zone: str, topic: str, partitions: int, n: int, prefix: str
) -> dict[str, list[Record]]:
    producer = AIOKafkaProducer(
        bootstrap_servers=fleet.bootstrap(producer_zone),
        client_id=zone_client_id(producer_zone),
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=str(i % 101).encode(), value=f"{prefix}-{i}".encode())
            for i in range(n)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()

    async def consume(zone: str) -> list[Record]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=fleet.bootstrap(zone),
            client_id=zone_client_id(zone),
            enable_auto_commit=False,
        )
        tps = [AIOTopicPartition(topic, p) for p in range(partitions)]
        out: list[Record] = []
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)

            async def behind() -> bool:
                return any([await consumer.position(tp) < ends[tp] for tp in tps])

            async with asyncio.timeout(30):
                while await behind():
                    batch = await consumer.getmany(timeout_ms=200)
                    for tp, msgs in batch.items():
                        out.extend((tp.partition, m.offset, m.value) for m in msgs)
        finally:
            await consumer.stop()
        return out

    results = await asyncio.gather(*(consume(zone) for zone in fleet.zones))
    return dict(zip(fleet.zones, results, strict=True))


def aiokafka_round_trip(
    fleet: ZoneFleet, producer_zone: str, topic: str, partitions: int, n: int, prefix: str
) -> dict[str, list[Record]]:
    """Produce from one zone, then read everything from every zone, all with aiokafka."""
    return asyncio.run(_aiokafka_round_trip(fleet, producer_zone, topic, partitions, n, prefix))


def produce_many_batches(
    bootstrap: str, zone: str, topic: str, prefix: str, start: int, count: int
) -> None:
    """Values `prefix-start..start+count-1`, idempotent and acks=all, ten records a batch: many
    batches, so the mains' WALs span many segments."""
    settings = {"linger.ms": 2, "batch.num.messages": 10}
    produce_confluent(bootstrap, zone, topic, count, prefix, start, **settings)
