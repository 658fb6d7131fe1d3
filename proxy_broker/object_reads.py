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
from kio.schema.errors import ErrorCode

from kafka_wire.fetch_serving import PartitionReadError
from s3_commit import AsyncObjectStore, ObjectStore
from s3_commit.manifest import StreamManifest
from s3_commit.object_reader import ObjectReader
from shared_wal.batch_index import BatchEntry

__all__ = ["ObjectSpan", "ProxyObjects"]

log = logging.getLogger("zonefleet.proxy.objects")

MAX_THREADS = 8


class ObjectSpan(BatchEntry):
    """Whole batches of a stream from `base_offset` below `end`, within `size` bytes (at least
    one when `must_return_one`): the part of a fetch that committed objects answer. `size` is
    the budget, an upper bound of what the read returns."""

    __slots__ = ("end", "must_return_one", "stream", "stream_id")

    def __init__(
        self,
        stream: StreamManifest,
        stream_id: int,
        offset: int,
        end: int,
        budget: int,
        must_return_one: bool,
    ) -> None:
        super().__init__(offset, end - 1, -1, budget, None, None)
        self.stream = stream
        self.stream_id = stream_id
        self.end = end
        self.must_return_one = must_return_one

    def __repr__(self) -> str:
        return f"ObjectSpan({self.base_offset}..<{self.end}, <= {self.size} B)"


class ProxyObjects:
    def __init__(self, store: ObjectStore, cache_bytes: int) -> None:
        self.store = store
        self.astore = AsyncObjectStore(store, max_threads=MAX_THREADS)
        self.reader = ObjectReader(self.astore, block_cache_bytes=cache_bytes)
        self.failures = 0

    async def run(self) -> None:
        """Hosts the reader's read-ahead tasks; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self.reader.nursery = nursery
            await trio.sleep_forever()

    async def read(self, span: ObjectSpan) -> list[memoryview]:
        """The span's batches. Any failure (the store, a missing or corrupt object) fails only
        the partition that read it, with KAFKA_STORAGE_ERROR, which clients retry."""
        try:
            return await self.reader.read(
                span.stream,
                span.stream_id,
                span.base_offset,
                span.end,
                span.size,
                span.must_return_one,
            )
        except Exception as exc:  # of any kind: a store, a file system, or corrupt bytes
            self.failures += 1
            log.warning(
                "reading offsets %d..%d of stream %016x from objects failed: %s: %s",
                span.base_offset,
                span.end - 1,
                span.stream_id,
                type(exc).__name__,
                exc,
            )
            raise PartitionReadError(ErrorCode.kafka_storage_error, str(exc)) from exc

    def evict(self, keys: list[str]) -> None:
        self.reader.evict(keys)
