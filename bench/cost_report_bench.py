"""How fast the Spark cost report is, against the plain-Python reference sum (issue 10).

Generates (once, cached by rows and seed) a realistic 30-day traffic ledger: one or more fleets
of three mains and three proxies (one of each per zone; a fleet per ``ROWS_PER_FLEET`` rows, so
1M rows is one fleet of 6 nodes and 10M two fleets, 12 nodes), per-minute rows as the nodes
write them (docs/formats.md, "Traffic accounting"): ``<dir>/dt=YYYY-MM-DD/<node>.jsonl``, one
compact JSON object a line, keys in the ledger's order. Per node the rows are the (from_zone,
to_zone, channel, api, topic) keys a node of that kind books, each active in some of the day's
minutes (busy topics and channels most minutes, rare calls seldom), with bytes and requests
that follow a daily curve:

- kafka-client: both directions of Produce and Fetch per topic (40 topics a fleet, sizes
  Zipf-skewed), the other APIs without a topic; proxies' clients are in the proxy's zone, a
  main's clients in its zone too, but for a few misplaced clients in other zones (cross-zone)
  and a small share of untagged clients (``unknown``);
- confirm-rpc proxy -> main (~116 B a partition) and main -> proxy (~37 B), state-stream,
  relay, rpc (``_handshake``, ``cancel``): between zones, so mostly cross-zone;
- wal-write, wal-read (``read``, ``scan``), s3-put (PutObject, CreateMultipartUpload,
  UploadPart, CompleteMultipartUpload, DeleteObjects), s3-get (GetObject, HeadObject): to and
  from the ``regional`` storage pseudo-zone, never cross-zone.

Then, per size, it times in the same run (``--runs`` times, the order alternating) the whole
report as a process, ``python -m cost_report.job --accounting DIR --out TMP --master local[2]
--quiet`` (Spark start-up included), and the plain-Python reference sum over the same files,
``cost_report.reference.reference_totals`` in a subprocess of its own. The report's
summary.json must agree with the reference (rows, bytes, cross-zone bytes, unknown-zone bytes,
rejected rows, bytes per channel and cross-zone bytes per day): exit 2 if it does not or the
report fails. Prints a table (or ``--json``) with seconds and rows per second of both, their
ratio, and the growth of the report's time from the smallest size to each larger one, and
whether the issue's targets are met: the largest size (10M) in <= 90 s, time growing no faster
than the rows, and >= 5x the reference's rows per second. The 1-minute load average is sampled
during every timed run.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GENERATOR_VERSION = 2  # bump when the generated rows change, so caches are not reused
FIRST_DAY = date(2026, 11, 1)
DAYS = 30
MINUTES = 1440
ZONES = ("az1", "az2", "az3")
ROWS_PER_FLEET = 5_000_000
TOPICS_PER_FLEET = 40
FLEET_PRODUCE_BYTES_S = 30e6  # a fleet's mean client produce rate
MARKER = "_generated.json"  # "_" first: the report and the reference skip it

TARGET_SECONDS = 90.0
TARGET_ROWS = 10_000_000
TARGET_RATIO = 5.0

_TOPIC_NAMES = (
    "orders", "payments", "clickstream", "page-views", "inventory", "shipments", "user-events",
    "audit-log", "search-queries", "recommendations", "cart-updates", "invoices", "refunds",
    "notifications", "sessions", "metrics", "logs-app", "logs-nginx", "fraud-scores",
    "price-changes", "catalog", "reviews", "ad-impressions", "ad-clicks", "geo-pings",
    "device-telemetry", "emails", "sms", "ledger", "customers", "support-tickets",
    "feature-flags", "ml-features", "cdc.users", "cdc.accounts", "cdc.orders", "dlq",
    "heartbeats", "billing", "exports",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The ledger generator


@dataclass(frozen=True)
class Key:
    """One kind of row a node books: who sends to whom, on what, and how much when active."""

    from_zone: str
    to_zone: str
    channel: str
    api: str
    topic: str
    weight: float  # relative chance of being active in a minute (1 = every minute at full load)
    requests_min: float  # mean requests a minute (frames, partitions for confirm-rpc)
    bytes_per_request: float


@dataclass(frozen=True)
class Node:
    name: str
    zone: str
    keys: tuple[Key, ...]


def _cross(a: str, b: str) -> bool:
    return a != b and a not in ("regional", "unknown") and b not in ("regional", "unknown")


def _topics(fleet: int) -> list[tuple[str, float]]:
    """(name, produce bytes/s) of a fleet's topics, Zipf-skewed: the first carries ~20 %."""
    raw = [1 / (i + 1) ** 1.1 for i in range(TOPICS_PER_FLEET)]
    total = sum(raw)
    prefix = "" if fleet == 0 else f"fleet{fleet + 1}."
    names = (_TOPIC_NAMES * 2)[:TOPICS_PER_FLEET]
    return [
        (prefix + n, FLEET_PRODUCE_BYTES_S * r / total) for n, r in zip(names, raw, strict=True)
    ]


