"""`zonefleet status`: every node of the fleet, read through its admin HTTP API (with the
fleet's `[admin] token`, when it has one, for /status)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from fleet.admin_http import bearer_headers
from fleet.config import WILDCARD_HOSTS, ConfigError, FleetNode, load_fleet_config

__all__ = [
    "NodeStatus",
    "add_status_parser",
    "collect_status",
    "format_status_table",
    "run_status_command",
]

DEFAULT_TIMEOUT_S = 2.0


@dataclass
class NodeStatus:
    node_id: int
    zone: str
    role: str
    admin: str  # host:port of its admin HTTP endpoint
    health: str  # "ok", "down", or the reason /healthz gives (e.g. "starting")
    healthy: bool
    partitions: int | None
    status: dict[str, Any] | None  # the node's /status document, None when it did not answer


def add_status_parser(sub: Any) -> None:
    status = sub.add_parser("status", help="health and partitions of every node of a fleet")
    source = status.add_mutually_exclusive_group()
    source.add_argument("--config", default=None, help="fleet TOML file")
    source.add_argument(
        "--data-dir", default=None, help="directory of a `zonefleet up` fleet (its fleet.toml)"
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-node timeout, seconds"
    )


def _admin_url(node: FleetNode) -> str:
    # A node listening on all interfaces is reached on loopback from here.
    host = "127.0.0.1" if node.admin_host in WILDCARD_HOSTS else node.admin_host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{node.admin_port}"


async def _probe(client: httpx.AsyncClient, node: FleetNode) -> NodeStatus:
    base = _admin_url(node)
    result = NodeStatus(
        node.node_id, node.zone, node.role, base[len("http://") :], "down", False, None, None
    )
    try:
        health = await client.get(base + "/healthz")
        status = await client.get(base + "/status", headers=bearer_headers(node.admin_token))
    except httpx.HTTPError:
        return result
    result.healthy = health.status_code == 200
    result.health = (
        "ok" if result.healthy else (health.text.strip() or f"http {health.status_code}")
    )
    if status.status_code == 200:
        try:
            doc = status.json()
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            result.status = doc
            # The node knows its zone best (the config may say "auto").
            result.zone = str(doc.get("zone") or node.zone)
            partitions = doc.get("partitions")
            result.partitions = partitions if isinstance(partitions, int) else None
    return result


async def collect_status(
    nodes: list[FleetNode], timeout: float = DEFAULT_TIMEOUT_S
) -> list[NodeStatus]:
    """Probe every node concurrently; a node that does not answer is reported as down."""
    results: list[NodeStatus | None] = [None] * len(nodes)

    async def probe(i: int, client: httpx.AsyncClient) -> None:
        results[i] = await _probe(client, nodes[i])

    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        async with trio.open_nursery() as nursery:
            for i in range(len(nodes)):
                nursery.start_soon(probe, i, client)
    return [r for r in results if r is not None]


def format_status_table(rows: list[NodeStatus]) -> str:
    header = ("NODE", "ZONE", "ROLE", "HEALTH", "PARTITIONS", "ADMIN")
    lines = [header]
    for r in rows:
        partitions = "-" if r.partitions is None else str(r.partitions)
        lines.append((str(r.node_id), r.zone, r.role, r.health, partitions, r.admin))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def run_status_command(args: argparse.Namespace) -> int:
    if args.config:
        path = Path(args.config)
    else:
        path = Path(args.data_dir or "data") / "fleet.toml"
        if not path.exists():
            raise ConfigError(f"no fleet at {path}: pass --config or the --data-dir of `up`")
    # Zones left to IMDS stay "auto" here: each node reports its real zone in /status.
    config = load_fleet_config(path, discover=None)
    rows = trio.run(collect_status, config.nodes(), args.timeout)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2, sort_keys=True))
    else:
        print(format_status_table(rows))
    return 0
