"""Node assembly: a main broker or a zone proxy wired to its admin HTTP endpoint."""

from __future__ import annotations

import trio

from fleet.admin_http import serve_admin_http
from fleet.config import MainBrokerNode, ProxyNode
from main_broker.broker import MainBroker
from proxy_broker.broker import ProxyBroker
from telemetry import MetricsRegistry


async def run_main_broker_node(
    node: MainBrokerNode, *, task_status: trio.TaskStatus[MainBroker] = trio.TASK_STATUS_IGNORED
) -> None:
    registry = MetricsRegistry()
    broker = MainBroker(node.broker, registry)
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
