"""A dead proxy: what a zone's clients see while their zone proxy is down, step by step.

A 3-zone fleet, one process per node (`tests/zone_fleet.SplitFleet`: the TOML `zonefleet up
--zones 3` writes, at its default timings). In az2 an idempotent acks=all producer and an
assign consumer (confluent-kafka, `client.id` zone=az2) run all along; their bootstrap lists
az2's proxy and az2's main, the zone's own brokers (what az2's Metadata lists). Each round
kills (-9) az2's proxy, waits until the zone's clients work across zones, starts the proxy
again and waits until they are back on it. Which broker each Produce went to comes from
librdkafka's own statistics (per broker request counts, every 100 ms).

The steps, each in seconds after the kill:

- `cross_zone`: the first acknowledgement of a record of a partition whose main is in
  another zone, produced straight to that main (the mains' Metadata for a zone without a
  live proxy names the real mains: the fallback);
- `restart`: the proxy is started again (`--down` seconds later), and `healthy` its /healthz
  answers;
- `local`: the first acknowledgement of such a record through az2's proxy again;
- `settled`: the last Produce sent to another zone's main;
- `fetch_cross_zone` and `fetch_local`: the consumer's first Fetch from another zone's main
  after the kill (-1: none), and through the proxy again after the restart.

At the end every acknowledged record is read back (exactly once, in order per partition) by
the consumer that ran all along and by a new one.

    .venv/bin/python bench/dead_proxy.py --rounds 5 --down 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.zone_fleet import (
    SplitFleet,
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    create_topic,
    true_leader_zones,
    zone_client_id,
)

ZONE = "az2"
PARTITIONS = 6
RATE = 200.0  # records a second
STATS_INTERVAL_MS = 100
# librdkafka's own default: how often a client that sees no error refreshes its Metadata.
METADATA_REFRESH_MS = 300_000
STEPS = (
    "cross_zone",
    "restart",
    "healthy",
    "local",
    "settled",
    "fetch_cross_zone",
    "fetch_local",
)


def zone_bootstrap(fleet: ZoneFleet, zone: str) -> str:
    """The zone's proxy, then the zone's mains: the brokers a client of the zone is shown."""
    mains = [
        f"{m.broker.host}:{m.broker.port}" for m in fleet.config.mains if m.broker.zone == zone
    ]
    return ",".join([fleet.bootstrap(zone), *mains])


def _accumulate(
    text: str, request: str, total: dict[int, int], last: dict[tuple[int, str], int]
) -> None:
    """Adds one librdkafka statistics report's `request` counts per broker node to `total`.
    librdkafka drops a broker's handle when Metadata stops listing it and makes a new one
    (counting from 0) when it comes back: each handle's increments are summed."""
    for b in json.loads(text).get("brokers", {}).values():
        node = int(b.get("nodeid", -1))
        if node < 0:
            continue
        count = int(b.get("req", {}).get(request, 0))
        key = (node, str(b.get("name", "")))
        before = last.get(key, 0)
        total[node] = total.get(node, 0) + (count - before if count >= before else count)
        last[key] = count


@dataclass
class Ack:
    at: float  # time.monotonic()
    partition: int
    offset: int | None
    value: bytes

    @property
    def index(self) -> int:
        """n of `dead-<n>`: the order the record was produced in."""
        return int(self.value.rsplit(b"-", 1)[1])


@dataclass
class Sample:
    at: float
    produce_requests: dict[int, int]  # broker node id -> Produce requests sent to it


