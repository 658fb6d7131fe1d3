"""Bad input is one warning line, rate-limited per peer and counted, never a traceback; a zone
proxy decodes a request before it relays it, so a malformed one never crosses a zone
(issue 14, "Bad input and resource limits")."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

import httpx
import pytest
import trio

from internal_rpc import RpcClient
from internal_rpc.errors import RpcRemoteError
from internal_rpc.messages import RelayParams
from telemetry import BadInputLog
from tests.fleet_process import FleetProcess
from tests.raw_kafka import RawKafka
from tests.zone_fleet import ZoneFleet, start_up_fleet

MALFORMED = 300


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_one_line_an_interval_per_peer(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[str] = []
    clock = _Clock()
    limited = BadInputLog(
        logging.getLogger("test.bad"), counted.append, burst=3, interval_s=10, clock=clock
    )
    with caplog.at_level(logging.WARNING, "test.bad"):
        shown = [limited.warn("10.0.0.1", "request", "bad %d", i) for i in range(50)]
        assert shown == [True] * 3 + [False] * 47
        assert limited.warn("10.0.0.2", "frame", "other peer")  # its own share
        clock.now = 10.0  # one interval: one more line, saying what was held back
        assert limited.warn("10.0.0.1", "request", "bad %d", 50)
        assert not limited.warn("10.0.0.1", "request", "bad %d", 51)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bad 0",
        "bad 1",
        "bad 2",
        "other peer",
        "bad 50 (47 more from 10.0.0.1 held back)",
    ]
    assert len(counted) == 53 and counted.count("frame") == 1  # every warning is counted


def test_the_peers_tracked_are_bounded() -> None:
    limited = BadInputLog(logging.getLogger("test.bad"), burst=1, max_peers=100)
    for i in range(10_000):
        limited.warn(f"10.0.{i // 256}.{i % 256}", "frame", "x")
    assert len(limited._peers) == 100


@pytest.fixture(scope="module")
def zones(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    proc, fleet = start_up_fleet(tmp_path_factory.mktemp("bad-input") / "fleet")
    try:
        yield proc, fleet
    finally:
        proc.stop()


def _metric(admin: tuple[str, int], name: str, kind: str) -> float:
    text = httpx.get(f"http://{admin[0]}:{admin[1]}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{kind="{kind}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_malformed_requests_to_a_proxy_are_refused_in_its_zone(
    zones: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = zones
    proxy = next(p for p in fleet.config.proxies if p.proxy.zone == "az1")
    admin = (proxy.admin_host, proxy.admin_port)
    before = len(proc.output)
    counted_before = _metric(admin, "zonefleet_bad_input_total", "request")
    for i in range(MALFORMED):
        conn = RawKafka(fleet.bootstrap("az1"))
        # Metadata v9 (relayed to a main) whose body is garbage: a topics array of 2**30.
        conn.send_frame(struct.pack(">hhih", 3, 9, i, -1) + b"\x00" + b"\xff\xff\xff\x7f" * 4)
        assert conn.is_closed()
        conn.close()
    counted = _metric(admin, "zonefleet_bad_input_total", "request") - counted_before
    assert counted == MALFORMED
    refusals = [line for line in proc.output[before:] if "malformed api 3" in line]
    # The proxy's share of lines for one peer (a burst, then one every 10 s), not 300 lines.
    assert 1 <= len(refusals) <= 8, refusals
    assert not any("Traceback" in line for line in proc.output[before:])
    # No main saw them: none counted a relayed request it could not read.
    for main in fleet.config.mains:
        assert _metric((main.admin_host, main.admin_port), "zonefleet_bad_input_total", "rpc") == 0


def test_a_malformed_relay_to_a_main_is_one_line_not_a_traceback(
    zones: tuple[FleetProcess, ZoneFleet],
) -> None:
    """What a proxy of the previous release (which relayed without decoding) sent."""
    proc, fleet = zones
    main = fleet.config.mains[0]
    secret = fleet.config.mains[0].broker.rpc_secret
    assert secret is not None and main.broker.rpc_port is not None
    before = len(proc.output)
    frame = struct.pack(">hhih", 3, 9, 1, -1) + b"\x00" + b"\xff\xff\xff\x7f" * 4

    async def relay_garbage() -> int:
        proxy_id = fleet.config.proxies[0].proxy.node_id
        client = RpcClient(proxy_id, secret, main.broker.host, main.broker.rpc_port)
        refused = 0
        try:
            for _ in range(50):
                try:
                    await client.call("relay", RelayParams(frame, "127.0.0.1").to_wire())
                except RpcRemoteError:
                    refused += 1
        finally:
            await client.aclose()
        return refused

    assert trio.run(relay_garbage) == 50
    lines = proc.output[before:]
    assert not any("Traceback" in line for line in lines), "".join(lines)
    refusals = [line for line in lines if "refused" in line and "relay" in line]
    assert 1 <= len(refusals) <= 8, refusals
    admin = (main.admin_host, main.admin_port)
    assert _metric(admin, "zonefleet_bad_input_total", "rpc") == 50


def test_the_fleet_still_serves(zones: tuple[FleetProcess, ZoneFleet]) -> None:
    _, fleet = zones
    for zone in fleet.zones:
        conn = RawKafka(fleet.bootstrap(zone))
        try:
            resp = conn.request(
                18, 3, {"client_software_name": "t", "client_software_version": "1"}
            )
            assert resp.error_code == 0
        finally:
            conn.close()
