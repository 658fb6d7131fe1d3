"""Idle connections and slowloris clients beside a producer (issue 14, "Limits").

Starts a lone main (``zonefleet up --config <generated TOML> --single-process``, so the broker
is one process whose RSS can be read) and, for ``--rounds`` rounds, times a confluent-kafka
producer twice: alone ("quiet"), and while ``--idle`` idle TCP connections are open and
``--slowloris`` clients each send one byte a second of a frame that never completes ("loaded");
the order alternates between rounds so that drift on a shared machine hits both alike. Prints
one JSON line per phase, then a summary line: the throughput ratio loaded/quiet per round
(target: at least 0.9), the same ratio of broker CPU seconds per 100 MB produced (what the
connections cost the broker, steadier than MB/s on a shared machine) and the broker's RSS per
connection opened (idle and slowloris).

    .venv/bin/python bench/connections_bench.py --idle 5000 --slowloris 200 --rounds 4

The helpers (opening idle connections, the slowloris thread, RSS, the producer) are shared with
tests/test_connection_resources.py. Figures: docs/reliability.md, "Idle connections and
slowloris".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))
# What a slowloris announces: a 1 MB Produce frame, of which it sends one byte a second.
SLOW_FRAME_BYTES = 1_000_000
# The start of a Produce v9 request header (api key 0, version 9, correlation id 1, client id
# "slowloris"), so that the bytes look like a real request while they trickle in.
SLOW_PREFIX = struct.pack(">ihhih", SLOW_FRAME_BYTES, 0, 9, 1, 9) + b"slowloris" + b"\x00" * 64


def raise_open_files(need: int) -> int:
    """Raises this process's soft RLIMIT_NOFILE to at least `need` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_idle(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections that never send a byte."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection((host, port), timeout=30))
    except BaseException:
        close_all(socks)
        raise
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()
    socks.clear()


@dataclass
class Slowloris:
    """`count` connections that each send one byte of `SLOW_PREFIX` (then zeros) every
    `interval` seconds from one thread, until the server closes them or `stop()`.
    `closed_by_server` counts those the server closed (EOF or reset seen)."""

    host: str
    port: int
    count: int
    interval: float = 1.0
    socks: list[socket.socket] = field(default_factory=list)
    closed_by_server: int = 0
    bytes_sent: int = 0
    opened_at: float = 0.0
    all_closed_at: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Slowloris:
        self.socks = open_idle(self.host, self.port, self.count)
        for sock in self.socks:
            sock.setblocking(False)
        self.opened_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        position = 0
        open_socks = list(self.socks)
        while open_socks and not self._stop.is_set():
            byte = SLOW_PREFIX[position : position + 1] or b"\x00"
            still_open = []
            for sock in open_socks:
                if self._server_closed(sock):
                    self.closed_by_server += 1
                    continue
                with contextlib.suppress(BlockingIOError):
                    try:
                        self.bytes_sent += sock.send(byte)
                    except OSError:
                        self.closed_by_server += 1
                        continue
                still_open.append(sock)
            open_socks = still_open
            position += 1
            self._stop.wait(self.interval)
        if not open_socks:
            self.all_closed_at = time.monotonic()

    @staticmethod
    def _server_closed(sock: socket.socket) -> bool:
        try:
            return sock.recv(1, socket.MSG_DONTWAIT) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except BlockingIOError:
            return False

    def wait_all_closed(self, timeout: float) -> bool:
        """True once the server closed every connection (the thread then ends)."""
        assert self._thread is not None
        self._thread.join(timeout)
        return self.closed_by_server == self.count

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        close_all(self.socks)


def metric(admin: tuple[str, int], name: str) -> float:
    """An unlabelled metric of a node's admin /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://{admin[0]}:{admin[1]}/metrics", timeout=120) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for_metric(
    admin: tuple[str, int], name: str, done: Callable[[float], bool], timeout: float = 60
) -> float:
    """Polls the metric until `done(value)`; raises TimeoutError with the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = metric(admin, name)
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} = {value} after {timeout} s")
        time.sleep(0.05)


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(timeout=30)


@dataclass
class Produced:
    messages: int
    delivered: int
    errors: list[str]
    seconds: float
    size: int

    @property
    def mb_s(self) -> float:
        """Decimal MB/s of values delivered."""
        return self.delivered * self.size / self.seconds / 1e6 if self.seconds else 0.0


def produce(bootstrap: str, topic: str, messages: int, size: int, timeout: float = 120) -> Produced:
    """Produce `messages` values of `size` bytes (acks=all) and wait for every delivery."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_048_576,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    errors: list[str] = []
    delivered = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            errors.append(str(err))

    value = os.urandom(size)
    started = time.perf_counter()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, value, str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(timeout)
    seconds = time.perf_counter() - started
    if remaining:
        errors.append(f"{remaining} messages not delivered within {timeout} s")
    return Produced(messages, delivered, errors, seconds, size)


def consume_count(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> int:
    """Reads partition 0 of `topic` from the start until `expected` records (or the timeout)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen = 0
        deadline = time.monotonic() + timeout
        while seen < expected and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 1.0):
                if msg.error() is None:
                    seen += 1
        return seen
    finally:
        consumer.close()


