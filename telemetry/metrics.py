"""A small Prometheus-compatible metric registry (text exposition format 0.0.4).

Updates (`inc`, `set`, `observe`) are plain attribute arithmetic without locks: they run on
the produce/fetch hot path of a single trio thread. Calls from worker threads are safe for
the process but a concurrent `+=` may rarely lose an increment.

Why not `prometheus_client` (issue 12): `bench/metrics_bench.py` measured it 3-6.5x slower
per hot-path update (a labelled counter inc 1.1 us against 0.18 us; a labelled histogram
observe 1.5 us against 0.24 us: it takes a lock per update) and 13x slower to render
`/metrics` (7.4 ms against 0.56 ms for a realistic registry). Figures and command in
docs/performance.md, "Issue 12: metrics registry".
"""

from __future__ import annotations

import logging
import math
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Generic, TypeVar

__all__ = [
    "DEFAULT_LATENCY_BUCKETS",
    "DEFAULT_SIZE_BUCKETS",
    "BrokerMetrics",
    "Counter",
    "CounterChild",
    "Gauge",
    "GaugeChild",
    "Histogram",
    "HistogramChild",
    "MetricsRegistry",
]

log = logging.getLogger(__name__)

DEFAULT_LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
# Byte sizes from 512 B to 128 MiB, x4 apart.
DEFAULT_SIZE_BUCKETS: tuple[float, ...] = tuple(float(512 * 4**i) for i in range(10))

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _fmt_value(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


def _fmt_bound(b: float) -> str:
    return "+Inf" if math.isinf(b) else repr(float(b))


def _label_pairs(names: Sequence[str], values: Sequence[str]) -> str:
    return ",".join(f'{n}="{_escape_label_value(v)}"' for n, v in zip(names, values, strict=True))


class CounterChild:
    """One counter time series."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value: float = 0

    def inc(self, n: float = 1) -> None:
        if n < 0:
            raise ValueError("counters only go up")
        self._value += n

    @property
    def value(self) -> float:
        return self._value


class GaugeChild:
    """One gauge time series; `set_function` makes its value computed at render time."""

    __slots__ = ("_fn", "_value")

    def __init__(self) -> None:
        self._value: float = 0
        self._fn: Callable[[], float] | None = None

    def set(self, v: float) -> None:
        self._value = v

    def inc(self, n: float = 1) -> None:
        self._value += n

    def dec(self, n: float = 1) -> None:
        self._value -= n

    def set_function(self, fn: Callable[[], float] | None) -> None:
        """Compute the value with `fn()` at render time (None reverts to the stored value)."""
        self._fn = fn

    @property
    def value(self) -> float:
        fn = self._fn
        if fn is None:
            return self._value
        try:
            return float(fn())
        except Exception:
            log.exception("gauge function failed")
            return math.nan


class HistogramChild:
    """One histogram time series. Bucket counts are kept per bucket, cumulated at render."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds  # finite upper bounds; the last count slot is +Inf
        self._counts = [0] * (len(bounds) + 1)
        self._sum: float = 0

    def observe(self, v: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le = "less or equal").
        self._counts[bisect_left(self._bounds, v)] += 1
        self._sum += v

    @property
    def sum(self) -> float:
        return self._sum

    @property
    def count(self) -> int:
        return sum(self._counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, ending with +Inf."""
        out: list[tuple[float, int]] = []
        acc = 0
        for bound, c in zip((*self._bounds, math.inf), self._counts, strict=True):
            acc += c
            out.append((bound, acc))
        return out


C = TypeVar("C", CounterChild, GaugeChild, HistogramChild)


class _Metric(Generic[C]):
    """Shared label handling: children are cached per label-value tuple."""

    kind = ""

    def __init__(self, name: str, help: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.help = help
        self.labelnames = labelnames
        # canonical (str tuple) -> child, and any tuple a caller used -> child (fast path)
        self._children: dict[tuple[str, ...], C] = {}
        self._lookup: dict[tuple[object, ...], C] = {}
        self._pairs: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()
        self._default: C | None = None
        if not labelnames:
            self._default = self._child_for(())

    def _new_child(self) -> C:
        raise NotImplementedError

    def _child_for(self, values: tuple[str, ...]) -> C:
        with self._lock:
            child = self._children.get(values)
            if child is None:
                child = self._new_child()
                self._children[values] = child
                self._pairs[values] = _label_pairs(self.labelnames, values)
            return child

    def labels(self, *values: str, **kv: str) -> C:
        """The child for these label values (positional in label order, or by name)."""
        if not kv:
            child = self._lookup.get(values)
            if child is not None:
                return child
        return self._labels_slow(values, kv)

    def _labels_slow(self, values: tuple[str, ...], kv: dict[str, str]) -> C:
        if not self.labelnames:
            raise ValueError(f"{self.name} has no labels")
        if kv:
            if values:
                raise ValueError("pass label values positionally or by name, not both")
            if set(kv) != set(self.labelnames):
                raise ValueError(f"{self.name} expects labels {self.labelnames}, got {sorted(kv)}")
            canon = tuple(str(kv[n]) for n in self.labelnames)
        else:
            if len(values) != len(self.labelnames):
                raise ValueError(
                    f"{self.name} expects {len(self.labelnames)} label values, got {len(values)}"
                )
            canon = tuple(str(v) for v in values)
        child = self._child_for(canon)
        if not kv:
            self._lookup[values] = child
        self._lookup[canon] = child
        return child

    def remove(self, *values: str) -> None:
        """Drop one labelled series (e.g. for a deleted topic)."""
        canon = tuple(str(v) for v in values)
        with self._lock:
            child = self._children.pop(canon, None)
            self._pairs.pop(canon, None)
            if child is not None:
                self._lookup = {k: c for k, c in self._lookup.items() if c is not child}

    def _labelled_error(self) -> ValueError:
        return ValueError(f"{self.name} has labels {self.labelnames}; use .labels(...)")

    def _unlabelled(self) -> C:
        if self._default is None:
            raise self._labelled_error()
        return self._default

    def _series(self) -> list[tuple[str, C]]:
        with self._lock:
            items = sorted(self._children.items())
            return [(self._pairs[k], c) for k, c in items]

    def render_into(self, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {_escape_help(self.help)}")
        out.append(f"# TYPE {self.name} {self.kind}")
        self._render_samples(out)

    def _render_samples(self, out: list[str]) -> None:
        for pairs, child in self._series():
            labels = f"{{{pairs}}}" if pairs else ""
            out.append(f"{self.name}{labels} {_fmt_value(self._sample(child))}")

    def _sample(self, child: C) -> float:
        raise NotImplementedError


class Counter(_Metric[CounterChild]):
    """A monotonically increasing counter."""

    kind = "counter"

    def inc(self, n: float = 1) -> None:
        d = self._default
        if d is None:
            raise self._labelled_error()
        d.inc(n)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _sample(self, child: CounterChild) -> float:
        return child.value

    @property
    def value(self) -> float:
        return self._unlabelled().value


class Gauge(_Metric[GaugeChild]):
    """A value that goes up and down."""

    kind = "gauge"

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def _sample(self, child: GaugeChild) -> float:
        return child.value

    def set(self, v: float) -> None:
        self._unlabelled().set(v)

    def inc(self, n: float = 1) -> None:
        self._unlabelled().inc(n)

    def dec(self, n: float = 1) -> None:
        self._unlabelled().dec(n)

    def set_function(self, fn: Callable[[], float] | None) -> None:
        self._unlabelled().set_function(fn)

    @property
    def value(self) -> float:
        return self._unlabelled().value


class Histogram(_Metric[HistogramChild]):
    """Observations counted into cumulative `le` buckets, with _sum and _count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]
    ) -> None:
        self.buckets = buckets
        super().__init__(name, help, labelnames)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.buckets)

    def observe(self, v: float) -> None:
        d = self._default
        if d is None:
            raise self._labelled_error()
        d.observe(v)

    def _render_samples(self, out: list[str]) -> None:
        name = self.name
        for pairs, child in self._series():
            prefix = f"{pairs}," if pairs else ""
            for bound, acc in child.cumulative():
                out.append(f'{name}_bucket{{{prefix}le="{_fmt_bound(bound)}"}} {acc}')
            labels = f"{{{pairs}}}" if pairs else ""
            out.append(f"{name}_sum{labels} {_fmt_value(child.sum)}")
            out.append(f"{name}_count{labels} {child.count}")


