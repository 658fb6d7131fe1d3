"""``produce_consume.py --zones``: the issue-3 figures of the zone proxies, on one fleet.

Starts ``zonefleet up --zones N`` and, against partitions led by the main in ``--remote-zone``
(az1), measures on the same run:

1. produce throughput from a client in ``--client-zone`` (az2) through its zone proxy, versus
   the same workload produced straight to that main by a client in the main's zone;
2. produce latency through the proxy (and, for comparison, direct) at ``--latency-rate``;
3. end-to-end latency, producer through the az2 proxy to a consumer through the
   ``--consumer-zone`` (az3) proxy, from a send time carried in each message;
4. cross-zone bytes (every node's ``zonefleet_traffic_bytes_total`` on its admin ``/metrics``)
   as a fraction of produced payload bytes, at 64 KiB batches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import sys
import tempfile
import threading
import time
import uuid
from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import produce_consume as pc
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient
from zone_table import format_table, ratio
from zone_targets import (
    TARGET_CROSS_ZONE_PCT,
    TARGET_E2E_P99_MS,
    TARGET_PRODUCE_P99_MS,
    TARGET_THROUGHPUT_RATIO,
)
from zone_traffic import scrape_traffic, traffic_delta

from fleet.config import FleetConfig, load_fleet_config

CROSS_BATCH_BYTES = 65_536
CROSS_LINGER_MS = 50  # long enough that batches fill to batch.size, not linger
SETTLE_S = 0.5  # state-stream deltas and confirms of the last batches land in the counters
QUIESCE_CPU = 0.2  # fraction of one core
QUIESCE_WINDOW_S = 0.5
QUIESCE_MAX_S = 30.0
STAMP = struct.Struct("<Q")  # send time, perf_counter_ns (system-wide CLOCK_MONOTONIC)


def zone_conf(zone: str) -> dict[str, Any]:
    return {"client.id": f"zone={zone}"}


@dataclass
class ZoneFleet:
    """The running fleet, as its fleet.toml describes it (ports are never assumed)."""

    config: FleetConfig

    @property
    def zones(self) -> list[str]:
        return [z.name for z in self.config.zones]

    def proxy_bootstrap(self, zone: str) -> tuple[int, str]:
        for node in self.config.proxies:
            if node.proxy.zone == zone:
                host, port = node.proxy.advertised
                return node.proxy.node_id, f"{host}:{port}"
        raise pc.TargetUnavailable(f"no proxy in zone {zone}")

    def main_bootstrap(self, zone: str) -> tuple[int, str]:
        for node in self.config.mains:
            if node.broker.zone == zone:
                host, port = node.broker.advertised
                return node.broker.node_id, f"{host}:{port}"
        raise pc.TargetUnavailable(f"no main broker in zone {zone}")

    def metrics_urls(self) -> list[str]:
        return [f"http://{n.admin_host}:{n.admin_port}/metrics" for n in self.config.nodes()]


def leaders_seen(bootstrap: str, zone: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """Partition -> leader node id in the Metadata a client of ``zone`` gets from ``bootstrap``."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **zone_conf(zone)})
    info = admin.list_topics(topic, timeout=timeout).topics[topic]
    return {p: meta.leader for p, meta in info.partitions.items()}


