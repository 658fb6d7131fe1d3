"""The `zonefleet` command line as a user runs it: `up --zones`, `proxy`, `status`."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from fleet import cli
from fleet.config import local_zones_fleet_toml
from tests.fleet_process import ZONEFLEET, FleetProcess
from tests.ports import free_port_block

ZONES = 3
PORTS = 10 * ZONES + 5  # the documented layout of `up --zones N`: base .. base+10N+4


def zonefleet(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZONEFLEET, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def status_json(*args: str) -> list[dict[str, Any]]:
    done = zonefleet("status", "--json", *args)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


@pytest.fixture
def zones_fleet(tmp_path: Path) -> Iterator[FleetProcess]:
    fleet = FleetProcess(
        tmp_path / "fleet", free_port_block(PORTS), extra=["--zones", str(ZONES)]
    ).start()
    yield fleet
    fleet.stop()


def _round_trip(bootstrap: str, topic: str, n: int) -> tuple[list[bytes], Any]:
    conf: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "client.id": "zone=az2",
    }
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=20)
    meta = admin.list_topics(topic, timeout=10)
    producer = Producer({**conf, "enable.idempotence": True, "linger.ms": 2})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), key=str(i % 5).encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            **conf,
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (len(eof) < 2 or len(values) < n):
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            partition = msg.partition()
            if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                eof.add(partition)
            continue
        value = msg.value()
        assert value is not None
        values.append(value)
    consumer.close()
    return values, meta


def test_up_zones_serves_each_zone_through_its_proxy(zones_fleet: FleetProcess) -> None:
    base = zones_fleet.base_port
    assert zones_fleet.zones == {
        f"az{k}": f"127.0.0.1:{base + 10 * k}" for k in range(1, ZONES + 1)
    }
    toml = zones_fleet.data_dir / "fleet.toml"
    assert stat.S_IMODE(toml.stat().st_mode) == 0o600  # it holds the internal secret
    assert "[internal]\nsecret = " in toml.read_text()
    assert (zones_fleet.data_dir / "wal").is_dir()

    topic = f"cli-{uuid.uuid4().hex[:8]}"
    values, meta = _round_trip(zones_fleet.zones["az2"], topic, 500)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(500))
    # The az2 client sees only az2's nodes: its main broker and its proxy.
    assert set(meta.brokers) == {2, 102}
    assert {p.leader for p in meta.topics[topic].partitions.values()} <= {2, 102}

    rows = status_json("--data-dir", str(zones_fleet.data_dir))
    by_id = {r["node_id"]: r for r in rows}
    assert sorted(by_id) == [1, 2, 3, 101, 102, 103]
    assert by_id[1]["role"] == "main" and by_id[102]["role"] == "proxy"
    assert {r["zone"] for r in rows} == {"az1", "az2", "az3"}
    assert by_id[103]["zone"] == "az3"
    assert all(r["health"] == "ok" and r["healthy"] for r in rows)
    # The mains lead the topic's two partitions between them; every proxy serves both.
    assert sum(by_id[n]["partitions"] for n in (1, 2, 3)) == 2
    assert all(by_id[n]["partitions"] == 2 for n in (101, 102, 103))
    assert by_id[102]["admin"] == f"127.0.0.1:{base + 21}"

    table = zonefleet("status", "--data-dir", str(zones_fleet.data_dir))
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NODE", "ZONE", "ROLE", "HEALTH", "PARTITIONS", "ADMIN"]
    assert lines[5].split()[:5] == ["102", "az2", "proxy", "ok", "2"]

    assert zones_fleet.stop() == 0  # SIGTERM: clean exit
    down = status_json("--data-dir", str(zones_fleet.data_dir), "--timeout", "0.5")
    assert [(r["health"], r["healthy"], r["partitions"]) for r in down] == [
        ("down", False, None)
    ] * 6


def _wait_healthy(admin_port: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(f"http://127.0.0.1:{admin_port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"node on admin port {admin_port} never became healthy")


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ZONEFLEET, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_main_broker_and_proxy_as_separate_processes(tmp_path: Path) -> None:
    base = free_port_block(PORTS)
    config = tmp_path / "fleet.toml"
    config.write_text(local_zones_fleet_toml(tmp_path, base, ZONES, "cd" * 32))
    procs = [_spawn("main-broker", "--config", str(config), "--node-id", str(k)) for k in (1, 2, 3)]
    try:
        for k, proc in enumerate(procs, start=1):
            _wait_healthy(base + 10 * k + 3, proc)
        procs.append(_spawn("proxy", "--config", str(config), "--node-id", "102"))
        _wait_healthy(base + 21, procs[-1])
        rows = {r["node_id"]: r for r in status_json("--config", str(config))}
        assert all(rows[n]["health"] == "ok" for n in (1, 2, 3, 102))
        assert rows[102]["status"]["mains"] == {"1": True, "2": True, "3": True}
        # Proxies 101 and 103 were never started: shown as down, not an error.
        assert rows[101]["health"] == rows[103]["health"] == "down"

        topic = f"sep-{uuid.uuid4().hex[:8]}"
        values, meta = _round_trip(f"127.0.0.1:{base + 20}", topic, 50)
        assert len(values) == 50 and set(meta.brokers) == {2, 102}
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)  # Ctrl-C
        codes = [proc.wait(15) for proc in procs]
    assert codes == [0, 0, 0, 0]


def test_configuration_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # In-process: these fail before any node starts, and each subprocess costs a second.
    def run(*args: str) -> tuple[int, str]:
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    code, err = run("up", "--zones", "0", "--data-dir", str(tmp_path / "z"))
    assert code == 2 and "--zones must be at least 1" in err

    code, err = run("up", "--zones", "2", "--config", "x.toml")
    assert code == 2 and "not allowed with" in err

    config = tmp_path / "fleet.toml"
    text = local_zones_fleet_toml(tmp_path, 40000, 2, "ef" * 32)
    config.write_text(text.replace("[internal]\nsecret", "[internal]\nunused"))
    code, err = run("proxy", "--config", str(config))
    assert code == 2 and "no [internal] secret" in err

    config.write_text(text)
    code, err = run("proxy", "--config", str(config), "--node-id", "105")
    assert code == 2 and "no proxy with node_id 105" in err

    code, err = run("status", "--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no fleet at" in err