class ZoneClients:
    """The zone's producer (`dead-<n>` at RATE a second, round-robin over the partitions)
    and a consumer reading every partition from the start; both keep going until `close`."""

    def __init__(self, fleet: ZoneFleet, topic: str, **producer_conf: Any) -> None:
        self.topic = topic
        self.bootstrap = zone_bootstrap(fleet, ZONE)
        self.acks: list[Ack] = []
        self.failed: list[tuple[bytes, str]] = []
        self.client_errors: list[str] = []
        self.samples: list[Sample] = []
        self._total: dict[int, int] = {}  # broker node id -> Produce requests so far
        self._last_count: dict[tuple[int, str], int] = {}
        # The consumer's Fetch requests per broker, the same way: (time, {node id: so far}).
        self.fetches: list[tuple[float, dict[int, int]]] = []
        self._fetch_total: dict[int, int] = {}
        self._fetch_last: dict[tuple[int, str], int] = {}
        self.records: list[tuple[int, int, bytes]] = []
        self.sent = 0
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": zone_client_id(ZONE),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "reconnect.backoff.max.ms": 500,
                "statistics.interval.ms": STATS_INTERVAL_MS,
                "stats_cb": self._stats,
                "error_cb": lambda err: self.client_errors.append(err.name()),
                "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
                **producer_conf,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": zone_client_id(ZONE),
                "group.id": f"dead-proxy-{uuid.uuid4().hex}",
                "statistics.interval.ms": STATS_INTERVAL_MS,
                "stats_cb": self._consumer_stats,
                "enable.auto.commit": False,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self.consumer.assign(
            [KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        self._threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _consumer_stats(self, text: str) -> None:
        _accumulate(text, "Fetch", self._fetch_total, self._fetch_last)
        self.fetches.append((time.monotonic(), dict(self._fetch_total)))

    def fetched_from(self, nodes: set[int], after: float) -> float | None:
        """When the consumer's statistics first showed a Fetch to `nodes` sent after `after`."""
        samples = list(self.fetches)
        before = [c for at, c in samples if at <= after]
        base = sum(before[-1].get(n, 0) for n in nodes) if before else 0
        for at, counts in samples:
            if at > after and sum(counts.get(n, 0) for n in nodes) > base:
                return at
        return None

    def _stats(self, text: str) -> None:
        _accumulate(text, "Produce", self._total, self._last_count)
        self.samples.append(Sample(time.monotonic(), dict(self._total)))

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        value = msg.value() or b""
        if err is not None:
            self.failed.append((value, err.name()))
            return
        partition = msg.partition()
        assert partition is not None
        self.acks.append(Ack(time.monotonic(), partition, msg.offset(), value))

    def _produce(self) -> None:
        start = time.monotonic()
        while not self._stop_producing.is_set():
            if self.sent < (time.monotonic() - start) * RATE:
                try:
                    self.producer.produce(
                        self.topic,
                        f"dead-{self.sent}".encode(),
                        partition=self.sent % PARTITIONS,
                        on_delivery=self._delivered,
                    )
                    self.sent += 1
                except BufferError:
                    pass
            self.producer.poll(0.002)

    def _consume(self) -> None:
        try:
            while not self._stop_consuming.is_set():
                for msg in self.consumer.consume(500, 0.1):
                    if msg.error() is not None:
                        continue  # transport errors while a broker is down
                    p, offset, value = msg.partition(), msg.offset(), msg.value()
                    assert p is not None and offset is not None and value is not None
                    self.records.append((p, offset, value))
        finally:
            self.consumer.close()

    def produced_to(self, nodes: set[int], after: float = float("-inf")) -> int:
        """Produce requests sent to `nodes`, as of the latest statistics (minus those sent by
        `after`)."""
        if not self.samples:
            return 0
        last = sum(self.samples[-1].produce_requests.get(n, 0) for n in nodes)
        return last - self.produced_by(nodes, after)

    def produced_by(self, nodes: set[int], at: float) -> int:
        """Produce requests sent to `nodes` in the last statistics taken at or before `at`."""
        before = [s for s in self.samples if s.at <= at]
        if not before:
            return 0
        return sum(before[-1].produce_requests.get(n, 0) for n in nodes)

    def first_increase(self, nodes: set[int], after: float) -> float | None:
        """When the statistics first showed a Produce request to `nodes` sent after `after`."""
        base = self.produced_by(nodes, after)
        for s in list(self.samples):
            if s.at > after and sum(s.produce_requests.get(n, 0) for n in nodes) > base:
                return s.at
        return None

    def last_increase(self, nodes: set[int]) -> float | None:
        """When the statistics last showed a new Produce request to `nodes`."""
        samples = list(self.samples)
        for prev, s in zip(reversed(samples[:-1]), reversed(samples), strict=False):
            if sum(s.produce_requests.get(n, 0) for n in nodes) > sum(
                prev.produce_requests.get(n, 0) for n in nodes
            ):
                return s.at
        return None

    def first_ack(self, partitions: set[int], after: float, sent_from: int = 0) -> float | None:
        """When the first record of `partitions` produced as `sent_from` or later was
        acknowledged after `after`."""
        for ack in list(self.acks):
            if ack.at > after and ack.partition in partitions and ack.index >= sent_from:
                return ack.at
        return None

    def finish(self, timeout: float = 60.0) -> tuple[int, list[tuple[int, int, bytes]]]:
        """Stop producing and flush, then let the consumer read every acknowledged record;
        returns (records left unflushed, what the consumer read, in the order read)."""
        self._stop_producing.set()
        self._threads[0].join(10)
        left = self.producer.flush(timeout)
        acked = {a.value for a in self.acks}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not acked <= {v for _, _, v in self.records}:
            time.sleep(0.05)
        self._stop_consuming.set()
        self._threads[1].join(10)
        return left, self.records


def wait_for(what: str, predicate: Callable[[], bool], timeout: float) -> float:
    """Until `predicate()`; returns time.monotonic() then. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic()


@dataclass
class Round:
    """Seconds after the kill of each step."""

    cross_zone: float
    restart: float
    healthy: float
    local: float
    settled: float
    fetch_cross_zone: float  # the consumer's first Fetch from another zone's main
    fetch_local: float  # the consumer's first Fetch through the proxy again
    cross_zone_requests: int  # Produce requests to other zones' mains while the proxy was down
    acked_while_down: int  # records acknowledged from the kill to the restart


def run_round(
    split: SplitFleet,
    clients: ZoneClients,
    foreign: set[int],
    down_s: float = 0.0,
    timeout: float = 120.0,
) -> Round:
    """Kill az2's proxy, wait until its clients produce across zones, restart it, wait until
    they are back on it and no Produce goes to another zone for `quiet` seconds."""
    proxy = split.proxies[ZONE]
    proxy_id = proxy.node_id
    foreign_mains = {m.broker.node_id for m in split.fleet.config.mains} - {
        m.broker.node_id for m in split.fleet.config.mains if m.broker.zone == ZONE
    }
    # Flowing through the proxy first: Produce requests to it in the last second.
    now = time.monotonic()
    wait_for(
        "produce through the proxy",
        lambda: (
            clients.produced_to({proxy_id}, now) > 0 and clients.first_ack(foreign, now) is not None
        ),
        timeout,
    )
    t_kill = time.monotonic()
    proxy.kill()
    acked_at_kill = len(clients.acks)
    # A record produced after the kill cannot have gone through the proxy.
    sent_at_kill = clients.sent
    t_cross = wait_for(
        "an acknowledgement across zones",
        lambda: (
            clients.first_ack(foreign, t_kill, sent_at_kill) is not None
            and clients.produced_to(foreign_mains, t_kill) > 0
        ),
        timeout,
    )
    t_cross = clients.first_ack(foreign, t_kill, sent_at_kill) or t_cross
    # Left down a while longer (a replacement instance takes a while to boot).
    wait_for("the proxy's downtime", lambda: time.monotonic() - t_cross >= down_s, down_s + 1)
    acked_at_restart = len(clients.acks)
    t_restart = time.monotonic()
    proxy.launch()
    proxy.wait_healthy()
    t_healthy = time.monotonic()
    cross_requests = clients.produced_to(foreign_mains, t_kill)

    def back_local() -> bool:
        seen = clients.first_increase({proxy_id}, t_restart)
        return seen is not None and clients.first_ack(foreign, seen) is not None

    wait_for("an acknowledgement through the proxy again", back_local, timeout)
    seen = clients.first_increase({proxy_id}, t_restart)
    assert seen is not None
    t_local = clients.first_ack(foreign, seen) or seen

    # Settled: a whole second of statistics with Produce requests to the proxy and none to
    # another zone's main.
    def settled() -> bool:
        last = clients.last_increase(foreign_mains)
        latest = clients.samples[-1].at if clients.samples else 0.0
        return (last is None or latest - last >= 1.0) and clients.produced_to(
            {proxy_id}, latest - 1.0
        ) > 0

    wait_for("no more Produce to another zone", settled, timeout)
    wait_for(
        "the consumer to fetch through the proxy again",
        lambda: clients.fetched_from({proxy_id}, t_restart) is not None,
        timeout,
    )
    t_fetch_local = clients.fetched_from({proxy_id}, t_restart) or t_restart
    t_fetch_cross = clients.fetched_from(foreign_mains, t_kill)
    t_settled = clients.last_increase(foreign_mains) or t_cross
    return Round(
        cross_zone=t_cross - t_kill,
        restart=t_restart - t_kill,
        healthy=t_healthy - t_kill,
        local=t_local - t_kill,
        settled=max(t_settled, t_local) - t_kill,
        fetch_cross_zone=(t_fetch_cross - t_kill) if t_fetch_cross is not None else -1.0,
        fetch_local=t_fetch_local - t_kill,
        cross_zone_requests=cross_requests,
        acked_while_down=acked_at_restart - acked_at_kill,
    )


def summary(rounds: list[Round]) -> dict[str, dict[str, float]]:
    out = {}
    for step in STEPS:
        values = [getattr(r, step) for r in rounds]
        out[step] = {
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--down",
        type=float,
        default=5.0,
        help="seconds the proxy stays down after the zone "
        "works across zones, before it is started again",
    )
    parser.add_argument("--json", type=Path, help="write every round and the summary here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dead-proxy-") as tmp:
        split = SplitFleet(Path(tmp) / "fleet").start()
        try:
            rounds, checked = measure(split, args.rounds, args.down)
        finally:
            split.close()
    table = summary(rounds)
    print(
        f"{len(rounds)} rounds, the proxy down {args.down:.0f} s more once the zone worked "
        "across zones; seconds after the kill of az2's proxy (median, min-max):"
    )
    for step, row in table.items():
        print(f"  {step:<17} {row['median']:7.2f}  ({row['min']:.2f}-{row['max']:.2f})")
    print(checked)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"rounds": [asdict(r) for r in rounds], "summary": table}, indent=2)
        )
    return 0


def measure(split: SplitFleet, rounds: int, down_s: float = 0.0) -> tuple[list[Round], str]:
    """`rounds` rounds on one topic and one pair of clients; then every acknowledged record
    read back. Returns the rounds and a line saying what was checked."""
    fleet = split.fleet
    topic = f"dead-proxy-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, ZONE, topic, PARTITIONS)
    foreign = {p for p, zone in true_leader_zones(fleet, topic).items() if zone != ZONE}
    clients = ZoneClients(fleet, topic)
    out = []
    try:
        for i in range(rounds):
            r = run_round(split, clients, foreign, down_s)
            print(f"round {i + 1}: {asdict(r)}", flush=True)
            out.append(r)
    finally:
        left, tail = clients.finish()
    return out, verify(fleet, topic, clients, left, tail)


def verify(
    fleet: ZoneFleet,
    topic: str,
    clients: ZoneClients,
    left: int,
    tail: list[tuple[int, int, bytes]],
) -> str:
    """Nothing acknowledged lost, nothing twice, in order: as read all along by the zone's
    consumer and afresh through the restarted proxy."""
    assert left == 0, f"{left} records unflushed"
    assert not clients.failed, clients.failed[:5]
    acked = {a.value for a in clients.acks}
    assert len(acked) == clients.sent, (len(acked), clients.sent)
    check_exactly_once_in_order(tail, clients.sent, "dead")
    fresh = consume_confluent(fleet.bootstrap(ZONE), ZONE, topic, PARTITIONS, len(acked))
    check_exactly_once_in_order(fresh, clients.sent, "dead")
    return (
        f"{clients.sent} records produced and acknowledged, each read exactly once and in order "
        "by the consumer that ran all along and by a new one"
    )


if __name__ == "__main__":
    sys.exit(main())