M = TypeVar("M", Counter, Gauge, Histogram)


def _check_labels(
    name: str, labels: Sequence[str], reserved: tuple[str, ...] = ()
) -> tuple[str, ...]:
    if isinstance(labels, str):
        raise TypeError("labels must be a sequence of names, not a string")
    out = tuple(labels)
    for label in out:
        if not _LABEL_RE.match(label) or label.startswith("__") or label in reserved:
            raise ValueError(f"invalid label name {label!r} for {name}")
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate label names for {name}: {out}")
    return out


def _check_buckets(buckets: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(b) for b in buckets if not (math.isinf(b) and b > 0))
    if any(math.isnan(b) for b in out) or any(a >= b for a, b in pairwise(out)):
        raise ValueError(f"histogram buckets must be strictly increasing: {buckets}")
    return out


class MetricsRegistry:
    """Holds metrics by name and renders them in name order."""

    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        self._lock = threading.Lock()

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        labelnames = _check_labels(name, labels)
        return self._register(Counter, name, labelnames, lambda: Counter(name, help, labelnames))

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        labelnames = _check_labels(name, labels)
        return self._register(Gauge, name, labelnames, lambda: Gauge(name, help, labelnames))

    def gauge_functions(self, gauges: Mapping[str, tuple[str, Callable[[], float]]]) -> None:
        """Gauges read from the given functions at each scrape: {name: (help, function)}."""
        for name, (help_text, fn) in gauges.items():
            self.gauge(name, help_text).set_function(fn)

    def histogram(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_LATENCY_BUCKETS,
    ) -> Histogram:
        labelnames = _check_labels(name, labels, reserved=("le",))
        bounds = _check_buckets(buckets)
        metric = self._register(
            Histogram, name, labelnames, lambda: Histogram(name, help, labelnames, bounds)
        )
        if metric.buckets != bounds:
            raise ValueError(f"{name} already registered with buckets {metric.buckets}")
        return metric

    def _register(
        self,
        cls: type[M],
        name: str,
        labelnames: tuple[str, ...],
        make: Callable[[], M],
    ) -> M:
        if not _NAME_RE.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        with self._lock:
            existing = self._metrics.get(name)
            if existing is None:
                metric = make()
                self._metrics[name] = metric
                return metric
        if type(existing) is not cls or existing.labelnames != labelnames:
            raise ValueError(
                f"{name} already registered as {existing.kind} with labels {existing.labelnames}"
            )
        return existing

    def get(self, name: str) -> Counter | Gauge | Histogram | None:
        return self._metrics.get(name)

    def render(self) -> str:
        """All metrics in the Prometheus text format 0.0.4, sorted by name and labels."""
        with self._lock:
            metrics = sorted(self._metrics.items())
        out: list[str] = []
        for _, metric in metrics:
            metric.render_into(out)
        return "\n".join(out) + "\n" if out else ""


