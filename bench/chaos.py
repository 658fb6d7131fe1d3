"""Chaos soak (issue 14): a 3-zone fleet under idempotent acks=all load while faults land.

Starts SeaweedFS (the object store and the cluster metadata), NFS-Ganesha (the shared WAL at an
``nfs://`` URL) and the fleet of one TOML as one process per node (3 mains, 3 zone proxies, as
`tests/zone_fleet.SplitFleet`). In every zone an idempotent acks=all producer (value
``<zone>-<seq>``, partition ``seq % partitions``) and an assign() consumer talk to that zone's
proxy. A seeded scheduler injects one fault at a time: kill -9 of a main or a proxy (restarted
2-10 s later, as a supervisor would), SIGSTOP of a main or a proxy (SIGCONT 2-8 s later), a
restart of ganesha on the same port, SIGSTOP of the object store. A watcher restarts any node
that exits on its own and logs it. Then a checker reads every partition from the start through
every zone's proxy and compares with the producers' delivery reports.

Definitions (docs/reliability.md, "Chaos soak"):

- a fault's *window* runs from its injection to its *recovery*: the first moment at which every
  (zone, partition) pair has had a record acknowledged at or after the heal (the restart
  launched, SIGCONT sent, ganesha serving again);
- *produce availability outside fault windows*: of the whole seconds of load that overlap no
  fault window, the share in which every zone's producer got at least one acknowledgement;
- *lost*: acknowledged but absent, in any zone's read; *duplicate*: a value read twice;
  *out of order*: one producer's values not in increasing sequence within a partition;
  *misplaced*: read at another offset or partition than its delivery report said.

    .venv/bin/python bench/chaos.py --minutes 10 --seed 1 --faults-per-minute 3 --json out.json

Exit code 1 when a record was lost, duplicated, reordered or misplaced, or zones disagree;
2 when the data is right but a fault did not recover within --recovery-timeout.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from fleet.config import load_fleet_config
from tests.nfs_server import GANESHA, GaneshaServer, _accepting
from tests.s3_servers import SeaweedServer
from tests.zone_fleet import NodeProcess, SplitFleet, ZoneFleet, create_topic, zone_client_id

FAULT_KINDS = (
    "kill-main",
    "pause-main",
    "kill-proxy",
    "pause-proxy",
    "restart-nfs",
    "pause-store",
)


@dataclass
class ChaosOptions:
    minutes: float = 10.0
    seed: int = 1
    faults_per_minute: float = 3.0
    wal: str = "nfs"  # nfs: ganesha; local: osfs under the data dir (no restart-nfs faults)
    partitions: int = 6
    rate: int = 100  # records a second, per zone
    kinds: tuple[str, ...] = FAULT_KINDS
    plan: tuple[str, ...] = ()  # these faults in this order, then stop (the test's short soak)
    down_s: tuple[float, float] = (2.0, 10.0)  # a killed node's time before its restart
    pause_s: tuple[float, float] = (2.0, 8.0)  # SIGSTOP to SIGCONT
    registration_interval_s: float = 1.0
    session_timeout_s: float = 4.0
    upload_interval_s: float = 10.0
    recovery_timeout_s: float = 120.0
    # A main whose /healthz says "WAL failed" this long is restarted (a liveness probe); 0: never.
    wal_failed_restart_s: float = 2.0
    flush_timeout_s: float = 180.0
    data_dir: Path | None = None
    keep: bool = False


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the services behind the fleet ------------------------------------------------------------


class RestartableGanesha(GaneshaServer):
    """A GaneshaServer that can be stopped and started again on the same port and export."""

    def stop_server(self) -> None:
        self._terminate()

    def start_again(self, timeout: float = 30.0) -> None:
        binary = shutil.which(GANESHA) or ("/usr/bin/" + GANESHA)
        mark = len(self._log_bytes())
        conf = self.tmp / "ganesha.conf"
        pid = str(self.tmp / "ganesha.pid")
        args = [binary, "-F", "-f", str(conf), "-L", str(self.log_path), "-p", pid]
        deadline = time.monotonic() + timeout
        while True:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            while time.monotonic() < deadline and self._proc.poll() is None:
                if _accepting(self.port) and b"NFS SERVER INITIALIZED" in self._log_bytes()[mark:]:
                    return
                time.sleep(0.05)
            if time.monotonic() >= deadline:
                raise RuntimeError(f"ganesha did not come back:\n{self.log_tail()}")
            time.sleep(0.5)  # exited (the port still held): try again


def fleet_toml(fleet: SplitFleet, wal_url: str, store_url: str, opts: ChaosOptions) -> None:
    """Point the split fleet's TOML at the shared WAL and the object store, with the soak's
    metadata timings, and reload its config."""
    text = fleet.path.read_text()
    data_dir = fleet.fleet.config.data_dir

    def sub(old: str, new: str) -> None:
        nonlocal text
        assert text.count(old) == 1, f"the generated fleet TOML has no single {old!r}"
        text = text.replace(old, new)

    sub(f'[wal]\nurl = "osfs://{data_dir}/wal"', f'[wal]\nurl = "{wal_url}"')
    sub(
        f'[metadata]\nurl = "file://{data_dir}/metadata"',
        f'[metadata]\nurl = "{store_url}"\n'
        f"registration_interval_s = {opts.registration_interval_s}\n"
        f"session_timeout_s = {opts.session_timeout_s}\nreassign_dead_mains = true",
    )
    sub(f'object_store = "file://{data_dir}/objects"', f'object_store = "{store_url}"')
    sub("upload_interval_s = 60.0", f"upload_interval_s = {opts.upload_interval_s}")
    fleet.path.write_text(text)
    fleet.fleet = ZoneFleet(load_fleet_config(fleet.path, discover=None))


# -- the record of what happened ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


@dataclass
class FaultRecord:
    kind: str
    target: str
    injected: float
    healed: float = -1.0
    recovered: float = -1.0  # -1: not within the recovery timeout
    note: str = ""

    @property
    def recovery_s(self) -> float:
        return self.recovered - self.injected if self.recovered >= 0 else -1.0


class AckLedger:
    """Acknowledgement times per (zone, partition), for recovery and availability."""

    def __init__(self, zones: list[str], partitions: int) -> None:
        self.lock = threading.Lock()
        self.times: dict[tuple[str, int], list[float]] = {
            (z, p): [] for z in zones for p in range(partitions)
        }

    def add(self, zone: str, partition: int, t: float) -> None:
        with self.lock:
            self.times[(zone, partition)].append(t)

    def all_acked_after(self, t: float) -> float | None:
        """The moment by which every pair had an ack at or after t; None if one has not yet."""
        latest = 0.0
        with self.lock:
            for times in self.times.values():
                i = bisect.bisect_left(times, t)
                if i == len(times):
                    return None
                latest = max(latest, times[i])
        return latest


class ZoneProducer(threading.Thread):
    """Values `<zone>-<seq>` at `rate` a second, partition seq % partitions; every delivery
    report kept with its time."""

    def __init__(
        self,
        zone: str,
        bootstrap: str,
        topic: str,
        opts: ChaosOptions,
        clock: Clock,
        ledger: AckLedger,
    ) -> None:
        super().__init__(name=f"producer-{zone}", daemon=True)
        self.zone, self.bootstrap, self.topic = zone, bootstrap, topic
        self.opts, self.clock, self.ledger = opts, clock, ledger
        self.halt = threading.Event()
        self.sent = 0
        # value -> partition, offset (None when the report has none), time
        self.acked: dict[bytes, tuple[int, int | None, float]] = {}
        self.failed: list[tuple[str, str, float]] = []
        self.fatal: list[str] = []
        self.fatal_handled = 0
        self.callback_errors: list[str] = []
        self.unflushed = 0

    def _producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": zone_client_id(self.zone),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 300000,
                "error_cb": self._on_error,
                "log_level": 3,  # errors only: disconnects during faults are expected
            }
        )

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal.append(str(err))
            log(f"{self.zone} producer FATAL: {err}")

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        # An exception escaping a callback would surface later, inside librdkafka's poll.
        try:
            t = self.clock.now()
            if err is not None:
                self.failed.append((bytes(msg.value()).decode(), str(err), t))
                return
            self.acked[msg.value()] = (msg.partition(), msg.offset(), t)
            self.ledger.add(self.zone, msg.partition(), t)
        except Exception as exc:
            self.callback_errors.append(repr(exc))

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:
            self.callback_errors.append(f"producer thread: {exc!r}")
            raise

    def _run(self) -> None:
        producer = self._producer()
        start = time.monotonic()
        while not self.halt.is_set():
            if len(self.fatal) > self.fatal_handled:
                # A fatal idempotence error: counted; a new producer (a new id) carries on.
                self.fatal_handled = len(self.fatal)
                producer.flush(5)
                producer = self._producer()
            due = int((time.monotonic() - start) * self.opts.rate) - self.sent
            for _ in range(min(due, 1000)):
                seq = self.sent
                try:
                    producer.produce(
                        self.topic,
                        f"{self.zone}-{seq}".encode(),
                        partition=seq % self.opts.partitions,
                        on_delivery=self._delivered,
                    )
                except BufferError:
                    break
                self.sent += 1
            producer.poll(0.01)
        self.unflushed = producer.flush(self.opts.flush_timeout_s)


class ZoneConsumer(threading.Thread):
    """Reads every partition from the start through its zone's proxy while the faults land."""

    def __init__(self, zone: str, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name=f"consumer-{zone}", daemon=True)
        self.zone, self.bootstrap, self.topic, self.partitions = zone, bootstrap, topic, partitions
        self.halt = threading.Event()
        self.read: dict[tuple[int, int], bytes] = {}
        self.rewinds = 0
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        consumer = fresh_consumer(self.bootstrap, self.zone)
        consumer.assign(
            [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)]
        )
        last: dict[int, int] = {}
        try:
            while not self.halt.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    self.errors[error.name()] += 1
                    continue
                p, o, value = record_of(msg)
                if o <= last.get(p, -1):
                    self.rewinds += 1
                last[p] = o
                self.read[(p, o)] = value
        finally:
            consumer.close()


