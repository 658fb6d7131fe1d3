"""Tests for the metric registry, traffic accounting and the JSONL traffic sink."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import trio

from telemetry import (
    DEFAULT_LATENCY_BUCKETS,
    BrokerMetrics,
    JsonlTrafficSink,
    MetricsRegistry,
    TrafficAccounting,
    minute_iso,
)

# --- a small parser for the text exposition format 0.0.4 ---------------------------------

_SAMPLE_RE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)\Z")
_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|\Z)')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _parse_labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _PAIR_RE.match(text, pos)
        assert m, f"bad label set at {text[pos:]!r}"
        out[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return out


def _parse_value(text: str) -> float:
    return {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(text) or float(text)


def parse_exposition(text: str) -> dict[str, dict]:
    """Return {family: {"help", "type", "samples": [(name, labels, value)]}}."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            current = families.setdefault(name, {"samples": []})
            current["help"] = _unescape(help_text)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name in families, "TYPE must follow HELP of the same family"
            families[name]["type"] = kind
        else:
            m = _SAMPLE_RE.match(line)
            assert m, f"bad sample line {line!r}"
            assert current is not None
            labels = _parse_labels(m.group(3) or "")
            current["samples"].append((m.group(1), labels, _parse_value(m.group(4))))
    return families


def sample(families: dict, family: str, name: str, **labels: str) -> float:
    for n, lbls, value in families[family]["samples"]:
        if n == name and lbls == labels:
            return value
    raise KeyError((name, labels))


# --- registry ------------------------------------------------------------------------------


def test_tiny_registry_renders_exact_text() -> None:
    reg = MetricsRegistry()
    c = reg.counter("zonefleet_requests_total", "Requests.", ["api"])
    g = reg.gauge("zonefleet_connections", "Open connections.")
    c.labels("produce").inc()
    c.labels("produce").inc(2)
    c.labels(api="fetch").inc()
    g.set(3)
    g.dec()
    assert reg.render() == (
        "# HELP zonefleet_connections Open connections.\n"
        "# TYPE zonefleet_connections gauge\n"
        "zonefleet_connections 2\n"
        "# HELP zonefleet_requests_total Requests.\n"
        "# TYPE zonefleet_requests_total counter\n"
        'zonefleet_requests_total{api="fetch"} 1\n'
        'zonefleet_requests_total{api="produce"} 3\n'
    )


def test_empty_registry_renders_empty() -> None:
    assert MetricsRegistry().render() == ""


def test_render_is_deterministic_regardless_of_creation_order() -> None:
    def build(order: list[str]) -> str:
        reg = MetricsRegistry()
        for name in order:
            reg.counter(name, "h", ["k"]).labels(name[-1]).inc()
        for v in reversed("abc"):
            reg.counter("m_x", "h", ["k"]).labels(v).inc()
        return reg.render()

    assert build(["m_b", "m_a", "m_c"]) == build(["m_c", "m_b", "m_a"])


def test_children_are_cached_per_label_tuple() -> None:
    reg = MetricsRegistry()
    c = reg.counter("x_total", "h", ["a", "b"])
    child = c.labels("1", "2")
    assert c.labels("1", "2") is child
    assert c.labels(a="1", b="2") is child
    assert c.labels(b="2", a="1") is child
    assert c.labels("1", "3") is not child
    child.inc(5)
    assert c.labels(a="1", b="2").value == 5


def test_label_arity_and_type_errors() -> None:
    reg = MetricsRegistry()
    c = reg.counter("x_total", "h", ["a"])
    with pytest.raises(ValueError):
        c.labels("1", "2")
    with pytest.raises(ValueError):
        c.labels(b="1")
    with pytest.raises(ValueError):
        c.inc()  # labelled metric used without labels
    with pytest.raises(ValueError):
        c.labels("1").inc(-1)
    plain = reg.counter("y_total", "h")
    with pytest.raises(ValueError):
        plain.labels("1")
    with pytest.raises(ValueError):
        reg.counter("bad name", "h")
    with pytest.raises(ValueError):
        reg.counter("z_total", "h", ["__reserved"])
    with pytest.raises(ValueError):
        reg.histogram("h_seconds", "h", ["le"])
    with pytest.raises(ValueError):
        reg.histogram("h2_seconds", "h", buckets=[1, 0.5])


