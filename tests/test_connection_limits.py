"""Kafka's max.connections, max.connections.per.ip and connections.max.idle.ms (issue 14,
"Limits"): the admission core directly, then a main started from a fleet TOML."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kafka_wire.connection_limits import ConnectionLimits
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.raw_kafka import RawKafka


def test_admission_counts_per_address_and_in_all() -> None:
    limits = ConnectionLimits(max_connections=3, max_per_ip=2)
    assert limits.admit("10.0.0.1") is None and limits.admit("10.0.0.1") is None
    refused = limits.admit("10.0.0.1")
    assert refused is not None and "max_connections_per_ip" in refused
    assert limits.admit("10.0.0.2") is None
    refused = limits.admit("10.0.0.3")
    assert refused is not None and "max_connections" in refused
    limits.release("10.0.0.1")
    assert limits.admit("10.0.0.3") is None
    assert limits.total == 3 and limits.connections_from("10.0.0.1") == 1
    unlimited = ConnectionLimits()
    assert all(unlimited.admit("10.0.0.9") is None for _ in range(10_000))


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcess]:
    data_dir = tmp_path_factory.mktemp("limits")
    port = free_port_block(2)
    config = data_dir / "fleet.toml"
    config.write_text(
        f"""\
[fleet]
cluster_id = "limits"
data_dir = "{data_dir}"

[[zones]]
name = "az1"
az_id = "use1-az1"

[wal]
url = "osfs://{data_dir / "wal"}"

[[main_brokers]]
node_id = 1
zone = "az1"
host = "127.0.0.1"
port = {port}
admin_port = {port + 1}
max_connections_per_ip = 3
connections_max_idle_ms = 1500
"""
    )
    fleet = FleetProcess(data_dir, port, ["--config", str(config)]).start()
    try:
        yield fleet
    finally:
        fleet.stop()


def _hello(conn: RawKafka) -> None:
    resp = conn.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert resp.error_code == 0


def test_a_connection_over_the_per_ip_limit_is_closed_at_once(limited: FleetProcess) -> None:
    conns = [RawKafka(limited.bootstrap) for _ in range(3)]
    try:
        for conn in conns:
            _hello(conn)
        extra = RawKafka(limited.bootstrap)
        assert extra.is_closed(timeout=5)
        extra.close()
        conns.pop().close()
        # One went: the next is admitted (wait for the broker to see the close).
        for _ in range(50):
            again = RawKafka(limited.bootstrap)
            if not again.is_closed(timeout=0.1):
                break
            again.close()
        _hello(again)
        conns.append(again)
    finally:
        for conn in conns:
            conn.close()


def _no_connections(fleet: FleetProcess) -> None:
    """Waits until the main has seen every earlier connection close, so that the per-IP
    limit admits the next ones."""
    deadline = time.monotonic() + 30
    url = f"http://127.0.0.1:{fleet.admin_port}/metrics"
    while "\nzonefleet_connections 0\n" not in "\n" + httpx.get(url, timeout=5).text:
        assert time.monotonic() < deadline, "earlier connections still open"
        time.sleep(0.05)


def test_idle_and_slowloris_connections_are_closed(limited: FleetProcess) -> None:
    _no_connections(limited)
    idle = RawKafka(limited.bootstrap)
    _hello(idle)
    slow = RawKafka(limited.bootstrap)
    # One byte of a frame's size prefix, then nothing: a frame that never completes.
    slow.send_raw(struct.pack(">i", 100)[:1])
    try:
        assert idle.is_closed(timeout=10), "an idle connection stayed open"
        assert slow.is_closed(timeout=10), "a frame that never completes kept its connection"
    finally:
        idle.close()
        slow.close()
    fresh = RawKafka(limited.bootstrap)
    try:
        _hello(fresh)  # and it serves the next client
    finally:
        fresh.close()


def test_the_example_config_documents_the_limits() -> None:
    import fleet.config

    doc = fleet.config.__doc__ or ""
    for key in (
        "max_connections",
        "max_connections_per_ip",
        "connections_max_idle_ms",
        "max_in_flight_bytes_per_connection",
    ):
        assert doc.count(key) >= 2, key  # under [[main_brokers]] and [[proxies]]


def test_negative_limits_are_refused(tmp_path: Path) -> None:
    from fleet.config import ConfigError, _connection_limits

    with pytest.raises(ConfigError):
        _connection_limits({"max_connections": -1})
    with pytest.raises(ConfigError):
        _connection_limits({"max_in_flight_bytes_per_connection": -1})
    limits = _connection_limits({"max_in_flight_bytes_per_connection": 1 << 20})
    assert limits["max_in_flight_bytes_per_connection"] == 1 << 20