def record_of(msg: Message) -> tuple[int, int, bytes]:
    """Partition, offset and value of a message that carries a record."""
    p, o, value = msg.partition(), msg.offset(), msg.value()
    assert p is not None and o is not None and value is not None
    return p, o, value


def fresh_consumer(bootstrap: str, zone: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": zone_client_id(zone),
            "group.id": f"chaos-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 3,
        }
    )


# -- faults -----------------------------------------------------------------------------------


class Supervised:
    """The fleet's node processes, restarted when they exit on their own (as the fleet
    supervisor would); a node the chaos took down on purpose is left alone meanwhile."""

    def __init__(
        self,
        fleet: SplitFleet,
        clock: Clock,
        events: list[dict[str, Any]],
        wal_failed_restart_s: float,
    ) -> None:
        self.nodes: dict[str, NodeProcess] = {f"main-{n.node_id}": n for n in fleet.mains}
        self.nodes.update({f"proxy-{z}": n for z, n in fleet.proxies.items()})
        self.clock, self.events = clock, events
        self.held: set[str] = set()
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.unplanned: list[dict[str, Any]] = []
        self.wal_failed_restart_s = wal_failed_restart_s
        self.wal_failed_since: dict[str, float] = {}
        self.launched: dict[str, float] = {}
        self.wal_failed_restarts: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def _watch(self) -> None:
        while not self.halt.wait(0.2):
            with self.lock:
                for name, node in self.nodes.items():
                    proc = node.proc
                    if name in self.held or proc is None:
                        continue
                    if proc.poll() is None:
                        self._probe(name, node)
                        continue
                    if time.monotonic() - self.launched.get(name, 0.0) < 1.0:
                        continue  # crash-looping: at most one restart a second
                    exit_info = {
                        "t": round(self.clock.now(), 2),
                        "node": name,
                        "code": proc.returncode,
                        "log_tail": node.log_tail(15),
                    }
                    self.unplanned.append(exit_info)
                    event(
                        self.events,
                        self.clock,
                        f"{name} exited on its own (code {proc.returncode}): restarting",
                    )
                    node.launch()
                    self.launched[name] = time.monotonic()

    def _probe(self, name: str, node: NodeProcess) -> None:
        """A liveness probe on a main's /healthz: "WAL failed" (the main refuses writes until
        it is restarted) for `wal_failed_restart_s` gets it killed and restarted."""
        if not name.startswith("main-") or self.wal_failed_restart_s <= 0:
            return
        try:
            host, port = node.admin
            answer = httpx.get(f"http://{host}:{port}/healthz", timeout=0.5)
            failed = answer.status_code == 503 and answer.text == "WAL failed"
        except httpx.HTTPError:
            failed = False
        if not failed:
            self.wal_failed_since.pop(name, None)
            return
        since = self.wal_failed_since.setdefault(name, time.monotonic())
        if time.monotonic() - since < self.wal_failed_restart_s:
            return
        del self.wal_failed_since[name]
        self.wal_failed_restarts.append({"t": round(self.clock.now(), 2), "node": name})
        event(self.events, self.clock, f"{name}: /healthz says WAL failed: kill -9, restart")
        node.kill()
        node.launch()

    def hold(self, name: str) -> NodeProcess:
        with self.lock:
            self.held.add(name)
            return self.nodes[name]

    def release(self, name: str) -> None:
        with self.lock:
            self.held.discard(name)