# Non-payload Kafka APIs: (api, requests a minute per node, request bytes, response bytes).
_CLIENT_APIS = (
    ("Metadata", 40, 60, 2_000),
    ("ApiVersions", 4, 50, 420),
    ("FindCoordinator", 6, 60, 60),
    ("JoinGroup", 0.5, 400, 600),
    ("SyncGroup", 0.5, 300, 200),
    ("Heartbeat", 60, 70, 20),
    ("OffsetCommit", 30, 250, 120),
    ("OffsetFetch", 2, 200, 300),
    ("ListOffsets", 4, 120, 140),
    ("InitProducerId", 0.2, 60, 40),
)
_RELAYED = ("JoinGroup", "SyncGroup", "Heartbeat", "OffsetCommit", "OffsetFetch", "FindCoordinator")


def _client_keys(
    zone: str, client_zone: str, topics: Sequence[tuple[str, float]], share: float, activity: float
) -> list[Key]:
    """Both directions of one group of clients' traffic: `share` of every topic's produce and
    fetch (fetch fan-out 2), and the other APIs, with their activity scaled by `activity`."""
    keys = []
    top = topics[0][1]
    for topic, rate in topics:
        w = activity * max(0.01, rate / top)
        produce_rpm = max(0.5, rate * share * 60 / 262_144)  # ~256 KiB produce requests
        fetch_rpm = max(0.5, 2 * rate * share * 60 / 524_288)  # ~512 KiB fetch responses
        keys += [
            Key(client_zone, zone, "kafka-client", "Produce", topic, w, produce_rpm, 262_144),
            Key(zone, client_zone, "kafka-client", "Produce", topic, w, produce_rpm, 70),
            Key(client_zone, zone, "kafka-client", "Fetch", topic, w, fetch_rpm, 110),
            Key(zone, client_zone, "kafka-client", "Fetch", topic, w, fetch_rpm, 524_288),
        ]
    for api, rpm, req_b, resp_b in _CLIENT_APIS:
        w = activity * min(1.0, 0.1 + rpm / 20)
        keys += [
            Key(client_zone, zone, "kafka-client", api, "", w, rpm, req_b),
            Key(zone, client_zone, "kafka-client", api, "", w, rpm, resp_b),
        ]
    return keys


