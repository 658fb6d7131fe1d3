"""One node's traffic accounting as a broker wires it: the counters, the daily JSONL sink under
the data directory, the shared-WAL I/O callback and the flusher task."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import trio

from telemetry.metrics import MetricsRegistry
from telemetry.traffic import (
    CHANNEL_WAL_READ,
    CHANNEL_WAL_WRITE,
    REGIONAL_ZONE,
    TrafficAccounting,
)
from telemetry.traffic_sink import DailyJsonlTrafficSink

__all__ = ["DEFAULT_FLUSH_INTERVAL_S", "NodeTraffic"]

DEFAULT_FLUSH_INTERVAL_S = 15.0

log = logging.getLogger("zonefleet.telemetry")


class NodeTraffic:
    """Accounting of node `node` (e.g. ``main-1``, ``proxy-102``) in zone `zone`.

    With `data_dir`, closed minutes go to ``<data_dir>/accounting/dt=YYYY-MM-DD/<node>.jsonl``;
    without, only to Prometheus. Shared-WAL traffic is booked between `zone` and `storage_zone`.
    """

    def __init__(
        self,
        registry: MetricsRegistry,
        node: str,
        zone: str,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        storage_zone: str = REGIONAL_ZONE,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.zone = zone
        self.storage_zone = storage_zone
        self.flush_interval_s = flush_interval_s
        self.sink = DailyJsonlTrafficSink(data_dir, node) if data_dir is not None else None
        self.accounting = TrafficAccounting(registry, node, self.sink, clock=clock)
        # The bound methods, so hot paths skip one attribute lookup.
        self.record = self.accounting.record
        self.record_topics = self.accounting.record_topics
        self._limiter = trio.CapacityLimiter(1)

    def wal_io(self, op: str, nbytes: int) -> None:
        """The shared-WAL I/O callback (any thread): ``write`` goes to the storage zone, reads
        (``read`` of one record, ``scan`` of a segment stretch) come from it."""
        if op == "write":
            self.record(self.zone, self.storage_zone, CHANNEL_WAL_WRITE, op, nbytes)
        else:
            self.record(self.storage_zone, self.zone, CHANNEL_WAL_READ, op, nbytes)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The flusher: writes closed minutes every `flush_interval_s`, the open one on exit."""
        await self.accounting.run_flusher(
            self.flush_interval_s, limiter=self._limiter, task_status=task_status
        )

    async def flush(self) -> None:
        """Write the closed minutes now, as the flusher does (e.g. right before an upload)."""
        await self.accounting.flush_async(limiter=self._limiter)

    async def aclose(self) -> None:
        """The last flush, for a node that has stopped every other task (shielded): frames
        sent while the flusher itself was being cancelled land in the ledger too."""
        with trio.CancelScope(shield=True):
            try:
                await self.accounting.flush_async(include_open=True, limiter=self._limiter)
            except Exception:
                log.exception("traffic accounting: final flush of %s failed", self.node)