def event(events: list[dict[str, Any]], clock: Clock, what: str) -> None:
    t = round(clock.now(), 2)
    events.append({"t": t, "event": what})
    log(f"t={t:7.2f} {what}")


class Faults:
    def __init__(
        self,
        opts: ChaosOptions,
        rng: random.Random,
        clock: Clock,
        events: list[dict[str, Any]],
        nodes: Supervised,
        ganesha: RestartableGanesha | None,
        store: SeaweedServer,
    ) -> None:
        self.opts, self.rng, self.clock, self.events = opts, rng, clock, events
        self.nodes, self.ganesha, self.store = nodes, ganesha, store

    def inject(self, kind: str) -> FaultRecord:
        """Inject one fault and heal it; returns with `healed` set."""
        handler: Callable[[FaultRecord], None] = getattr(self, "_" + kind.replace("-", "_"))
        if kind.endswith("main"):
            target = self.rng.choice([n for n in self.nodes.nodes if n.startswith("main-")])
        elif kind.endswith("proxy"):
            target = self.rng.choice([n for n in self.nodes.nodes if n.startswith("proxy-")])
        else:
            target = "ganesha" if kind == "restart-nfs" else "seaweedfs"
        fault = FaultRecord(kind, target, self.clock.now())
        handler(fault)
        return fault

    def _signal_node(self, fault: FaultRecord, sig: signal.Signals) -> NodeProcess:
        node = self.nodes.hold(fault.target)
        assert node.proc is not None
        fault.injected = self.clock.now()
        if sig == signal.SIGKILL:
            node.kill()
        else:
            os.kill(node.proc.pid, sig)
        return node

    def _kill(self, fault: FaultRecord) -> None:
        node = self._signal_node(fault, signal.SIGKILL)
        down = self.rng.uniform(*self.opts.down_s)
        event(
            self.events,
            self.clock,
            f"{fault.kind} {fault.target}: kill -9, restart in {down:.1f} s",
        )
        time.sleep(down)
        node.launch()
        fault.healed = self.clock.now()
        self.nodes.release(fault.target)
        event(self.events, self.clock, f"{fault.target} relaunched")
        try:
            node.wait_healthy(60.0)
            event(self.events, self.clock, f"{fault.target} healthy")
        except RuntimeError as exc:
            fault.note = f"not healthy after its restart: {str(exc)[:200]}"
            event(self.events, self.clock, f"{fault.target} {fault.note}")

    def _pause(self, fault: FaultRecord) -> None:
        node = self._signal_node(fault, signal.SIGSTOP)
        pause = self.rng.uniform(*self.opts.pause_s)
        event(self.events, self.clock, f"{fault.kind} {fault.target}: SIGSTOP for {pause:.1f} s")
        time.sleep(pause)
        assert node.proc is not None
        if node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGCONT)
        fault.healed = self.clock.now()
        self.nodes.release(fault.target)
        event(self.events, self.clock, f"{fault.target} SIGCONT")

    _kill_main = _kill_proxy = _kill
    _pause_main = _pause_proxy = _pause

    def _restart_nfs(self, fault: FaultRecord) -> None:
        assert self.ganesha is not None
        event(self.events, self.clock, "restart-nfs: stopping ganesha")
        fault.injected = self.clock.now()
        self.ganesha.stop_server()
        down = self.rng.uniform(0.5, 3.0)
        event(self.events, self.clock, f"ganesha stopped; starting it again in {down:.1f} s")
        time.sleep(down)
        self.ganesha.start_again()
        fault.healed = self.clock.now()
        event(self.events, self.clock, "ganesha serving again")

    def _pause_store(self, fault: FaultRecord) -> None:
        proc = self.store.proc
        assert proc is not None
        pause = self.rng.uniform(*self.opts.pause_s)
        fault.injected = self.clock.now()
        os.kill(proc.pid, signal.SIGSTOP)
        event(self.events, self.clock, f"pause-store: SeaweedFS SIGSTOP for {pause:.1f} s")
        time.sleep(pause)
        os.kill(proc.pid, signal.SIGCONT)
        fault.healed = self.clock.now()
        event(self.events, self.clock, "SeaweedFS SIGCONT")


