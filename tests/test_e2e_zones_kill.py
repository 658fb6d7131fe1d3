"""Kill -9 of a zone proxy during acks=all produce (issue 3, item 6).

Every node runs as its own `zonefleet main-broker` / `zonefleet proxy` process from one TOML.
An idempotent producer and a consumer in az2 keep going while az2's proxy is SIGKILLed and
restarted on the same port: no acknowledged record may be lost, idempotence means none may
be duplicated either, and both clients carry on through the restarted proxy.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.zone_fleet import (
    Record,
    SplitFleet,
    check_exactly_once_in_order,
    confluent_record,
    consume_confluent,
    create_topic,
    true_leader_zones,
    zone_client_id,
)

PARTITIONS = 3
ZONE = "az2"


@pytest.fixture
def split_fleet(tmp_path: Path) -> Iterator[SplitFleet]:
    fleet = SplitFleet(tmp_path / "fleet").start()
    try:
        yield fleet
    finally:
        fleet.close()


class _Producer(threading.Thread):
    """Produces `kill-<i>` until stopped; remembers which ones were acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.acked: set[bytes] = set()
        self.errors: list[str] = []
        self.sent = 0
        self.stop = threading.Event()
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": zone_client_id(ZONE),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 60000,
                "reconnect.backoff.max.ms": 500,
            }
        )

    def _delivered(self, err: KafkaError | None, msg: object) -> None:
        if err is None:
            self.acked.add(msg.value())  # type: ignore[attr-defined]
        else:
            self.errors.append(str(err))

    def run(self) -> None:
        while not self.stop.is_set():
            value = f"kill-{self.sent}".encode()
            self.producer.produce(
                self.topic, value, str(self.sent).encode(), on_delivery=self._delivered
            )
            self.sent += 1
            self.producer.poll(0.001)

    def finish(self) -> int:
        self.stop.set()
        self.join(10)
        return self.producer.flush(60)


class _Tail(threading.Thread):
    """A consumer in the same zone that reads all along, through the kill and the restart."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.records: list[Record] = []
        self.stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": zone_client_id(ZONE),
                "group.id": f"tail-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None or msg.error():
                    continue  # e.g. transport errors while its proxy is down
                record = confluent_record(msg)
                assert record is not None
                self.records.append(record)
        finally:
            self.consumer.close()


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_kill_9_of_a_proxy_loses_no_acknowledged_record(split_fleet: SplitFleet) -> None:
    fleet = split_fleet.fleet
    topic = f"kill-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, ZONE, topic, PARTITIONS)
    # Partitions led by mains outside az2 are produced through az2's proxy (those led by
    # az2's own main, once there is one, go straight to it).
    via_proxy = {p for p, zone in true_leader_zones(fleet, topic).items() if zone != ZONE}
    assert via_proxy, "no partition goes through the proxy"
    producer = _Producer(fleet.bootstrap(ZONE), topic)
    tail = _Tail(fleet.bootstrap(ZONE), topic)
    proxy = split_fleet.proxies[ZONE]
    producer.start()
    tail.start()
    try:
        _wait(lambda: len(producer.acked) >= 1000, 30, "acks before the kill")
        proxy.kill()
        acked_at_kill, sent_at_kill = len(producer.acked), producer.sent
        time.sleep(0.5)  # the producer keeps queueing while its proxy is gone
        proxy.start()
        acked_at_restart = len(producer.acked)
        _wait(lambda: len(producer.acked) >= acked_at_restart + 1000, 30, "acks after restart")
        assert producer.sent > sent_at_kill
        print(
            f"killed the {ZONE} proxy after {acked_at_kill} acks ({sent_at_kill} sent); "
            f"{acked_at_restart} acked when it was back; {producer.sent} sent in all"
        )
    finally:
        unflushed = producer.finish()
    assert unflushed == 0
    assert producer.errors == [], producer.errors[:5]
    assert len(producer.acked) > acked_at_kill
    acked = producer.acked
    assert len(acked) == producer.sent  # idempotent, nothing failed: every record acked once

    try:
        _wait(lambda: len(tail.records) >= len(acked), 30, "the az2 consumer to catch up")
        time.sleep(0.3)  # a duplicate would arrive now
    finally:
        tail.stop.set()
        tail.join(10)
    check_exactly_once_in_order(tail.records, producer.sent, "kill")

    # Read afresh through the restarted proxy and through another zone.
    for zone in (ZONE, "az1"):
        records = consume_confluent(fleet.bootstrap(zone), zone, topic, PARTITIONS, len(acked))
        values = Counter(v for _, _, v in records)
        assert acked <= set(values), f"{zone}: lost {len(acked - set(values))} acked records"
        assert max(values.values()) == 1, f"{zone}: duplicates with an idempotent producer"
        check_exactly_once_in_order(records, producer.sent, "kill")
