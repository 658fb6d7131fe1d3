"""The admin HTTP endpoint's bearer token (issue 15, fleet-internal): /healthz and /metrics
open, /status and every other path behind `[admin] token`; the config keys, the clients
that send it (`zonefleet status`), and `zonefleet up --tls`'s generated token."""

from __future__ import annotations

import stat
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fleet.admin_http import bearer_headers, serve_admin_http
from fleet.config import ConfigError, FleetNode, local_zones_fleet_toml, parse_fleet_config
from fleet.local_tls import write_local_tls
from fleet.status_cli import collect_status
from telemetry import MetricsRegistry
from tests.test_admin_http import raw_exchange, status_of

TOKEN = "t0ken-of-the-admin-port-0123456789"


class Refusals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []
        self.status_calls = 0

    def __call__(self, host: str, port: int, what: str) -> None:
        self.seen.append((host, port, what))

    def status(self) -> dict[str, Any]:
        self.status_calls += 1
        return {"node": "main-1", "partitions": 3}


@pytest.fixture
async def guarded(nursery: trio.Nursery) -> AsyncIterator[tuple[int, Refusals]]:
    refusals = Refusals()
    port = await nursery.start(
        lambda task_status: serve_admin_http(
            "127.0.0.1",
            0,
            MetricsRegistry(),
            refusals.status,
            token=TOKEN,
            on_unauthorized=refusals,
            task_status=task_status,
        )
    )
    yield port, refusals


async def test_status_needs_the_token_metrics_and_healthz_do_not(
    guarded: tuple[int, Refusals],
) -> None:
    port, refusals = guarded
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        r = await client.get("/status")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer realm="zonefleet-admin"'
        assert "partitions" not in r.text and refusals.status_calls == 0
        r = await client.get("/status", headers={"Authorization": "Bearer not-the-token"})
        assert r.status_code == 401
        assert r.headers["www-authenticate"].endswith('error="invalid_token"')
        r = await client.get("/status", headers={"Authorization": f"Basic {TOKEN}"})
        assert r.status_code == 401
        r = await client.get("/status", headers=bearer_headers(TOKEN))
        assert (r.status_code, r.json()) == (200, {"node": "main-1", "partitions": 3})
        r = await client.get("/status?x=1", headers={"authorization": f"bearer {TOKEN}"})
        assert r.status_code == 200  # the scheme is case-insensitive
        # Every other path is behind the token too (fail closed): 401 before 404 or 405.
        assert (await client.get("/nope")).status_code == 401
        assert (await client.get("/nope", headers=bearer_headers(TOKEN))).status_code == 404
        r = await client.post("/status", headers=bearer_headers(TOKEN), content=b"x")
        assert r.status_code == 405
        assert (await client.post("/metrics", content=b"x")).status_code == 405
    assert refusals.status_calls == 2
    whats = [what for _, _, what in refusals.seen]
    assert whats == [
        "GET /status: no bearer token",
        "GET /status: wrong or malformed bearer token",
        "GET /status: wrong or malformed bearer token",
        "GET /nope: no bearer token",
    ]
    assert all(host == "127.0.0.1" and port > 0 for host, port, _ in refusals.seen)
    assert all(TOKEN not in what for what in whats)


async def test_two_authorization_headers_are_refused(guarded: tuple[int, Refusals]) -> None:
    port, _ = guarded
    req = (
        b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    assert status_of(await raw_exchange(port, req)) == 401


async def test_status_cli_sends_the_token(guarded: tuple[int, Refusals]) -> None:
    port, _ = guarded
    with_token = FleetNode(1, "main", "az1", "127.0.0.1", port, TOKEN)
    without = FleetNode(1, "main", "az1", "127.0.0.1", port)
    rows = await collect_status([with_token, without])
    assert rows[0].status == {"node": "main-1", "partitions": 3} and rows[0].partitions == 3
    assert rows[1].status is None and rows[1].healthy  # /healthz is open either way
    assert TOKEN not in repr(with_token)


def test_bearer_headers() -> None:
    assert bearer_headers(None) == {}
    assert bearer_headers("abc") == {"Authorization": "Bearer abc"}


# -- config ----------------------------------------------------------------------------------

SECRET = "s" * 32


def doc(admin: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "internal": {"secret": SECRET},
        "zones": [{"name": "az1"}],
        "main_brokers": [{"node_id": 1, "zone": "az1", "port": 9092, "rpc_port": 9094}],
        "proxies": [
            {"node_id": 101, "zone": "az1", "port": 9192, "admin_host": "10.0.0.5"},
        ],
    }
    if admin is not None:
        out["admin"] = admin
    return out


def test_admin_config(tmp_path: Path) -> None:
    config = parse_fleet_config(doc(None), tmp_path, discover=None)
    # No [admin]: the node's host, no token (as before).
    assert [(n.admin_host, n.admin_token) for n in config.nodes()] == [
        ("127.0.0.1", None),
        ("10.0.0.5", None),
    ]
    config = parse_fleet_config(doc({"host": "0.0.0.0", "token": TOKEN}), tmp_path, discover=None)
    # [admin] host binds every node that names no admin_host of its own.
    assert [(n.admin_host, n.admin_token) for n in config.nodes()] == [
        ("0.0.0.0", TOKEN),
        ("10.0.0.5", TOKEN),
    ]
    assert TOKEN not in repr(config.mains[0]) and TOKEN not in repr(config.proxies[0])
    (tmp_path / "admin.token").write_text(TOKEN + "\n")
    config = parse_fleet_config(doc({"token_file": "admin.token"}), tmp_path, discover=None)
    assert config.mains[0].admin_token == TOKEN == config.proxies[0].admin_token


@pytest.mark.parametrize(
    ("admin", "error"),
    [
        ({"token": TOKEN, "token_file": "x"}, "not both"),
        ({"token": "short"}, "at least 16"),
        ({"token": "has a space in it, long enough"}, "without spaces"),
        ({"token_file": "missing.token"}, "cannot read"),
        ({"tokn": TOKEN}, "unknown keys"),
    ],
)
def test_admin_config_errors(tmp_path: Path, admin: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_fleet_config(doc(admin), tmp_path, discover=None)


def test_up_tls_generates_an_admin_token(tmp_path: Path) -> None:
    tls = write_local_tls(tmp_path)
    assert tls.admin_token_file == tmp_path / "tls" / "admin.token"
    assert tls.admin_token_file.read_text().strip() == tls.admin_token
    assert len(tls.admin_token) >= 32
    assert stat.S_IMODE(tls.admin_token_file.stat().st_mode) == 0o600
    assert tls.admin_token not in repr(tls) and tls.admin_password not in repr(tls)
    assert tls.admin_token in tls.admin_line()
    text = local_zones_fleet_toml(
        tmp_path, 20000, 2, SECRET, security_toml=tls.security_toml() + tls.admin_toml()
    )
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    config = parse_fleet_config(tomllib.loads(text), tmp_path, path, discover=None)
    assert {n.admin_token for n in config.nodes()} == {tls.admin_token}
