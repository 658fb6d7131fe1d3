"""Node assembly: a main broker or a zone proxy wired to its admin HTTP endpoint and its
audit log."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial

import trio

from fleet.admin_http import serve_admin_http
from fleet.audit_file import open_audit_log
from fleet.config import MainBrokerNode, ProxyNode
from kafka_wire.connection_limits import ConnectionLimits
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


async def run_main_broker_node(
    node: MainBrokerNode, *, task_status: trio.TaskStatus[MainBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    registry = MetricsRegistry()
    with _node_audit(node.audit_log, f"main-{node.broker.node_id}") as audit:
        broker = MainBroker(node.broker, registry, audit=audit)
        _export_connections(broker.connection_limits, registry)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    serve_admin_http,
                    node.admin_host,
                    node.admin_port,
                    registry,
                    broker.status,
                    broker.health,
                    token=node.admin_token,
                    on_unauthorized=partial(_admin_refused, audit),
                )
            )
            nursery.start_soon(_sweep_audit, audit)
            await nursery.start(broker.run)
            task_status.started(broker)


async def run_proxy_node(
    node: ProxyNode, *, task_status: trio.TaskStatus[ProxyBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    registry = MetricsRegistry()
    with _node_audit(node.audit_log, f"proxy-{node.proxy.node_id}") as audit:
        proxy = ProxyBroker(node.proxy, registry, audit=audit)
        _export_connections(proxy.connection_limits, registry)
        async with trio.open_nursery() as nursery:
            # Admin first, so /healthz says "starting" while the proxy syncs with its mains.
            await nursery.start(
                partial(
                    serve_admin_http,
                    node.admin_host,
                    node.admin_port,
                    registry,
                    proxy.status,
                    proxy.health,
                    token=node.admin_token,
                    on_unauthorized=partial(_admin_refused, audit),
                )
            )
            nursery.start_soon(_sweep_audit, audit)
            await nursery.start(proxy.run)
            task_status.started(proxy)
