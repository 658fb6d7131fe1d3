"""Issue 10, as a user runs it: `zonefleet up --zones 3` carries traffic, stops, and
`zonefleet cost-report` turns its ledgers into summary.json, Parquet tables and report.html
that agree with the plain-Python sum; the ledgers the nodes uploaded to the object store hold
the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cost_report.reference import reference_totals
from tests.fleet_process import ZONEFLEET
from tests.zone_fleet import (
    consume_confluent,
    create_topic,
    produce_confluent,
    start_up_fleet,
    unique_name,
)

pytestmark = pytest.mark.slow

MESSAGES = 2000
PARTITIONS = 3


def cost_report(accounting: str, out: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [
            ZONEFLEET,
            "cost-report",
            "--accounting",
            accounting,
            "--out",
            str(out),
            "--master",
            "local[1]",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The short text summary on stdout, progress on stderr.
    assert "zonefleet cost report" in proc.stdout and "Kafka RF3" in proc.stdout, proc.stdout
    assert "reading" in proc.stderr and "done" in proc.stderr, proc.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


def test_cost_report_on_a_fleet_that_carried_traffic(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, fleet = start_up_fleet(data)
    topics = [unique_name("orders"), unique_name("clicks")]
    try:
        for topic in topics:
            create_topic(fleet, "az1", topic, PARTITIONS)
            produce_confluent(fleet.bootstrap("az2"), "az2", topic, MESSAGES, topic)
            for zone in ("az1", "az3"):
                got = consume_confluent(fleet.bootstrap(zone), zone, topic, PARTITIONS, MESSAGES)
                assert len(got) >= MESSAGES
    finally:
        assert proc.stop() == 0, proc.output[-40:]

    local = cost_report(str(data / "accounting"), tmp_path / "report")
    out = tmp_path / "report"
    assert (out / "report.html").stat().st_size > 10_000
    html = (out / "report.html").read_text()
    assert topics[0] in html and "http://" not in html.replace("http://www.w3.org", "")
    for table in (
        "traffic_hourly",
        "traffic_daily",
        "cost_daily",
        "cost_by_channel",
        "cost_by_topic",
        "zone_matrix",
        "sources_daily",
    ):
        assert list((out / table).glob("dt=*/*.parquet")), table

    ref = reference_totals(data / "accounting")
    assert local["cross_zone_bytes"] == ref.cross_zone_bytes > 0  # confirms, state streams
    assert local["totals"]["total_bytes"] == ref.total_bytes
    assert local["rejected"] == []
    by_topic = {t["topic"]: t for t in local["top_topics"]}
    for topic in topics:
        # Produced once through az2, fetched through az1 and az3: at least 3x the payload.
        assert by_topic[topic]["bytes"] >= 3 * MESSAGES * len(f"{topic}-0"), by_topic
        assert by_topic[topic]["bytes"] == ref.bytes_by_topic[topic]
    # Clients talked to their own zone's proxy: no payload byte crossed.
    assert local["totals"]["cross_zone_payload_bytes"] == 0
    assert local["zonefleet_usd"] > 0 and local["counterfactual_usd"]["kafka_rf3"] > 0

    # The nodes uploaded their ledgers to the fleet's object store at the clean stop: staged
    # back through the project's object store, they are the local files' bytes (the report
    # reads staged copies like local ones: tests/test_cost_report.py, the SeaweedFS case).
    from cost_report.staging import stage_accounting

    staged = tmp_path / "staged"
    stage_accounting(f"file://{data / 'objects'}", staged)
    again = reference_totals(staged)
    assert (again.total_bytes, again.cross_zone_bytes) == (ref.total_bytes, ref.cross_zone_bytes)