def lone_main_toml(data_dir: Path, port: int, idle_ms: int) -> Path:
    config = data_dir / "fleet.toml"
    config.write_text(
        f"""\
[fleet]
cluster_id = "connections-bench"
data_dir = "{data_dir}"

[[zones]]
name = "az1"
az_id = "use1-az1"

[wal]
url = "osfs://{data_dir / "wal"}"

[[main_brokers]]
node_id = 1
zone = "az1"
host = "127.0.0.1"
port = {port}
admin_port = {port + 1}
connections_max_idle_ms = {idle_ms}
"""
    )
    return config


def free_port_pair() -> int:
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        with contextlib.suppress(OSError), socket.socket() as b:
            b.bind(("127.0.0.1", port + 1))
            return port
    raise RuntimeError("no two free consecutive ports")


@contextlib.contextmanager
def lone_main(data_dir: Path, idle_ms: int) -> Iterator[tuple[str, int]]:
    """A lone main in one process: yields (bootstrap, pid)."""
    port = free_port_pair()
    config = lone_main_toml(data_dir, port, idle_ms)
    cmd = [ZONEFLEET, "up", "--config", str(config), "--single-process"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        bootstrap = ""
        for line in proc.stdout:
            match = re.match(r"zone=\S+ bootstrap=(\S+)", line)
            if match:
                bootstrap = match.group(1)
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError(f"zonefleet did not start (exit {proc.wait()})")
        threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
        yield bootstrap, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=5000, help="idle connections")
    parser.add_argument("--slowloris", type=int, default=200, help="slowloris connections")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--idle-ms", type=int, default=600_000, help="connections_max_idle_ms")
    args = parser.parse_args()
    raise_open_files(args.idle + args.slowloris + 1024)
    results: list[dict[str, float]] = []
    per_conn: list[float] = []
    total = args.idle + args.slowloris
    with tempfile.TemporaryDirectory(prefix="connections-bench-") as tmp:
        with lone_main(Path(tmp), args.idle_ms) as (bootstrap, pid):
            host, _, port_text = bootstrap.rpartition(":")
            port = int(port_text)
            admin = (host, port + 1)
            topic = f"conn-bench-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic)
            produce(bootstrap, topic, args.messages // 4, args.size)  # warm up
            for round_no in range(args.rounds):
                phases = ("quiet", "loaded") if round_no % 2 == 0 else ("loaded", "quiet")
                row: dict[str, float] = {}
                for phase in phases:
                    idle: list[socket.socket] = []
                    slow: Slowloris | None = None
                    if phase == "loaded":
                        before = rss_kib(pid)
                        idle = open_idle(host, port, args.idle)
                        slow = Slowloris(host, port, args.slowloris).start()
                        wait_for_metric(admin, "zonefleet_connections", lambda n: n >= total)
                        if not per_conn:  # later rounds reuse the memory the first freed
                            per_conn.append((rss_kib(pid) - before) / total)
                    try:
                        cpu_before = cpu_seconds(pid)
                        got = produce(bootstrap, topic, args.messages, args.size)
                        cpu = cpu_seconds(pid) - cpu_before
                    finally:
                        if slow is not None:
                            slow.stop()
                        close_all(idle)
                    # The broker's work for the closes (~0.3 ms of CPU each) must not land on
                    # the next phase.
                    wait_for_metric(admin, "zonefleet_connections", lambda n: n == 0, 300)
                    if got.errors:
                        print(f"errors: {got.errors[:5]}", file=sys.stderr)
                        return 1
                    row[phase] = got.mb_s
                    # Broker CPU per 100 MB of values: what the connections cost the broker,
                    # less sensitive than MB/s to other load on a shared machine.
                    row[f"{phase}_cpu_s_per_100mb"] = cpu / (got.delivered * args.size / 1e8)
                    print(json.dumps({"round": round_no, "phase": phase, "mb_s": got.mb_s}))
                row["ratio"] = row["loaded"] / row["quiet"]
                row["cpu_ratio"] = row["loaded_cpu_s_per_100mb"] / row["quiet_cpu_s_per_100mb"]
                results.append(row)
                print(json.dumps({"round": round_no, **row}), flush=True)
    ratios = [r["ratio"] for r in results]
    summary = {
        "idle": args.idle,
        "slowloris": args.slowloris,
        "messages": args.messages,
        "size": args.size,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "quiet_mb_s_median": statistics.median(r["quiet"] for r in results),
        "loaded_mb_s_median": statistics.median(r["loaded"] for r in results),
        "rss_kib_per_connection": per_conn[0],
        "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in results),
        "cpu_ratio_min": min(r["cpu_ratio"] for r in results),
        "cpu_ratio_max": max(r["cpu_ratio"] for r in results),
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
