"""Smoke tests for bench/: the produce/consume script against a real tansu, and the launcher."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPT = BENCH / "produce_consume.py"

pytest.importorskip("confluent_kafka", reason="bench extra not installed (confluent-kafka)")


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    """bench/ is a script directory, not a package: import its modules the way the script does."""
    sys.path.insert(0, str(BENCH))
    try:
        import produce_consume
        import tansu

        yield produce_consume, tansu
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def tansu_ok(bench: tuple[ModuleType, ModuleType]) -> None:
    """Skip, saying why, unless the tansu binary exists and answers on a free loopback port."""
    _, tansu = bench
    try:
        with tansu.run_tansu(startup_timeout=15.0):
            pass
    except tansu.TansuUnavailable as exc:
        pytest.skip(f"tansu cannot start on this machine: {exc}")


def _run(*args: str, timeout: float = 120.0) -> tuple[int, list[dict[str, object]], str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines, proc.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("tansu_ok")
def test_throughput_against_tansu_counts_match() -> None:
    rc, lines, stderr = _run("--broker", "tansu", "--messages", "2000", "--partitions", "3")
    assert rc == 0, stderr
    assert len(lines) == 1
    rec = lines[0]
    assert rec["target"] == "tansu" and rec["workload"] == "throughput"
    assert rec["messages"] == rec["acked"] == rec["consumed"] == 2000
    assert rec["errors"] == 0 and rec["ok"] is True
    assert rec["message_bytes"] == 1024 and rec["partitions"] == 3
    assert rec["produce_mb_s"] > 0 and rec["consume_mb_s"] > 0  # type: ignore[operator]
    p50, p99, p999 = rec["produce_p50_ms"], rec["produce_p99_ms"], rec["produce_p999_ms"]
    assert 0 < p50 <= p99 <= p999  # type: ignore[operator]


@pytest.mark.slow
@pytest.mark.usefixtures("tansu_ok")
def test_compare_against_given_bootstrap(bench: tuple[ModuleType, ModuleType]) -> None:
    """--compare with --bootstrap benchmarks that address, then a fresh tansu, then ratios."""
    _, tansu = bench
    with tansu.run_tansu() as other:
        rc, lines, stderr = _run(
            "--compare", "--bootstrap", other, "--workload", "latency",
            "--messages", "300", "--rate", "2000", "--size", "200",
        )  # fmt: skip
    assert rc == 0, stderr
    assert [line.get("target") for line in lines[:2]] == ["zonefleet", "tansu"]
    assert lines[0]["bootstrap"] == other and lines[1]["bootstrap"] != other
    summary = lines[2]
    assert summary["zonefleet"] == lines[0] and summary["tansu"] == lines[1]
    for side in (lines[0], lines[1]):
        assert side["acked"] == side["consumed"] == 300 and side["message_bytes"] == 200
    ratios = summary["compare"]
    assert isinstance(ratios, dict)
    expected = lines[0]["produce_p99_ms"] / lines[1]["produce_p99_ms"]  # type: ignore[operator]
    assert ratios["produce_p99_ms"] == pytest.approx(expected, abs=1e-3)


FAKE_ZONEFLEET = """
import signal, sys, time
args = sys.argv[1:]
open(sys.argv[0] + ".args", "w").write(" ".join(args))
mode = "{mode}"
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("starting", flush=True)
if mode == "ok":
    base = int(args[args.index("--base-port") + 1])
    print(f"zone=use1-az1 bootstrap=127.0.0.1:{{base}} admin=http://127.0.0.1:{{base + 1}}")
    print(f"zone=use1-az2 bootstrap=127.0.0.1:{{base + 10}}")
    print("ready", flush=True)