def test_reregistration_returns_same_metric_or_raises() -> None:
    reg = MetricsRegistry()
    c = reg.counter("x_total", "h", ["a"])
    assert reg.counter("x_total", "other help", ("a",)) is c
    with pytest.raises(ValueError):
        reg.counter("x_total", "h", ["b"])
    with pytest.raises(ValueError):
        reg.gauge("x_total", "h", ["a"])
    h = reg.histogram("lat_seconds", "h", buckets=[1, 2])
    assert reg.histogram("lat_seconds", "h", buckets=[1, 2]) is h
    with pytest.raises(ValueError):
        reg.histogram("lat_seconds", "h", buckets=[1, 3])


def test_label_value_and_help_escaping_round_trips() -> None:
    reg = MetricsRegistry()
    nasty = 'a"b\\c\nd,e="f"}'
    reg.counter("x_total", 'help with \\ and\nnewline "quoted"', ["topic"]).labels(nasty).inc(7)
    text = reg.render()
    assert 'topic="a\\"b\\\\c\\nd,e=\\"f\\"}"' in text
    assert '# HELP x_total help with \\\\ and\\nnewline "quoted"\n' in text
    assert len(text.splitlines()) == 3  # no raw newline leaked into the output
    fam = parse_exposition(text)
    assert fam["x_total"]["help"] == 'help with \\ and\nnewline "quoted"'
    assert sample(fam, "x_total", "x_total", topic=nasty) == 7


def test_histogram_buckets_are_cumulative() -> None:
    reg = MetricsRegistry()
    h = reg.histogram("lat_seconds", "Latency.", ["api"], buckets=[0.1, 1, 10])
    values = [0.05, 0.1, 0.5, 1.0, 3, 10, 11, 1000]
    for v in values:
        h.labels("produce").observe(v)
    fam = parse_exposition(reg.render())
    assert fam["lat_seconds"]["type"] == "histogram"

    def bucket(le: str) -> float:
        return sample(fam, "lat_seconds", "lat_seconds_bucket", api="produce", le=le)

    # A value equal to a bound counts in that bound's bucket (le = less or equal).
    assert bucket("0.1") == sum(v <= 0.1 for v in values) == 2
    assert bucket("1.0") == sum(v <= 1 for v in values) == 4
    assert bucket("10.0") == sum(v <= 10 for v in values) == 6
    assert bucket("+Inf") == len(values)
    assert sample(fam, "lat_seconds", "lat_seconds_count", api="produce") == len(values)
    assert sample(fam, "lat_seconds", "lat_seconds_sum", api="produce") == pytest.approx(
        sum(values)
    )
    names = [n for n, _, _ in fam["lat_seconds"]["samples"]]
    assert names == ["lat_seconds_bucket"] * 4 + ["lat_seconds_sum", "lat_seconds_count"]


def test_unlabelled_histogram_and_default_buckets() -> None:
    reg = MetricsRegistry()
    h = reg.histogram("fsync_seconds", "h")
    h.observe(0.003)
    fam = parse_exposition(reg.render())
    buckets = [
        (lbls["le"], v) for n, lbls, v in fam["fsync_seconds"]["samples"] if n.endswith("_bucket")
    ]
    assert len(buckets) == len(DEFAULT_LATENCY_BUCKETS) + 1
    counts = [v for _, v in buckets]
    assert counts == sorted(counts)  # cumulative, never decreasing
    assert dict(buckets)["0.0025"] == 0
    assert dict(buckets)["0.005"] == 1


def test_gauge_set_function_is_evaluated_at_render_time() -> None:
    reg = MetricsRegistry()
    g = reg.gauge("zonefleet_partitions", "h")
    lg = reg.gauge("queue_depth", "h", ["queue"])
    state = {"n": 1}
    g.set_function(lambda: state["n"])
    lg.labels("wal").set_function(lambda: state["n"] * 10)
    lg.labels("s3").set(2.5)
    assert (
        sample(parse_exposition(reg.render()), "zonefleet_partitions", "zonefleet_partitions") == 1
    )
    state["n"] = 42
    fam = parse_exposition(reg.render())
    assert sample(fam, "zonefleet_partitions", "zonefleet_partitions") == 42
    assert sample(fam, "queue_depth", "queue_depth", queue="wal") == 420
    assert sample(fam, "queue_depth", "queue_depth", queue="s3") == 2.5
    g.set_function(lambda: 1 / 0)  # a failing callback must not break the endpoint
    assert math.isnan(
        sample(parse_exposition(reg.render()), "zonefleet_partitions", "zonefleet_partitions")
    )


