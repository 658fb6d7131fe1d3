"""Node assembly: a main broker or a zone proxy wired to its admin HTTP endpoint."""

from __future__ import annotations

import trio

from fleet.admin_http import serve_admin_http
from fleet.config import MainBrokerNode, ProxyNode
from kafka_wire.connection_limits import ConnectionLimits
from main_broker.broker import MainBroker
from proxy_broker.broker import ProxyBroker
from telemetry import MetricsRegistry


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


async def run_main_broker_node(
    node: MainBrokerNode, *, task_status: trio.TaskStatus[MainBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    registry = MetricsRegistry()
    broker = MainBroker(node.broker, registry)
    _export_connections(broker.connection_limits, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(
            serve_admin_http,
            node.admin_host,
            node.admin_port,
            registry,
            broker.status,
            broker.health,
        )
        await nursery.start(broker.run)
        task_status.started(broker)


async def run_proxy_node(
    node: ProxyNode, *, task_status: trio.TaskStatus[ProxyBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    registry = MetricsRegistry()
    proxy = ProxyBroker(node.proxy, registry)
    _export_connections(proxy.connection_limits, registry)
    async with trio.open_nursery() as nursery:
        # Admin first, so /healthz says "starting" while the proxy syncs with its mains.
        await nursery.start(
            serve_admin_http,
            node.admin_host,
            node.admin_port,
            registry,
            proxy.status,
            proxy.health,
        )
        await nursery.start(proxy.run)
        task_status.started(proxy)
