"""Issue 10: the Spark cost report on a hand-computed fixture ledger, and on bad input.

The golden numbers are worked out by hand in docs/cost_report.md ("Worked example"); the job's
totals must also equal an independent plain-Python sum (cost_report.reference) of the files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cost_report.ledger_rows import NOT_JSON, UNKNOWN_CHANNEL, WRONG_DAY
from cost_report.prices import load_prices
from cost_report.reference import reference_totals
from tests.s3_servers import SeaweedServer, seaweedfs
from tests.spark_session import local_spark

__all__ = ["seaweedfs"]  # the fixture, imported so pytest finds it

GIB = 1 << 30
D1, D2 = "2026-11-22", "2026-11-23"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("test_cost_report")


def row(
    minute: str,
    node: str,
    src: str,
    dst: str,
    channel: str,
    api: str,
    nbytes: int,
    requests: int = 1,
    topic: str = "",
) -> str:
    from cost_report.ledger_rows import is_cross_zone

    return json.dumps(
        {
            "minute": minute,
            "node": node,
            "from_zone": src,
            "to_zone": dst,
            "channel": channel,
            "api": api,
            "topic": topic,
            "bytes": nbytes,
            "requests": requests,
            "cross_zone": is_cross_zone(src, dst),
        },
        separators=(",", ":"),
    )


def golden_ledger(root: Path) -> None:
    """Two days, a proxy and a main (docs/cost_report.md, "Worked example")."""
    files = {
        f"dt={D1}/proxy-102.jsonl": [
            row(
                f"{D1}T10:30:00Z",
                "proxy-102",
                "az2",
                "az2",
                "kafka-client",
                "Produce",
                GIB,
                10,
                "orders",
            ),
            row(
                f"{D1}T10:31:00Z",
                "proxy-102",
                "az2",
                "az2",
                "kafka-client",
                "Produce",
                GIB,
                10,
                "orders",
            ),
            row(
                f"{D1}T10:30:00Z",
                "proxy-102",
                "az2",
                "az2",
                "kafka-client",
                "Fetch",
                3 * GIB,
                30,
                "orders",
            ),
            row(f"{D1}T10:30:00Z", "proxy-102", "az2", "az1", "confirm-rpc", "confirm", GIB, 20),
            row(
                f"{D1}T10:30:00Z", "proxy-102", "az2", "regional", "wal-write", "write", 2 * GIB, 20
            ),
        ],
        f"dt={D1}/main-1.jsonl": [
            row(
                f"{D1}T11:00:00Z", "main-1", "az1", "regional", "s3-put", "PutObject", 2 * GIB, 2000
            ),
            row(
                f"{D1}T11:00:00Z", "main-1", "az1", "regional", "s3-put", "DeleteObjects", 100, 1000
            ),
            row(
                f"{D1}T11:00:00Z",
                "main-1",
                "regional",
                "az1",
                "s3-get",
                "GetObject",
                5 * GIB,
                10000,
            ),
        ],
        f"dt={D2}/main-1.jsonl": [
            row(
                f"{D2}T00:00:00Z",
                "main-1",
                "az1",
                "az1",
                "kafka-client",
                "Produce",
                GIB,
                5,
                "payments",
            ),
            row(f"{D2}T00:01:00Z", "main-1", "az1", "az3", "state-stream", "state", GIB // 2, 9),
        ],
    }
    for name, lines in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))


GOLDEN_PRICES = """
# The worked example's sheet: round numbers so the dollars can be checked by hand.
days_per_month = 30.0
retention_days = 2.0
fsx_ontap_capacity_gb = 1.2
fsx_ontap_throughput_mbps = 0.0
"""


def run_job(
    spark: Any, accounting: Path | str, out: Path, prices: Path | None = None, **kwargs: Any
) -> dict[str, Any]:
    from cost_report.report import ReportInputs, run_report

    inputs = ReportInputs(
        accounting=str(accounting),
        out=out,
        prices=load_prices(prices),
        staging_dir=out.parent / "staging",
        **kwargs,
    )
    run_report(spark, inputs, lambda message: None)
    return json.loads((out / "summary.json").read_text())


def test_golden_bytes_and_dollars(spark: Any, tmp_path: Path) -> None:
    golden_ledger(tmp_path / "accounting")
    sheet = tmp_path / "prices.toml"
    sheet.write_text(GOLDEN_PRICES)
    s = run_job(spark, tmp_path / "accounting", tmp_path / "out", sheet)

    assert s["period"] == {"from": D1, "to": D2}
    assert s["cross_zone_bytes"] == GIB + GIB // 2
    day1, day2 = s["daily"]
    # Day 1: 1 GiB crossed ($0.02); 2,000 billable PUTs ($0.01) and 10,000 GETs ($0.004);
    # 2 GiB stored ($0.023 * 2 / 30); the file system $0.25 * 1.2 / 30 = $0.01.
    assert day1["inter_az_usd"] == pytest.approx(0.02)
    assert day1["s3_requests_usd"] == pytest.approx(0.014)
    assert day1["s3_storage_usd"] == pytest.approx(0.046 / 30)
    assert day1["shared_fs_usd"] == pytest.approx(0.01)
    assert day1["zonefleet_usd"] == pytest.approx(0.044 + 0.046 / 30)
    # Kafka: 2/3 of 2 GiB to leaders, 2 replica copies of 2 GiB, 2/3 of 3 GiB fetched across:
    # 22/3 GiB at $0.02; with fetch from follower 16/3 GiB; EBS 2 GiB x 3 x $0.08 / 30.
    assert day1["kafka_rf3_usd"] == pytest.approx(22 / 3 * 0.02 + 0.016)
    assert day1["kafka_rf3_fetch_from_follower_usd"] == pytest.approx(16 / 3 * 0.02 + 0.016)
    # Day 2: 0.5 GiB crossed; 3 GiB stored (two days' retention); Kafka 8/3 GiB + EBS of 9 GiB.
    assert day2["zonefleet_usd"] == pytest.approx(0.01 + 0.069 / 30 + 0.01)
    assert day2["kafka_rf3_usd"] == pytest.approx(8 / 3 * 0.02 + 0.024)
    zonefleet = 0.044 + 0.046 / 30 + 0.02 + 0.069 / 30
    kafka = 22 / 3 * 0.02 + 0.016 + 8 / 3 * 0.02 + 0.024
    kafka_ffr = 16 / 3 * 0.02 + 0.016 + 8 / 3 * 0.02 + 0.024
    assert s["zonefleet_usd"] == pytest.approx(zonefleet)
    assert s["counterfactual_usd"] == pytest.approx(
        {"kafka_rf3": kafka, "kafka_rf3_fetch_from_follower": kafka_ffr}
    )
    assert s["savings_usd"]["kafka_rf3"] == pytest.approx(kafka - zonefleet)
    assert s["savings_fraction"]["kafka_rf3"] == pytest.approx((kafka - zonefleet) / kafka)
    # Topics and channels.
    topics = {t["topic"]: t for t in s["top_topics"]}
    assert topics["orders"]["bytes"] == 5 * GIB
    assert topics["payments"]["bytes"] == GIB
    channels = {c["channel"]: c for c in s["by_channel"]}
    assert channels["confirm-rpc"]["usd"] == pytest.approx(0.02)
    assert channels["s3-put"]["usd"] == pytest.approx(0.01)
    # Every price used is in the summary.
    assert s["prices"]["days_per_month"] == 30.0
    assert s["prices"]["inter_az_usd_per_gb_each_side"] == 0.01
    assert s["rejected"] == [] and s["warnings"] == []
    items = {i["item"]: i for i in s["line_items"]}
    transfer = items["inter-AZ transfer (both sides)"]
    assert (transfer["quantity"], transfer["unit"]) == (1.5, "GB")
    assert transfer["usd"] == pytest.approx(0.03)
    assert items["S3 PUT-class requests"]["quantity"] == 2000
    # The three outputs.
    out = tmp_path / "out"
    assert (out / "report.html").stat().st_size > 0
    for table in ("traffic_hourly", "cost_daily", "cost_by_topic", "zone_matrix"):
        assert sorted(p.name for p in (out / table).glob("dt=*")) == [f"dt={D1}", f"dt={D2}"]


def test_totals_equal_the_plain_python_sum(spark: Any, tmp_path: Path) -> None:
    golden_ledger(tmp_path / "accounting")
    s = run_job(spark, tmp_path / "accounting", tmp_path / "out")
    ref = reference_totals(tmp_path / "accounting")
    assert s["cross_zone_bytes"] == ref.cross_zone_bytes
    assert s["totals"]["total_bytes"] == ref.total_bytes
    assert s["totals"]["rows"] == ref.rows
    assert {c["channel"]: c["bytes"] for c in s["by_channel"]} == dict(ref.bytes_by_channel)
    assert {d["dt"]: d["cross_zone_bytes"] for d in s["daily"]} == dict(ref.cross_zone_by_day)


def test_bad_input_is_named_and_counted_never_twice(spark: Any, tmp_path: Path) -> None:
    acc = tmp_path / "accounting"
    golden_ledger(acc)
    good = (acc / f"dt={D1}/main-1.jsonl").read_text()
    # An upload retried: the node's whole file, and a range of it, as the object store holds
    # them next to the local file (docs/formats.md, "Ledger uploads").
    (acc / f"dt={D1}/main-1.000000000000.jsonl").write_text(good)
    first_line = good.split("\n", 1)[0] + "\n"
    (acc / f"dt={D1}/main-1.{len(first_line):012d}.jsonl").write_text(good[len(first_line) :])
    bad = acc / f"dt={D2}/proxy-101.jsonl"
    lines = [
        row(f"{D2}T01:00:00Z", "proxy-101", "az1", "az1", "kafka-client", "Fetch", 700, 1, "t"),
        '{"minute":"2026-11-23T01:00:00Z","node":"proxy-101","from_zo',  # torn
        "garbage, not json",
        row(f"{D2}T01:00:00Z", "proxy-101", "az1", "az1", "carrier-pigeon", "coo", 5),
        row(f"{D1}T01:00:00Z", "proxy-101", "az1", "az1", "kafka-client", "Fetch", 9),
    ]
    bad.write_text("\n".join(lines) + "\n")
    (acc / "README.txt").write_text("not a ledger")

    s = run_job(spark, acc, tmp_path / "out", date_from=D1, date_to="2026-11-24")
    ref = reference_totals(acc)
    # The duplicates are not counted again; the bad lines are not counted at all.
    assert s["totals"]["total_bytes"] == ref.total_bytes
    golden = reference_totals(_golden_only(tmp_path))
    assert s["totals"]["total_bytes"] == golden.total_bytes + 700
    rejected = {(Path(r["source"]).name, r["line"], r["reason"]) for r in s["rejected"]}
    assert rejected == {
        ("proxy-101.jsonl", 2, NOT_JSON),
        ("proxy-101.jsonl", 4, UNKNOWN_CHANNEL),
        ("proxy-101.jsonl", 5, WRONG_DAY),
    }
    not_json = next(r for r in s["rejected"] if r["reason"] == NOT_JSON)
    assert not_json["rows"] == 2 and not_json["lines"] == "2,3"
    assert s["totals"]["rejected_rows"] == 4 == ref.rejected_rows
    warnings = "\n".join(s["warnings"])
    assert "no ledger rows for 1 day(s): 2026-11-24" in warnings
    assert "2 ledger file(s) repeat bytes of another" in warnings
    assert "README.txt" in warnings


def _golden_only(tmp_path: Path) -> Path:
    root = tmp_path / "golden-only"
    golden_ledger(root)
    return root


def test_overlapping_upload_is_rejected_whole(spark: Any, tmp_path: Path) -> None:
    acc = tmp_path / "accounting"
    golden_ledger(acc)
    text = (acc / f"dt={D2}/main-1.jsonl").read_text()
    # Bytes 10.. of the file: overlaps the local file's range in part (not a clean cut).
    (acc / f"dt={D2}/main-1.000000000010.jsonl").write_text(text[10:] + text)
    s = run_job(spark, acc, tmp_path / "out")
    assert s["totals"]["total_bytes"] == reference_totals(_golden_only(tmp_path)).total_bytes
    assert any(
        "overlap" in r["reason"] and r["source"].endswith("000000000010.jsonl")
        for r in s["rejected"]
    )


def run_job_process(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The job as spark-submit or a user starts it (only argument errors are tested this way:
    they end before Spark starts)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cost_report.job",
            "--accounting",
            str(tmp_path / "accounting"),
            "--out",
            str(tmp_path / "out"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_price_sheet_typo_names_file_and_line(tmp_path: Path) -> None:
    sheet = tmp_path / "prices.toml"
    sheet.write_text("inter_az_usd_per_gb_each_side = 0.01\ns3_put_usd_per_100 = 0.005\n")
    golden_ledger(tmp_path / "accounting")
    proc = run_job_process(tmp_path, "--prices", str(sheet))
    assert proc.returncode == 2
    assert f"{sheet}:2: unknown price 's3_put_usd_per_100'" in proc.stderr
    assert "did you mean 's3_put_usd_per_1000'" in proc.stderr
    sheet.write_text('[prices]\nretention_days = "seven"\n')
    proc = run_job_process(tmp_path, "--prices", str(sheet))
    assert proc.returncode == 2 and f"{sheet}:2: retention_days must be a float" in proc.stderr


def test_cli_without_pyspark_says_how_to_install(tmp_path: Path) -> None:
    # A Python whose path hides pyspark, as on a machine without the 'report' extra.
    shim = tmp_path / "shim"
    (shim / "pyspark").mkdir(parents=True)
    (shim / "pyspark" / "__init__.py").write_text("raise ImportError('hidden by the test')")
    code = (
        "import importlib.util, sys;"
        "real = importlib.util.find_spec;"
        "importlib.util.find_spec = lambda n, *a: None if n == 'pyspark' else real(n, *a);"
        "from fleet.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "cost-report",
            "--accounting",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "zonefleet cost-report needs PySpark and Java 17: pip install "
        "'zonefleet[report]' (or: make report)"
    ]
    assert shutil.which("java")


def test_flow_logs_and_cur_beside_the_ledger(spark: Any, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from cost_report.flow_logs import flow_records, write_flow_log
    from tests.test_cost_report_inputs import _write_cur as write_cur

    golden_ledger(tmp_path / "accounting")
    start = int(datetime.fromisoformat(f"{D1}T10:30:00+00:00").timestamp())
    # az2 -> az1, both ends logging: one egress and one ingress record, counted once.
    records = flow_records("10.2.0.5", "10.1.0.7", 3000, start, start + 60, "use1-az2", "use1-az1")
    records += flow_records("10.1.0.7", "10.1.0.8", 999, start, start + 60, "use1-az1", None)
    write_flow_log(tmp_path / "flows" / "f.log.gz", records)
    (tmp_path / "flows" / "bad.log").write_text("version srcaddr\n2 10.0.0.1 extra\n")
    when = datetime(2026, 11, 23, 1, tzinfo=UTC)
    regional = "USE1-DataTransfer-Regional-Bytes"
    cur = write_cur(
        spark,
        tmp_path / "cur",
        [
            (regional, 2.0, 0.02, "i-fleet", when, {}, "InterZone-Out"),
            (regional, 9.0, 0.09, "i-other", when, {}, "InterZone-Out"),
        ],
    )
    zones = "az1:use1-az1=10.1.0.0/16,az2:use1-az2=10.2.0.0/16"
    s = run_job(
        spark,
        tmp_path / "accounting",
        tmp_path / "out",
        flow_logs=str(tmp_path / "flows"),
        zones=zones,
        cur=str(cur),
        cur_resource_ids=("i-fleet",),
    )
    sources = {r["dt"]: r for r in s["sources"]}
    assert sources[D1]["flow_log_cross_zone_bytes"] == 3000
    assert sources[D1]["ledger_cross_zone_bytes"] == GIB
    assert sources[D2]["flow_log_cross_zone_bytes"] == 0
    # CUR meters both sides of a crossing: 2 GB of usage is 1 GiB that crossed once.
    assert sources[D2]["cur_billed_bytes"] == GIB and sources[D2]["cur_billed_usd"] == 0.02
    assert sources[D1]["cur_billed_bytes"] == 0
    assert any(Path(r["source"]).name == "bad.log" for r in s["rejected"]), s["rejected"]
    assert (tmp_path / "out" / "sources_daily").is_dir()


def test_flow_logs_without_a_zone_map_is_refused(tmp_path: Path) -> None:
    proc = run_job_process(tmp_path, "--flow-logs", str(tmp_path))
    assert proc.returncode == 2 and "--flow-logs needs --zones" in proc.stderr


def test_report_from_ledgers_uploaded_to_seaweedfs(
    spark: Any, seaweedfs: SeaweedServer, tmp_path: Path
) -> None:
    """The nodes' uploads in a real S3 server, read back as `--accounting s3://...?endpoint=`
    (staged through the project's object store): the same report as from the local files."""
    from s3_commit import open_object_store
    from s3_commit.ledger_uploads import LedgerUploader

    data = tmp_path / "data"
    golden_ledger(data / "accounting")
    url = seaweedfs.bucket_url("fleet")
    store = open_object_store(url)
    for node in ("proxy-102", "main-1"):
        LedgerUploader(store, data, node).upload_pending()
    # A retried upload of the same bytes stays one object; a second run adds nothing.
    assert LedgerUploader(store, data, "main-1").upload_pending().objects == 0
    from_store = run_job(spark, url, tmp_path / "out-s3")
    local = run_job(spark, data / "accounting", tmp_path / "out-local")
    assert from_store["cross_zone_bytes"] == local["cross_zone_bytes"] == GIB + GIB // 2
    assert from_store["totals"]["total_bytes"] == local["totals"]["total_bytes"]
    assert from_store["zonefleet_usd"] == pytest.approx(local["zonefleet_usd"])
