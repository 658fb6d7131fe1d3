"""Produce/consume benchmark with confluent-kafka; prints one JSON line per run.

Targets: ``--bootstrap host:port`` (any Kafka-compatible broker), or a broker this script starts
itself: zonefleet (``zonefleet up``, the default) or tansu (``--broker tansu``). ``--compare``
runs the same workload against zonefleet and a tansu peer and adds a line of ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from tansu import TansuUnavailable, run_tansu

MB = 1_000_000  # MB/s figures are decimal megabytes of message values.
EXIT_MISMATCH = 2
EXIT_TARGET_UNAVAILABLE = 3

PRESETS: dict[str, dict[str, Any]] = {
    "throughput": {
        "messages": 200_000,
        "size": 1024,
        "acks": "all",
        "linger_ms": 5,
        "batch_size": 1_048_576,
        "rate": 0,
    },
    # Paced at 1,000 msg/s for 10 s, so each latency sample sees an idle-ish broker.
    "latency": {
        "messages": 10_000,
        "size": 1024,
        "acks": "all",
        "linger_ms": 0,
        "batch_size": 1_048_576,
        "rate": 1000,
    },
}
COMPARED_METRICS = (
    "produce_mb_s",
    "produce_msgs_s",
    "produce_p50_ms",
    "produce_p99_ms",
    "produce_p999_ms",
    "consume_mb_s",
)
_ZONE_LINE = re.compile(r"\bzone=(?P<zone>\S+).*?\bbootstrap=(?P<bootstrap>[\w.\-\[\]:]+:\d+)")
_READY_LINE = re.compile(r"^\s*ready\b", re.IGNORECASE)


class TargetUnavailable(RuntimeError):
    """The broker under test could not be started."""


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return float("nan")
    rank = (len(sorted_values) - 1) * q / 100.0
    lo = int(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int,
    timeout: float,
    conf: dict[str, Any] | None = None,
) -> None:
    """Create the topic (an existing one is fine) and wait until metadata shows its leaders."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(conf or {})})
    future = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
        request_timeout=timeout,
    )[topic]
    try:
        future.result(timeout=timeout)
    except Exception as exc:
        error = exc.args[0] if exc.args else None
        if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
        info = meta.topics.get(topic)
        if info is not None and info.error is None and info.partitions:
            if all(p.leader >= 0 for p in info.partitions.values()):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} has no leaders after {timeout:.0f} s")
        time.sleep(0.1)


class _ProduceStats:
    """Delivery-callback state: latencies and the acked offset range per partition."""

    def __init__(self) -> None:
        self.latencies = array("d")
        self.acked = 0
        self.acked_bytes = 0
        self.errors = 0
        self.first_error = ""
        self.last_ack = 0.0
        self.elapsed = 0.0
        self.offsets: dict[int, tuple[int, int]] = {}
        self.unknown_offsets = 0

    def on_delivery(self, sent_at: float, err: KafkaError | None, msg: Message) -> None:
        now = time.perf_counter()
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        self.latencies.append(now - sent_at)
        self.acked += 1
        self.acked_bytes += len(msg.value() or b"")
        self.last_ack = now
        partition, offset = msg.partition(), msg.offset()
        if partition is None or offset is None or offset < 0:
            self.unknown_offsets += 1  # acks=0 reports no offset
            return
        lo, hi = self.offsets.get(partition, (offset, offset))
        self.offsets[partition] = (min(lo, offset), max(hi, offset))


