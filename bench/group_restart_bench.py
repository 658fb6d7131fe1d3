"""What a consumer group sees when the main that coordinates it restarts.

Starts ``zonefleet up --zones 3`` (its own data dir, a free port block; ``--zonefleet PATH`` runs
another build's console script, e.g. an old worktree's), creates a topic of ``--partitions`` (6)
and produces ``--rate`` (2,000) msg/s of ``--size`` (100) B, idempotent, acks=all, through az1's
proxy in a thread for the whole run. A group of three confluent-kafka members, one per zone
(``client.id=zone=azK``, each through its zone's proxy), ``--protocol classic`` or
``consumer`` (KIP-848, ``group.protocol=consumer``), records the arrival time of every record
and every on_assign/on_revoke/on_lost call. Members auto-commit every 5 s (librdkafka's
default; it also commits on a revocation, not on a loss).

Once the group is steady (every member holds partitions, all partitions are held, each one
delivered a record in the last second, for 6 s: every member committed once), the main that
coordinates the group is sent SIGTERM and ``up`` starts it again. ``--rounds`` (3) such
restarts; each round waits ``--window`` (30 s) and then for the group to be steady again before
the next. Per round:

- longest gap: the longest time between consecutive records received by any member, over the
  gaps that overlap [restart, restart + window] (a gap that starts before the window or runs
  past its end counts whole, so a stall longer than the window shows its real length);
- rebalance callbacks: assign, revoke and lost calls of any member from the restart until the
  next round's restart (or the end);
- records read twice: reads of a (partition, offset) already read, in that same interval;
- restart: seconds from SIGTERM until the new main process answers its admin /healthz.

At the end the producer stops and the members read on until every acknowledged record was read
(``--drain-timeout``); an acknowledged record never read is lost, and any loss exits 2. The
table (or ``--json``) gives each round and the median.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import produce_consume as pc
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from zone_bench import ZoneFleet, zone_conf

from fleet.config import load_fleet_config
from zone_router import group_coordinator

ZONES = ("az1", "az2", "az3")
STEADY_RECENT_S = 1.0  # every partition delivered a record this recently
# The group stays steady this long before a restart: longer than librdkafka's 5 s auto-commit
# interval, so every member has committed what it read in steady state.
AUTO_COMMIT_MS = 5000
STEADY_HOLD_S = AUTO_COMMIT_MS / 1000 + 1.0
STEADY_TIMEOUT_S = 120.0  # an old KIP-848 group stalls one session (45 s) after a restart

# (monotonic time, member, "assign" | "revoke" | "lost", partitions)
Callback = tuple[float, str, str, tuple[int, ...]]


def longest_gap(times: Sequence[float], start: float, end: float) -> tuple[float, float]:
    """(length, start) of the longest gap between consecutive ``times`` (ascending) among
    the gaps that overlap [start, end]. Before the first time and after the last there is no
    record to bound a gap, so ``start`` and ``end`` do (no record at all: the whole window)."""
    best = (0.0, start)
    prev = start
    for t in times:
        if t < start:
            prev = t
            continue
        if t - prev > best[0]:
            best = (t - prev, prev)
        prev = t
        if t > end:
            return best
    if end - prev > best[0]:
        best = (end - prev, prev)
    return best


def count_in(times: Iterable[float], start: float, end: float) -> int:
    return sum(1 for t in times if start <= t < end)


def repeat_reads(reads: Iterable[tuple[float, int, int]]) -> list[float]:
    """Times of the reads of a (partition, offset) read before (reads: (time, p, offset))."""
    seen: set[tuple[int, int]] = set()
    again: list[float] = []
    for t, p, offset in sorted(reads):
        if (p, offset) in seen:
            again.append(t)
        seen.add((p, offset))
    return again


def median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


class SteadyProducer(threading.Thread):
    """Produces ``rate`` msg/s until ``stop`` is set, then flushes; keeps every acked offset."""

    def __init__(self, bootstrap: str, topic: str, rate: float, size: int) -> None:
        super().__init__(name="producer", daemon=True)
        self.topic, self.rate, self.size = topic, rate, size
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": "zone=az1",
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        self.acked: set[tuple[int, int]] = set()
        self.errors = 0
        self.first_error = ""
        self.sent = 0
        self.unflushed = 0
        self.stop = threading.Event()

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        self.acked.add((msg.partition() or 0, msg.offset() or 0))

    def run(self) -> None:
        payload = os.urandom(self.size)
        start = time.perf_counter()
        while not self.stop.is_set():
            wait = start + self.sent / self.rate - time.perf_counter()
            if wait > 0:
                self.producer.poll(max(wait, 0.001))  # 1 ms resolution: never a 0 spin
                continue
            try:
                self.producer.produce(self.topic, payload, on_delivery=self._on_delivery)
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.sent += 1
            self.producer.poll(0)
        self.unflushed = self.producer.flush(60.0)


class Member(threading.Thread):
    """One group member: (arrival time, partition, offset) of every record, and its callbacks."""

    def __init__(self, zone: str, bootstrap: str, group: str, topic: str, protocol: str) -> None:
        super().__init__(name=f"member-{zone}", daemon=True)
        self.zone = zone
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "client.id": f"zone={zone}",
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": AUTO_COMMIT_MS,
            # librdkafka backs off reconnecting up to 10 s by default; a member whose coordinator
            # was down a few seconds would then add its own backoff to what the fleet costs.
            "reconnect.backoff.max.ms": 500,
        }
        if protocol == "consumer":
            conf["group.protocol"] = "consumer"
        self.consumer = Consumer(conf)
        self.reads: list[tuple[float, int, int]] = []
        self.callbacks: list[Callback] = []
        self.owned: set[int] = set()
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self.stop = threading.Event()
        self.consumer.subscribe(
            [topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
        )

    def _note(self, kind: str, parts: list[KafkaTopicPartition]) -> set[int]:
        got = {p.partition for p in parts}
        self.callbacks.append((time.monotonic(), self.zone, kind, tuple(sorted(got))))
        return got

    def _assign(self, _c: Any, parts: list[KafkaTopicPartition]) -> None:
        self.owned |= self._note("assign", parts)

    def _revoke(self, _c: Any, parts: list[KafkaTopicPartition]) -> None:
        self.owned -= self._note("revoke", parts)

    def _lost(self, _c: Any, parts: list[KafkaTopicPartition]) -> None:
        self.owned -= self._note("lost", parts)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = self.consumer.consume(num_messages=1000, timeout=0.05)
                now = time.monotonic()
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            self.errors.append(str(err))
                        continue
                    self.reads.append((now, msg.partition() or 0, msg.offset() or 0))
            self.consumer.close()
        except BaseException as exc:
            self.failure = exc


def node_pids(supervisor: int) -> dict[str, int]:
    """'main-broker 1' / 'proxy 102' -> pid of the node process `zonefleet up` runs."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{supervisor}/task").iterdir():
        with contextlib.suppress(OSError):
            for kid in map(int, (task / "children").read_text().split()):
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{kid}/cmdline").read_bytes().decode().split("\0")
                    if "fleet.cli" in argv and "--node-id" in argv:
                        role = argv[argv.index("fleet.cli") + 1]
                        out[f"{role} {argv[argv.index('--node-id') + 1]}"] = kid
    return out


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Run:
    """One fleet, one producer, one group; ``rounds`` restarts of the group's coordinator."""

    def __init__(self, args: argparse.Namespace, fleet: ZoneFleet, supervisor: int) -> None:
        self.args, self.fleet, self.supervisor = args, fleet, supervisor
        self.topic = f"restart-{uuid.uuid4().hex[:8]}"
        self.group = f"restart-{args.protocol}-{uuid.uuid4().hex[:8]}"
        mains = {m.broker.node_id: m for m in fleet.config.mains}
        self.coordinator = group_coordinator(self.group, sorted(mains))
        node = mains[self.coordinator]
        self.health_url = f"http://{node.admin_host}:{node.admin_port}/healthz"
        self.members: list[Member] = []

    def steady(self) -> bool:
        now = time.monotonic()
        held = [m.owned for m in self.members]
        if not all(held) or set().union(*held) != set(range(self.args.partitions)):
            return False
        recent: set[int] = set()
        for m in self.members:
            for t, p, _ in reversed(m.reads[-2000:]):
                if t < now - STEADY_RECENT_S:
                    break
                recent.add(p)
        return len(recent) == self.args.partitions

    def wait_steady(self) -> None:
        deadline = time.monotonic() + STEADY_TIMEOUT_S
        since: float | None = None
        while True:
            now = time.monotonic()
            if self.steady():
                since = since or now
                if now - since >= STEADY_HOLD_S:
                    return
            else:
                since = None
            for m in self.members:
                if m.failure is not None:
                    raise RuntimeError(f"member {m.zone} failed: {m.failure!r}")
            if now > deadline:
                owned = {m.zone: sorted(m.owned) for m in self.members}
                raise TimeoutError(f"group not steady after {STEADY_TIMEOUT_S:.0f} s: {owned}")
            time.sleep(0.1)

    def restart(self) -> tuple[float, float]:
        """SIGTERM the coordinator; (time sent, seconds until the new process is healthy)."""
        key = f"main-broker {self.coordinator}"
        old = node_pids(self.supervisor)[key]
        sent = time.monotonic()
        os.kill(old, signal.SIGTERM)
        wait(lambda: node_pids(self.supervisor).get(key) not in (None, old), 60, f"new {key}")
        wait(lambda: healthy(self.health_url), 60, f"{key} healthy")
        return sent, time.monotonic() - sent

    def measure(self) -> dict[str, Any]:
        args = self.args
        _, proxy = self.fleet.proxy_bootstrap("az1")
        pc.create_topic(proxy, self.topic, args.partitions, timeout=30.0, conf=zone_conf("az1"))
        producer = SteadyProducer(proxy, self.topic, args.rate, args.size)
        producer.start()
        for zone in ZONES:
            _, bootstrap = self.fleet.proxy_bootstrap(zone)
            m = Member(zone, bootstrap, self.group, self.topic, args.protocol)
            self.members.append(m)
            m.start()
        restarts: list[tuple[float, float]] = []
        try:
            self.wait_steady()
            for i in range(args.rounds):
                pc.log(f"round {i + 1}: SIGTERM main {self.coordinator} (group coordinator)")
                restarts.append(self.restart())
                time.sleep(max(0.0, restarts[-1][0] + args.window - time.monotonic()))
                self.wait_steady()
        finally:
            producer.stop.set()
            producer.join(90.0)
        ended = time.monotonic()
        self.drain(producer.acked)
        for m in self.members:
            m.stop.set()
        for m in self.members:
            m.join(30.0)
        return self.figures(producer, restarts, ended)

    def drain(self, acked: set[tuple[int, int]]) -> None:
        """Wait (up to --drain-timeout) until the members read every acked record."""
        unread = set(acked)
        done = {m.zone: 0 for m in self.members}  # reads already checked off
        deadline = time.monotonic() + self.args.drain_timeout
        while unread and time.monotonic() < deadline:
            time.sleep(0.5)
            for m in self.members:
                upto = len(m.reads)
                unread.difference_update((p, o) for _, p, o in m.reads[done[m.zone] : upto])
                done[m.zone] = upto
        if unread:
            pc.log(f"{len(unread)} acked records unread after {self.args.drain_timeout:.0f} s")

    def figures(
        self, producer: SteadyProducer, restarts: list[tuple[float, float]], ended: float
    ) -> dict[str, Any]:
        reads = sorted(r for m in self.members for r in m.reads)
        times = [t for t, _, _ in reads]
        again = repeat_reads(reads)
        callbacks = sorted(c for m in self.members for c in m.callbacks)
        rounds = []
        for i, (sent, healthy_s) in enumerate(restarts):
            until = restarts[i + 1][0] if i + 1 < len(restarts) else ended
            gap, gap_at = longest_gap(times, sent, sent + self.args.window)
            rounds.append(
                {
                    "round": i + 1,
                    "longest_gap_s": round(gap, 3),
                    "gap_starts_s": round(gap_at - sent, 3),  # relative to the SIGTERM
                    "callbacks": count_in((c[0] for c in callbacks), sent, until),
                    "read_twice": count_in(again, sent, until),
                    "restart_s": round(healthy_s, 3),
                }
            )
        read_set = {(p, o) for _, p, o in reads}
        lost = len(producer.acked - read_set)
        t0 = restarts[0][0] if restarts else ended
        return {
            "protocol": self.args.protocol,
            "zonefleet": self.args.zonefleet or "venv",
            "coordinator": self.coordinator,
            "topic": self.topic,
            "group": self.group,
            "partitions": self.args.partitions,
            "rate": self.args.rate,
            "message_bytes": self.args.size,
            "window_s": self.args.window,
            "rounds": rounds,
            "median": {
                key: median([r[key] for r in rounds])
                for key in ("longest_gap_s", "callbacks", "read_twice", "restart_s")
            },
            "acked": len(producer.acked),
            "sent": producer.sent,
            "produce_errors": producer.errors + producer.unflushed,
            "produce_first_error": producer.first_error,
            "reads": len(reads),
            "read_twice": len(again),
            "lost": lost,
            "member_errors": sorted({e for m in self.members for e in m.errors})[:10],
            "callbacks": [[round(t - t0, 3), z, k, list(p)] for t, z, k, p in callbacks],
            "ok": lost == 0,
        }


