"""Metric-update and exposition cost: telemetry.metrics vs prometheus_client (issue 12).

Times the operations the produce/fetch hot paths do (main_broker/broker.py, api_produce.py,
api_fetch.py, confirm.py, proxy_broker/broker.py, telemetry/traffic.py): a labelled counter
`inc` through `.labels(...)` on every call (as the call sites do today), the same on a cached
child (how prometheus_client wants hot paths written), a histogram `observe` (labelled and
not) and a gauge `inc`/`set`; then the `/metrics` rendering of a realistic registry (the
BrokerMetrics set over 40 APIs and 50 topics, plus a traffic-accounting counter pair with 200
label sets). One JSON line per operation: ns/op for each side and the ratio prom/ours.

    .venv/bin/python bench/metrics_bench.py [--repeat 5] [--number 200000]
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable

import prometheus_client as prom
from prometheus_client import CollectorRegistry, generate_latest

from telemetry.metrics import DEFAULT_LATENCY_BUCKETS, DEFAULT_SIZE_BUCKETS, MetricsRegistry

APIS = [f"Api{i}" for i in range(40)]
TOPICS = [f"topic-{i}" for i in range(50)]
TRAFFIC = [
    (f"az{a}", f"az{b}", f"ch{c}", f"api{d}")
    for a in range(2)
    for b in range(5)
    for c in range(4)
    for d in range(5)
]


def _ours() -> tuple[dict[str, Callable[[], object]], Callable[[], object]]:
    reg = MetricsRegistry()
    requests = reg.counter("zonefleet_requests_total", "Kafka requests handled, by API.", ("api",))
    latency = reg.histogram("zonefleet_request_latency_seconds", "Latency.", ("api",))
    bytes_in = reg.counter("zonefleet_bytes_in_total", "Bytes in.", ("topic",))
    fsync = reg.histogram("zonefleet_wal_fsync_seconds", "fsync.")
    group = reg.histogram("zonefleet_wal_group_commit_bytes", "g.", buckets=DEFAULT_SIZE_BUCKETS)
    conns = reg.gauge("zonefleet_connections", "Open client connections.")
    tb = reg.counter(
        "zonefleet_traffic_bytes_total", "t", ("from_zone", "to_zone", "channel", "api")
    )
    tr = reg.counter(
        "zonefleet_traffic_requests_total", "t", ("from_zone", "to_zone", "channel", "api")
    )
    ops = _fill_and_ops(requests, latency, bytes_in, fsync, group, conns, tb, tr)
    return ops, reg.render


def _prom() -> tuple[dict[str, Callable[[], object]], Callable[[], object]]:
    prom.disable_created_metrics()
    reg = CollectorRegistry(auto_describe=False)
    requests = prom.Counter("zonefleet_requests", "Kafka requests.", ("api",), registry=reg)
    latency = prom.Histogram(
        "zonefleet_request_latency_seconds",
        "Latency.",
        ("api",),
        registry=reg,
        buckets=DEFAULT_LATENCY_BUCKETS,
    )
    bytes_in = prom.Counter("zonefleet_bytes_in", "Bytes in.", ("topic",), registry=reg)
    fsync = prom.Histogram(
        "zonefleet_wal_fsync_seconds", "fsync.", registry=reg, buckets=DEFAULT_LATENCY_BUCKETS
    )
    group = prom.Histogram(
        "zonefleet_wal_group_commit_bytes", "g.", registry=reg, buckets=DEFAULT_SIZE_BUCKETS
    )
    conns = prom.Gauge("zonefleet_connections", "Open client connections.", registry=reg)
    labels = ("from_zone", "to_zone", "channel", "api")
    tb = prom.Counter("zonefleet_traffic_bytes", "t", labels, registry=reg)
    tr = prom.Counter("zonefleet_traffic_requests", "t", labels, registry=reg)
    ops = _fill_and_ops(requests, latency, bytes_in, fsync, group, conns, tb, tr)
    return ops, lambda: generate_latest(reg)


def _fill_and_ops(requests, latency, bytes_in, fsync, group, conns, tb, tr):  # type: ignore[no-untyped-def]
    """Fill either registry alike, then the hot-path operations on its metrics."""
    for api in APIS:
        requests.labels(api).inc(5)
        latency.labels(api).observe(0.002)
    for topic in TOPICS:
        bytes_in.labels(topic).inc(4096)
    fsync.observe(0.001)
    group.observe(65536)
    for key in TRAFFIC:
        tb.labels(*key).inc(100)
        tr.labels(*key).inc(1)
    child = requests.labels("Produce")
    ops: dict[str, Callable[[], object]] = {
        "counter_labels_inc": lambda: bytes_in.labels("topic-7").inc(1024),
        "counter_cached_child_inc": lambda: child.inc(),
        "histogram_labels_observe": lambda: latency.labels("Produce").observe(0.0031),
        "histogram_observe": lambda: fsync.observe(0.0012),
        "gauge_inc": lambda: conns.inc(),
        "gauge_set": lambda: conns.set(3),
    }
    return ops


def _best(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--number", type=int, default=200_000)
    args = ap.parse_args()
    ours_ops, ours_render = _ours()
    prom_ops, prom_render = _prom()
    for name in ours_ops:
        a = _best(ours_ops[name], args.number, args.repeat)
        b = _best(prom_ops[name], args.number, args.repeat)
        print(
            json.dumps(
                {
                    "op": name,
                    "ours_ns": round(a, 1),
                    "prom_ns": round(b, 1),
                    "prom_over_ours": round(b / a, 2),
                }
            )
        )
    n = max(1, args.number // 1000)
    a = _best(ours_render, n, args.repeat)
    b = _best(prom_render, n, args.repeat)
    print(
        json.dumps(
            {
                "op": "render_metrics",
                "ours_us": round(a / 1e3, 1),
                "prom_us": round(b / 1e3, 1),
                "prom_over_ours": round(b / a, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
