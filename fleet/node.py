"""Node assembly: a main broker or a zone proxy wired to its admin HTTP endpoint and its
audit log."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Protocol, TypeVar

import trio

from fleet.admin_http import serve_admin_http
from fleet.audit_file import open_audit_log
from fleet.config import MainBrokerNode, ProxyNode
from kafka_wire.connection_limits import ConnectionLimits
from kafka_wire.server_loop import ClientServing
from main_broker.broker import MainBroker
from proxy_broker.broker import ProxyBroker
from telemetry import MetricsRegistry
from telemetry.audit import ANONYMOUS, AuditLog, AuthenticationFailed

AUDIT_SWEEP_S = 1.0  # how often held-back audit events whose window passed are written


def _export_connections(limits: ConnectionLimits, registry: MetricsRegistry) -> None:
    """What the node's client connections hold under way, so its per-connection bound
    (max_in_flight_bytes_per_connection) can be watched."""
    registry.gauge_functions(
        {
            "zonefleet_connection_in_flight_bytes": (
                "Request bytes read from client connections and not yet answered, in all.",
                lambda: limits.in_flight_bytes,
            ),
            "zonefleet_connection_in_flight_bytes_peak": (
                "The most request bytes one client connection has had under way.",
                lambda: limits.peak_in_flight_bytes,
            ),
        }
    )


@contextlib.contextmanager
def _node_audit(template: str | None, node: str) -> Iterator[AuditLog]:
    """The node's audit log for its lifetime: on the way out, what it held back is written
    and its file closed."""
    audit, out = open_audit_log(template, node)
    try:
        yield audit
    finally:
        audit.close()
        if out is not None:
            out.close()


async def _sweep_audit(audit: AuditLog) -> None:
    if not audit.enabled:
        return
    while True:
        await trio.sleep(AUDIT_SWEEP_S)
        audit.sweep()


def _admin_refused(audit: AuditLog, host: str, port: int, what: str) -> None:
    audit.record(
        AuthenticationFailed(ANONYMOUS, host, port, "admin-http", "Bearer", None, what, "HTTP_401")
    )


class _Node(Protocol):
    """What the admin endpoint and the supervisor use of a main broker or a proxy."""

    clients: ClientServing

    def status(self) -> dict[str, Any]: ...
    def health(self) -> tuple[bool, str]: ...
    async def run(self, *, task_status: trio.TaskStatus[int] = ...) -> None: ...


N = TypeVar("N", bound=_Node)


async def _run_node(
    name: str,
    admin: tuple[str, int, str | None],
    audit_template: str | None,
    build: Callable[[MetricsRegistry, AuditLog], N],
    task_status: trio.TaskStatus[N],
) -> None:
    """Builds the node with its metrics registry and audit log, and runs it behind its admin
    endpoint (started first, so /healthz says "starting" while the node syncs)."""
    host, port, token = admin
    registry = MetricsRegistry()
    with _node_audit(audit_template, name) as audit:
        node = build(registry, audit)
        _export_connections(node.clients.limits, registry)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    serve_admin_http,
                    host,
                    port,
                    registry,
                    node.status,
                    node.health,
                    token=token,
                    on_unauthorized=partial(_admin_refused, audit),
                )
            )
            nursery.start_soon(_sweep_audit, audit)
            await nursery.start(node.run)
            task_status.started(node)


async def run_main_broker_node(
    node: MainBrokerNode, *, task_status: trio.TaskStatus[MainBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    await _run_node(
        f"main-{node.broker.node_id}",
        (node.admin_host, node.admin_port, node.admin_token),
        node.audit_log,
        lambda registry, audit: MainBroker(node.broker, registry, audit=audit),
        task_status,
    )


async def run_proxy_node(
    node: ProxyNode, *, task_status: trio.TaskStatus[ProxyBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    await _run_node(
        f"proxy-{node.proxy.node_id}",
        (node.admin_host, node.admin_port, node.admin_token),
        node.audit_log,
        lambda registry, audit: ProxyBroker(node.proxy, registry, audit=audit),
        task_status,
    )
