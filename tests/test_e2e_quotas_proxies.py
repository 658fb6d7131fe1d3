"""Client quotas enforced by the zone proxies (issue 15), with confluent-kafka.

One `up --zones 3` fleet for the module. Quotas are set as an operator sets them, with
`zonefleet quotas alter` (AlterClientQuotas, relayed by a proxy to a main, stored in
`cluster/quotas.json`), and each proxy picks them up within its refresh (its /status shows
the document version in force). Then, in zone az1:

- a producer (client id `greedy`) that sends as fast as it can gets its producer_byte_rate,
  within 10 %, measured over 20 s from 5 s after its first throttle (before that it may use
  the burst of ten windows of quota that Kafka gives a new client, and what it had queued
  drains);
- a neighbour in the same zone (client id `calm`, no quota) keeps the rate it paces itself at;
- a consumer (client id `slowreader`) over its consumer_byte_rate gets that rate, within 10 %.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer

from tests.fleet_process import FleetProcess
from tests.zone_fleet import ZoneFleet, create_topic, running_up_fleet

pytestmark = pytest.mark.slow

ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))
QUOTA = 512 * 1024  # bytes per second
READ_QUOTA = 512 * 1024  # well below what one consumer reads through a proxy here
CALM_RATE = 200  # 1 KiB messages per second
VALUE = b"q" * 1024
MEASURE_S = 20.0
# From the first throttle to the start of the measured span: what the client queued and the
# socket buffers held before it heard of its throttle drains meanwhile.
SETTLE_S = 5.0
TOPIC = f"quota-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def quota_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    data_dir = tmp_path_factory.mktemp("quotas") / "fleet"
    data_dir.mkdir(parents=True)
    with running_up_fleet(data_dir) as (proc, fleet):
        create_topic(fleet, "az1", TOPIC, 2)
        yield proc, fleet


def _quotas_cli(fleet: ZoneFleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZONEFLEET, "quotas", "--bootstrap", fleet.bootstrap("az1"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _proxy_documents(fleet: ZoneFleet, zone: str) -> dict[str, int]:
    node = next(p for p in fleet.config.proxies if p.proxy.zone == zone)
    status = httpx.get(f"http://{node.admin_host}:{node.admin_port}/status", timeout=5).json()
    documents: dict[str, int] = status["documents"]
    return documents


def _wait_for_quotas_version(fleet: ZoneFleet, version: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for zone in fleet.zones:
        while _proxy_documents(fleet, zone)["quotas"] < version:
            assert time.monotonic() < deadline, f"proxy of {zone} never read quotas v{version}"
            time.sleep(0.2)


class _Acks:
    """When each acknowledged message was acknowledged, and when the client was first told
    to wait (its throttle callback)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.failed = 0
        self.first_throttle: float | None = None
        self.lock = threading.Lock()

    def delivered(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is None:
                self.times.append(time.monotonic())
            else:
                self.failed += 1

    def throttled(self, event: Any) -> None:
        if event.throttle_time > 0 and self.first_throttle is None:
            self.first_throttle = time.monotonic()

    def rate(self, start: float, span: float) -> float:
        """Value bytes per second acknowledged in [start, start + span)."""
        with self.lock:
            count = sum(1 for t in self.times if start <= t < start + span)
        return count * len(VALUE) / span


def _producer(fleet: ZoneFleet, client_id: str, acks: _Acks) -> Producer:
    return Producer(
        {
            "bootstrap.servers": fleet.bootstrap("az1"),
            "client.id": client_id,
            "batch.size": 65536,
            "linger.ms": 5,
            "queue.buffering.max.kbytes": 1024,
            "message.timeout.ms": 120000,
            "throttle_cb": acks.throttled,
        }
    )


def _run_greedy(producer: Producer, acks: _Acks, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            producer.produce(TOPIC, VALUE, on_delivery=acks.delivered)
        except BufferError:
            producer.poll(0.01)
        else:
            producer.poll(0)
    producer.flush(60)


def _run_calm(producer: Producer, acks: _Acks, stop: threading.Event) -> None:
    interval, next_send = 1 / CALM_RATE, time.monotonic()
    while not stop.is_set():
        producer.produce(TOPIC, VALUE, on_delivery=acks.delivered)
        next_send += interval
        producer.poll(max(0.0, next_send - time.monotonic()))
    producer.flush(60)


def test_quotas_are_set_and_described_with_the_cli(
    quota_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = quota_fleet
    before = _proxy_documents(fleet, "az1")["quotas"]
    added = _quotas_cli(
        fleet, "alter", "--client-id", "greedy", "--add", f"producer_byte_rate={QUOTA}"
    )
    assert added.returncode == 0, added.stderr
    read = _quotas_cli(
        fleet, "alter", "--client-id", "slowreader", "--add", f"consumer_byte_rate={READ_QUOTA}"
    )
    assert read.returncode == 0, read.stderr
    refused = _quotas_cli(fleet, "alter", "--client-id", "x", "--add", "producer_byte_rate=-1")
    assert refused.returncode == 1 and "INVALID_REQUEST" in refused.stderr.upper(), refused.stderr
    described = _quotas_cli(fleet, "describe")
    assert described.returncode == 0, described.stderr
    entries = {json.dumps(e["entity"]): e["quotas"] for e in json.loads(described.stdout)}
    assert entries == {
        '{"client-id": "greedy"}': {"producer_byte_rate": QUOTA},
        '{"client-id": "slowreader"}': {"consumer_byte_rate": READ_QUOTA},
    }
    _wait_for_quotas_version(fleet, max(before, 0) + 2)


def test_a_producer_over_its_quota_gets_it_and_its_neighbour_keeps_its_rate(
    quota_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = quota_fleet
    if _proxy_documents(fleet, "az1")["quotas"] < 2:
        test_quotas_are_set_and_described_with_the_cli(quota_fleet)
    greedy, calm = _Acks(), _Acks()
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_run_greedy, args=(_producer(fleet, "greedy", greedy), greedy, stop)
        ),
        threading.Thread(target=_run_calm, args=(_producer(fleet, "calm", calm), calm, stop)),
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        deadline = started + 60
        while greedy.first_throttle is None:
            assert time.monotonic() < deadline, "the greedy producer was never throttled"
            time.sleep(0.05)
        start = greedy.first_throttle + SETTLE_S
        while time.monotonic() < start + MEASURE_S:
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    assert greedy.failed == 0 and calm.failed == 0
    greedy_rate = greedy.rate(start, MEASURE_S)
    calm_rate = calm.rate(start, MEASURE_S)
    print(f"quota {QUOTA}: greedy {greedy_rate:.0f} B/s, calm {calm_rate:.0f} B/s")
    assert greedy_rate == pytest.approx(QUOTA, rel=0.10), (
        f"greedy got {greedy_rate / 1024:.0f} KiB/s against {QUOTA // 1024} KiB/s"
    )
    assert calm_rate >= 0.9 * CALM_RATE * len(VALUE), (
        f"calm got {calm_rate / 1024:.0f} KiB/s of the {CALM_RATE} KiB/s it paced"
    )


def test_a_consumer_over_its_quota_gets_it(quota_fleet: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = quota_fleet
    if _proxy_documents(fleet, "az1")["quotas"] < 2:
        test_quotas_are_set_and_described_with_the_cli(quota_fleet)
    # Enough to read for the burst and the measured span at the quota, and then some.
    needed = int((10 + SETTLE_S + MEASURE_S + 5) * READ_QUOTA / len(VALUE))
    producer = Producer({"bootstrap.servers": fleet.bootstrap("az1"), "linger.ms": 20})
    for _ in range(needed):
        while True:
            try:
                producer.produce(TOPIC, VALUE)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    acks = _Acks()
    consumer = Consumer(
        {
            "bootstrap.servers": fleet.bootstrap("az1"),
            "client.id": "slowreader",
            "group.id": f"slow-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 262144,
            "message.max.bytes": 262144,
            "max.partition.fetch.bytes": 131072,
            "throttle_cb": acks.throttled,
        }
    )
    consumer.subscribe([TOPIC])
    try:
        deadline = time.monotonic() + 90
        while (
            acks.first_throttle is None
            or time.monotonic() < acks.first_throttle + SETTLE_S + MEASURE_S
        ):
            assert time.monotonic() < deadline, "the consumer was never throttled"
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error() is None:
                    acks.delivered(None, msg)
    finally:
        consumer.close()
    assert acks.first_throttle is not None
    rate = acks.rate(acks.first_throttle + SETTLE_S, MEASURE_S)
    print(f"consumer quota {READ_QUOTA}: slowreader {rate:.0f} B/s")
    assert rate == pytest.approx(READ_QUOTA, rel=0.10), (
        f"slowreader got {rate / 1024:.0f} KiB/s against {READ_QUOTA // 1024} KiB/s"
    )
