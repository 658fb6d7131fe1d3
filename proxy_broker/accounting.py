"""Traffic accounting of a zone proxy: its Kafka clients (all in the proxy's zone: a client
that reached this listener is in its zone), its RPC to the mains and its shared-WAL I/O."""

from __future__ import annotations

from typing import Any

import trio

from kafka_wire.codec import RequestHeader
from kafka_wire.rpc_accounting import RpcTrafficMeter
from kafka_wire.server_loop import ConnectionInfo, KafkaTrafficMeter
from proxy_broker.config import ProxyConfig
from s3_commit import request_class
from shared_wal import set_io_hook
from telemetry import CHANNEL_S3_GET, CHANNEL_S3_PUT, MetricsRegistry, NodeTraffic

__all__ = ["ProxyTraffic"]


class ProxyTraffic:
    """The meters a proxy hands to its Kafka listener, RPC clients and WAL file system."""

    def __init__(self, cfg: ProxyConfig, registry: MetricsRegistry) -> None:
        self.zone = cfg.zone
        self.node = NodeTraffic(
            registry,
            f"proxy-{cfg.node_id}",
            cfg.zone,
            data_dir=cfg.data_dir,
            storage_zone=cfg.storage_zone,
        )
        self.kafka = KafkaTrafficMeter(self.node.record, cfg.zone, self._client_zone)
        self.rpc = RpcTrafficMeter(
            self.node.record, cfg.zone, {m.node_id: m.zone for m in cfg.mains}
        )

    def _client_zone(self, header: RequestHeader, conn: ConnectionInfo) -> str:
        return self.zone

    def s3_request(self, op: str, nbytes: int) -> None:
        """An object-store request (a proxy only reads): booked from the storage zone."""
        node = self.node
        if request_class(op) == "put":
            node.record(self.zone, node.storage_zone, CHANNEL_S3_PUT, op, nbytes)
        else:
            node.record(node.storage_zone, self.zone, CHANNEL_S3_GET, op, nbytes)

    def attach_wal(self, fs: Any) -> None:
        """Count every WAL read and write this node makes on `fs`."""
        set_io_hook(fs, self.node.wal_io)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The JSONL flusher, as a task of the node's nursery."""
        await self.node.run(task_status=task_status)

    async def aclose(self) -> None:
        """The final flush, once the node's other tasks have stopped."""
        await self.node.aclose()
