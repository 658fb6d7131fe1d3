"""One partition's log as the main broker sees it: an offset index over WAL records.

Pure logic (no I/O, no trio). Each produced batch becomes a `BatchEntry` that knows its offsets,
its maximum timestamp, the cached batch bytes (while they fit in the broker's WAL cache) and the
WAL position of the DATA record that holds it (once durable). The high watermark moves only when
a batch's WAL group commit has been fsynced, so nothing above it was ever unacknowledged-durable.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_wire.record_batch import BatchInfo, assign_offsets, stamp_log_append_time
from main_broker.producer_state import (
    APPEND_OK,
    BatchMetadata,
    CheckResult,
    ProducerStateTable,
)
from main_broker.topic_config import EffectiveTopicConfig
from shared_wal import WalPosition
from shared_wal.broker_records import PreparedLink


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


@dataclass(frozen=True, slots=True)
class FetchSlice:
    error: ErrorCode
    entries: list[BatchEntry]


class PartitionLog:
    def __init__(
        self,
        topic: str,
        partition: int,
        topic_id: bytes,
        config: EffectiveTopicConfig,
        leader_epoch: int = 0,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.config = config
        self.leader_epoch = leader_epoch
        self.entries: list[BatchEntry] = []
        self._bases: list[int] = []
        # Running maximum of max_timestamp, so the first batch reaching a timestamp is a bisect.
        self._max_ts_prefix: list[int] = []
        self.next_offset = 0
        self.high_watermark = 0
        self.log_start_offset = 0
        self.producers = ProducerStateTable()

    # -- append path -------------------------------------------------------------------------

    def check_producer(self, batch: BatchInfo) -> CheckResult:
        if batch.producer_id < 0:
            return APPEND_OK
        return self.producers.check(
            batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence
        )

    def append(self, buf: memoryview, batch: BatchInfo, now_ms: int) -> BatchEntry:
        """Assign offsets to a validated batch (patched in place) and index it."""
        base = self.next_offset
        assign_offsets(buf, batch, base, self.leader_epoch)
        max_timestamp = batch.max_timestamp
        if self.config.log_append_time:
            stamp_log_append_time(buf, batch, now_ms)
            max_timestamp = now_ms
        last = base + batch.last_offset_delta
        entry = BatchEntry(base, last, max_timestamp, batch.size, buf, None)
        self._index(entry)
        if batch.producer_id >= 0:
            self.producers.record(
                batch.producer_id,
                batch.producer_epoch,
                BatchMetadata(batch.base_sequence, batch.last_sequence, base, last, now_ms),
            )
        return entry

    def mark_durable(self, entry: BatchEntry, position: WalPosition) -> bool:
        """Record where the batch lives; returns True when the high watermark moved."""
        entry.position = position
        if entry.last_offset + 1 > self.high_watermark:
            self.high_watermark = entry.last_offset + 1
            return True
        return False

    def _index(self, entry: BatchEntry) -> None:
        self.entries.append(entry)
        self._bases.append(entry.base_offset)
        previous = self._max_ts_prefix[-1] if self._max_ts_prefix else -1
        self._max_ts_prefix.append(max(previous, entry.max_timestamp))
        self.next_offset = entry.last_offset + 1

    # -- replay ------------------------------------------------------------------------------

    def replay_batch(
        self,
        header: dict[str, Any],
        payload: memoryview | None,
        position: WalPosition,
        link: PreparedLink | None = None,
    ) -> None:
        """Index a DATA record (payload given) or a LINK record (link given, size in header)."""
        base, last = header["b"], header["l"]
        if base < self.next_offset:
            return  # already covered by the snapshot this replay started from
        if not self.entries and base > self.log_start_offset:
            self.log_start_offset = base
        size = len(payload) if payload is not None else header["sz"]
        entry = BatchEntry(base, last, header["ts"], size, payload, position, link)
        self._index(entry)
        self.high_watermark = self.next_offset
        pid = header.get("pid", -1)
        if pid >= 0:
            self.producers.record(
                pid,
                header["pe"],
                BatchMetadata(header["s"], header["ls"], base, last, header.get("at", 0)),
            )

    def drop_segments(self, segments: set[int]) -> None:
        """Forget batches whose WAL segments retention deleted; the log start moves up."""
        keep = 0
        while keep < len(self.entries):
            pos = self.entries[keep].position
            if pos is None or pos.segment not in segments:
                break
            keep += 1
        if keep:
            del self.entries[:keep]
            del self._bases[:keep]
            del self._max_ts_prefix[:keep]
            self.log_start_offset = (
                self.entries[0].base_offset if self.entries else self.next_offset
            )

    # -- read path ---------------------------------------------------------------------------

    def _first_index_at(self, offset: int) -> int:
        idx = bisect.bisect_right(self._bases, offset) - 1
        if idx < 0:
            return 0
        if self.entries[idx].last_offset < offset:
            idx += 1
        return idx

    def fetch_slice(
        self, offset: int, max_bytes: int, upper: int, must_return_one: bool
    ) -> FetchSlice:
        """Whole batches from `offset` below `upper` (HW or LSO), within max_bytes.

        The first batch is returned even when it alone exceeds max_bytes (KIP-74), when the
        caller says this partition may be the first with data in the response.
        """
        if offset < self.log_start_offset or offset > self.next_offset:
            return FetchSlice(ErrorCode.offset_out_of_range, [])
        out: list[BatchEntry] = []
        total = 0
        for i in range(self._first_index_at(offset), len(self.entries)):
            entry = self.entries[i]
            if entry.last_offset >= upper:
                break
            if total + entry.size > max_bytes and (out or not must_return_one):
                break
            out.append(entry)
            total += entry.size
        return FetchSlice(ErrorCode.none, out)

    def bytes_available(self, offset: int, upper: int) -> int:
        total = 0
        for i in range(self._first_index_at(offset), len(self.entries)):
            entry = self.entries[i]
            if entry.last_offset >= upper:
                break
            total += entry.size
        return total

    def first_batch_at_timestamp(self, timestamp: int) -> BatchEntry | None:
        idx = bisect.bisect_left(self._max_ts_prefix, timestamp)
        if idx >= len(self.entries) or self.entries[idx].last_offset >= self.high_watermark:
            return None
        return self.entries[idx]

    def max_timestamp_entry(self) -> BatchEntry | None:
        best: BatchEntry | None = None
        for entry in self.entries:
            if entry.last_offset >= self.high_watermark:
                break
            if best is None or entry.max_timestamp > best.max_timestamp:
                best = entry
        return best

    def iter_durable(self) -> Iterator[BatchEntry]:
        for entry in self.entries:
            if entry.last_offset >= self.high_watermark:
                return
            yield entry

    # -- snapshot ----------------------------------------------------------------------------

    def to_snapshot(self) -> dict[str, Any]:
        return {
            "ls": self.log_start_offset,
            "no": self.high_watermark,
            "e": self.leader_epoch,
            "pr": self.producers.to_snapshot(self.high_watermark),
        }

    def restore_snapshot(self, snap: dict[str, Any]) -> None:
        # Offsets past the durable HW at snapshot time were not yet acknowledged; the DATA
        # records that follow the snapshot in the WAL bring them back if they were written.
        self.log_start_offset = snap["ls"]
        self.next_offset = self.high_watermark = snap["no"]
        self.leader_epoch = snap["e"]
        self.producers = ProducerStateTable.from_snapshot(snap["pr"])
