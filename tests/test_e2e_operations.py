"""What an operator touches: the topics CLI, the admin endpoint, and WAL recovery on restart."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import httpx
from confluent_kafka import Producer

from tests.fleet_process import ZONEFLEET, FleetProcess
from tests.test_e2e_clients import consume_confluent


def _cli(fleet: FleetProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZONEFLEET, "topics", "--bootstrap", fleet.bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_topics_cli_round_trip(fleet: FleetProcess) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    created = _cli(fleet, "create", name, "--partitions", "3", "--config", "retention.ms=60000")
    assert created.returncode == 0, created.stderr
    again = _cli(fleet, "create", name)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr.upper()
    bad = _cli(fleet, "create", f"{name}-bad", "--config", "no.such.key=1")
    assert bad.returncode == 1 and "INVALID_CONFIG" in bad.stderr.upper()
    listed = _cli(fleet, "list")
    assert name in listed.stdout.split()
    described = _cli(fleet, "describe", name)
    assert described.returncode == 0, described.stderr
    info = json.loads(described.stdout)
    assert [p["partition"] for p in info["partitions"]] == [0, 1, 2]
    assert info["configs"]["retention.ms"] == "60000"
    assert info["configs"]["cleanup.policy"] == "delete"
    deleted = _cli(fleet, "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    assert name not in _cli(fleet, "list").stdout.split()


def test_admin_endpoint_reports_health_and_metrics(fleet: FleetProcess) -> None:
    topic = f"metrics-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": fleet.bootstrap, "acks": "all"})
    for i in range(50):
        producer.produce(topic, f"v{i}".encode())
    assert producer.flush(30) == 0
    base = f"http://127.0.0.1:{fleet.admin_port}"
    assert httpx.get(f"{base}/healthz").status_code == 200
    status = httpx.get(f"{base}/status").json()
    assert status["ready"] is True and status["partitions"] >= 1
    metrics = httpx.get(f"{base}/metrics").text

    def sample(prefix: str) -> float:
        lines = [ln for ln in metrics.splitlines() if ln.startswith(prefix)]
        assert lines, f"no sample {prefix}"
        return float(lines[0].rsplit(" ", 1)[1])

    assert sample('zonefleet_requests_total{api="Produce"}') >= 1
    assert sample('zonefleet_request_latency_seconds_count{api="Produce"}') >= 1
    assert sample(f'zonefleet_bytes_in_total{{topic="{topic}"}}') > 50 * 2
    assert sample("zonefleet_wal_fsync_seconds_count") >= 1
    assert sample("zonefleet_partitions") >= 1


def test_torn_wal_tail_is_recovered_and_logged(tmp_path: Path) -> None:
    fleet = FleetProcess(tmp_path / "fleet").start()
    topic = "torn"
    try:
        producer = Producer({"bootstrap.servers": fleet.bootstrap, "acks": "all"})
        for i in range(100):
            producer.produce(topic, f"good-{i}".encode())
            producer.flush(10)
    finally:
        fleet.kill()
    segments = sorted((tmp_path / "fleet" / "wal").rglob("*.wal"))
    assert segments
    last = segments[-1]
    data = last.read_bytes()
    # Tear the last record in half and add garbage, as a crash mid-write would.
    last.write_bytes(data[:-7] + b"\x00\xffgarbage")
    restarted = FleetProcess(tmp_path / "fleet", base_port=fleet.base_port).start()
    try:
        records = consume_confluent(restarted.bootstrap, topic, 99, timeout=30)
        values = [v for _, _, v in records]
        assert values == [f"good-{i}".encode() for i in range(99)]
        log_text = "".join(restarted.output)
        assert "truncat" in log_text.lower(), log_text[-2000:]
        # New writes go after the last good record.
        producer = Producer({"bootstrap.servers": restarted.bootstrap, "acks": "all"})
        producer.produce(topic, b"after")
        assert producer.flush(10) == 0
        records = consume_confluent(restarted.bootstrap, topic, 100, timeout=30)
        assert records[-1][2] == b"after" and records[-1][1] == 99
    finally:
        restarted.stop()
