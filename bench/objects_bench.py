"""Issue-4 figures of the object tier, on a real S3 server (SeaweedFS, started here).

Every leg runs its own ``zonefleet main-broker`` process (one main, one zone, the cluster
metadata and the objects in one SeaweedFS bucket, a prefix per leg) from a fleet TOML written
here, and produces with confluent-kafka (the ``throughput`` preset of produce_consume.py):

1. **produce with uploads vs without**: the same workload (``--mb`` MB of ``--size`` values) on
   a main whose uploads run every ``--upload-threshold-mb`` MiB, so several run during the leg,
   and on a main whose object tier never uploads (thresholds of 1 TiB and a day). Legs run
   off, on, on, off (``--legs``), each on a fresh main, so drift of the machine weighs on both
   sides; MB/s = acked bytes / summed leg time per side. Target: ratio >= 0.9.
2. **catch-up consume from S3**: produce ``--catchup-mb`` MB, wait until every batch is in
   committed objects, restart the main with an empty WAL directory (same bucket), and consume
   from offset 0 with confluent-kafka (assigned partitions; MB/s from assignment to the last
   message, as produce_consume.py). Target: >= 100 MB/s.
3. **PUTs per GB** at the default thresholds (``--put-threshold-mb``, 500 MiB, and 60 s):
   produce ``--put-mb`` MB (enough for two threshold uploads), wait for those uploads, and
   divide the PUT-class requests the object tier made (its traffic hook: PUT, multipart
   create/part/complete, the manifest CAS) by the object GB uploaded. Target: <= 20; the cost
   per TB at $0.005 per 1,000 PUTs is PUTs/GB x $0.005.

Prints the table, or with ``--json`` one JSON object on stdout (the table goes to stderr).
Exit code 0 when every record was acked and read back, 2 otherwise, 3 when SeaweedFS or a
main could not start. A missed target only shows as ``met: false``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import boto3
import httpx
import produce_consume as pc
from botocore.config import Config

MiB = 1 << 20
MB = pc.MB
TARGET_CATCHUP_MB_S = 100.0
TARGET_PRODUCE_RATIO = 0.9
TARGET_PUTS_PER_GB = 20.0
USD_PER_1000_PUTS = 0.005
NEVER_BYTES = 1 << 40  # "without uploads": the object tier is there but never due
NEVER_S = 86_400.0
ACCESS_KEY, SECRET_KEY = "zonefleet-bench", "zonefleet-bench-secret"
WAIT_UPLOADS_S = 300.0


# -- SeaweedFS -----------------------------------------------------------------------------------


def _binary(name: str) -> str:
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    raise pc.TargetUnavailable(f"{local} not found (pip install -e '.[dev]' installs {name})")


def _s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(s3={"addressing_style": "path"}, connect_timeout=1, read_timeout=5),
    )


@contextlib.contextmanager
def run_seaweedfs(
    work: Path, store_dir: Path | None = None, ready_timeout: float = 60.0, nice: int = 0
) -> Iterator[tuple[str, int]]:
    """``weed server`` with S3 on free loopback ports (every port set); yields the endpoint
    and the process id. `nice` > 0 lowers its CPU and I/O priority, so that the broker gets
    the cores first, as it would with S3 on other hosts."""
    data = Path(tempfile.mkdtemp(prefix="seaweedfs-", dir=store_dir or work))
    base = pc.free_port_range(8)
    ports = list(range(base, base + 8))
    cmd = [
        _binary("weed"), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={ports[0]}", f"-master.port.grpc={ports[1]}", "-master.telemetry=false",
        "-master.volumeSizeLimitMB=512", "-volume.max=100",
        f"-volume.port={ports[2]}", f"-volume.port.grpc={ports[3]}",
        "-filer", f"-filer.port={ports[4]}", f"-filer.port.grpc={ports[5]}",
        f"-filer.localSocket={data}/filer.sock",
        "-s3", f"-s3.port={ports[6]}", f"-s3.port.grpc={ports[7]}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip
    endpoint = f"http://127.0.0.1:{ports[6]}"
    log_path = work / "seaweedfs.log"
    with open(log_path, "wb") as log_file:
        if nice > 0:
            # ionice class 3 (idle): SeaweedFS's disk writes wait for the WAL's fsyncs.
            cmd = ["nice", "-n", str(nice), "ionice", "-c", "3", *cmd]
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        client = _s3_client(endpoint)
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise pc.TargetUnavailable(f"weed exited: {log_path.read_text()[-2000:]}")
            try:
                client.list_buckets()
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise pc.TargetUnavailable(f"SeaweedFS S3 not up: {exc}") from None
                time.sleep(0.2)
        pc.log(f"SeaweedFS S3 on {endpoint}")
        yield endpoint, proc.pid
    finally:
        # It can take a second SIGTERM to stop.
        for _ in range(2):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)  # --s3-dir is outside the temp dir


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one main broker -------------------------------------------------------------------------


class Main:
    """One ``zonefleet main-broker`` process on a fleet TOML of its own."""

    def __init__(self, work: Path, name: str, store_url: str, threshold: int, interval: float):
        self.dir = work / name
        self.dir.mkdir(exist_ok=True)
        self.store_url = store_url
        self.threshold = threshold
        self.interval = interval
        base = pc.free_port_range(2)
        self.port, self.admin_port = base, base + 1
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def _toml(self, wal_dir: Path) -> Path:
        path = self.dir / "fleet.toml"
        path.write_text(
            f"""\