def test_remove_drops_a_series() -> None:
    reg = MetricsRegistry()
    c = reg.counter("x_total", "h", ["topic"])
    c.labels("a").inc()
    old = c.labels("b")
    old.inc()
    c.remove("b")
    assert 'topic="b"' not in reg.render()
    assert c.labels("b") is not old
    assert c.labels("b").value == 0


def test_broker_metrics_names() -> None:
    reg = MetricsRegistry()
    bm = BrokerMetrics.create(reg)
    assert BrokerMetrics.create(reg).requests is bm.requests  # idempotent per registry
    bm.requests.labels("produce").inc()
    bm.request_latency.labels("produce").observe(0.002)
    bm.request_errors.labels("produce", "NOT_LEADER_OR_FOLLOWER").inc()
    bm.bytes_in.labels("t").inc(100)
    bm.bytes_out.labels("t").inc(50)
    bm.wal_fsync_latency.observe(0.001)
    bm.wal_group_bytes.observe(3000)
    bm.partitions.set(4)
    bm.connections.inc()
    bm.bad_input.labels("frame").inc()
    bm.auth_failures.labels("SASL", "PLAIN").inc()
    fam = parse_exposition(reg.render())
    assert {k: v["type"] for k, v in fam.items()} == {
        "zonefleet_authentication_failures_total": "counter",
        "zonefleet_bad_input_total": "counter",
        "zonefleet_requests_total": "counter",
        "zonefleet_request_latency_seconds": "histogram",
        "zonefleet_request_errors_total": "counter",
        "zonefleet_bytes_in_total": "counter",
        "zonefleet_bytes_out_total": "counter",
        "zonefleet_wal_fsync_seconds": "histogram",
        "zonefleet_wal_group_commit_bytes": "histogram",
        "zonefleet_partitions": "gauge",
        "zonefleet_connections": "gauge",
    }
    assert (
        sample(
            fam,
            "zonefleet_request_errors_total",
            "zonefleet_request_errors_total",
            api="produce",
            error="NOT_LEADER_OR_FOLLOWER",
        )
        == 1
    )
    assert sample(fam, "zonefleet_bytes_in_total", "zonefleet_bytes_in_total", topic="t") == 100


# --- traffic accounting -------------------------------------------------------------------


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


T0 = 1_795_343_400.0  # 2026-11-22T10:30:00Z, a minute boundary