# -- the check ------------------------------------------------------------------------------


def read_everything(
    bootstrap: str, zone: str, topic: str, partitions: int, at_least: dict[int, int], timeout: float
) -> tuple[dict[int, list[tuple[int, bytes]]], str]:
    """Every partition from the start with a fresh assign() consumer, up to its high watermark
    (and at least to `at_least[p]`, the end the delivery reports imply): (offset, value) lists
    per partition, and why the read stopped short ('' if it did not)."""
    consumer = fresh_consumer(bootstrap, zone)
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + timeout
    try:
        ends: dict[int, int] = {}
        for p in range(partitions):
            while p not in ends:
                try:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    ends[p] = max(high, at_least.get(p, 0))
                except Exception:
                    if time.monotonic() > deadline:
                        return out, f"no watermark for partition {p}"
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        position = dict.fromkeys(range(partitions), 0)
        while any(position[p] < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                short = {p: (position[p], ends[p]) for p in position if position[p] < ends[p]}
                return out, f"stopped short (position, end): {short}"
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            p, o, value = record_of(msg)
            out[p].append((o, value))
            position[p] = o + 1
    finally:
        consumer.close()
    return out, ""


def check_zone(
    read: dict[int, list[tuple[int, bytes]]],
    acked: dict[bytes, tuple[int, int | None, float]],
) -> dict[str, Any]:
    """One zone's read against every producer's delivery reports."""
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    gaps = out_of_order = 0
    for p, items in read.items():
        offsets = [o for o, _ in items]
        if offsets != list(range(len(offsets))):
            gaps += 1
        last_seq: dict[str, int] = {}
        for o, value in items:
            where[value].append((p, o))
            zone, _, seq_text = value.decode().rpartition("-")
            seq = int(seq_text)
            if seq <= last_seq.get(zone, -1):
                out_of_order += 1
            last_seq[zone] = seq
    duplicates = sorted(v.decode() for v, at in where.items() if len(at) > 1)
    lost = sorted(v.decode() for v in acked if v not in where)
    misplaced = sorted(
        v.decode()
        for v, (p, o, _) in acked.items()
        # A report without an offset (librdkafka's answer to a retried duplicate, whose
        # original's offset it never learnt) can only be checked for presence.
        if v in where and len(where[v]) == 1 and o is not None and where[v][0] != (p, o)
    )
    return {
        "records": sum(len(items) for items in read.values()),
        "lost": len(lost),
        "lost_examples": lost[:10],
        "duplicates": len(duplicates),
        "duplicate_examples": duplicates[:10],
        "out_of_order": out_of_order,
        "misplaced": len(misplaced),
        "misplaced_examples": misplaced[:10],
        "partitions_with_offset_gaps": gaps,
        "unacked_present": sum(1 for v in where if v not in acked),
    }


def availability(
    ledger: AckLedger,
    zones: list[str],
    start: float,
    end: float,
    windows: list[tuple[float, float]],
) -> dict[str, Any]:
    """Acks per second (all zones), and the share of whole seconds outside every fault window
    in which every zone had at least one ack."""
    seconds = int(end - start)
    per_zone = {z: [0] * seconds for z in zones}
    for (zone, _), times in ledger.times.items():
        for t in times:
            i = int(t - start)
            if 0 <= i < seconds:
                per_zone[zone][i] += 1
    in_fault = [
        any(a < start + i + 1 and start + i < b for a, b in windows) for i in range(seconds)
    ]
    outside = [i for i in range(seconds) if not in_fault[i]]
    good = [i for i in outside if all(per_zone[z][i] > 0 for z in zones)]
    return {
        "start_s": round(start, 2),
        "seconds": seconds,
        "seconds_in_fault_windows": seconds - len(outside),
        "seconds_outside": len(outside),
        "seconds_outside_with_acks_in_every_zone": len(good),
        "availability_outside_faults": round(len(good) / len(outside), 4) if outside else None,
        "acks_per_second": [sum(per_zone[z][i] for z in zones) for i in range(seconds)],
        "acks_per_second_by_zone": per_zone,
        "in_fault": in_fault,
        "bad_seconds_outside": [i for i in outside if i not in set(good)][:50],
    }


def timeline_text(av: dict[str, Any], width: int = 15) -> str:
    """Acks a second across zones, `width` a row; `*` marks a second in a fault window."""
    rows = []
    acks, in_fault = av["acks_per_second"], av["in_fault"]
    for row in range(0, len(acks), width):
        cells = [
            f"{acks[i]:4d}{'*' if in_fault[i] else ' '}"
            for i in range(row, min(row + width, len(acks)))
        ]
        rows.append(f"  {row:5d}s |" + "".join(cells))
    return "\n".join(rows)


# -- the run ----------------------------------------------------------------------------------


def run_chaos(opts: ChaosOptions) -> dict[str, Any]:
    rng = random.Random(opts.seed)
    kinds = [k for k in opts.kinds if opts.wal == "nfs" or k != "restart-nfs"]
    base = opts.data_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    log(f"data dir {base} (node logs under {base / 'fleet'})")
    clock = Clock()
    events: list[dict[str, Any]] = []
    store = SeaweedServer(base / "seaweedfs").start()
    ganesha: RestartableGanesha | None = None
    fleet: SplitFleet | None = None
    try:
        store_url = store.bucket_url("fleet")
        fleet = SplitFleet(base / "fleet")
        if opts.wal == "nfs":
            ganesha = RestartableGanesha()
            ganesha.start()
            wal_url = f"{ganesha.url}/fleet"
        else:
            wal_url = f"osfs://{base / 'fleet' / 'wal'}"
        fleet_toml(fleet, wal_url, store_url, opts)
        log(
            f"metadata timings: registration_interval_s={opts.registration_interval_s} "
            f"session_timeout_s={opts.session_timeout_s} reassign_dead_mains=true; "
            f"WAL {wal_url}; store {store.endpoint}"
        )
        fleet.start()
        report = _soak(opts, rng, kinds, clock, events, fleet, ganesha, store)
    finally:
        if fleet is not None:
            for node in [*fleet.proxies.values(), *fleet.mains]:
                if node.proc is not None and node.proc.poll() is None:
                    os.kill(node.proc.pid, signal.SIGCONT)
            fleet.close()
        if ganesha is not None:
            shutil.copy(ganesha.log_path, base / "ganesha.log")
            ganesha.stop()
        if store.proc is not None and store.proc.poll() is None:
            os.kill(store.proc.pid, signal.SIGCONT)
        store.stop()
    report["data_dir"] = str(base)
    if report["ok"] and report["all_recovered"] and not opts.keep and opts.data_dir is None:
        shutil.rmtree(base, ignore_errors=True)
        report["data_dir"] = None
    return report


def _soak(
    opts: ChaosOptions,
    rng: random.Random,
    kinds: list[str],
    clock: Clock,
    events: list[dict[str, Any]],
    fleet: SplitFleet,
    ganesha: RestartableGanesha | None,
    store: SeaweedServer,
) -> dict[str, Any]:
    zfleet = fleet.fleet
    zones = zfleet.zones
    topic = f"chaos-{uuid.uuid4().hex[:8]}"
    create_topic(zfleet, zones[0], topic, opts.partitions)
    ledger = AckLedger(zones, opts.partitions)
    producers = [ZoneProducer(z, zfleet.bootstrap(z), topic, opts, clock, ledger) for z in zones]
    consumers = [ZoneConsumer(z, zfleet.bootstrap(z), topic, opts.partitions) for z in zones]
    nodes = Supervised(fleet, clock, events, opts.wal_failed_restart_s)
    faults = Faults(opts, rng, clock, events, nodes, ganesha, store)
    for thread in [*producers, *consumers]:
        thread.start()
    nodes.thread.start()
    records: list[FaultRecord] = []
    try:
        warm_deadline = time.monotonic() + 60
        while (load_start := ledger.all_acked_after(0.0)) is None:
            if time.monotonic() > warm_deadline:
                raise RuntimeError("no acknowledgement on every (zone, partition) within 60 s")
            time.sleep(0.1)
        event(events, clock, f"load running: {opts.rate}/s per zone, topic {topic}")
        end = load_start + opts.minutes * 60
        gap = 60.0 / opts.faults_per_minute if opts.faults_per_minute > 0 else float("inf")
        next_at = clock.now() + rng.uniform(0.5, 1.0) * min(gap, 10.0)
        plan = list(opts.plan)
        while True:
            if opts.plan and not plan:
                break
            if clock.now() < next_at:
                if clock.now() >= end:
                    break
                time.sleep(min(0.2, next_at - clock.now()))
                continue
            if clock.now() >= end - 10:  # no fault in the last seconds: room to recover
                break
            kind = plan.pop(0) if opts.plan else rng.choice(kinds)
            fault = faults.inject(kind)
            records.append(fault)
            deadline = fault.healed + opts.recovery_timeout_s
            while (recovered := ledger.all_acked_after(fault.healed)) is None:
                if clock.now() > deadline:
                    break
                time.sleep(0.1)
            if recovered is not None:
                fault.recovered = recovered
                event(
                    events,
                    clock,
                    f"{kind} {fault.target}: recovered "
                    f"{fault.recovery_s:.1f} s after injection "
                    f"({recovered - fault.healed:.1f} s after the heal)",
                )
            else:
                event(
                    events,
                    clock,
                    f"{kind} {fault.target}: NOT recovered within "
                    f"{opts.recovery_timeout_s:.0f} s of the heal",
                )
            next_at = max(fault.injected + rng.uniform(0.5, 1.5) * gap, clock.now() + 2.0)
        # A few calm seconds after the last fault, so every window ends inside the load.
        calm_until = clock.now() + 5.0
        while clock.now() < max(calm_until, end if not opts.plan else 0.0):
            time.sleep(0.2)
        load_end = clock.now()
        event(events, clock, "stopping producers; flushing")
    finally:
        for p in producers:
            p.halt.set()
        for p in producers:
            p.join()
        nodes.halt.set()
        nodes.thread.join()
        for c in consumers:
            c.halt.set()
        for c in consumers:
            c.join()
    event(events, clock, "reading every partition through every zone")
    acked: dict[bytes, tuple[int, int | None, float]] = {}
    for p in producers:
        acked.update(p.acked)
    at_least: dict[int, int] = defaultdict(int)
    for part, offset, _ in acked.values():
        if offset is not None:  # see check_zone: a retried duplicate's report has none
            at_least[part] = max(at_least[part], offset + 1)
    by_zone: dict[str, Any] = {}
    reads: dict[str, dict[int, list[tuple[int, bytes]]]] = {}
    for zone in zones:
        read, short = read_everything(
            zfleet.bootstrap(zone), zone, topic, opts.partitions, at_least, 180.0
        )
        reads[zone] = read
        by_zone[zone] = check_zone(read, acked) | {"read_stopped_short": short}
    first = reads[zones[0]]
    divergent = [z for z in zones[1:] if reads[z] != first]
    live = {}
    for c in consumers:
        wrong = sum(
            1 for (p, o), v in c.read.items() if o >= len(first[p]) or first[p][o] != (o, v)
        )
        live[c.zone] = {
            "records": len(c.read),
            "rewinds": c.rewinds,
            "differs_from_final_read": wrong,
            "errors": dict(c.errors),
        }
    windows = [(f.injected, f.recovered if f.recovered >= 0 else load_end) for f in records]
    av = availability(ledger, zones, load_start, load_end, windows)
    recoveries = [f.recovery_s for f in records if f.recovered >= 0]
    ok = (
        not divergent
        and all(v["differs_from_final_read"] == 0 and v["rewinds"] == 0 for v in live.values())
        and all(
            r["lost"] == 0
            and r["duplicates"] == 0
            and r["out_of_order"] == 0
            and r["misplaced"] == 0
            and r["partitions_with_offset_gaps"] == 0
            and not r["read_stopped_short"]
            for r in by_zone.values()
        )
    )
    return {
        "ok": ok,
        "all_recovered": all(f.recovered >= 0 for f in records),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
        "topic": topic,
        "faults": [asdict(f) | {"recovery_s": round(f.recovery_s, 2)} for f in records],
        "faults_by_kind": dict(Counter(f.kind for f in records)),
        "recovery_s": {
            "median": round(statistics.median(recoveries), 2) if recoveries else None,
            "max": round(max(recoveries), 2) if recoveries else None,
        },
        "recovery_by_kind": _stats_by_kind(records, lambda f: f.recovery_s),
        "after_heal_by_kind": _stats_by_kind(records, lambda f: f.recovered - f.healed),
        "sent": sum(p.sent for p in producers),
        "acked": len(acked),
        "delivery_failures": sum(len(p.failed) for p in producers),
        "delivery_failure_examples": [f for p in producers for f in p.failed][:10],
        "producer_fatal_errors": [e for p in producers for e in p.fatal],
        "unflushed": sum(p.unflushed for p in producers),
        "callback_errors": [e for p in producers for e in p.callback_errors][:10],
        "lost": max(r["lost"] for r in by_zone.values()),
        "duplicates": max(r["duplicates"] for r in by_zone.values()),
        "out_of_order": max(r["out_of_order"] for r in by_zone.values()),
        "zones_disagreeing": divergent,
        "by_zone": by_zone,
        "live_consumers": live,
        "unplanned_exits": nodes.unplanned,
        "wal_failed_restarts": nodes.wal_failed_restarts,
        "availability": av,
        "events": events,
    }


def _stats_by_kind(
    records: list[FaultRecord], measure: Callable[[FaultRecord], float]
) -> dict[str, dict[str, float]]:
    """Median and max of `measure` over each kind's recovered faults."""
    out = {}
    for kind in sorted({f.kind for f in records}):
        values = [measure(f) for f in records if f.kind == kind and f.recovered >= 0]
        if values:
            out[kind] = {
                "median": round(statistics.median(values), 2),
                "max": round(max(values), 2),
            }
    return out


def summary_text(report: dict[str, Any]) -> str:
    av = report["availability"]
    opts = report["options"]
    lines = [
        f"chaos soak: {opts['minutes']} min, seed {opts['seed']}, WAL {opts['wal']}, metadata "
        f"registration_interval_s={opts['registration_interval_s']} "
        f"session_timeout_s={opts['session_timeout_s']}",
        f"faults: {len(report['faults'])} {report['faults_by_kind']}",
        f"recovery (injection to every zone and partition acked again): median "
        f"{report['recovery_s']['median']} s, max {report['recovery_s']['max']} s; by kind "
        f"{report['recovery_by_kind']}",
        f"from the heal (restart launched, SIGCONT, ganesha serving) to recovery, by kind: "
        f"{report['after_heal_by_kind']}",
    ]
    for f in report["faults"]:
        lines.append(
            f"  t={f['injected']:7.1f}s {f['kind']:<12} {f['target']:<10} healed "
            f"+{f['healed'] - f['injected']:5.1f}s recovered "
            + (f"+{f['recovery_s']:5.1f}s" if f["recovered"] >= 0 else "NEVER")
            + (f"  ({f['note']})" if f["note"] else "")
        )
    lines += [
        f"records: sent {report['sent']}, acked {report['acked']}, delivery failures "
        f"{report['delivery_failures']}, producer fatal errors "
        f"{len(report['producer_fatal_errors'])}",
        f"lost {report['lost']}, duplicates {report['duplicates']}, out of order "
        f"{report['out_of_order']}, zones disagreeing {report['zones_disagreeing']}",
    ]
    for zone, r in report["by_zone"].items():
        lines.append(
            f"  {zone}: read {r['records']}, lost {r['lost']}, dup {r['duplicates']}, "
            f"order {r['out_of_order']}, misplaced {r['misplaced']}, unacked present "
            f"{r['unacked_present']}"
            + (f", {r['read_stopped_short']}" if r["read_stopped_short"] else "")
        )
    lines.append(f"live consumers: {report['live_consumers']}")
    if report["unplanned_exits"]:
        lines.append(
            "nodes that exited on their own: "
            + ", ".join(
                f"{u['node']} at t={u['t']} (code {u['code']})" for u in report["unplanned_exits"]
            )
        )
    if report["wal_failed_restarts"]:
        lines.append(
            "mains restarted because /healthz said WAL failed: "
            + ", ".join(f"{u['node']} at t={u['t']}" for u in report["wal_failed_restarts"])
        )
    share = av["availability_outside_faults"]
    lines += [
        f"produce availability outside fault windows: "
        f"{av['seconds_outside_with_acks_in_every_zone']}/{av['seconds_outside']} s "
        f"= {share * 100 if share is not None else float('nan'):.2f} % "
        f"({av['seconds_in_fault_windows']} of {av['seconds']} s in fault windows)",
        "acks per second, all zones (* = in a fault window), from the start of the load:",
        timeline_text(av),
        f"verdict: {'OK' if report['ok'] else 'FAILED'}"
        + ("" if report["all_recovered"] else " (a fault did not recover)"),
    ]
    if report.get("data_dir"):
        lines.append(f"data dir kept: {report['data_dir']}")
    return "\n".join(lines)


def _range(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    return float(low), float(high or low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults-per-minute", type=float, default=3.0)
    parser.add_argument("--wal", choices=["nfs", "local"], default="nfs")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rate", type=int, default=100, help="records/s per zone")
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS))
    parser.add_argument("--plan", default="", help="comma-separated faults, run in order")
    parser.add_argument("--down", type=_range, default=(2.0, 10.0), help="kill: LOW-HIGH s")
    parser.add_argument("--pause", type=_range, default=(2.0, 8.0), help="SIGSTOP: LOW-HIGH s")
    parser.add_argument("--registration-interval", type=float, default=1.0)
    parser.add_argument("--session-timeout", type=float, default=4.0)
    parser.add_argument("--upload-interval", type=float, default=10.0)
    parser.add_argument("--recovery-timeout", type=float, default=120.0)
    parser.add_argument(
        "--wal-failed-restart",
        type=float,
        default=2.0,
        help="restart a main whose /healthz says 'WAL failed' this long (s); 0: never",
    )
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the data dir even if OK")
    parser.add_argument("--json", type=Path, help="write the whole report here")
    args = parser.parse_args(argv)
    for kind in [*args.kinds.split(","), *filter(None, args.plan.split(","))]:
        if kind not in FAULT_KINDS:
            parser.error(f"unknown fault {kind!r}; one of {', '.join(FAULT_KINDS)}")
    opts = ChaosOptions(
        minutes=args.minutes,
        seed=args.seed,
        faults_per_minute=args.faults_per_minute,
        wal=args.wal,
        partitions=args.partitions,
        rate=args.rate,
        kinds=tuple(args.kinds.split(",")),
        plan=tuple(filter(None, args.plan.split(","))),
        down_s=args.down,
        pause_s=args.pause,
        registration_interval_s=args.registration_interval,
        session_timeout_s=args.session_timeout,
        upload_interval_s=args.upload_interval,
        recovery_timeout_s=args.recovery_timeout,
        wal_failed_restart_s=args.wal_failed_restart,
        data_dir=args.data_dir,
        keep=args.keep,
    )
    report = run_chaos(opts)
    print(summary_text(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if not report["ok"]:
        return 1
    return 0 if report["all_recovered"] else 2


if __name__ == "__main__":
    sys.exit(main())