time.sleep(60)
"""


def _fake(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / f"fake_zonefleet_{mode}.py"
    script.write_text(FAKE_ZONEFLEET.format(mode=mode))
    return [sys.executable, str(script)]


def test_run_zonefleet_parses_zones_and_stops(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    produce_consume, _ = bench
    cmd = _fake(tmp_path, "ok")
    base = produce_consume.free_port_range(16)
    with produce_consume.run_zonefleet(tmp_path, base_port=base, command=cmd) as zones:
        assert zones == {
            "use1-az1": f"127.0.0.1:{base}",
            "use1-az2": f"127.0.0.1:{base + 10}",
        }
    args = Path(cmd[1] + ".args").read_text().split()
    assert args == ["up", "--data-dir", str(tmp_path), "--base-port", str(base), "--zones", "1"]


def test_run_zonefleet_without_ready_fails_clearly_and_kills(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    produce_consume, _ = bench
    started = time.monotonic()
    with pytest.raises(
        produce_consume.TargetUnavailable, match=r"no 'ready' line within 1 s.*starting"
    ):
        with produce_consume.run_zonefleet(
            tmp_path, command=_fake(tmp_path, "stubborn"), ready_timeout=1.0, stop_grace=0.5
        ):
            pytest.fail("must not yield without a ready line")
    # SIGTERM is ignored by the fake, so only the SIGKILL fallback can end it this quickly.
    assert time.monotonic() - started < 10


def test_run_zonefleet_early_exit_reports_exit_code(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    produce_consume, _ = bench
    crash = tmp_path / "crash.py"
    crash.write_text("import sys; print('boom', file=sys.stderr); sys.exit(7)\n")
    with pytest.raises(produce_consume.TargetUnavailable, match=r"exited with code 7.*boom"):
        with produce_consume.run_zonefleet(tmp_path, command=[sys.executable, str(crash)]):
            pytest.fail("must not yield after the process exited")


# -- --zones mode: zonefleet up --zones 3, proxies vs direct, cross-zone accounting ----------------


def test_zones_mode_reports_every_figure() -> None:
    rc, lines, stderr = _run(
        "--zones", "--json", "--messages", "2000", "--latency-messages", "200",
        "--e2e-messages", "200", "--cross-messages", "1000", "--timeout", "60",
    )  # fmt: skip
    assert rc == 0, stderr
    assert len(lines) == 1
    rec: dict[str, Any] = lines[0]
    assert rec["mode"] == "zones" and rec["ok"] is True and rec["problems"] == []
    assert rec["zones"] == ["az1", "az2", "az3"]
    assert rec["remote_zone"] == "az1" and rec["remote_main"] == 1 and rec["client_zone"] == "az2"
    assert rec["partitions"]  # led by main 1, out of the 6 created
    tp = rec["throughput"]
    assert tp["proxy_mb_s"] > 0 and tp["direct_mb_s"] > 0
    assert tp["ratio"] == pytest.approx(tp["proxy_mb_s"] / tp["direct_mb_s"], abs=1e-3)
    assert [leg["path"] for leg in tp["legs"]] == ["direct", "proxy", "proxy", "direct"]
    assert sum(leg["messages"] for leg in tp["legs"]) == 4000
    lat = rec["latency"]
    for path in ("proxy", "direct"):
        side = lat[path]
        assert side["samples"] == 200
        assert 0 < side["p50_ms"] <= side["p99_ms"] <= side["p999_ms"] <= side["max_ms"]
    e2e = rec["e2e"]
    assert e2e["consumed"] == e2e["samples"] == 200
    assert (e2e["producer_zone"], e2e["consumer_zone"]) == ("az2", "az3")
    assert 0 < e2e["p50_ms"] <= e2e["p99_ms"]
    cz = rec["cross_zone"]
    assert cz["payload_bytes"] == 1000 * 1024 and cz["consumed"] == 1000
    # Confirms cross zones (az2 proxy -> main 1 in az1) on every produce, so this is never 0.
    assert cz["cross_zone_bytes"] > 0 and cz["by_channel"].get("confirm-rpc", 0) > 0
    assert sum(cz["by_channel"].values()) == cz["cross_zone_bytes"]
    assert cz["fraction_pct"] == pytest.approx(
        100 * cz["cross_zone_bytes"] / cz["payload_bytes"], abs=1e-3
    )
    assert "kafka-client" not in cz["by_channel"]  # no payload crosses zones
    assert 0 < cz["confirm_bytes_per_partition"] <= 200
    assert cz["storage_bytes"] > cz["payload_bytes"]  # PREPARED write + mirror reads, regional
    assert "produce throughput MB/s" in stderr and "cross-zone bytes / payload" in stderr


def test_traffic_scrape_sums_nodes_and_deltas(bench: tuple[ModuleType, ModuleType]) -> None:
    """The /metrics parser: bytes and requests by key, summed over nodes, then differenced."""
    import zone_traffic  # importable while the bench fixture has bench/ on sys.path

    page = (
        "# TYPE zonefleet_traffic_bytes_total counter\n"
        'zonefleet_traffic_bytes_total{from_zone="az2",to_zone="az1",channel="confirm-rpc",'
        'api="confirm"} 300\n'
        'zonefleet_traffic_requests_total{from_zone="az2",to_zone="az1",channel="confirm-rpc",'
        'api="confirm"} 3\n'
        "zonefleet_wal_fsync_seconds_count 7\n"
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        totals = zone_traffic.scrape_traffic([url, url])
    finally:
        server.shutdown()
    key = ("az2", "az1", "confirm-rpc", "confirm")
    assert totals == {key: (600.0, 6.0)}
    before = {key: (100.0, 1.0), ("az1", "az1", "rpc", "x"): (5.0, 1.0)}
    assert zone_traffic.traffic_delta(before, totals) == {key: (500.0, 5.0)}
