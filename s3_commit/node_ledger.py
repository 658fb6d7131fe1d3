"""A node's traffic ledger as a broker runs it: the JSONL flusher of its `NodeTraffic` and,
when the node has an object store and a data directory, the uploads of its closed lines
(docs/formats.md, "Ledger uploads"). Mains and proxies run it alike."""

from __future__ import annotations

import os

import trio

from s3_commit.ledger_uploads import LedgerUploads
from s3_commit.object_store import request_class
from telemetry import CHANNEL_S3_GET, CHANNEL_S3_PUT, MetricsRegistry, NodeTraffic

__all__ = ["NodeLedger"]


class NodeLedger:
    def __init__(
        self,
        traffic: NodeTraffic,
        registry: MetricsRegistry,
        *,
        object_store_url: str | None,
        data_dir: str | os.PathLike[str] | None,
        upload_interval_s: float,
    ) -> None:
        self.traffic = traffic
        self.registry = registry
        self.object_store_url = object_store_url
        self.data_dir = data_dir
        self.upload_interval_s = upload_interval_s
        self.uploads: LedgerUploads | None = None

    def s3_request(self, op: str, nbytes: int) -> None:
        """An object-store request: PUT-class requests go to the storage zone, GET-class ones
        come from it."""
        node = self.traffic
        if request_class(op) == "put":
            node.record(node.zone, node.storage_zone, CHANNEL_S3_PUT, op, nbytes)
        else:
            node.record(node.storage_zone, node.zone, CHANNEL_S3_GET, op, nbytes)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The flusher and, with an object store, the uploads (a pass at start, then every
        `upload_interval_s`), as tasks of the node's nursery."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.traffic.run)
            if self.object_store_url is not None and self.data_dir is not None:
                self.uploads = await LedgerUploads.open(
                    self.object_store_url,
                    self.data_dir,
                    self.traffic.node,
                    self.traffic.flush,
                    interval_s=self.upload_interval_s,
                    traffic_hook=self.s3_request,
                    registry=self.registry,
                )
                await nursery.start(self.uploads.run)
            task_status.started()

    async def aclose(self) -> None:
        """The final flush, once the node's other tasks have stopped, then the last (bounded)
        upload."""
        await self.traffic.aclose()
        if self.uploads is not None:
            await self.uploads.final_upload()