@dataclass
class BrokerMetrics:
    """The standard broker metric set, so every broker names them the same."""

    requests: Counter
    request_latency: Histogram
    request_errors: Counter
    bytes_in: Counter
    bytes_out: Counter
    wal_fsync_latency: Histogram
    wal_group_bytes: Histogram
    partitions: Gauge
    connections: Gauge
    bad_input: Counter
    auth_failures: Counter

    @classmethod
    def create(cls, registry: MetricsRegistry) -> BrokerMetrics:
        return cls(
            requests=registry.counter(
                "zonefleet_requests_total", "Kafka requests handled, by API.", ("api",)
            ),
            request_latency=registry.histogram(
                "zonefleet_request_latency_seconds",
                "Kafka request handling latency in seconds, by API.",
                ("api",),
            ),
            request_errors=registry.counter(
                "zonefleet_request_errors_total",
                "Kafka requests that failed, by API and error name.",
                ("api", "error"),
            ),
            bytes_in=registry.counter(
                "zonefleet_bytes_in_total", "Produce payload bytes accepted, by topic.", ("topic",)
            ),
            bytes_out=registry.counter(
                "zonefleet_bytes_out_total", "Fetch payload bytes served, by topic.", ("topic",)
            ),
            wal_fsync_latency=registry.histogram(
                "zonefleet_wal_fsync_seconds", "WAL fsync (durable sync) latency in seconds."
            ),
            wal_group_bytes=registry.histogram(
                "zonefleet_wal_group_commit_bytes",
                "Bytes written per WAL group commit.",
                buckets=DEFAULT_SIZE_BUCKETS,
            ),
            partitions=registry.gauge("zonefleet_partitions", "Partitions hosted by this node."),
            connections=registry.gauge("zonefleet_connections", "Open client connections."),
            bad_input=registry.counter(
                "zonefleet_bad_input_total",
                "Requests and frames refused as malformed (their warnings are rate-limited per "
                "peer), by kind: frame, request, relay, rpc.",
                ("kind",),
            ),
            auth_failures=registry.counter(
                "zonefleet_authentication_failures_total",
                "Failed SASL authentications, by listener and mechanism.",
                ("listener", "mechanism"),
            ),
        )
