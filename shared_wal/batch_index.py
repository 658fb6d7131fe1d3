"""An offset index over one partition's record batches, shared by the main broker and proxies.

Pure logic (no I/O, no trio). Each batch is a `BatchEntry` that knows its offsets, its maximum
timestamp, the cached batch bytes (while kept in memory) and the WAL position of the record that
holds it (once durable). Reads take an `upper` bound (high watermark or last stable offset):
nothing whose last offset reaches it is returned.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from shared_wal.broker_records import PreparedLink
    from shared_wal.record import WalPosition


class BatchEntry:
    __slots__ = ("base_offset", "data", "last_offset", "link", "max_timestamp", "position", "size")

    def __init__(
        self,
        base_offset: int,
        last_offset: int,
        max_timestamp: int,
        size: int,
        data: memoryview | bytes | None,
        position: WalPosition | None,
        link: PreparedLink | None = None,
    ) -> None:
        self.base_offset = base_offset
        self.last_offset = last_offset
        self.max_timestamp = max_timestamp
        self.size = size
        self.data = data
        self.position = position
        # Set when the bytes live in a proxy's PREPARED record rather than in our DATA record.
        self.link = link

    def __repr__(self) -> str:
        return f"BatchEntry({self.base_offset}..{self.last_offset}, {self.size} B)"


S = TypeVar("S")


class ObjectSpan(BatchEntry, Generic[S]):
    """A read the WAL index cannot answer, for committed S3 objects to serve: whole batches
    from `base_offset` below `end` within `size` bytes (at least one when `must_return_one`).

    It stands in for the entries of a fetch slice, so Fetch serving needs no change: the
    broker's batch reader resolves it with ranged GETs. `size` is the budget, an upper bound of
    what the read returns. `stream` is the object manifest's record of the stream (opaque
    here). With `timestamp` set it asks for the first batch reaching that timestamp instead
    (ListOffsets); the reader then moves `base_offset` to that batch.
    """

    __slots__ = ("end", "must_return_one", "stream", "stream_id", "timestamp")

    def __init__(
        self,
        stream: S,
        stream_id: int,
        offset: int,
        end: int,
        budget: int,
        must_return_one: bool,
        timestamp: int | None = None,
        max_timestamp: int = -1,
    ) -> None:
        super().__init__(offset, end - 1, max_timestamp, budget, None, None)
        self.stream = stream
        self.stream_id = stream_id
        self.end = end
        self.must_return_one = must_return_one
        self.timestamp = timestamp

    def __repr__(self) -> str:
        return f"ObjectSpan({self.base_offset}..<{self.end}, <= {self.size} B)"


class BatchIndex:
    """Batches in offset order, searchable by offset and by timestamp."""

    __slots__ = ("_bases", "_max_ts_prefix", "end_offset", "entries")

    def __init__(self, start_offset: int = 0) -> None:
        self.entries: list[BatchEntry] = []
        self._bases: list[int] = []
        # Running maximum of max_timestamp, so the first batch reaching a timestamp is a bisect.
        self._max_ts_prefix: list[int] = []
        # Last offset + 1 of the newest entry ever added (dropping entries keeps it), or the
        # offset the log starts at when nothing was added yet.
        self.end_offset = start_offset

    def add(self, entry: BatchEntry) -> None:
        """Append a batch; its offsets must follow the previous entry's."""
        self.entries.append(entry)
        self._bases.append(entry.base_offset)
        previous = self._max_ts_prefix[-1] if self._max_ts_prefix else -1
        self._max_ts_prefix.append(max(previous, entry.max_timestamp))
        self.end_offset = entry.last_offset + 1

    def first_index_at(self, offset: int) -> int:
        """Index of the first entry holding `offset` or later (len(entries) when none)."""
        idx = bisect.bisect_right(self._bases, offset) - 1
        if idx < 0:
            return 0
        if self.entries[idx].last_offset < offset:
            idx += 1
        return idx

    def fetch_slice(
        self, offset: int, max_bytes: int, upper: int, must_return_one: bool
    ) -> list[BatchEntry]:
        """Whole batches from `offset` below `upper`, within max_bytes.

        The first batch is returned even when it alone exceeds max_bytes (KIP-74), when the
        caller says this partition may be the first with data in the response.
        """
        out: list[BatchEntry] = []
        total = 0
        entries = self.entries
        for i in range(self.first_index_at(offset), len(entries)):
            entry = entries[i]
            if entry.last_offset >= upper:
                break
            if total + entry.size > max_bytes and (out or not must_return_one):
                break
            out.append(entry)
            total += entry.size
        return out

    def bytes_available(self, offset: int, upper: int) -> int:
        total = 0
        entries = self.entries
        for i in range(self.first_index_at(offset), len(entries)):
            entry = entries[i]
            if entry.last_offset >= upper:
                break
            total += entry.size
        return total

    def first_batch_at_timestamp(self, timestamp: int, upper: int) -> BatchEntry | None:
        """The first batch whose max timestamp (or an earlier batch's) reaches `timestamp`."""
        idx = bisect.bisect_left(self._max_ts_prefix, timestamp)
        if idx >= len(self.entries) or self.entries[idx].last_offset >= upper:
            return None
        return self.entries[idx]

    def max_timestamp_entry(self, upper: int) -> BatchEntry | None:
        """The earliest batch below `upper` holding the largest max timestamp."""
        best: BatchEntry | None = None
        for entry in self.entries:
            if entry.last_offset >= upper:
                break
            if best is None or entry.max_timestamp > best.max_timestamp:
                best = entry
        return best

    def iter_below(self, upper: int) -> Iterator[BatchEntry]:
        for entry in self.entries:
            if entry.last_offset >= upper:
                return
            yield entry

    def drop_segments(self, segments: set[int] | frozenset[int]) -> int:
        """Drop the leading batches stored in `segments`; returns how many were dropped.

        Stops at the first batch that is not durable yet or lives in a segment still kept.
        """
        keep = 0
        entries = self.entries
        while keep < len(entries):
            pos = entries[keep].position
            if pos is None or pos.segment not in segments:
                break
            keep += 1
        self.drop_front(keep)
        return keep

    def drop_front(self, n: int) -> None:
        """Forget the `n` oldest batches."""
        if n > 0:
            del self.entries[:n]
            del self._bases[:n]
            del self._max_ts_prefix[:n]