def fleet_nodes(fleet: int) -> list[Node]:
    """The 3 mains and 3 proxies of fleet `fleet` (0-based) with every key they book."""
    topics = _topics(fleet)
    mains = [(f"main-{3 * fleet + i + 1}", z) for i, z in enumerate(ZONES)]
    proxies = [(f"proxy-{100 + 3 * fleet + i + 1}", z) for i, z in enumerate(ZONES)]
    zone_produce = FLEET_PRODUCE_BYTES_S / 3 * 60  # bytes a minute one zone's clients produce
    owned = FLEET_PRODUCE_BYTES_S / 3 * 60  # bytes a minute into one main's partitions
    # A proxy confirms its clients' produce to the two mains of the other zones, 64 KiB batches.
    partitions = zone_produce * 2 / 3 / 2 / 65_536
    nodes = []
    for name, zone in mains:
        # A zone's clients reach their own main for the third of partitions it leads.
        keys = _client_keys(zone, zone, topics, 1 / 9, 1.0)
        for other in ZONES:
            if other != zone:  # misplaced clients: metadata and a little payload, cross-zone
                keys += _client_keys(zone, other, topics[:3], 0.002, 0.05)[:12]
                keys += [
                    Key(other, zone, "kafka-client", "Metadata", "", 0.05, 2, 60),
                    Key(zone, other, "kafka-client", "Metadata", "", 0.05, 2, 2_000),
                ]
        keys += _client_keys(zone, "unknown", topics[:5], 0.01, 0.2)  # untagged clients
        for _pname, pzone in proxies:
            keys.append(Key(zone, pzone, "state-stream", "state", "", 1.0, 60, 180))
            if pzone == zone:
                continue  # the proxy of its own zone never stands in for it
            keys += [
                Key(zone, pzone, "confirm-rpc", "confirm", "", 1.0, partitions, 37),
                Key(zone, pzone, "relay", "Metadata", "", 0.3, 5, 2_000),
                *(Key(zone, pzone, "relay", api, "", 0.4, 10, 120) for api in _RELAYED),
                Key(zone, pzone, "rpc", "_handshake", "", 0.01, 1, 300),
                Key(zone, pzone, "rpc", "cancel", "", 0.005, 1, 40),
            ]
        keys += [
            Key(zone, "regional", "wal-write", "write", "", 1.0, 600, zone_produce / 3 / 600),
            Key("regional", zone, "wal-read", "read", "", 0.5, 20, 200_000),
            Key("regional", zone, "wal-read", "scan", "", 1.0, 30, owned * 2 / 3 / 30),
            Key(zone, "regional", "s3-put", "PutObject", "", 0.3, 0.5, 16 << 20),
            Key(zone, "regional", "s3-put", "CreateMultipartUpload", "", 0.5, 1.1, 600),
            Key(zone, "regional", "s3-put", "UploadPart", "", 1.0, owned / (8 << 20), 8 << 20),
            Key(zone, "regional", "s3-put", "CompleteMultipartUpload", "", 0.5, 1.1, 1_200),
            Key(zone, "regional", "s3-put", "DeleteObjects", "", 0.02, 0.05, 4_000),
            Key("regional", zone, "s3-get", "GetObject", "", 0.3, 5, 4 << 20),
            Key("regional", zone, "s3-get", "HeadObject", "", 0.1, 1, 300),
        ]
        nodes.append(Node(name, zone, tuple(keys)))
    for name, zone in proxies:
        # A zone's clients reach their proxy for the two thirds of partitions led elsewhere.
        keys = _client_keys(zone, zone, topics, 2 / 9, 1.0)
        for _mname, mzone in mains:
            keys.append(Key(zone, mzone, "state-stream", "state", "", 0.01, 1, 200))
            if mzone == zone:
                continue
            keys += [
                Key(zone, mzone, "confirm-rpc", "confirm", "", 1.0, partitions, 116),
                Key(zone, mzone, "relay", "Metadata", "", 0.3, 5, 80),
                *(Key(zone, mzone, "relay", api, "", 0.4, 10, 200) for api in _RELAYED),
                Key(zone, mzone, "rpc", "_handshake", "", 0.01, 1, 300),
            ]
        fleet_minute = FLEET_PRODUCE_BYTES_S * 60  # a proxy mirrors every main's WAL
        keys += [
            Key(zone, "regional", "wal-write", "write", "", 1.0, 600, zone_produce * 2 / 3 / 600),
            Key("regional", zone, "wal-read", "scan", "", 1.0, 90, fleet_minute / 90),
            Key("regional", zone, "wal-read", "read", "", 0.3, 20, 200_000),
            Key("regional", zone, "s3-get", "GetObject", "", 0.5, 20, 1 << 20),
            Key("regional", zone, "s3-get", "HeadObject", "", 0.1, 5, 300),
        ]
        nodes.append(Node(name, zone, tuple(keys)))
    return nodes


