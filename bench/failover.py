"""Failover: how long a killed main's partitions stay unavailable, through every zone.

A 3-zone fleet, one process per node, at the default timings (`tests/zone_fleet.SplitFleet`:
the TOML `zonefleet up --zones 3` writes). In every zone an idempotent acks=all producer
(confluent-kafka, through the zone's proxy) sends to every partition in turn, and a consumer
(assign, through the same proxy) reads every partition. Each round kills (-9) a random main,
then measures, for every partition it led and every zone:

- produce: the time from the kill to the first acknowledgment of a record sent after the kill;
- fetch: the time from the kill to the first read of a record sent after the kill.

The round's time is the slowest of these (every zone resumed on every moved partition). The
killed main is then restarted (as its supervisor would) before the next round. At the end
every acknowledged record is read back through one zone: exactly once, in order per producer.

    .venv/bin/python bench/failover.py --rounds 20 --seed 1 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    SplitFleet,
    ZoneFleet,
    consume_confluent,
    create_topic,
    raw_metadata,
    zone_client_id,
)

PARTITIONS = 6
RATE_PER_ZONE = 300  # records a second per zone producer, spread over the partitions
DEBUG = os.environ.get("FAILOVER_PRODUCER_DEBUG", "")  # librdkafka contexts, e.g. "eos"


def leaders(fleet: ZoneFleet, topic: str, alive: set[int]) -> dict[int, int]:
    """partition -> leading main, as the live mains claim it (the highest epoch wins)."""
    best: dict[int, tuple[int, int]] = {}
    for m in fleet.config.mains:
        main = m.broker
        if main.node_id not in alive:
            continue
        raw = RawKafka(f"{main.host}:{main.port}")
        try:
            (described,) = raw_metadata(raw, topic).topics
        except Exception:  # a main still starting: ask the others
            continue
        finally:
            raw.close()
        for p in described.partitions:
            if p.leader_id == main.node_id:
                claim = (p.leader_epoch, main.node_id)
                if claim > best.get(p.partition_index, (-1, -1)):
                    best[p.partition_index] = claim
    return {p: node for p, (_, node) in best.items()}


class ZoneClients:
    """One zone's producer and consumer threads, stamping each value with its send time."""

    def __init__(self, fleet: ZoneFleet, zone: str, topic: str) -> None:
        self.zone = zone
        self.topic = topic
        bootstrap = fleet.bootstrap(zone)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": zone_client_id(zone),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 120000,
                **({"debug": DEBUG} if DEBUG else {}),
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": zone_client_id(zone),
                "group.id": f"failover-{zone}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
        self.acked: dict[int, list[tuple[float, bytes]]] = defaultdict(list)  # when acked
        self.read: dict[int, list[float]] = defaultdict(list)  # send time of what was read,
        self.read_at: dict[int, list[float]] = defaultdict(list)  # and when
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.seq = 0
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
            return
        with self._lock:
            self.acked[msg.partition()].append((time.monotonic(), msg.value()))

    def _produce(self) -> None:
        period = 1.0 / RATE_PER_ZONE
        next_at = time.monotonic()
        while not self.stop.is_set():
            partition = self.seq % PARTITIONS
            value = f"{self.zone}|{self.seq}|{time.monotonic():.6f}".encode()
            self.producer.produce(
                self.topic, value, partition=partition, on_delivery=self._delivered
            )
            self.seq += 1
            self.producer.poll(0)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                self.producer.poll(delay)
        self.producer.flush(120)

    def _consume(self) -> None:
        while not self.stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            sent = float(msg.value().split(b"|")[2])
            with self._lock:
                self.read[msg.partition()].append(sent)
                self.read_at[msg.partition()].append(time.monotonic())
        self.consumer.close()

    def first_ack_after(self, partition: int, t0: float) -> float | None:
        with self._lock:
            for at, value in self.acked[partition]:
                if float(value.split(b"|")[2]) > t0:
                    return at
        return None

    def first_read_after(self, partition: int, t0: float) -> float | None:
        with self._lock:
            for sent, at in zip(self.read[partition], self.read_at[partition], strict=True):
                if sent > t0:
                    return at
        return None