def format_table(rec: dict[str, Any]) -> str:
    head = ("round", "longest gap s", "gap starts s", "callbacks", "read twice", "restart s")
    keys = ("round", "longest_gap_s", "gap_starts_s", "callbacks", "read_twice", "restart_s")
    median_row = {**rec["median"], "round": "median", "gap_starts_s": ""}
    rows = [head, *(tuple(str(r[k]) for k in keys) for r in [*rec["rounds"], median_row])]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        f"group {rec['group']} ({rec['protocol']}), coordinator main {rec['coordinator']}, "
        f"zonefleet {rec['zonefleet']}; {rec['rate']:.0f} msg/s of {rec['message_bytes']} B "
        f"over {rec['partitions']} partitions; window {rec['window_s']:.0f} s after each SIGTERM"
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(
        f"acked {rec['acked']}, read {rec['reads']} ({rec['read_twice']} twice), "
        f"lost {rec['lost']}, produce errors {rec['produce_errors']}"
    )
    if rec["member_errors"]:
        lines.append(f"member errors: {rec['member_errors']}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add: Callable[..., Any] = parser.add_argument
    add("--protocol", choices=("classic", "consumer"), default="classic")
    add("--rounds", type=int, default=3, help="coordinator restarts")
    add("--window", type=float, default=30.0, help="seconds after each SIGTERM for the gap")
    add("--partitions", type=int, default=6)
    add("--rate", type=float, default=2000.0, help="messages/s produced through az1's proxy")
    add("--size", type=int, default=100, help="message value bytes")
    add("--drain-timeout", type=float, default=90.0, help="read every acked record, seconds")
    add("--ready-timeout", type=float, default=60.0, help="wait for zonefleet's ready line")
    add("--zonefleet", help="the zonefleet console script to run (default: this venv's)")
    add("--json", action="store_true", help="print one JSON object (table on stderr)")
    args = parser.parse_args(argv)
    if args.rounds <= 0 or args.partitions < len(ZONES) or args.rate <= 0:
        parser.error("--rounds and --rate must be positive, --partitions at least 3")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds run_zonefleet, which stops the fleet

    signal.signal(signal.SIGTERM, on_sigterm)
    command = [args.zonefleet] if args.zonefleet else None
    try:
        with tempfile.TemporaryDirectory(prefix="zonefleet-group-restart-") as tmp:
            data_dir = Path(tmp)
            procs: list[Any] = []
            with pc.run_zonefleet(
                data_dir,
                base_port=pc.free_port_range(10 * len(ZONES) + 10),
                command=command,
                ready_timeout=args.ready_timeout,
                zone_count=len(ZONES),
                on_start=procs.append,
            ) as announced:
                pc.log(f"zonefleet up --zones {len(ZONES)}: {announced}")
                fleet = ZoneFleet(load_fleet_config(data_dir / "fleet.toml", discover=None))
                record = Run(args, fleet, procs[0].pid).measure()
    except pc.TargetUnavailable as exc:
        pc.log(f"target unavailable: {exc}")
        return pc.EXIT_TARGET_UNAVAILABLE
    table = format_table(record)
    if args.json:
        print(table, file=sys.stderr, flush=True)
        print(json.dumps(record), flush=True)
    else:
        print(table, flush=True)
    if not record["ok"]:
        pc.log(f"{record['lost']} acknowledged records were never read")
    return 0 if record["ok"] else pc.EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