def fleets_for(rows: int) -> int:
    return max(1, math.ceil(rows / ROWS_PER_FLEET - 0.01))


def all_nodes(rows: int) -> list[Node]:
    return [n for f in range(fleets_for(rows)) for n in fleet_nodes(f)]


def day_quotas(rows: int, nodes: int, days: int = DAYS) -> list[int]:
    """Rows per node-day, in (day, node) order: as even as possible, summing to `rows`."""
    n = nodes * days
    return [rows // n + (1 if i < rows % n else 0) for i in range(n)]


def key_counts(weights: Sequence[float], quota: int) -> list[int]:
    """Active minutes per key: proportional to weight, at most one row a key a minute, summing
    to `quota` (water-filling: keys that would exceed every minute are capped, the rest share
    what is left)."""
    cap = MINUTES * len(weights)
    if quota > cap:
        raise ValueError(f"{quota} rows do not fit in {len(weights)} keys x {MINUTES} minutes")
    counts = [0] * len(weights)
    free = list(range(len(weights)))
    left = quota
    while free and left:
        total = sum(weights[i] for i in free)
        ideal = {i: left * weights[i] / total for i in free}
        over = [i for i in free if ideal[i] >= MINUTES]
        if over:
            for i in over:
                counts[i] = MINUTES
                left -= MINUTES
            free = [i for i in free if i not in over]
            continue
        floors = {i: int(ideal[i]) for i in free}
        rest = left - sum(floors.values())
        by_fraction = sorted(free, key=lambda i: (floors[i] - ideal[i], i))
        for i in by_fraction[:rest]:
            floors[i] += 1
        for i in free:
            counts[i] = floors[i]
        break
    return counts


def _templates(node: Node) -> list[str]:
    """A %-template per key: minute, bytes and requests to fill in, everything else fixed, in
    the ledger's key order (the same text as `json.dumps(row, separators=(",", ":"))`)."""
    out = []
    for k in node.keys:
        head = json.dumps(
            {
                "node": node.name,
                "from_zone": k.from_zone,
                "to_zone": k.to_zone,
                "channel": k.channel,
                "api": k.api,
                "topic": k.topic,
            },
            separators=(",", ":"),
        )[1:-1].replace("%", "%%")
        cross = "true" if _cross(k.from_zone, k.to_zone) else "false"
        out.append(
            '{"minute":"%s",' + head + ',"bytes":%d,"requests":%d,"cross_zone":' + cross + "}\n"
        )
    return out


def _curve(day: date) -> list[float]:
    """Load through the day (UTC): a trough at 03:00, a peak at 15:00; weekends at 70 %."""
    weekend = 0.7 if day.weekday() >= 5 else 1.0
    return [
        weekend * (1 + 0.5 * math.sin(2 * math.pi * (m / MINUTES - 0.375))) for m in range(MINUTES)
    ]


def node_day_lines(node: Node, day: date, quota: int, seed: int) -> list[str]:
    """The `quota` lines of one node-day file, in minute order (rows of a minute in key order),
    deterministic in (seed, node, day)."""
    rng = random.Random(f"{seed}:{node.name}:{day.isoformat()}")
    counts = key_counts([k.weight for k in node.keys], quota)
    buckets: list[list[int]] = [[] for _ in range(MINUTES)]
    everything = range(MINUTES)
    for ki, c in enumerate(counts):
        for m in everything if c == MINUTES else rng.sample(everything, c):
            buckets[m].append(ki)
    templates = _templates(node)
    # A key's day total does not depend on how many of its minutes have a row: fewer rows
    # (a smaller --rows) each carry more (the fleet's traffic stays the same).
    rpm = [
        k.requests_min * MINUTES / c if c else 0.0 for k, c in zip(node.keys, counts, strict=True)
    ]
    size = [k.bytes_per_request for k in node.keys]
    curve = _curve(day)
    stamp = day.isoformat()
    minutes = [f"{stamp}T{m // 60:02d}:{m % 60:02d}:00Z" for m in everything]
    rand = rng.random
    lines = []
    append = lines.append
    for m in everything:
        load, minute = curve[m], minutes[m]
        for ki in sorted(buckets[m]):
            requests = int(rpm[ki] * load * (0.5 + rand())) or 1
            nbytes = int(requests * size[ki] * (0.9 + 0.2 * rand()))
            append(templates[ki] % (minute, nbytes, requests))
    return lines


def _write_node_day(task: tuple[Path, Node, date, int, int]) -> tuple[int, int]:
    root, node, day, quota, seed = task
    lines = node_day_lines(node, day, quota, seed)
    path = root / f"dt={day.isoformat()}" / f"{node.name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(lines).encode("ascii")
    path.write_bytes(data)
    return len(lines), len(data)


def ledger_dir(cache: Path, rows: int, seed: int) -> Path:
    return cache / f"ledgers-v{GENERATOR_VERSION}-rows{rows}-seed{seed}"


def generate(
    root: Path, rows: int, seed: int, days: int = DAYS, workers: int = 2
) -> dict[str, Any]:
    """Write `rows` ledger rows under `root` (which must not exist yet); returns the facts."""
    t0 = time.monotonic()
    nodes = all_nodes(rows)
    quotas = day_quotas(rows, len(nodes), days)
    tasks = [
        (root, node, FIRST_DAY + timedelta(days=d), quotas[d * len(nodes) + n], seed)
        for d in range(days)
        for n, node in enumerate(nodes)
    ]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            done = pool.map(_write_node_day, tasks, chunksize=1)
    else:
        done = [_write_node_day(t) for t in tasks]
    return {
        "rows": sum(r for r, _ in done),
        "bytes": sum(b for _, b in done),
        "files": len(done),
        "nodes": [n.name for n in nodes],
        "days": days,
        "seed": seed,
        "generator_version": GENERATOR_VERSION,
        "generate_s": round(time.monotonic() - t0, 2),
    }


def cached_ledgers(
    cache: Path, rows: int, seed: int, log: Callable[[str], None]
) -> tuple[Path, dict[str, Any]]:
    """The ledgers for (rows, seed) under `cache`, generated on first use (into a temporary
    directory renamed into place when complete, so an interrupted run leaves nothing)."""
    root = ledger_dir(cache, rows, seed)
    marker = root / MARKER
    if marker.exists():
        facts = json.loads(marker.read_text())
        log(f"reusing {root} ({facts['rows']:,} rows, {facts['bytes'] / 1e6:,.0f} MB)")
        return root, {**facts, "cached": True}
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=cache))
    log(f"generating {rows:,} rows into {root} ...")
    try:
        facts = generate(partial, rows, seed)
        (partial / MARKER).write_text(json.dumps(facts, indent=1) + "\n")
        if root.exists():
            shutil.rmtree(root)
        partial.rename(root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    mb = facts["bytes"] / 1e6
    log(f"generated {facts['rows']:,} rows, {mb:,.0f} MB in {facts['generate_s']} s")
    return root, {**facts, "cached": False}


# ---------------------------------------------------------------------------------------------
# Timing


class LoadSampler:
    """The 1-minute load average every `interval` seconds while it runs (and at both ends)."""

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.interval):
                break

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        return {"min": min(self.samples), "max": max(self.samples)}