def run(rounds: int, seed: int, data_dir: Path, resume_timeout: float) -> dict[str, Any]:
    rng = random.Random(seed)
    fleet = SplitFleet(data_dir / "fleet").start()
    results: list[dict[str, Any]] = []
    clients: list[ZoneClients] = []
    try:
        z = fleet.fleet
        topic = "failover"
        create_topic(z, "az1", topic, PARTITIONS)
        clients = [ZoneClients(z, zone, topic) for zone in z.zones]
        for c in clients:
            c.start()
        alive = {m.node_id for m in fleet.mains}
        deadline = time.monotonic() + 60
        while any(not c.read[p] for c in clients for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, "the clients never got going"
            time.sleep(0.1)
        for rnd in range(rounds):
            led = leaders(z, topic, alive)
            victim = rng.choice([m for m in fleet.mains if m.node_id in set(led.values())])
            moved = sorted(p for p, n in led.items() if n == victim.node_id)
            controller = _controller(z)
            t0 = time.monotonic()
            print(f"killing main {victim.node_id} at {time.time():.3f}", flush=True)
            victim.kill()
            produce: dict[str, float] = {}
            fetch: dict[str, float] = {}
            deadline = t0 + resume_timeout
            while time.monotonic() < deadline and (
                len(produce) < len(moved) * len(clients) or len(fetch) < len(moved) * len(clients)
            ):
                for c in clients:
                    for p in moved:
                        key = f"{c.zone}/{p}"
                        if key not in produce and (at := c.first_ack_after(p, t0)) is not None:
                            produce[key] = at - t0
                        if key not in fetch and (at := c.first_read_after(p, t0)) is not None:
                            fetch[key] = at - t0
                time.sleep(0.02)
            worst = max([*produce.values(), *fetch.values()], default=float("inf"))
            if len(produce) < len(moved) * len(clients) or len(fetch) < len(moved) * len(clients):
                worst = float("inf")
            row = {
                "round": rnd,
                "killed": victim.node_id,
                "was_controller": controller == victim.node_id,
                "partitions": moved,
                "produce_s": round(max(produce.values(), default=float("inf")), 3),
                "fetch_s": round(max(fetch.values(), default=float("inf")), 3),
                "resumed_s": round(worst, 3),
                # Which zone/partition was last, produce and fetch: where the time went.
                "slowest_produce": max(produce, key=produce.__getitem__, default=None),
                "slowest_fetch": max(fetch, key=fetch.__getitem__, default=None),
            }
            results.append(row)
            print(json.dumps(row), flush=True)
            victim.launch().wait_healthy(120)
            time.sleep(2.0)  # let the restarted main settle before the next kill
        for c in clients:
            c.stop.set()
        for c in clients:
            for t in c.threads:
                t.join(180)
        acked = {v for c in clients for rows in c.acked.values() for _, v in rows}
        got = consume_confluent(z.bootstrap("az1"), "az1", topic, PARTITIONS, len(acked), 900)
        values = [v for _, _, v in got]
        lost = len(acked - set(values))
        duplicates = len(values) - len(set(values))
        seen: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
        for partition, offset, value in got:
            seen[value].append((partition, offset))
        twice = {v.decode(): where for v, where in seen.items() if len(where) > 1}
        order_errors = _order_errors(got)
    finally:
        fleet.close()
    times = sorted(r["resumed_s"] for r in results)
    summary = {
        "rounds": rounds,
        "resumed_p50_s": statistics.median(times),
        "resumed_p99_s": times[min(len(times) - 1, int(0.99 * len(times)))],
        "resumed_max_s": times[-1],
        "produce_p50_s": statistics.median(r["produce_s"] for r in results),
        "fetch_p50_s": statistics.median(r["fetch_s"] for r in results),
        "acked": len(acked),
        "lost": lost,
        "duplicates": duplicates,
        "read_twice": dict(list(twice.items())[:10]),
        "order_errors": order_errors,
        "producer_errors": sum(len(c.failed) for c in clients),
    }
    return {"summary": summary, "rounds": results}


def _controller(fleet: ZoneFleet) -> int | None:
    import httpx

    for m in fleet.config.mains:
        try:
            status = httpx.get(f"http://{m.admin_host}:{m.admin_port}/status", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            continue
        ctl = status.get("cluster", {}).get("controller", {})
        if ctl.get("active"):
            return m.broker.node_id
    return None


def _order_errors(got: list[tuple[int, int, bytes]]) -> int:
    """Records of one producer on one partition out of their send order."""
    last: dict[tuple[int, bytes], int] = {}
    errors = 0
    for partition, _offset, value in got:
        zone, seq, _ = value.split(b"|")
        key = (partition, zone)
        if int(seq) <= last.get(key, -1):
            errors += 1
        last[key] = int(seq)
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--resume-timeout", type=float, default=90.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--data-dir", type=Path, help="keep the fleet (and its logs) here")
    args = parser.parse_args()
    if args.data_dir is not None:
        out = run(args.rounds, args.seed, args.data_dir, args.resume_timeout)
    else:
        with tempfile.TemporaryDirectory(prefix="zonefleet-failover-") as tmp:
            out = run(args.rounds, args.seed, Path(tmp), args.resume_timeout)
    print(json.dumps(out["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    s = out["summary"]
    return 1 if s["lost"] or s["duplicates"] or s["order_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