def test_minute_iso() -> None:
    assert minute_iso(int(T0 // 60)) == "2026-11-22T10:30:00Z"
    assert minute_iso(int(T0 // 60) + 61) == "2026-11-22T11:31:00Z"


def test_traffic_counters_and_minute_rollover(tmp_path: Path) -> None:
    reg = MetricsRegistry()
    clock = FakeClock(T0 + 5)
    sink = JsonlTrafficSink(tmp_path / "traffic" / "node-1.jsonl")
    ta = TrafficAccounting(reg, "main-1", sink, clock=clock)

    ta.record("az1", "az2", "confirm", "produce", 100)
    ta.record("az1", "az2", "confirm", "produce", 50)
    ta.record("az1", "az1", "client", "fetch", 4000)
    clock.t = T0 + 59.999
    ta.record("az2", "az1", "state", "stream", 10)
    assert ta.flush() == []  # the minute has not ended yet
    assert not sink.path.exists()

    clock.t = T0 + 60  # next minute
    ta.record("az1", "az2", "confirm", "produce", 7)
    rows = ta.flush()
    first = "2026-11-22T10:30:00Z"
    assert rows == [
        {
            "minute": first,
            "node": "main-1",
            "from_zone": "az1",
            "to_zone": "az1",
            "channel": "client",
            "api": "fetch",
            "topic": "",
            "bytes": 4000,
            "requests": 1,
            "cross_zone": False,
        },
        {
            "minute": first,
            "node": "main-1",
            "from_zone": "az1",
            "to_zone": "az2",
            "channel": "confirm",
            "api": "produce",
            "topic": "",
            "bytes": 150,
            "requests": 2,
            "cross_zone": True,
        },
        {
            "minute": first,
            "node": "main-1",
            "from_zone": "az2",
            "to_zone": "az1",
            "channel": "state",
            "api": "stream",
            "topic": "",
            "bytes": 10,
            "requests": 1,
            "cross_zone": True,
        },
    ]
    assert ta.flush() == []  # flushed rows are not repeated

    # Counters are cumulative across minutes.
    fam = parse_exposition(reg.render())
    key = {"from_zone": "az1", "to_zone": "az2", "channel": "confirm", "api": "produce"}
    bytes_family = "zonefleet_traffic_bytes_total"
    reqs_family = "zonefleet_traffic_requests_total"
    assert sample(fam, bytes_family, bytes_family, **key) == 157
    assert sample(fam, reqs_family, reqs_family, **key) == 3

    # Skip two minutes: only minutes with traffic produce rows.
    rows = ta.flush(now_s=T0 + 200)
    assert [(r["minute"], r["bytes"], r["requests"]) for r in rows] == [
        ("2026-11-22T10:31:00Z", 7, 1)
    ]

    lines = sink.path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [*ta_rows_first(first), rows[0]]


def ta_rows_first(minute: str) -> list[dict]:
    def row(f: str, t: str, ch: str, api: str, b: int, r: int) -> dict:
        return {
            "minute": minute,
            "node": "main-1",
            "from_zone": f,
            "to_zone": t,
            "channel": ch,
            "api": api,
            "topic": "",
            "bytes": b,
            "requests": r,
            "cross_zone": f != t,
        }

    return [
        row("az1", "az1", "client", "fetch", 4000, 1),
        row("az1", "az2", "confirm", "produce", 150, 2),
        row("az2", "az1", "state", "stream", 10, 1),
    ]


def test_traffic_minutes_accumulate_until_flushed_and_clock_going_back() -> None:
    clock = FakeClock(T0)
    ta = TrafficAccounting(MetricsRegistry(), "p-1", clock=clock)
    for i in range(5):  # five consecutive minutes, one flush at the end
        clock.t = T0 + 60 * i + 1
        ta.record("a", "b", "relay", "join_group", 10 * (i + 1))
    clock.t -= 120  # a clock step backwards is charged to the open minute
    ta.record("a", "b", "relay", "join_group", 1)
    rows = ta.flush(now_s=T0 + 60 * 5)
    assert [r["minute"][11:16] for r in rows] == ["10:30", "10:31", "10:32", "10:33", "10:34"]
    assert [r["bytes"] for r in rows] == [10, 20, 30, 40, 51]
    assert all(r["cross_zone"] for r in rows)


def test_flush_include_open_closes_current_minute(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 10)
    sink = JsonlTrafficSink(tmp_path / "t.jsonl")
    ta = TrafficAccounting(MetricsRegistry(), "n", sink, clock=clock)
    ta.record("a", "a", "client", "produce", 5)
    assert ta.flush() == []
    rows = ta.flush(include_open=True)
    assert [(r["bytes"], r["requests"]) for r in rows] == [(5, 1)]
    ta.record("a", "a", "client", "produce", 6)  # same minute again: a second row later
    assert [r["bytes"] for r in ta.flush(include_open=True)] == [6]
    assert [json.loads(x)["bytes"] for x in sink.path.read_text().splitlines()] == [5, 6]


def test_jsonl_sink_appends(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "traffic.jsonl"
    sink = JsonlTrafficSink(str(path))
    sink.write([{"a": 1}, {"b": "x"}])
    sink.write([])
    sink.write([{"c": True}])
    assert path.read_text() == '{"a":1}\n{"b":"x"}\n{"c":true}\n'


async def test_run_flusher_writes_in_background_and_on_cancel(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 1)
    sink = JsonlTrafficSink(tmp_path / "t.jsonl")
    ta = TrafficAccounting(MetricsRegistry(), "n", sink, clock=clock)
    ta.record("a", "b", "confirm", "produce", 3)
    async with trio.open_nursery() as nursery:
        await nursery.start(ta.run_flusher, 0.01)
        clock.t = T0 + 61
        ta.record("a", "b", "confirm", "produce", 4)  # rolls the minute
        for _ in range(200):
            await trio.sleep(0.01)
            if sink.path.exists():
                break
        assert [json.loads(x)["bytes"] for x in sink.path.read_text().splitlines()] == [3]
        nursery.cancel_scope.cancel()
    # Cancellation flushed the open minute too.
    assert [json.loads(x)["bytes"] for x in sink.path.read_text().splitlines()] == [3, 4]
