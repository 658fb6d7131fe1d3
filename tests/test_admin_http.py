"""Tests for the admin HTTP endpoint and the structured log formats."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import trio

import fleet.admin_http as admin_http
from fleet.admin_http import METRICS_CONTENT_TYPE, serve_admin_http
from fleet.logs import configure_logging
from telemetry import MetricsRegistry


class Node:
    """Mutable health and status, as node assembly would provide them."""

    def __init__(self) -> None:
        self.healthy = True
        self.reason = "wal not writable"
        self.info: dict[str, Any] = {"node": "main-1", "zone": "az1", "partitions": 3}
        self.status_calls = 0

    def health(self) -> tuple[bool, str]:
        return self.healthy, self.reason

    def status(self) -> dict[str, Any]:
        self.status_calls += 1
        if self.info.get("fail"):
            raise RuntimeError("status exploded")
        return self.info


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[tuple[int, Node, MetricsRegistry]]:
    reg = MetricsRegistry()
    reg.counter("zonefleet_requests_total", "Requests.", ["api"]).labels("produce").inc(3)
    node = Node()
    port = await nursery.start(serve_admin_http, "127.0.0.1", 0, reg, node.status, node.health)
    yield port, node, reg


async def raw_exchange(port: int, data: bytes, *, read_until_close: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        with trio.fail_after(5):
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                out += chunk
                if not read_until_close and b"\r\n\r\n" in out:
                    break
        return out


def status_of(response: bytes) -> int:
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", response)
    assert m, response[:100]
    return int(m.group(1))


async def test_healthz_metrics_status_via_httpx(server: tuple[int, Node, MetricsRegistry]) -> None:
    port, node, reg = server
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        r = await client.get("/healthz")
        assert (r.status_code, r.text) == (200, "ok")

        r = await client.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"] == METRICS_CONTENT_TYPE
        assert r.text == reg.render()
        assert 'zonefleet_requests_total{api="produce"} 3\n' in r.text

        r = await client.get("/status")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert r.json() == node.info

        node.healthy = False
        r = await client.get("/healthz")
        assert (r.status_code, r.text) == (503, "wal not writable")

        r = await client.get("/nope")
        assert r.status_code == 404
        r = await client.post("/metrics", content=b"x=1")
        assert r.status_code == 405
        assert r.headers["allow"] == "GET"

        node.info = {"fail": True}
        r = await client.get("/status")
        assert r.status_code == 500
        # The same keep-alive client still works after every error above.
        r = await client.get("/metrics?debug=1")
        assert r.status_code == 200


async def test_keep_alive_pipelined_and_connection_close(
    server: tuple[int, Node, MetricsRegistry],
) -> None:
    port, node, _ = server
    req = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = await raw_exchange(port, req + req + last)
    assert out.count(b"HTTP/1.1 200 ") == 3
    assert out.endswith(b"ok")
    assert node.status_calls == 2
    # HTTP/1.0 without keep-alive closes after one response.
    out = await raw_exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert status_of(out) == 200


@pytest.mark.parametrize(
    "garbage",
    [
        b"this is not http\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"\x00\x01\x02\x03\r\n\r\n",
    ],
)
async def test_malformed_request_gets_400_and_server_survives(
    server: tuple[int, Node, MetricsRegistry], garbage: bytes
) -> None:
    port, _, _ = server
    out = await raw_exchange(port, garbage)
    assert status_of(out) == 400
    assert b"connection: close" in out.lower()
    out = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(out) == 200


async def test_oversize_head_and_body_are_rejected(
    server: tuple[int, Node, MetricsRegistry],
) -> None:
    port, _, _ = server
    huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    assert status_of(await raw_exchange(port, huge)) in (400, 431)
    body = b"a" * 100_000
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert status_of(await raw_exchange(port, req)) == 413


async def test_slow_client_does_not_block_others(
    server: tuple[int, Node, MetricsRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _, _ = server
    monkeypatch.setattr(admin_http, "READ_TIMEOUT_S", 1.5)
    # A client that sends half a request head and then stalls.
    slow = await trio.open_tcp_stream("127.0.0.1", port)
    await slow.send_all(b"GET /metrics HTTP/1.1\r\nHo")
    idle = await trio.open_tcp_stream("127.0.0.1", port)  # connected, never sends
    async with httpx.AsyncClient() as client:
        with trio.fail_after(1.2):  # others are served while both stall
            for _ in range(5):
                r = await client.get(f"http://127.0.0.1:{port}/healthz")
                assert r.status_code == 200
    with trio.fail_after(5):
        out = b""
        while chunk := await slow.receive_some(65536):
            out += chunk
        assert status_of(out) == 408
        assert await idle.receive_some(65536) == b""  # idle connection closed quietly
    await slow.aclose()
    await idle.aclose()


async def test_port_zero_reports_bound_port(nursery: trio.Nursery) -> None:
    node = Node()
    port = await nursery.start(serve_admin_http, "127.0.0.1", 0, MetricsRegistry(), node.status)
    assert isinstance(port, int) and port > 0
    out = await raw_exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(out) == 200  # default health callback: always healthy


# --- structured logs ----------------------------------------------------------------------


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def test_json_logs(restore_root_logger: None) -> None:
    buf = io.StringIO()
    configure_logging("debug", "json", node="main-1", stream=buf)
    log = logging.getLogger("zonefleet.test")
    log.debug("hello %s", "world", extra={"topic": "t1", "partition": 3, "obj": object()})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", extra={"api": "produce"})
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(x) for x in lines)
    assert ISO_UTC.match(first["ts"])
    assert {k: first[k] for k in ("level", "logger", "node", "msg", "topic", "partition")} == {
        "level": "DEBUG",
        "logger": "zonefleet.test",
        "node": "main-1",
        "msg": "hello world",
        "topic": "t1",
        "partition": 3,
    }
    assert first["obj"].startswith("<object")
    assert list(first)[:5] == ["ts", "level", "logger", "node", "msg"]
    assert second["level"] == "ERROR" and second["api"] == "produce"
    assert "ValueError: boom" in second["exc"]


def test_text_logs_and_reconfiguration(restore_root_logger: None) -> None:
    first_buf, buf = io.StringIO(), io.StringIO()
    configure_logging("INFO", "json", stream=first_buf)
    configure_logging("INFO", "text", node="proxy-b", stream=buf)  # replaces the previous one
    log = logging.getLogger("zonefleet.x")
    log.debug("hidden")
    log.warning("disk slow", extra={"path": "/wal/a b", "ms": 12})
    assert first_buf.getvalue() == ""
    (line,) = buf.getvalue().splitlines()
    ts, rest = line.split(" ", 1)
    assert ISO_UTC.match(ts)
    assert rest == 'WARNING zonefleet.x [proxy-b] disk slow path="/wal/a b" ms=12'
    with pytest.raises(ValueError):
        configure_logging("LOUD")


async def test_bad_request_is_logged(
    server: tuple[int, Node, MetricsRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    port, _, _ = server
    with caplog.at_level(logging.INFO, logger="fleet.admin_http"):
        await raw_exchange(port, b"nonsense\r\n\r\n")
    assert any(getattr(r, "status", None) == 400 for r in caplog.records)