[fleet]
cluster_id = "zonefleet-objects-bench"
data_dir = "{self.dir}"

[[zones]]
name = "az1"
az_id = "use1-az1"

[wal]
url = "osfs://{wal_dir}"

[metadata]
url = "{self.store_url}"

[storage]
object_store = "{self.store_url}"
upload_threshold_bytes = {self.threshold}
upload_interval_s = {self.interval}

[[main_brokers]]
node_id = 1
zone = "az1"
host = "127.0.0.1"
port = {self.port}
admin_port = {self.admin_port}
"""
        )
        return path

    def start(self, wal_dir: Path, timeout: float = 60.0) -> Main:
        config = self._toml(wal_dir)
        cmd = [*pc.zonefleet_command(), "main-broker", "--config", str(config), "--node-id", "1"]
        with open(self.dir / "main.log", "ab") as log_file:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise pc.TargetUnavailable(f"main exited: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                url = f"http://127.0.0.1:{self.admin_port}/healthz"
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise pc.TargetUnavailable(f"main not healthy in {timeout:.0f} s")
            time.sleep(0.05)

    def log_tail(self) -> str:
        return (self.dir / "main.log").read_text(errors="replace")[-2000:]

    def objects(self) -> dict[str, Any]:
        """The object tier's part of the main's admin /status."""
        doc = httpx.get(f"http://127.0.0.1:{self.admin_port}/status", timeout=10).json()
        objects: dict[str, Any] = doc["objects"]
        return objects

    def wait_objects(
        self, done: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            objects = self.objects()
            if done(objects) or time.monotonic() > deadline:
                return objects
            time.sleep(0.2)

    def fsyncs(self) -> tuple[float, float]:
        """(count, seconds) of the main's WAL fsyncs so far (its /metrics histogram)."""
        page = httpx.get(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=10).text
        found = {"_count": 0.0, "_sum": 0.0}
        for line in page.splitlines():
            name, _, value = line.partition(" ")
            for suffix in found:
                if name == f"zonefleet_wal_fsync_seconds{suffix}":
                    found[suffix] = float(value)
        return found["_count"], found["_sum"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- legs ----------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, endpoint: str, s3_pid: int) -> None:
        self.args = args
        self.s3_pid = s3_pid
        self.work = work
        self.endpoint = endpoint
        self.bucket = f"bench-{uuid.uuid4().hex[:8]}"
        _s3_client(endpoint).create_bucket(Bucket=self.bucket)
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.legs = 0

    def _main(self, name: str, threshold: int, interval: float) -> Main:
        self.legs += 1
        url = (
            f"s3://{self.bucket}/{name}?endpoint={self.endpoint}&region=us-east-1"
            f"&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}&path_style=true"
        )
        if self.args.file_store is not None:
            url = f"file://{self.args.file_store / self.bucket / name}"
        return Main(self.work, name, url, threshold, interval)

    def _workload(self, mb: float) -> argparse.Namespace:
        args = argparse.Namespace(**vars(self.args))
        args.messages = max(1, int(mb * MB / args.size))
        return args

    def _produce(self, main: Main, mb: float) -> tuple[str, pc._ProduceStats, argparse.Namespace]:
        topic = f"objects-{uuid.uuid4().hex[:8]}"
        workload = self._workload(mb)
        pc.create_topic(main.bootstrap, topic, self.args.partitions, timeout=30.0)
        stats = pc.produce_phase(main.bootstrap, topic, workload)
        if stats.errors or stats.acked != workload.messages:
            self.problems.append(
                f"{main.dir.name}: {stats.acked} of {workload.messages} acked ({stats.first_error})"
            )
        return topic, stats, workload

    def produce_leg(self, i: int, uploads: bool) -> dict[str, Any]:
        threshold = int(self.args.upload_threshold_mb * MiB) if uploads else NEVER_BYTES
        main = self._main(f"produce-{i}-{'on' if uploads else 'off'}", threshold,
                          60.0 if uploads else NEVER_S)  # fmt: skip
        main.start(main.dir / "wal")
        assert main.proc is not None
        pids = {"main": main.proc.pid, "s3_server": self.s3_pid, "client": os.getpid()}
        try:
            before, fsyncs_before = main.objects(), main.fsyncs()
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            _, stats, workload = self._produce(main, self.args.mb)
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            after, fsyncs_after = main.objects(), main.fsyncs()
        finally:
            main.stop()
        mb_s = stats.acked_bytes / MB / stats.elapsed if stats.elapsed > 0 else 0.0
        fsyncs = int(fsyncs_after[0] - fsyncs_before[0])
        fsync_s = fsyncs_after[1] - fsyncs_before[1]
        leg = {
            "uploads_enabled": uploads,
            "messages": workload.messages,
            "acked": stats.acked,
            "acked_bytes": stats.acked_bytes,
            "elapsed_s": round(stats.elapsed, 3),
            "mb_s": round(mb_s, 3),
            "uploads": after["uploads"] - before["uploads"],
            "uploaded_bytes": after["bytes_uploaded"] - before["bytes_uploaded"],
            # CPU seconds used during the produce phase (the machine's cores are shared).
            "cpu_s": {name: round(seconds, 2) for name, seconds in cpu.items()},
            "wal_fsyncs": fsyncs,
            "wal_fsync_mean_ms": round(1000 * fsync_s / fsyncs, 3) if fsyncs else None,
        }
        pc.log(f"produce leg {i} uploads={'on' if uploads else 'off'}: {leg}")
        if uploads and leg["uploads"] < 1:
            # A measurement that proves nothing, not a broken broker: say so, keep `ok`.
            self.warnings.append(f"produce leg {i}: no upload ran during the leg (raise --mb)")
        return leg

    def produce_ratio(self) -> dict[str, Any]:
        order = [False, True, True, False]
        legs = [self.produce_leg(i, order[i % 4]) for i in range(self.args.legs)]

        def side(uploads: bool) -> float:
            mine = [leg for leg in legs if leg["uploads_enabled"] is uploads]
            seconds = sum(leg["elapsed_s"] for leg in mine)
            return sum(leg["acked_bytes"] for leg in mine) / MB / seconds if seconds else 0.0

        on, off = side(True), side(False)
        ratio = round(on / off, 3) if off > 0 else None
        return {
            "with_uploads_mb_s": round(on, 3),
            "without_uploads_mb_s": round(off, 3),
            "ratio": ratio,
            "upload_threshold_bytes": int(self.args.upload_threshold_mb * MiB),
            "target": TARGET_PRODUCE_RATIO,
            "met": ratio is not None and ratio >= TARGET_PRODUCE_RATIO,
            "legs": legs,
        }

    def catchup(self) -> dict[str, Any]:
        main = self._main("catchup", int(self.args.upload_threshold_mb * MiB), 1.0)
        main.start(main.dir / "wal")
        try:
            topic, stats, workload = self._produce(main, self.args.catchup_mb)
            objects = main.wait_objects(
                lambda o: (
                    o["pending_bytes"] == 0 and sum(o["uploaded_end"].values()) == stats.acked
                ),
                WAIT_UPLOADS_S,
            )
        finally:
            main.stop()
        if sum(objects["uploaded_end"].values()) != stats.acked:
            self.problems.append(f"catch-up: not every batch uploaded: {objects}")
        # Same bucket, an empty WAL directory: everything comes back from objects.
        main.start(main.dir / "wal-empty")
        assert main.proc is not None
        pids = {"main": main.proc.pid, "s3_server": self.s3_pid, "client": os.getpid()}
        try:
            before = main.objects()
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            consume = pc.consume_phase(main.bootstrap, topic, stats.offsets, stats.acked, workload)
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            after = main.objects()
        finally:
            main.stop()
        if consume["consumed"] != stats.acked or consume["consume_errors"]:
            self.problems.append(
                f"catch-up: read {consume['consumed']} of {stats.acked} "
                f"({consume['consume_first_error']})"
            )
        mb_s = consume["consume_mb_s"]
        return {
            "produced_bytes": stats.acked_bytes,
            "consumed": consume["consumed"],
            "consumed_bytes": consume["consumed_bytes"],
            "elapsed_s": consume["consume_elapsed_s"],
            "consume_mb_s": mb_s,
            "objects": objects["objects"],
            "get_requests": after["get_requests"] - before["get_requests"],
            "cpu_s": {name: round(seconds, 2) for name, seconds in cpu.items()},
            "target": TARGET_CATCHUP_MB_S,
            "met": mb_s >= TARGET_CATCHUP_MB_S,
        }

    def puts(self) -> dict[str, Any]:
        threshold = int(self.args.put_threshold_mb * MiB)
        main = self._main("puts", threshold, 60.0)
        main.start(main.dir / "wal")
        try:
            _, stats, _ = self._produce(main, self.args.put_mb)
            # Threshold uploads only: the tail below the threshold would wait for the interval.
            expected = max(1, stats.acked_bytes // threshold)
            objects = main.wait_objects(lambda o: o["uploads"] >= expected, WAIT_UPLOADS_S)
        finally:
            main.stop()
        if objects["uploads"] < expected:
            self.problems.append(f"puts: {objects['uploads']} of {expected} uploads ran")
        gb = objects["bytes_uploaded"] / 1e9
        per_gb = objects["put_requests"] / gb if gb > 0 else float("inf")
        return {
            "upload_threshold_bytes": threshold,
            "upload_interval_s": 60.0,
            "produced_bytes": stats.acked_bytes,
            "uploads": objects["uploads"],
            "objects": objects["objects_uploaded"],
            "uploaded_bytes": objects["bytes_uploaded"],
            "put_requests": objects["put_requests"],
            "puts_per_gb": round(per_gb, 2),
            "usd_per_tb": round(per_gb * 1000 * USD_PER_1000_PUTS / 1000, 4),
            "target": TARGET_PUTS_PER_GB,
            "met": per_gb <= TARGET_PUTS_PER_GB,
        }


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    return None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="zonefleet-objects-bench-") as tmp:
        work = Path(tmp)
        with run_seaweedfs(work, args.s3_dir, nice=args.s3_nice) as (endpoint, s3_pid):
            bench = Bench(args, work, endpoint, s3_pid)
            record: dict[str, Any] = {
                "mode": "objects",
                "commit": _git_commit(),
                "object_store": "file" if args.file_store is not None else "s3",
                "message_bytes": args.size,
                "partitions": args.partitions,
                "acks": args.acks,
                "linger_ms": args.linger_ms,
                "batch_size": args.batch_size,
                "produce": bench.produce_ratio() if args.legs else None,
                "catchup": bench.catchup() if args.catchup_mb > 0 else None,
                "puts": bench.puts() if args.put_mb > 0 else None,
            }
            record["problems"] = bench.problems
            record["warnings"] = bench.warnings
            record["ok"] = not bench.problems
            return record


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.2f}{suffix}" if isinstance(value, float) else f"{value}{suffix}"