class ZoneConsumer(threading.Thread):
    """Reads ``partitions`` from their current end through ``bootstrap`` as a client of ``zone``.

    Stops once ``finish(last)`` was called and every partition's offset ``last[p]`` was read,
    or at ``deadline``. With ``stamped``, values start with a send time (0: a warm-up message)
    and the latency of each stamped message is recorded.
    """

    def __init__(
        self, bootstrap: str, zone: str, topic: str, partitions: Sequence[int], stamped: bool
    ) -> None:
        super().__init__(name=f"consumer-{zone}", daemon=True)
        self.stamped = stamped
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-zones-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **zone_conf(zone),
            }
        )
        starts = []
        for p in partitions:
            _, high = self.consumer.get_watermark_offsets(
                KafkaTopicPartition(topic, p), timeout=10.0
            )
            starts.append(KafkaTopicPartition(topic, p, high))
        self.consumer.assign(starts)
        self.latencies = array("d")
        self.seen: dict[int, int] = {}  # partition -> highest offset read
        self.consumed = self.consumed_bytes = self.errors = 0
        self.first_error = ""
        self.deadline = float("inf")
        self._last: dict[int, int] | None = None
        self._halt = threading.Event()

    def finish(self, last: dict[int, int], timeout: float) -> None:
        self._last = dict(last)
        self.deadline = time.monotonic() + timeout
        self.join(timeout + 5.0)
        self._halt.set()
        self.join(5.0)

    def _done(self) -> bool:
        last = self._last
        if last is None:
            return False
        return all(self.seen.get(p, -1) >= off for p, off in last.items())

    def run(self) -> None:
        try:
            while not self._halt.is_set() and not self._done():
                if time.monotonic() > self.deadline:
                    pc.log(f"consumer timed out; read up to {self.seen}, wanted {self._last}")
                    break
                # poll, not consume(num_messages=...): librdkafka's batch consume waits for
                # the whole batch or the timeout, which would add up to that timeout to every
                # latency sample.
                msg = self.consumer.poll(0.05)
                if msg is None:
                    continue
                now_ns = time.perf_counter_ns()
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        self.errors += 1
                        self.first_error = self.first_error or str(err)
                    continue
                value = msg.value() or b""
                partition, offset = msg.partition() or 0, msg.offset() or 0
                self.seen[partition] = max(self.seen.get(partition, -1), offset)
                if self.stamped:
                    (sent_ns,) = STAMP.unpack_from(value)
                    if not sent_ns:
                        continue  # warm-up
                    self.latencies.append((now_ns - sent_ns) / 1e9)
                self.consumed += 1
                self.consumed_bytes += len(value)
        finally:
            self.consumer.close()