class TreeCpu:
    """CPU seconds of a process's descendants (the report's JVM is a grandchild that nobody
    waits for, so the rusage of the child misses it): /proc sampled every `interval` s, the
    last sample of each process kept (a process's last fraction of a second is missed)."""

    def __init__(self, root_pid: int, interval: float = 0.5) -> None:
        self.root = root_pid
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self._tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        parent: dict[int, int] = {}
        ticks: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rpartition(")")[2].split()
            except OSError:
                continue
            parent[int(entry)] = int(fields[1])
            ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime + stime
        for pid in ticks:
            p, depth = parent.get(pid), 0
            while p is not None and p != self.root and p > 1 and depth < 20:
                p, depth = parent.get(p), depth + 1
            if p == self.root:
                self.cpu[pid] = ticks[pid] / self._tick

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.cpu.values())


@dataclass
class Timed:
    wall_s: float
    cpu_s: float  # user + sys of the process and its descendants (the JVM)
    max_rss_mb: float
    load: dict[str, float]
    returncode: int
    stdout: str
    stderr: str


def timed_process(argv: Sequence[str], env: dict[str, str], cwd: Path) -> Timed:
    with LoadSampler() as load:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        tree = TreeCpu(proc.pid)
        out, err = [""], [""]
        readers = [
            threading.Thread(target=lambda: out.__setitem__(0, proc.stdout.read())),  # type: ignore[union-attr]
            threading.Thread(target=lambda: err.__setitem__(0, proc.stderr.read())),  # type: ignore[union-attr]
        ]
        for r in readers:
            r.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        descendants = tree.stop()
        for r in readers:
            r.join()
    return Timed(
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime + descendants,
        max_rss_mb=usage.ru_maxrss / 1024,
        load=load.summary(),
        returncode=proc.returncode,
        stdout=out[0],
        stderr=err[0],
    )


