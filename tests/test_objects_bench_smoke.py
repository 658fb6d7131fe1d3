"""Smoke test of bench/objects_bench.py (the issue-4 figures) at tiny sizes: SeaweedFS and the
main-broker processes start, every record is acked and read back, and every figure is there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "objects_bench.py"

pytest.importorskip("confluent_kafka", reason="bench extra not installed (confluent-kafka)")


def test_objects_bench_reports_every_figure() -> None:
    proc = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--json", "--mb", "4", "--legs", "2",
            "--upload-threshold-mb", "0.25", "--catchup-mb", "4",
            "--put-mb", "3", "--put-threshold-mb", "1", "--timeout", "60",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.strip()]
    rec: dict[str, Any] = json.loads(line)
    assert rec["mode"] == "objects" and rec["ok"] is True and rec["problems"] == []

    tp = rec["produce"]
    assert [leg["uploads_enabled"] for leg in tp["legs"]] == [False, True]
    assert all(leg["acked"] == leg["messages"] == 3906 for leg in tp["legs"])
    assert tp["legs"][0]["uploads"] == 0  # the "without uploads" side never uploads
    assert tp["with_uploads_mb_s"] > 0 and tp["without_uploads_mb_s"] > 0
    assert tp["ratio"] == pytest.approx(tp["with_uploads_mb_s"] / tp["without_uploads_mb_s"], 1e-2)

    cu = rec["catchup"]
    # Read back after a restart with an empty WAL: every byte came from objects.
    assert cu["consumed"] == 3906 and cu["consumed_bytes"] == cu["produced_bytes"]
    assert cu["objects"] >= 1 and cu["get_requests"] >= 2 and cu["consume_mb_s"] > 0

    pt = rec["puts"]
    assert pt["uploads"] >= 2 and pt["put_requests"] >= pt["uploads"] + pt["objects"]
    gb = pt["uploaded_bytes"] / 1e9
    assert pt["puts_per_gb"] == pytest.approx(pt["put_requests"] / gb, abs=0.01)
    assert pt["usd_per_tb"] == pytest.approx(pt["puts_per_gb"] * 0.005, abs=1e-4)
    assert "catch-up consume from S3 MB/s" in proc.stderr
