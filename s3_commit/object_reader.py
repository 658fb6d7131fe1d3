"""Reading a stream's batches back from committed objects, for main brokers and proxies alike.

The pure core (`select_block_batches`, plus `StreamManifest.find` and `ObjectIndex.find`)
decides which bytes answer a read; `ObjectReader` is the async edge: cached footers and
indexes per object, ranged GETs of DataBlocks, an LRU block cache bounded in bytes, and
read-ahead of the next block for sequential consumers. Batches come back as memoryviews into
cached blocks; records are never decoded.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from kafka_wire.record_batch import BatchInfo, Buffer, parse_batch_header
from s3_commit.async_store import AsyncObjectStore
from s3_commit.manifest import ObjectRange, StreamManifest
from s3_commit.object_format import (
    FOOTER_SIZE,
    CorruptObject,
    IndexEntry,
    ObjectIndex,
    check_block,
    parse_footer,
)
from s3_commit.object_store import ObjectStoreError

__all__ = [
    "DEFAULT_BLOCK_CACHE_BYTES",
    "BlockSelection",
    "ObjectMissing",
    "ObjectReader",
    "select_block_batches",
]

log = logging.getLogger("zonefleet.s3_commit.reader")

DEFAULT_BLOCK_CACHE_BYTES = 64 << 20
DEFAULT_INDEX_CACHE_OBJECTS = 4096
# One ranged GET usually covers footer and index: an object of 500 MiB in 1 MiB blocks has a
# 18 KiB index.
DEFAULT_TAIL_BYTES = 64 << 10


class ObjectMissing(ObjectStoreError):
    """A manifest lists an object the store does not have."""


@dataclass(slots=True)
class BlockSelection:
    batches: list[memoryview]
    nbytes: int
    done: bool  # the read is complete: the budget or `end` was reached inside this block
    first: BatchInfo | None = None


def select_block_batches(
    block: Buffer, offset: int, end: int, budget: int, must_return_one: bool
) -> BlockSelection:
    """Whole batches of a DataBlock from the one holding `offset`, all below `end`, within
    `budget` bytes; the first may exceed the budget when `must_return_one` (KIP-74)."""
    view = memoryview(block)
    out: list[memoryview] = []
    first: BatchInfo | None = None
    total = 0
    position = 0
    while position < len(view):
        info = parse_batch_header(view, position)
        if info.last_offset >= offset:
            if info.last_offset >= end:
                return BlockSelection(out, total, True, first)
            if total + info.size > budget and (out or not must_return_one):
                return BlockSelection(out, total, True, first)
            out.append(view[position : position + info.size])
            first = first or info
            total += info.size
        position += info.size
    return BlockSelection(out, total, False, first)


class ObjectReader:
    def __init__(
        self,
        store: AsyncObjectStore,
        *,
        block_cache_bytes: int = DEFAULT_BLOCK_CACHE_BYTES,
        index_cache_objects: int = DEFAULT_INDEX_CACHE_OBJECTS,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
    ) -> None:
        self.store = store
        self.block_cache_bytes = block_cache_bytes
        self.index_cache_objects = index_cache_objects
        self.tail_bytes = max(tail_bytes, FOOTER_SIZE)
        self._indexes: OrderedDict[str, ObjectIndex] = OrderedDict()
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._loading: dict[tuple[str, int], trio.Event] = {}
        self.cached_bytes = 0
        # Set by the owner to enable read-ahead: prefetches run as its background tasks.
        self.nursery: trio.Nursery | None = None
        self.gets = 0
        self.bytes_read = 0
        self.block_hits = 0
        self.block_misses = 0

    def gauges(self, prefix: str = "zonefleet_s3") -> dict[str, tuple[str, Callable[[], float]]]:
        """The reader's Prometheus gauges, for `MetricsRegistry.gauge_functions`."""
        return {
            f"{prefix}_block_cache_bytes": (
                "Bytes of DataBlocks in the read cache.",
                lambda: float(self.cached_bytes),
            ),
            f"{prefix}_block_cache_hits": (
                "DataBlock reads served from the cache.",
                lambda: float(self.block_hits),
            ),
            f"{prefix}_block_cache_misses": (
                "DataBlock reads that had to GET the block.",
                lambda: float(self.block_misses),
            ),
            f"{prefix}_read_gets": (
                "Ranged GETs of object footers, indexes and DataBlocks.",
                lambda: float(self.gets),
            ),
            f"{prefix}_read_bytes": ("Bytes read from objects.", lambda: float(self.bytes_read)),
        }

    # -- footers and indexes -------------------------------------------------------------------

    async def index(self, key: str, size: int) -> ObjectIndex:
        cached = self._indexes.get(key)
        if cached is not None:
            self._indexes.move_to_end(key)
            return cached
        guess = min(size, self.tail_bytes)
        tail = await self._get_range(key, size - guess, guess)
        footer = parse_footer(tail, size)
        needed = footer.index_length + FOOTER_SIZE
        if needed > len(tail):
            tail = await self._get_range(key, size - needed, needed)
        index = ObjectIndex.from_tail(tail, size)
        self._indexes[key] = index
        while len(self._indexes) > self.index_cache_objects:
            self._indexes.popitem(last=False)
        return index

    async def _get_range(self, key: str, start: int, length: int) -> bytes:
        data = await self.store.get_range(key, start, length)
        self.gets += 1
        if data is None:
            raise ObjectMissing(f"object {key} is listed in a manifest but missing")
        if len(data) != length:
            raise CorruptObject(f"{key}: asked for {length} bytes at {start}, got {len(data)}")
        self.bytes_read += len(data)
        return data

    # -- blocks --------------------------------------------------------------------------------

    async def block(self, key: str, entry: IndexEntry) -> bytes:
        """The DataBlock's bytes, checked against its index entry (sizes, offsets, CRCs)."""
        slot = (key, entry.position)
        while True:
            cached = self._blocks.get(slot)
            if cached is not None:
                self._blocks.move_to_end(slot)
                self.block_hits += 1
                return cached
            loading = self._loading.get(slot)
            if loading is None:
                break
            await loading.wait()  # another reader (or a read-ahead) is fetching it
            if slot not in self._blocks:
                break  # it failed or was evicted at once: fetch it ourselves
        self.block_misses += 1
        done = self._loading[slot] = trio.Event()
        try:
            data = await self._get_range(key, entry.position, entry.size)
            check_block(data, entry)
            self._remember(slot, data)
            return data
        finally:
            del self._loading[slot]
            done.set()

    def _remember(self, slot: tuple[str, int], data: bytes) -> None:
        if len(data) > self.block_cache_bytes:
            return
        self._blocks[slot] = data
        self.cached_bytes += len(data)
        while self.cached_bytes > self.block_cache_bytes:
            _, old = self._blocks.popitem(last=False)
            self.cached_bytes -= len(old)

    def _read_ahead(self, key: str, entry: IndexEntry) -> None:
        slot = (key, entry.position)
        if self.nursery is None or slot in self._blocks or slot in self._loading:
            return

        async def fetch() -> None:
            try:
                await self.block(key, entry)
            except (ObjectStoreError, CorruptObject, OSError) as exc:
                log.debug("read-ahead of %s at %d failed: %s", key, entry.position, exc)

        self.nursery.start_soon(fetch)

    def _next_entry(
        self, index: ObjectIndex, stream_id: int, entry: IndexEntry
    ) -> IndexEntry | None:
        entries = index.entries_for(stream_id)
        for i, e in enumerate(entries):
            if e.position == entry.position:
                return entries[i + 1] if i + 1 < len(entries) else None
        return None

    # -- reads ---------------------------------------------------------------------------------

    async def read(
        self,
        stream: StreamManifest,
        stream_id: int,
        offset: int,
        end: int,
        max_bytes: int,
        must_return_one: bool = True,
    ) -> list[memoryview]:
        """Whole batches of the stream from the one holding `offset`, below `end`, within
        `max_bytes` (at least one when `must_return_one`), across objects; an offset in a gap
        between ranges continues at the next range."""
        out: list[memoryview] = []
        total = 0
        current = offset
        while current < end:
            rng = stream.find(current)
            if rng is None or rng.start >= end:
                break
            current = max(current, rng.start)
            index = await self.index(rng.key, rng.size)
            entry = index.find(stream_id, current)
            if entry is None or entry.start_offset >= rng.end:
                current = rng.end
                continue
            data = await self.block(rng.key, entry)
            chosen = select_block_batches(
                data, current, end, max_bytes - total, must_return_one and not out
            )
            out.extend(chosen.batches)
            total += chosen.nbytes
            following = self._next_entry(index, stream_id, entry)
            if following is not None and following.start_offset < rng.end:
                self._read_ahead(rng.key, following)
            if chosen.done:
                break
            current = entry.end_offset
        return out

    async def first_batch_at_timestamp(
        self, stream: StreamManifest, stream_id: int, rng: ObjectRange, timestamp: int, end: int
    ) -> tuple[memoryview, BatchInfo] | None:
        """The first batch of `rng` whose max timestamp reaches `timestamp` (ListOffsets)."""
        current = rng.start
        index = await self.index(rng.key, rng.size)
        while current < min(rng.end, end):
            entry = index.find(stream_id, current)
            if entry is None or entry.start_offset >= rng.end:
                return None
            data = await self.block(rng.key, entry)
            view = memoryview(data)
            position = 0
            while position < len(view):
                info = parse_batch_header(view, position)
                if info.last_offset >= end:
                    return None
                if info.max_timestamp >= timestamp:
                    return view[position : position + info.size], info
                position += info.size
            current = entry.end_offset
        return None

    def evict(self, keys: Sequence[str]) -> None:
        """Forget objects that were deleted (compaction, retention)."""
        gone = set(keys)
        for key in gone:
            self._indexes.pop(key, None)
        for slot in [s for s in self._blocks if s[0] in gone]:
            self.cached_bytes -= len(self._blocks.pop(slot))