_REFERENCE = """
import json, sys, time
from cost_report.reference import reference_totals
t0 = time.monotonic()
t = reference_totals(sys.argv[1])
doc = {k: dict(v) if isinstance(v, dict) else v for k, v in vars(t).items()}
doc["elapsed_s"] = time.monotonic() - t0
print(json.dumps(doc))
"""


def run_reference(root: Path, python: str, env: dict[str, str]) -> tuple[Timed, dict[str, Any]]:
    t = timed_process([python, "-c", _REFERENCE, str(root)], env, REPO)
    if t.returncode != 0:
        raise RuntimeError(f"reference sum failed ({t.returncode}): {t.stderr[-2000:]}")
    return t, json.loads(t.stdout)


def run_report(
    root: Path,
    out: Path,
    python: str,
    env: dict[str, str],
    master: str,
    quiet: bool,
    checkout: Path = REPO,
) -> tuple[Timed, dict[str, Any] | None]:
    argv = [python, "-m", "cost_report.job", "--accounting", str(root), "--out", str(out)]
    argv += ["--master", master] + (["--quiet"] if quiet else [])
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")])),
    }
    t = timed_process(argv, env, checkout)
    summary = out / "summary.json"
    if t.returncode != 0 or not summary.exists():
        return t, None
    return t, json.loads(summary.read_text())


def compare(summary: dict[str, Any], ref: dict[str, Any]) -> list[str]:
    """Differences between the report's summary.json and the reference sum (empty: equal)."""
    totals = summary["totals"]
    problems = []
    pairs = [
        ("rows", "rows"),
        ("total_bytes", "total_bytes"),
        ("cross_zone_bytes", "cross_zone_bytes"),
        ("unknown_zone_bytes", "unknown_zone_bytes"),
        ("rejected_rows", "rejected_rows"),
    ]
    for mine, theirs in pairs:
        if totals.get(mine) != ref[theirs]:
            problems.append(f"{mine}: report {totals.get(mine)} != reference {ref[theirs]}")
    if summary["cross_zone_bytes"] != ref["cross_zone_bytes"]:
        problems.append("summary cross_zone_bytes differs from the reference")
    channels = {r["channel"]: r["bytes"] for r in summary["by_channel"]}
    if channels != ref["bytes_by_channel"]:
        problems.append(
            f"bytes by channel: report {channels} != reference {ref['bytes_by_channel']}"
        )
    days = {r["dt"]: r["cross_zone_bytes"] for r in summary["daily"]}
    ref_days = {d: ref["cross_zone_by_day"].get(d, 0) for d in ref["bytes_by_day"]}
    if days != ref_days:
        problems.append("cross-zone bytes by day differ from the reference")
    return problems


def _stages(stderr: str) -> list[tuple[float, str]]:
    """The job's progress lines ('[  12.3s] message') as (seconds, message)."""
    out = []
    for line in stderr.splitlines():
        if line.startswith("[") and "s] " in line:
            head, _, message = line.partition("s] ")
            try:
                out.append((float(head[1:]), message))
            except ValueError:
                continue
    return out


