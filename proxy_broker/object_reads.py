"""A proxy's reads from the mains' committed objects, for offsets its WAL mirrors no longer
hold (the main trimmed its WAL below them, or the proxy started after the trim).

A mirror partition answers such a fetch with one `ObjectSpan` entry standing for the batches
from an offset below an end; `ProxyObjects` resolves it with `s3_commit.object_reader` (cached
footers and indexes, ranged GETs, one LRU block cache bounded in bytes for every mirror,
read-ahead), its blocking store calls in worker threads under the store's limiter.
"""

from __future__ import annotations

import logging

import trio

from kafka_wire.fetch_serving import PartitionReadError, read_failures_fail_the_partition
from s3_commit import AsyncObjectStore, ObjectStore
from s3_commit.manifest import StreamManifest
from s3_commit.object_reader import ObjectReader
from shared_wal.batch_index import ObjectSpan
from telemetry import MetricsRegistry

__all__ = ["ObjectSpan", "ProxyObjects"]

log = logging.getLogger("zonefleet.proxy.objects")

MAX_THREADS = 8


class ProxyObjects:
    def __init__(self, store: ObjectStore, cache_bytes: int, registry: MetricsRegistry) -> None:
        self.store = store
        self.astore = AsyncObjectStore(store, max_threads=MAX_THREADS)
        self.reader = ObjectReader(self.astore, block_cache_bytes=cache_bytes)
        self.failures = 0
        registry.gauge_functions(
            {
                **self.reader.gauges(),
                "zonefleet_s3_read_failures": (
                    "Partition reads from objects that failed (KAFKA_STORAGE_ERROR).",
                    lambda: float(self.failures),
                ),
            }
        )

    async def run(self) -> None:
        """Hosts the reader's read-ahead tasks; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self.reader.nursery = nursery
            await trio.sleep_forever()

    async def read(self, span: ObjectSpan[StreamManifest]) -> list[memoryview]:
        """The span's batches; a failure fails only the partition that read it."""
        what = f"offsets {span.base_offset}..{span.end - 1} of stream {span.stream_id:016x}"
        try:
            with read_failures_fail_the_partition(log, f"{what} from objects"):
                return await self.reader.read(
                    span.stream,
                    span.stream_id,
                    span.base_offset,
                    span.end,
                    span.size,
                    span.must_return_one,
                )
        except PartitionReadError:
            self.failures += 1
            raise

    def evict(self, keys: list[str]) -> None:
        self.reader.evict(keys)