def _descendants(pid: int) -> list[int]:
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += _descendants(int(child))
    return out


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds so far of process ``pid`` and its descendants (``zonefleet
    up`` runs each node as a child process), with their threads."""
    total = 0
    for proc in _descendants(pid):
        with contextlib.suppress(OSError):  # exited meanwhile
            fields = Path(f"/proc/{proc}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def quiesce(pid: int | None, max_wait: float = QUIESCE_MAX_S) -> float:
    """Wait until the fleet process uses under QUIESCE_CPU of a core (mirrors have caught up
    with the previous leg's writes); returns the seconds waited."""
    if pid is None:
        return 0.0
    started = time.monotonic()
    while time.monotonic() - started < max_wait:
        try:
            before = process_cpu_s(pid)
            time.sleep(QUIESCE_WINDOW_S)
            busy = (process_cpu_s(pid) - before) / QUIESCE_WINDOW_S
        except (OSError, ValueError, IndexError):
            return 0.0  # not Linux, or the process is gone
        if busy < QUIESCE_CPU:
            break
    waited = time.monotonic() - started
    pc.log(f"fleet quiet after {waited:.1f} s")
    return round(waited, 1)


def leg_args(args: argparse.Namespace, **overrides: Any) -> argparse.Namespace:
    out = argparse.Namespace(**vars(args))
    for key, value in overrides.items():
        setattr(out, key, value)
    return out


def _ms(sorted_values: Sequence[float], q: float) -> float:
    return round(pc.percentile(sorted_values, q) * 1000.0, 3)


def latency_summary(latencies: Sequence[float]) -> dict[str, Any]:
    lat = sorted(latencies)
    return {
        "samples": len(lat),
        "p50_ms": _ms(lat, 50),
        "p99_ms": _ms(lat, 99),
        "p999_ms": _ms(lat, 99.9),
        "max_ms": round(lat[-1] * 1000.0, 3) if lat else float("nan"),
    }


def _check(stats: pc._ProduceStats, wanted: int, what: str, problems: list[str]) -> None:
    if stats.errors or stats.acked != wanted:
        problems.append(f"{what}: acked {stats.acked}/{wanted}, errors {stats.errors} "
                        f"{stats.first_error}".strip())  # fmt: skip


def throughput_legs(
    args: argparse.Namespace,
    topic: str,
    paths: dict[str, tuple[str, str]],
    partitions: list[int],
    problems: list[str],
) -> dict[str, Any]:
    """Direct, proxy, proxy, direct (half the messages each): a drift of the shared machine
    during the run weighs on both paths alike."""
    first = args.messages // 2
    halves = {"direct": [first, args.messages - first], "proxy": [first, args.messages - first]}
    order = ["direct", "proxy", "proxy", "direct"]
    acked_bytes: dict[str, int] = defaultdict(int)
    elapsed: dict[str, float] = defaultdict(float)
    legs = []
    for path in order:
        count = halves[path].pop(0)
        bootstrap, zone = paths[path]
        stats = pc.produce_phase(
            bootstrap,
            topic,
            leg_args(args, messages=count, rate=0),
            partitions=partitions,
            conf_overrides=zone_conf(zone),
        )
        _check(stats, count, f"throughput {path}", problems)
        acked_bytes[path] += stats.acked_bytes
        elapsed[path] += stats.elapsed
        mb_s = stats.acked_bytes / pc.MB / stats.elapsed if stats.elapsed > 0 else 0.0
        legs.append({"path": path, "messages": count, "mb_s": round(mb_s, 3)})
        pc.log(f"throughput {path}: {count} msgs, {mb_s:.1f} MB/s")
    out: dict[str, Any] = {}
    for path in ("proxy", "direct"):
        sec = elapsed[path]
        out[f"{path}_mb_s"] = round(acked_bytes[path] / pc.MB / sec, 3) if sec > 0 else 0.0
    out["ratio"] = ratio(out["proxy_mb_s"], out["direct_mb_s"])
    out["target_ratio"] = TARGET_THROUGHPUT_RATIO
    out["met"] = out["ratio"] is not None and out["ratio"] >= TARGET_THROUGHPUT_RATIO
    out["legs"] = legs
    return out


def latency_legs(
    args: argparse.Namespace,
    topic: str,
    paths: dict[str, tuple[str, str]],
    partitions: list[int],
    problems: list[str],
) -> dict[str, Any]:
    lat_args = leg_args(args, messages=args.latency_messages, rate=args.latency_rate, linger_ms=0)
    out: dict[str, Any] = {"rate": args.latency_rate, "messages": args.latency_messages}
    for path in ("proxy", "direct"):
        bootstrap, zone = paths[path]
        stats = pc.produce_phase(
            bootstrap, topic, lat_args, partitions=partitions, conf_overrides=zone_conf(zone)
        )
        _check(stats, args.latency_messages, f"latency {path}", problems)
        out[path] = latency_summary(stats.latencies)
        pc.log(f"latency {path}: {out[path]}")
    out["p99_ratio"] = ratio(out["proxy"]["p99_ms"], out["direct"]["p99_ms"])
    out["target_p99_ms"] = TARGET_PRODUCE_P99_MS
    out["met"] = out["proxy"]["p99_ms"] <= TARGET_PRODUCE_P99_MS
    return out


def _warm_up(producer_bootstrap: str, zone: str, topic: str, consumer: ZoneConsumer,
             partitions: Sequence[int], timeout: float) -> None:  # fmt: skip
    """Send unstamped messages until the consumer has read one from every partition, so the
    measured messages do not wait for its first fetches."""
    producer = Producer(
        {"bootstrap.servers": producer_bootstrap, "linger.ms": 0, **zone_conf(zone)}
    )
    deadline = time.monotonic() + timeout
    zero = STAMP.pack(0) + bytes(64)
    while not all(p in consumer.seen for p in partitions):
        if time.monotonic() > deadline or not consumer.is_alive():
            raise pc.TargetUnavailable(f"consumer saw no warm-up message within {timeout:.0f} s")
        for p in partitions:
            producer.produce(topic, zero, partition=p)
        producer.flush(timeout)
        time.sleep(0.05)


def e2e_leg(
    args: argparse.Namespace,
    topic: str,
    fleet: ZoneFleet,
    partitions: list[int],
    problems: list[str],
) -> dict[str, Any]:
    _, producer_bootstrap = fleet.proxy_bootstrap(args.client_zone)
    _, consumer_bootstrap = fleet.proxy_bootstrap(args.consumer_zone)
    consumer = ZoneConsumer(consumer_bootstrap, args.consumer_zone, topic, partitions, True)
    consumer.start()
    _warm_up(producer_bootstrap, args.client_zone, topic, consumer, partitions, args.timeout)

    def stamp(payload: bytes) -> bytes:
        return STAMP.pack(time.perf_counter_ns()) + payload[STAMP.size :]

    e2e_args = leg_args(args, messages=args.e2e_messages, rate=args.latency_rate, linger_ms=0)
    stats = pc.produce_phase(
        producer_bootstrap,
        topic,
        e2e_args,
        partitions=partitions,
        conf_overrides=zone_conf(args.client_zone),
        value_of=stamp,
    )
    _check(stats, args.e2e_messages, "end-to-end produce", problems)
    consumer.finish({p: hi for p, (_, hi) in stats.offsets.items()}, args.timeout)
    if consumer.consumed != stats.acked or consumer.errors:
        problems.append(f"end-to-end: consumed {consumer.consumed} of {stats.acked} acked, "
                        f"errors {consumer.errors} {consumer.first_error}".strip())  # fmt: skip
    out = {
        "producer_zone": args.client_zone,
        "consumer_zone": args.consumer_zone,
        "rate": args.latency_rate,
        "messages": args.e2e_messages,
        "consumed": consumer.consumed,
        **latency_summary(consumer.latencies),
        "target_p99_ms": TARGET_E2E_P99_MS,
    }
    out["met"] = out["p99_ms"] <= TARGET_E2E_P99_MS
    pc.log(f"end-to-end: {out}")
    return out


def cross_zone_leg(
    args: argparse.Namespace,
    topic: str,
    fleet: ZoneFleet,
    partitions: list[int],
    problems: list[str],
) -> dict[str, Any]:
    """Produce through the client zone's proxy at 64 KiB batches while the consumer zone's
    proxy reads it all back; count the fleet's cross-zone bytes over that window."""
    _, producer_bootstrap = fleet.proxy_bootstrap(args.client_zone)
    _, consumer_bootstrap = fleet.proxy_bootstrap(args.consumer_zone)
    urls = fleet.metrics_urls()
    zones = set(fleet.zones)
    before = scrape_traffic(urls)
    consumer = ZoneConsumer(consumer_bootstrap, args.consumer_zone, topic, partitions, False)
    consumer.start()
    cross_args = leg_args(
        args,
        messages=args.cross_messages,
        rate=0,
        batch_size=CROSS_BATCH_BYTES,
        linger_ms=CROSS_LINGER_MS,
    )
    stats = pc.produce_phase(
        producer_bootstrap,
        topic,
        cross_args,
        partitions=partitions,
        conf_overrides=zone_conf(args.client_zone),
    )
    _check(stats, args.cross_messages, "cross-zone produce", problems)
    consumer.finish({p: hi for p, (_, hi) in stats.offsets.items()}, args.timeout)
    if consumer.consumed != stats.acked or consumer.errors:
        problems.append(f"cross-zone: consumed {consumer.consumed} of {stats.acked} acked")
    time.sleep(SETTLE_S)
    delta = traffic_delta(before, scrape_traffic(urls))
    by_channel: dict[str, int] = defaultdict(int)
    cross = unknown = storage = 0.0
    confirms = confirm_requests = 0.0
    for (src, dst, channel, _api), (nbytes, requests) in delta.items():
        if src in zones and dst in zones and src != dst:
            cross += nbytes
            by_channel[channel] += int(nbytes)
        elif "unknown" in (src, dst):
            unknown += nbytes  # a client no rule placed: not cross-zone, but shown
        elif src not in zones or dst not in zones:
            storage += nbytes  # the regional shared FS / object store pseudo-zone
        if channel == "confirm-rpc" and src == args.client_zone and dst != src:
            confirms += nbytes
            confirm_requests += requests
    payload = stats.acked_bytes
    out: dict[str, Any] = {
        "payload_bytes": payload,
        "cross_zone_bytes": int(cross),
        "fraction_pct": round(100.0 * cross / payload, 4) if payload else None,
        "by_channel": dict(sorted(by_channel.items(), key=lambda kv: -kv[1])),
        "unknown_zone_bytes": int(unknown),
        "storage_bytes": int(storage),
        "confirmed_partitions": int(confirm_requests),
        "confirm_bytes_per_partition": round(confirms / confirm_requests, 1)
        if confirm_requests
        else None,
        "payload_bytes_per_confirm": round(payload / confirm_requests)
        if confirm_requests
        else None,
        "batch_size": CROSS_BATCH_BYTES,
        "linger_ms": CROSS_LINGER_MS,
        "consumed": consumer.consumed,
        "target_pct": TARGET_CROSS_ZONE_PCT,
    }
    out["met"] = out["fraction_pct"] is not None and out["fraction_pct"] <= TARGET_CROSS_ZONE_PCT
    pc.log(f"cross-zone: {out}")
    return out


def pick_partitions(
    fleet: ZoneFleet, args: argparse.Namespace, topic: str
) -> tuple[int, list[int]]:
    """Partitions led by the remote zone's main (from that main's Metadata to a client of its
    zone), checked to be served by the client zone's proxy in that zone's view."""
    main_id, main_bootstrap = fleet.main_bootstrap(args.remote_zone)
    proxy_id, proxy_bootstrap = fleet.proxy_bootstrap(args.client_zone)
    led = leaders_seen(main_bootstrap, args.remote_zone, topic)
    partitions = sorted(p for p, leader in led.items() if leader == main_id)
    if not partitions:
        raise pc.TargetUnavailable(
            f"no partition of {topic} is led by main {main_id}: {led}; try more --partitions"
        )
    seen = leaders_seen(proxy_bootstrap, args.client_zone, topic)
    wrong = {p: seen.get(p) for p in partitions if seen.get(p) != proxy_id}
    if wrong:
        raise pc.TargetUnavailable(f"{args.client_zone} clients do not see proxy {proxy_id} "
                                   f"leading {wrong}")  # fmt: skip
    return main_id, partitions


def measure(fleet: ZoneFleet, args: argparse.Namespace, pid: int | None = None) -> dict[str, Any]:
    """Each leg starts on a quiet fleet (see quiesce), latency legs first: the mirrors of all
    proxies tail every main's WAL, so a throughput leg leaves seconds of catching up behind."""
    topic = args.topic or f"bench-zones-{uuid.uuid4().hex[:10]}"
    _, client_proxy = fleet.proxy_bootstrap(args.client_zone)
    pc.create_topic(client_proxy, topic, args.partitions, 30.0, zone_conf(args.client_zone))
    main_id, partitions = pick_partitions(fleet, args, topic)
    _, main_bootstrap = fleet.main_bootstrap(args.remote_zone)
    paths = {
        "proxy": (client_proxy, args.client_zone),
        "direct": (main_bootstrap, args.remote_zone),
    }
    pc.log(f"topic {topic}: partitions {partitions} led by main {main_id} ({args.remote_zone})")
    problems: list[str] = []
    record: dict[str, Any] = {
        "mode": "zones",
        "zones": fleet.zones,
        "topic": topic,
        "partitions": partitions,
        "remote_zone": args.remote_zone,
        "remote_main": main_id,
        "client_zone": args.client_zone,
        "message_bytes": args.size,
        "acks": args.acks,
        "throughput_settings": {
            "messages": args.messages,
            "linger_ms": args.linger_ms,
            "batch_size": args.batch_size,
        },
    }
    quiet: dict[str, float] = {}
    quiet["latency"] = quiesce(pid)
    record["latency"] = latency_legs(args, topic, paths, partitions, problems)
    quiet["e2e"] = quiesce(pid)
    record["e2e"] = e2e_leg(args, topic, fleet, partitions, problems)
    quiet["cross_zone"] = quiesce(pid)
    record["cross_zone"] = cross_zone_leg(args, topic, fleet, partitions, problems)
    quiet["throughput"] = quiesce(pid)
    record["throughput"] = throughput_legs(args, topic, paths, partitions, problems)
    record["quiesce_wait_s"] = quiet
    record["problems"] = problems
    record["ok"] = not problems
    record["targets_met"] = all(
        record[k]["met"] for k in ("throughput", "latency", "e2e", "cross_zone")
    )
    return record


def run_zones(args: argparse.Namespace, emit: Callable[[str], None] = print) -> int:
    """Start the fleet, measure, print the table (or JSON); exit code as produce_consume."""
    if args.zones < 2:
        pc.log("--zones needs at least 2 zones (a client zone and a remote main)")
        return pc.EXIT_TARGET_UNAVAILABLE
    try:
        with tempfile.TemporaryDirectory(prefix="zonefleet-zones-bench-") as tmp:
            data_dir = Path(tmp)
            base = pc.free_port_range(10 * args.zones + 10)
            procs: list[Any] = []
            with pc.run_zonefleet(
                data_dir,
                base_port=base,
                ready_timeout=args.ready_timeout,
                zone_count=args.zones,
                on_start=procs.append,
            ) as announced:
                fleet = ZoneFleet(load_fleet_config(data_dir / "fleet.toml", discover=None))
                pc.log(f"zonefleet up --zones {args.zones}: {announced}")
                record = measure(fleet, args, procs[0].pid)
    except pc.TargetUnavailable as exc:
        pc.log(f"target unavailable: {exc}")
        return pc.EXIT_TARGET_UNAVAILABLE
    table = format_table(record)
    if args.json:
        print(table, file=sys.stderr, flush=True)  # for the human watching; stdout stays JSON
        emit(json.dumps(record))
    else:
        emit(table)
    return 0 if record["ok"] else pc.EXIT_MISMATCH