def bench_size(rows: int, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    root, facts = cached_ledgers(Path(args.cache_dir), rows, args.seed, log)
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    runs = []
    for i in range(args.runs):
        run: dict[str, Any] = {"run": i + 1}
        order = ("reference", "report") if i % 2 == 0 else ("report", "reference")
        for which in order:
            if which == "reference":
                if args.no_reference:
                    continue
                log(f"{rows:,} rows, run {i + 1}: reference sum ...")
                t, ref = run_reference(root, args.python, env)
                run["reference"] = {**_timing(t, rows), "inside_s": round(ref["elapsed_s"], 2)}
                run["_ref"] = ref
            else:
                log(f"{rows:,} rows, run {i + 1}: report (local Spark, {args.master}) ...")
                with tempfile.TemporaryDirectory(prefix="cost-report-bench-") as tmp:
                    t, summary = run_report(
                        root,
                        Path(tmp) / "out",
                        args.python,
                        env,
                        args.master,
                        not args.stages,
                        Path(args.checkout).resolve(),
                    )
                if summary is None:
                    raise RuntimeError(f"report failed ({t.returncode}): {t.stderr[-3000:]}")
                run["report"] = _timing(t, rows)
                if args.stages:
                    run["report"]["stages"] = _stages(t.stderr)
                run["_summary"] = summary
        if "_ref" in run:
            run["totals_equal"] = not (problems := compare(run["_summary"], run["_ref"]))
            run["problems"] = problems
            run["ratio"] = round(run["report"]["rows_s"] / run["reference"]["rows_s"], 2)
        run.pop("_ref", None)
        summary = run.pop("_summary")
        run["total_bytes"] = summary["totals"]["total_bytes"]
        run["cross_zone_bytes"] = summary["totals"]["cross_zone_bytes"]
        log(_run_line(rows, run))
        runs.append(run)
    return {"rows": rows, "ledgers": str(root), "ledger": facts, "runs": runs}


def _timing(t: Timed, rows: int) -> dict[str, Any]:
    return {
        "wall_s": round(t.wall_s, 2),
        "cpu_s": round(t.cpu_s, 1),
        "max_rss_mb": round(t.max_rss_mb),
        "rows_s": round(rows / t.wall_s),
        "load": t.load,
    }


def _run_line(rows: int, run: dict[str, Any]) -> str:
    rep = run["report"]
    text = f"{rows:,} rows run {run['run']}: report {rep['wall_s']} s ({rep['rows_s']:,} rows/s)"
    if "reference" in run:
        ref = run["reference"]
        text += f", reference {ref['wall_s']} s ({ref['rows_s']:,} rows/s), ratio {run['ratio']}"
        text += ", totals equal" if run["totals_equal"] else f", TOTALS DIFFER {run['problems']}"
    return text


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """Median per size, the growth from the smallest size, and the targets."""
    table = []
    for s in sizes:
        runs = s["runs"]
        rep = _median([r["report"]["wall_s"] for r in runs])
        row: dict[str, Any] = {
            "rows": s["rows"],
            "runs": len(runs),
            "report_s": round(rep, 2),
            "report_s_range": [
                min(r["report"]["wall_s"] for r in runs),
                max(r["report"]["wall_s"] for r in runs),
            ],
            "report_rows_s": round(s["rows"] / rep),
            "report_cpu_s": round(_median([r["report"]["cpu_s"] for r in runs]), 1),
            "load": [
                min(r["report"]["load"]["min"] for r in runs),
                max(r["report"]["load"]["max"] for r in runs),
            ],
        }
        refs = [r["reference"]["wall_s"] for r in runs if "reference" in r]
        if refs:
            ref = _median(refs)
            row["reference_s"] = round(ref, 2)
            row["reference_rows_s"] = round(s["rows"] / ref)
            row["ratio"] = round(_median([r["ratio"] for r in runs if "ratio" in r]), 2)
            row["totals_equal"] = all(r.get("totals_equal", True) for r in runs)
        table.append(row)
    base = table[0]
    for row in table:
        row["growth"] = round(row["report_s"] / base["report_s"], 2)
        row["rows_growth"] = round(row["rows"] / base["rows"], 2)
    targets: dict[str, Any] = {}
    big = next((r for r in table if r["rows"] == TARGET_ROWS), None)
    if big is not None:
        targets["10M_within_90s"] = {
            "value_s": big["report_s"],
            "met": big["report_s"] <= TARGET_SECONDS,
        }
    if len(table) > 1:
        last = table[-1]
        targets["no_worse_than_linear"] = {
            "time_growth": last["growth"],
            "rows_growth": last["rows_growth"],
            "met": last["growth"] <= last["rows_growth"],
        }
    ratios = [r["ratio"] for r in table if "ratio" in r]
    if ratios:
        targets["5x_reference"] = {"ratios": ratios, "met": all(x >= TARGET_RATIO for x in ratios)}
    return {"table": table, "targets": targets}


def print_table(result: dict[str, Any], file: Any) -> None:
    head = (
        "| rows | runs | report s (range) | report rows/s | reference s | reference rows/s "
        "| ratio | growth (rows) | report CPU s | load | totals |"
    )
    print(head, file=file)
    print("|" + "---:|" * 10 + "---|", file=file)
    for r in result["table"]:
        lo, hi = r["report_s_range"]
        print(
            f"| {r['rows']:,} | {r['runs']} | {r['report_s']} ({lo}-{hi}) | {r['report_rows_s']:,} "
            f"| {r.get('reference_s', 'n/a')} | {r.get('reference_rows_s', 0):,} "
            f"| {r.get('ratio', 'n/a')} | {r['growth']} ({r['rows_growth']}) "
            f"| {r['report_cpu_s']} | {r['load'][0]:.1f}-{r['load'][1]:.1f} "
            f"| {'equal' if r.get('totals_equal', True) else 'DIFFER'} |",
            file=file,
        )
    for name, t in result["targets"].items():
        print(f"target {name}: {'met' if t['met'] else 'MISSED'} {t}", file=file)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add: Callable[..., Any] = p.add_argument
    add("--rows", default="1000000,10000000", help="comma-separated sizes (default 1M,10M)")
    add("--seed", type=int, default=1, help="generator seed (default 1)")
    add("--runs", type=int, default=1, help="timed runs per size (default 1)")
    add("--master", default="local[2]", help="Spark master (default local[2])")
    add(
        "--cache-dir",
        default=os.path.join(tempfile.gettempdir(), "zonefleet-cost-report-bench"),
        help="where generated ledgers are kept, per (rows, seed)",
    )
    add("--python", default=sys.executable, help="interpreter for the report and the reference")
    add(
        "--checkout",
        default=str(REPO),
        help="run the report of another source tree (e.g. a git worktree with a change to "
        "measure); the reference sum always runs from this one",
    )
    add("--no-reference", action="store_true", help="time the report only")
    add(
        "--stages",
        action="store_true",
        help="run the report without --quiet and record the "
        "time of each of its progress lines (a diagnosis run; the figures then include them)",
    )
    add("--generate-only", action="store_true", help="write (or find) the ledgers and stop")
    add("--json", action="store_true", help="print one JSON object (table on stderr)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def log(message: str) -> None:
        stamp = f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.2f}]"
        print(f"{stamp} {message}", file=sys.stderr, flush=True)

    sizes = sorted({int(float(x)) for x in args.rows.split(",") if x.strip()})
    if args.generate_only:
        for rows in sizes:
            cached_ledgers(Path(args.cache_dir), rows, args.seed, log)
        return 0
    results = []
    try:
        for rows in sizes:
            results.append(bench_size(rows, args, log))
    except RuntimeError as exc:
        print(f"cost_report_bench: {exc}", file=sys.stderr)
        return 2
    summary = summarize(results)
    record = {
        "master": args.master,
        "cpus": os.cpu_count(),
        "checkout": str(Path(args.checkout).resolve()),
        "sizes": results,
        **summary,
    }
    print_table(summary, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(record), flush=True)
    return 0 if all(r.get("totals_equal", True) for r in summary["table"]) else 2


if __name__ == "__main__":
    sys.exit(main())
