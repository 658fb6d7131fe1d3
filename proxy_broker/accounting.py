"""Traffic accounting of a zone proxy: its Kafka clients (all in the proxy's zone: a client
that reached this listener is in its zone), its RPC to the mains and its shared-WAL I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from internal_rpc.accounting import RpcTrafficMeter
from kafka_wire.codec import RequestHeader
from kafka_wire.server_loop import ConnectionInfo, KafkaTrafficMeter
from proxy_broker.config import ProxyConfig
from s3_commit.node_ledger import NodeLedger
from shared_wal import set_io_hook
from telemetry import MetricsRegistry, NodeTraffic

__all__ = ["ProxyTraffic"]


class ProxyTraffic:
    """The meters a proxy hands to its Kafka listener, RPC clients and WAL file system.
    `topic_name(id)` names a topic by its id (Fetch v13+ requests are booked by topic)."""

    def __init__(
        self,
        cfg: ProxyConfig,
        registry: MetricsRegistry,
        topic_name: Callable[[bytes], str | None] = lambda topic_id: None,
    ) -> None:
        self.zone = cfg.zone
        self.node = NodeTraffic(
            registry,
            f"proxy-{cfg.node_id}",
            cfg.zone,
            data_dir=cfg.data_dir,
            storage_zone=cfg.storage_zone,
        )
        self.kafka = KafkaTrafficMeter(
            self.node.record, self.node.record_topics, cfg.zone, self._client_zone, topic_name
        )
        self.rpc = RpcTrafficMeter(
            self.node.record, cfg.zone, {m.node_id: m.zone for m in cfg.mains}
        )
        self.ledger = NodeLedger(
            self.node,
            registry,
            object_store_url=cfg.object_store_url,
            data_dir=cfg.data_dir,
            upload_interval_s=cfg.ledger_upload_interval_s,
        )

    def _client_zone(self, header: RequestHeader, conn: ConnectionInfo) -> str:
        return self.zone

    def attach_wal(self, fs: Any) -> None:
        """Count every WAL read and write this node makes on `fs`."""
        set_io_hook(fs, self.node.wal_io)

    def s3_request(self, op: str, nbytes: int) -> None:
        """An object-store request of this node (see NodeLedger.s3_request)."""
        self.ledger.s3_request(op, nbytes)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The ledger's flusher and uploads, as tasks of the node's nursery."""
        await self.ledger.run(task_status=task_status)

    async def aclose(self) -> None:
        """The final flush and upload, once the node's other tasks have stopped."""
        await self.ledger.aclose()
