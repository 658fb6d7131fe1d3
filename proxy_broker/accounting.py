"""Traffic accounting of a zone proxy: its Kafka clients (all in the proxy's zone: a client
that reached this listener is in its zone), its RPC to the mains and its shared-WAL I/O."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from kafka_wire.codec import RequestHeader
from kafka_wire.rpc_accounting import RpcTrafficMeter
from kafka_wire.server_loop import ConnectionInfo, KafkaTrafficMeter
from proxy_broker.config import ProxyConfig
from s3_commit import request_class
from s3_commit.ledger_uploads import LedgerUploads
from shared_wal import set_io_hook
from telemetry import CHANNEL_S3_GET, CHANNEL_S3_PUT, MetricsRegistry, NodeTraffic

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
        self.config = cfg
        self.registry = registry
        self.uploads: LedgerUploads | None = None

    def _client_zone(self, header: RequestHeader, conn: ConnectionInfo) -> str:
        return self.zone

    def s3_request(self, op: str, nbytes: int) -> None:
        """An object-store request: reads of objects come from the storage zone, the ledger
        uploads' puts go to it."""
        node = self.node
        if request_class(op) == "put":
            node.record(self.zone, node.storage_zone, CHANNEL_S3_PUT, op, nbytes)
        else:
            node.record(node.storage_zone, self.zone, CHANNEL_S3_GET, op, nbytes)

    def attach_wal(self, fs: Any) -> None:
        """Count every WAL read and write this node makes on `fs`."""
        set_io_hook(fs, self.node.wal_io)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The JSONL flusher and, with an object store, the ledger uploads (a pass at start,
        then every `ledger_upload_interval_s`), as tasks of the node's nursery."""
        cfg = self.config
        async with trio.open_nursery() as nursery:
            await nursery.start(self.node.run)
            if cfg.object_store_url is not None and cfg.data_dir is not None:
                self.uploads = await LedgerUploads.open(
                    cfg.object_store_url,
                    cfg.data_dir,
                    self.node.node,
                    self.node.flush,
                    interval_s=cfg.ledger_upload_interval_s,
                    traffic_hook=self.s3_request,
                    registry=self.registry,
                )
                await nursery.start(self.uploads.run)
            task_status.started()

    async def aclose(self) -> None:
        """The final flush, once the node's other tasks have stopped, then the last (bounded)
        ledger upload."""
        await self.node.aclose()
        if self.uploads is not None:
            await self.uploads.final_upload()