def format_table(rec: dict[str, Any]) -> str:
    rows: list[tuple[str, ...]] = [("metric", "value", "compared to", "target", "met")]
    tp, cu, pt = rec["produce"], rec["catchup"], rec["puts"]
    if tp is not None:
        rows.append(("produce MB/s, uploads on / off", _fmt(tp["with_uploads_mb_s"]),
                     _fmt(tp["without_uploads_mb_s"]), "", ""))  # fmt: skip
        rows.append(("produce ratio on/off", _fmt(tp["ratio"]), "",
                     f">= {TARGET_PRODUCE_RATIO}x", _yes(tp["met"])))  # fmt: skip
    if cu is not None:
        rows.append(("catch-up consume from S3 MB/s", _fmt(cu["consume_mb_s"]), "",
                     f">= {TARGET_CATCHUP_MB_S:g}", _yes(cu["met"])))  # fmt: skip
    if pt is not None:
        rows.append(("S3 PUTs per GB (default thresholds)", _fmt(pt["puts_per_gb"]), "",
                     f"<= {TARGET_PUTS_PER_GB:g}", _yes(pt["met"])))  # fmt: skip
        rows.append(("PUT cost per TB, USD", f"{pt['usd_per_tb']:.4f}", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    store = "a file:// store" if rec["object_store"] == "file" else "SeaweedFS"
    lines = [
        f"zonefleet object tier on {store} (commit {rec['commit']}); {rec['message_bytes']} B "
        f"messages, acks={rec['acks']}, {rec['partitions']} partition(s)"
    ]
    for i, row in enumerate(rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in pairs]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if tp is not None:
        legs = ", ".join(
            f"{'on' if leg['uploads_enabled'] else 'off'} {leg['mb_s']:.1f} ({leg['uploads']} up)"
            for leg in tp["legs"]
        )
        lines.append(f"produce legs MB/s: {legs}")
        cpu = "; ".join(
            f"{'on' if leg['uploads_enabled'] else 'off'} "
            + " ".join(f"{k} {v:.1f}" for k, v in leg["cpu_s"].items())
            for leg in tp["legs"]
        )
        lines.append(f"produce legs CPU s: {cpu}")
        fsync = ", ".join(
            f"{'on' if leg['uploads_enabled'] else 'off'} {_fmt(leg['wal_fsync_mean_ms'])}"
            for leg in tp["legs"]
        )
        lines.append(f"produce legs mean WAL fsync ms: {fsync}")
    if cu is not None:
        lines.append(
            f"catch-up: {cu['consumed']} records, {cu['consumed_bytes']} B from "
            f"{cu['objects']} objects in {cu['elapsed_s']} s, {cu['get_requests']} GETs; CPU s "
            + " ".join(f"{k} {v:.1f}" for k, v in cu["cpu_s"].items())
        )
    if pt is not None:
        lines.append(
            f"PUTs: {pt['put_requests']} PUT-class requests for {pt['uploads']} uploads "
            f"({pt['objects']} objects, {pt['uploaded_bytes']} B) at a "
            f"{pt['upload_threshold_bytes']} B threshold"
        )
    for problem in rec["problems"]:
        lines.append(f"PROBLEM: {problem}")
    for warning in rec["warnings"]:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _yes(met: bool) -> str:
    return "yes" if met else "NO"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add: Callable[..., Any] = parser.add_argument
    add("--mb", type=float, default=300.0, help="MB produced per produce leg")
    add("--legs", type=int, default=4, help="produce legs, in the order off, on, on, off")
    add("--upload-threshold-mb", type=float, default=32.0, help="MiB, the uploads-on legs")
    add("--catchup-mb", type=float, default=300.0, help="MB read back from S3 (0: skip)")
    add("--put-mb", type=float, default=1100.0, help="MB produced for PUTs/GB (0: skip)")
    add("--put-threshold-mb", type=float, default=500.0, help="MiB (the default threshold)")
    add("--size", type=int, default=1024, help="message value bytes")
    add("--partitions", type=int, default=1)
    add("--timeout", type=float, default=300.0, help="bound on each produce/consume phase")
    add(
        "--s3-dir",
        type=Path,
        help="where SeaweedFS keeps its data (default: the bench's temp dir, on the WAL's disk)",
    )
    add(
        "--s3-nice",
        type=int,
        default=0,
        help="diagnosis: run SeaweedFS under nice -n N and idle I/O priority (S3 elsewhere, "
        "approximated: the broker and client get the cores and the disk first)",
    )
    add(
        "--file-store",
        type=Path,
        help="diagnosis: objects in a file:// store under this dir instead of SeaweedFS's S3 "
        "(the main's own cost of uploads, without an S3 server on the same cores)",
    )
    add("--json", action="store_true", help="one JSON object on stdout (table on stderr)")
    args = parser.parse_args(argv)
    preset = pc.PRESETS["throughput"]
    args.acks, args.linger_ms, args.batch_size = (
        preset["acks"],
        preset["linger_ms"],
        preset["batch_size"],
    )
    args.rate, args.compression, args.idempotence, args.consumer_mode = 0, "none", False, "assign"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds the context managers, which stop what we started

    signal.signal(signal.SIGTERM, on_sigterm)
    os.environ.pop("ZONEFLEET_TEST_PAUSE_AT", None)  # never pause a benchmarked main
    try:
        record = measure(args)
    except pc.TargetUnavailable as exc:
        pc.log(f"target unavailable: {exc}")
        return pc.EXIT_TARGET_UNAVAILABLE
    table = format_table(record)
    if args.json:
        print(table, file=sys.stderr, flush=True)
        print(json.dumps(record), flush=True)
    else:
        print(table, flush=True)
    return 0 if record["ok"] else pc.EXIT_MISMATCH


if __name__ == "__main__":
    sys.exit(main())