def produce_phase(
    bootstrap: str,
    topic: str,
    args: argparse.Namespace,
    *,
    partitions: Sequence[int] | None = None,
    conf_overrides: dict[str, Any] | None = None,
    value_of: Callable[[bytes], bytes] | None = None,
) -> _ProduceStats:
    """Produce ``args.messages`` values to ``topic``, paced at ``args.rate`` if set.

    ``partitions``: round-robin over these (default: the client's partitioner);
    ``conf_overrides``: extra producer settings (e.g. ``client.id``); ``value_of``: maps each
    payload to the value sent, at send time (e.g. to stamp it with the send time).
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": args.acks,
        "linger.ms": args.linger_ms,
        "batch.size": args.batch_size,
        "compression.type": args.compression,
        "enable.idempotence": args.idempotence,
        "queue.buffering.max.messages": 1_000_000,
        # A batch must fit in one request; librdkafka rejects batch.size > message.max.bytes.
        "message.max.bytes": max(1_000_000, args.batch_size + 65_536),
        **(conf_overrides or {}),
    }
    producer = Producer(conf)
    stats = _ProduceStats()
    # Distinct random payloads so compression and dedup cannot flatter either broker.
    payloads = [os.urandom(args.size) for _ in range(64)]
    deadline = time.monotonic() + args.timeout
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    start = time.perf_counter()
    sent = 0
    while sent < args.messages and time.monotonic() < deadline:
        if interval:
            wait = start + sent * interval - time.perf_counter()
            if wait > 0:
                # Serves callbacks promptly while pacing; poll() has 1 ms resolution, so a
                # shorter wait would round to 0 and spin a core the broker may need.
                producer.poll(max(wait, 0.001))
                continue
        value = payloads[sent & 63]
        if value_of is not None:
            value = value_of(value)
        # -1: librdkafka's partitioner picks (RD_KAFKA_PARTITION_UA).
        partition = partitions[sent % len(partitions)] if partitions else -1
        now = time.perf_counter()
        try:
            producer.produce(
                topic,
                value,
                partition=partition,
                on_delivery=functools.partial(stats.on_delivery, now),
            )
        except BufferError:
            producer.poll(0.05)
            continue
        sent += 1
        producer.poll(0)
    remaining = producer.flush(max(0.0, deadline - time.monotonic()))
    stats.errors += remaining + (args.messages - sent)
    if remaining or sent < args.messages:
        log(f"produce timed out: {args.messages - sent} unsent, {remaining} undelivered")
    stats.elapsed = (stats.last_ack or time.perf_counter()) - start
    return stats


def consume_phase(
    bootstrap: str,
    topic: str,
    expected: dict[int, tuple[int, int]] | None,
    expected_count: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Read the topic from the beginning until every acked offset range has been seen.

    ``expected`` maps partition to its (first, last) acked offset; without it (acks=0) every
    message counts and reading stops after ``expected_count``.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    created_at = time.perf_counter()
    assigned_at: list[float] = []
    if args.consumer_mode == "subscribe":

        def on_assign(c: Consumer, parts: list[KafkaTopicPartition]) -> None:
            assigned_at.append(time.perf_counter())

        consumer.subscribe([topic], on_assign=on_assign)
    else:
        meta = consumer.list_topics(topic, timeout=10)
        parts = sorted(meta.topics[topic].partitions)
        assigned_at.append(time.perf_counter())
        consumer.assign([KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    pending = dict(expected or {})  # partitions whose last acked offset is not yet read
    consumed = consumed_bytes = errors = 0
    first_error = ""
    last_msg = 0.0
    deadline = time.monotonic() + args.timeout
    try:
        while (pending if expected is not None else consumed < expected_count) and (
            time.monotonic() < deadline
        ):
            # consume(n, t) blocks until n messages or t elapse, which would add up to t to the
            # last message's timestamp; so drain what is queued, and block only when idle.
            batch = consumer.consume(num_messages=10_000, timeout=0)
            if not batch:
                batch = consumer.consume(num_messages=1, timeout=0.5)
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        errors += 1
                        first_error = first_error or str(err)
                    continue
                partition, offset = msg.partition() or 0, msg.offset() or 0
                if expected is not None:
                    span = expected.get(partition)
                    if span is None or not span[0] <= offset <= span[1]:
                        continue  # not from this run (a reused --topic)
                    if offset == span[1]:
                        pending.pop(partition, None)
                consumed += 1
                consumed_bytes += len(msg.value() or b"")
                last_msg = time.perf_counter()
    finally:
        consumer.close()
    if pending:
        log(f"consume timed out; partitions not read to the end: {sorted(pending)}")
    elapsed = last_msg - assigned_at[0] if assigned_at and last_msg else 0.0
    return {
        "consumed": consumed,
        "consumed_bytes": consumed_bytes,
        "consume_errors": errors,
        "consume_first_error": first_error,
        "consume_elapsed_s": round(elapsed, 4),
        # Time to get partitions: group join with --consumer-mode subscribe, ~0 with assign.
        "consume_assign_wait_s": round(assigned_at[0] - created_at, 4) if assigned_at else None,
        "consume_mb_s": round(consumed_bytes / MB / elapsed, 3) if elapsed > 0 else 0.0,
    }


def run_benchmark(bootstrap: str, target: str, args: argparse.Namespace) -> dict[str, Any]:
    """One produce phase then one consume phase against ``bootstrap``; returns the JSON record."""
    topic = args.topic or f"bench-{args.workload}-{uuid.uuid4().hex[:10]}"
    log(f"{target}: {args.workload} x{args.messages} ({args.size} B) on {bootstrap} topic {topic}")
    create_topic(bootstrap, topic, args.partitions, timeout=30.0)
    stats = produce_phase(bootstrap, topic, args)
    lat = sorted(stats.latencies)
    elapsed = stats.elapsed
    spans = None if stats.unknown_offsets else stats.offsets
    consume = consume_phase(bootstrap, topic, spans, stats.acked, args)
    ms = 1000.0
    record: dict[str, Any] = {
        "target": target,
        "workload": args.workload,
        "messages": args.messages,
        "message_bytes": args.size,
        "produce_mb_s": round(stats.acked_bytes / MB / elapsed, 3) if elapsed > 0 else 0.0,
        "produce_msgs_s": round(stats.acked / elapsed, 1) if elapsed > 0 else 0.0,
        "produce_p50_ms": round(percentile(lat, 50) * ms, 3),
        "produce_p99_ms": round(percentile(lat, 99) * ms, 3),
        "produce_p999_ms": round(percentile(lat, 99.9) * ms, 3),
        "produce_max_ms": round(lat[-1] * ms, 3) if lat else float("nan"),
        "consume_mb_s": consume["consume_mb_s"],
        "errors": stats.errors + consume["consume_errors"],
        "acked": stats.acked,
        "consumed": consume["consumed"],
        "produce_errors": stats.errors,
        "consume_errors": consume["consume_errors"],
        "first_error": stats.first_error or consume["consume_first_error"],
        "produce_elapsed_s": round(elapsed, 4),
        "consume_elapsed_s": consume["consume_elapsed_s"],
        "consume_assign_wait_s": consume["consume_assign_wait_s"],
        "bootstrap": bootstrap,
        "topic": topic,
        "partitions": args.partitions,
        "acks": args.acks,
        "linger_ms": args.linger_ms,
        "batch_size": args.batch_size,
        "rate": args.rate,
        "compression": args.compression,
        "idempotence": args.idempotence,
        "consumer_mode": args.consumer_mode,
    }
    record["ok"] = record["errors"] == 0 and stats.acked == args.messages == record["consumed"]
    return record


def free_port_range(count: int, host: str = "127.0.0.1", tries: int = 50) -> int:
    """A base port such that base..base+count-1 were all free a moment ago (port-0 probing)."""
    for _ in range(tries):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise TargetUnavailable(f"no run of {count} free ports found on {host}")


def zonefleet_command() -> list[str]:
    """The ``zonefleet`` console script of the venv that runs this script."""
    script = Path(sys.executable).parent / "zonefleet"
    if not script.exists():
        raise TargetUnavailable(f"{script} not found; install zonefleet (pip install -e .)")
    return [str(script)]


def _stop_process(proc: subprocess.Popen[str], grace: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log(f"pid {proc.pid} ignored SIGTERM for {grace:.0f} s; sending SIGKILL")
            proc.kill()
            proc.wait(timeout=grace)
    # zonefleet may run its nodes as children in the session we created for it; reap stragglers.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def run_zonefleet(
    data_dir: Path,
    base_port: int | None = None,
    command: Sequence[str] | None = None,
    ready_timeout: float = 30.0,
    stop_grace: float = 10.0,
    zone_count: int = 1,
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
) -> Iterator[dict[str, str]]:
    """Run ``zonefleet up --zones N`` (1: the lone main) and yield ``{zone: bootstrap}`` parsed
    from its stdout. ``on_start`` gets the process once it is started.

    Waits for a line starting with ``ready``; raises TargetUnavailable (with the output seen) if it
    does not appear within ``ready_timeout`` seconds or the process exits first.
    """
    base = base_port if base_port is not None else free_port_range(64)
    cmd = [*(command or zonefleet_command()), "up", "--data-dir", str(data_dir)]
    cmd += ["--base-port", str(base)]
    cmd += ["--zones", str(zone_count)]
    stderr_path = data_dir / "zonefleet.stderr.log"
    with open(stderr_path, "w") as stderr_file:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=stderr_file, text=True, start_new_session=True
        )
    if on_start is not None:
        on_start(proc)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        # Keeps draining stdout for the whole run, so a chatty broker never blocks on the pipe.
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if _READY_LINE.search(line):
                ready.set()

    reader = threading.Thread(target=pump, name="zonefleet-stdout", daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + ready_timeout
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                reader.join(1.0)
                why = (
                    f"exited with code {proc.returncode}"
                    if proc.poll() is not None
                    else f"printed no 'ready' line within {ready_timeout:.0f} s"
                )
                stderr_tail = stderr_path.read_text(errors="replace")[-2000:].strip()
                raise TargetUnavailable(
                    f"zonefleet ({' '.join(cmd)}) {why}; stdout: {lines[-20:]!r}; "
                    f"stderr: {stderr_tail!r}"
                )
        zones: dict[str, str] = {}
        for line in list(lines):
            match = _ZONE_LINE.search(line)
            if match:
                zones.setdefault(match["zone"], match["bootstrap"])
        if not zones:
            raise TargetUnavailable(
                f"zonefleet printed 'ready' but no 'zone=... bootstrap=...': {lines}"
            )
        yield zones
    finally:
        _stop_process(proc, stop_grace)
        reader.join(2.0)


@contextlib.contextmanager
def target_bootstrap(args: argparse.Namespace, broker: str) -> Iterator[str]:
    """Yield the bootstrap for ``broker`` (zonefleet or tansu), starting it unless given."""
    if args.bootstrap and not (args.compare and broker == "tansu"):
        yield args.bootstrap
    elif broker == "zonefleet":
        with tempfile.TemporaryDirectory(prefix="zonefleet-bench-") as tmp:
            with run_zonefleet(Path(tmp), ready_timeout=args.ready_timeout) as zones:
                zone = args.zone or next(iter(zones))
                if zone not in zones:
                    raise TargetUnavailable(f"zone {zone!r} not among zonefleet's zones {zones}")
                log(f"zonefleet up: {zones}; benchmarking zone {zone}")
                yield zones[zone]
    else:
        with run_tansu() as bootstrap:
            log(f"tansu up on {bootstrap}")
            yield bootstrap


def compare(zonefleet: dict[str, Any], tansu: dict[str, Any]) -> dict[str, Any]:
    """Ratios zonefleet/tansu per metric (>1: zonefleet higher; for latencies, slower)."""
    ratios: dict[str, float | None] = {}
    for key in COMPARED_METRICS:
        num, den = zonefleet.get(key), tansu.get(key)
        ok = isinstance(num, int | float) and isinstance(den, int | float) and den > 0
        ratios[key] = round(num / den, 3) if ok else None  # type: ignore[operator]
    return {"compare": ratios, "zonefleet": zonefleet, "tansu": tansu}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add: Callable[..., Any] = parser.add_argument
    add("--bootstrap", help="host:port of the broker under test (default: start one)")
    add(
        "--broker",
        choices=("zonefleet", "tansu"),
        default="zonefleet",
        help="which broker to start when --bootstrap is absent (ignored with --compare)",
    )
    add("--target", help="label for the JSON 'target' field")
    add("--compare", action="store_true", help="also run against a tansu peer; print ratios")
    add("--zone", help="zone whose bootstrap to use when starting zonefleet (default: first)")
    add("--workload", choices=sorted(PRESETS), default="throughput")
    add("--topic", help="topic name (default: unique per run)")
    add("--partitions", type=int, help="default 1; with --zones 6 (spread over the mains)")
    add("--messages", type=int)
    add("--size", type=int, help="message value bytes")
    add("--acks", choices=("0", "1", "all", "-1"))
    add("--linger-ms", type=int)
    add("--batch-size", type=int)
    add("--rate", type=float, help="messages/s; 0 = as fast as possible")
    add("--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none")
    add("--idempotence", action="store_true", help="enable.idempotence=true")
    add(
        "--consumer-mode",
        choices=("assign", "subscribe"),
        default="assign",
        help="assign partitions directly, or subscribe and wait for the group to assign them",
    )
    add("--timeout", type=float, default=180.0, help="bound on each phase, seconds")
    add("--ready-timeout", type=float, default=30.0, help="wait for zonefleet's ready line")
    zones = parser.add_argument_group(
        "zones mode",
        "--zones starts `zonefleet up --zones N` and measures the zone proxies (issue 3): "
        "throughput through a proxy vs direct to the main, proxy produce latency, end-to-end "
        "latency across zones and the cross-zone byte fraction. --messages, --size, "
        "--linger-ms and --batch-size apply to the throughput legs.",
    )
    zadd: Callable[..., Any] = zones.add_argument
    zadd("--zones", type=int, nargs="?", const=3, help="zones to start (default 3)")
    zadd("--json", action="store_true", help="print one JSON object instead of the table")
    zadd("--remote-zone", default="az1", help="zone of the main that leads the target partitions")
    zadd("--client-zone", default="az2", help="zone of the producer (its proxy)")
    zadd("--consumer-zone", default="az3", help="zone of the end-to-end consumer (its proxy)")
    zadd("--latency-messages", type=int, default=10_000, help="per latency leg, at --latency-rate")
    zadd("--latency-rate", type=float, default=1000.0, help="msg/s of the latency legs")
    zadd("--e2e-messages", type=int, default=10_000, help="end-to-end leg, at --latency-rate")
    zadd("--cross-messages", type=int, default=50_000, help="cross-zone bytes leg (64 KiB batches)")
    args = parser.parse_args(argv)
    if args.partitions is None:
        args.partitions = 6 if args.zones else 1
    for key, value in PRESETS[args.workload].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.messages <= 0 or args.size <= 0 or args.partitions <= 0:
        parser.error("--messages, --size and --partitions must be positive")
    return args


def _emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds the context managers, which stop our brokers

    signal.signal(signal.SIGTERM, on_sigterm)
    if args.zones:
        # Imported here: only this mode needs the zonefleet packages (fleet config, accounting).
        from zone_bench import run_zones

        return run_zones(args)
    brokers = ["zonefleet", "tansu"] if args.compare else [args.broker]
    records: dict[str, dict[str, Any]] = {}
    try:
        for broker in brokers:
            label = broker if args.compare else (args.target or broker)
            with target_bootstrap(args, broker) as bootstrap:
                records[broker] = run_benchmark(bootstrap, label, args)
            _emit(records[broker])
    except (TansuUnavailable, TargetUnavailable) as exc:
        log(f"target unavailable: {exc}")
        return EXIT_TARGET_UNAVAILABLE
    if args.compare:
        _emit(compare(records["zonefleet"], records["tansu"]))
    return 0 if all(r["ok"] for r in records.values()) else EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
