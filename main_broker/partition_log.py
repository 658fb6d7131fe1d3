"""One partition's log as the main broker sees it: an offset index over WAL records.

Pure logic (no I/O, no trio). Each produced batch becomes a `BatchEntry` in the partition's
`BatchIndex` (shared_wal.batch_index), holding the cached batch bytes (while they fit in the
broker's WAL cache) and the WAL position of the record that holds it (once durable). The high
watermark moves only when a batch's WAL group commit has been fsynced, so nothing above it was
ever unacknowledged-durable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from kio.schema.errors import ErrorCode

from kafka_wire.record_batch import BatchInfo, assign_offsets, stamp_log_append_time
from main_broker.partition_txns import AbortedTxn, PartitionTxns
from main_broker.producer_state import (
    APPEND_OK,
    BatchMetadata,
    CheckResult,
    ProducerStateTable,
    Verdict,
)
from main_broker.topic_config import EffectiveTopicConfig
from s3_commit.object_format import stream_id_for
from shared_wal import WalPosition
from shared_wal.batch_index import BatchEntry, BatchIndex, ObjectSpan
from shared_wal.broker_records import PreparedLink

if TYPE_CHECKING:
    from s3_commit.manifest import StreamManifest

__all__ = ["BatchEntry", "FetchSlice", "ObjectSpan", "PartitionLog"]


def leader_error(plog: PartitionLog | None) -> ErrorCode | None:
    """The error a request only the partition's leader serves gets from this main, if any."""
    if plog is None:
        return ErrorCode.unknown_topic_or_partition
    if not plog.owned:
        return ErrorCode.not_leader_or_follower
    return None


class FetchSlice(NamedTuple):
    """Also an (error code, entries) pair, the shape `kafka_wire.fetch_serving` expects."""

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
        self.index = BatchIndex()
        self.high_watermark = 0
        self.log_start_offset = 0
        self.producers = ProducerStateTable()
        # Open and aborted transactions: the last stable offset and read_committed fetches.
        self.txns = PartitionTxns()
        # Which main leads the partition: None is this broker. Only the leader appends.
        self.leader_id: int | None = None
        # A reassignment moves the partition away (main_broker/cluster/reassignment.py): the leader
        # appends no more, but keeps its un-uploaded batches (WAL retention, links floor)
        # until the new leader has taken them over.
        self.fenced = False
        # Committed objects of this partition (the manifest's stream), when an object store
        # is configured; offsets below the WAL index are read from them.
        self.objects: StreamManifest | None = None
        # DeleteRecords' floor: the log start never falls below it (whatever objects or WAL
        # segments come and go).
        self.deleted_below = 0

    @property
    def owned(self) -> bool:
        return self.leader_id is None

    @property
    def entries(self) -> list[BatchEntry]:
        return self.index.entries

    @property
    def next_offset(self) -> int:
        return self.index.end_offset

    @property
    def last_stable_offset(self) -> int:
        first = self.txns.first_unstable_offset()
        hw = self.high_watermark
        return hw if first is None or first > hw else first

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions with records in
        [start, end), for a read_committed fetch."""
        return [(a.producer_id, a.first_offset) for a in self.txns.aborted_between(start, end)]

    @property
    def stream_id(self) -> int:
        return stream_id_for(self.topic_id, self.partition)

    @property
    def wal_start_offset(self) -> int:
        """The first offset the WAL index holds (its end when it holds none)."""
        return self.entries[0].base_offset if self.entries else self.next_offset

    # -- committed objects -------------------------------------------------------------------

    def adopt_objects(self, stream: StreamManifest | None) -> bool:
        """Take the manifest's view of this partition; returns True when offsets moved.

        Objects past the log's end mean the WAL lost its records (a restart with an empty WAL
        directory): the log continues after them. The log start becomes the objects' start
        when objects and WAL meet without a gap, and never stays below the manifest's log
        start (retention): batches the WAL index still holds below it are forgotten.
        """
        self.objects = stream
        if stream is None:
            return False
        before = (self.log_start_offset, self.next_offset, self.high_watermark)
        end = stream.end_offset
        if end > self.next_offset:
            self.index.drop_front(len(self.entries))  # all below what objects now hold
            self.index.end_offset = end
            self.high_watermark = end
        self._object_log_start()
        return before != (self.log_start_offset, self.next_offset, self.high_watermark)

    def _object_log_start(self) -> None:
        stream = self.objects
        if stream is None:
            return
        floor = stream.log_start
        if floor > 0:
            # Retention expired these offsets: the WAL's copies (their segments go with the
            # WAL's own retention) must not serve them either.
            self.index.drop_front(self.index.first_index_at(floor))
        wal_start = self.wal_start_offset
        if stream.end_offset >= wal_start:
            self.log_start_offset = max(min(stream.start_offset, wal_start), floor)
        elif self.log_start_offset < wal_start:
            self.log_start_offset = wal_start  # a gap: what lies between is lost
        self.log_start_offset = max(self.log_start_offset, self.deleted_below)
        self.txns.trim(self.log_start_offset)

    # -- append path -------------------------------------------------------------------------

    def check_producer(self, batch: BatchInfo) -> CheckResult:
        if batch.producer_id < 0:
            if batch.is_transactional:
                return CheckResult(
                    Verdict.REJECT,
                    ErrorCode.invalid_record,
                    "a transactional batch needs a producer id",
                )
            return APPEND_OK
        check = self.producers.check(
            batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence
        )
        if check.verdict is not Verdict.APPEND:
            return check
        # The one check a transaction adds to the hot path: membership.
        is_open = self.txns.is_open(batch.producer_id)
        if batch.is_transactional:
            if not is_open and not self.txns.may_open(batch.producer_id, batch.producer_epoch):
                return CheckResult(
                    Verdict.REJECT,
                    ErrorCode.invalid_txn_state,
                    f"{self.topic}-{self.partition} is not in a transaction of producer "
                    f"{batch.producer_id} at epoch {batch.producer_epoch} (AddPartitionsToTxn "
                    "first; a batch after its transaction ended is refused)",
                )
        elif is_open:
            return CheckResult(
                Verdict.REJECT,
                ErrorCode.invalid_txn_state,
                f"producer {batch.producer_id} has an open transaction on {self.topic}-"
                f"{self.partition}: its non-transactional batch is refused",
            )
        return check

    def append(self, buf: memoryview | None, batch: BatchInfo, now_ms: int) -> BatchEntry:
        """Assign offsets to a validated batch and index it. Its bytes, when given, are
        patched in place; without them (a batch a zone proxy holds, linked) whoever reads the
        batch back applies the same patches (shared_wal.broker_records.rebuild_linked_batch)."""
        base = self.next_offset
        max_timestamp = batch.max_timestamp
        if buf is not None:
            assign_offsets(buf, batch, base, self.leader_epoch)
            if self.config.log_append_time:
                stamp_log_append_time(buf, batch, now_ms)
        if self.config.log_append_time:
            max_timestamp = now_ms
        last = base + batch.last_offset_delta
        entry = BatchEntry(base, last, max_timestamp, batch.size, buf, None)
        self.index.add(entry)
        if batch.producer_id >= 0:
            self.producers.record(
                batch.producer_id,
                batch.producer_epoch,
                BatchMetadata(batch.base_sequence, batch.last_sequence, base, last, now_ms),
            )
            if batch.is_transactional:
                self.txns.on_transactional_batch(batch.producer_id, base)
        return entry

    def check_marker(self, producer_id: int, producer_epoch: int) -> ErrorCode | None:
        """Why a transaction marker at this epoch may not be appended, if it may not."""
        entry = self.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            return ErrorCode.invalid_producer_epoch
        return None

    def append_marker(self, buf: memoryview, batch: BatchInfo, now_ms: int) -> BatchEntry:
        """Index a transaction marker (a control batch the broker built); it closes the
        producer's transaction when it is durable (`apply_marker`)."""
        base = self.next_offset
        assign_offsets(buf, batch, base, self.leader_epoch)
        entry = BatchEntry(base, base, batch.max_timestamp, batch.size, buf, None)
        self.index.add(entry)
        self.producers.bump_epoch(batch.producer_id, batch.producer_epoch)
        return entry

    def apply_marker(self, producer_id: int, offset: int, commit: bool) -> AbortedTxn | None:
        """A durable marker at `offset` closes the producer's transaction."""
        return self.txns.on_marker(producer_id, offset, commit)

    def mark_durable(self, entry: BatchEntry, position: WalPosition) -> bool:
        """Record where the batch lives; returns True when the high watermark moved."""
        entry.position = position
        if entry.last_offset + 1 > self.high_watermark:
            self.high_watermark = entry.last_offset + 1
            return True
        return False

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
        first = not self.entries
        if first and base > self.log_start_offset:
            self.log_start_offset = base
        size = len(payload) if payload is not None else header["sz"]
        entry = BatchEntry(base, last, header["ts"], size, payload, position, link)
        self.index.add(entry)
        if first and self.objects is not None:
            # Objects may hold what lies below the first batch (a takeover's tail starts
            # where the adopted objects end): the log starts where they do, not here. Left
            # at the batch, a consumer reading from the earliest offset skipped the objects'
            # offsets until the next upload adopted them again.
            self._object_log_start()
        self.high_watermark = self.next_offset
        pid = header.get("pid", -1)
        marker = header.get("cm")
        if marker is not None:
            self.producers.bump_epoch(pid, header["pe"])
            self.txns.on_marker(pid, base, bool(marker))
        elif pid >= 0:
            self.producers.record(
                pid,
                header["pe"],
                BatchMetadata(header["s"], header["ls"], base, last, header.get("at", 0)),
            )
            if header.get("tx"):
                self.txns.on_transactional_batch(pid, base)

    def drop_segments(self, segments: set[int]) -> None:
        """Forget batches whose WAL segments retention deleted; the log start moves up."""
        if self.index.drop_segments(segments):
            self.log_start_offset = max(self.wal_start_offset, self.deleted_below)
            self._object_log_start()
            self.txns.trim(self.log_start_offset)

    def delete_records(self, offset: int) -> bool:
        """DeleteRecords: the log starts at `offset` (at most the log end). The batches below
        stay indexed until the object tier or WAL retention takes them (an upload must see
        the stream without gaps), but nothing below the start is served. Returns True when
        the start moved."""
        offset = min(offset, self.next_offset)
        if offset <= self.log_start_offset:
            return False
        self.deleted_below = max(self.deleted_below, offset)
        self.log_start_offset = offset
        self.txns.trim(offset)
        return True

    def reset_for_takeover(
        self,
        start: int,
        epoch: int,
        producer_rows: list[Any],
        floor: int = 0,
        txns: dict[str, Any] | None = None,
    ) -> None:
        """This main takes the partition over (a reassignment, main_broker/cluster/handoff.py): its
        log restarts at `start`, where the adopted objects end, with the previous leader's
        producer state and log start floor (DeleteRecords); the taken-over tail batches are
        replayed after this."""
        self.index = BatchIndex(start)
        self.high_watermark = start
        self.deleted_below = floor
        self.log_start_offset = max(start, floor)
        self.leader_epoch = epoch
        self.producers = ProducerStateTable.from_snapshot(producer_rows)
        self.txns = PartitionTxns.from_snapshot(txns)
        self.objects = None

    # -- read path ---------------------------------------------------------------------------

    def fetch_slice(
        self, offset: int, max_bytes: int, upper: int, must_return_one: bool
    ) -> FetchSlice:
        """Whole batches from `offset` below `upper` (HW or LSO), within max_bytes (KIP-74)."""
        if offset < self.log_start_offset or offset > self.next_offset:
            return FetchSlice(ErrorCode.offset_out_of_range, [])
        stream = self.objects
        if stream is not None and offset < min(stream.end_offset, self.wal_start_offset):
            if max_bytes <= 0 and not must_return_one:
                return FetchSlice(ErrorCode.none, [])
            end = min(stream.end_offset, upper)
            if offset >= end:
                return FetchSlice(ErrorCode.none, [])
            budget = max(max_bytes, 1)
            span = ObjectSpan(stream, self.stream_id, offset, end, budget, must_return_one)
            return FetchSlice(ErrorCode.none, [span])
        return FetchSlice(
            ErrorCode.none, self.index.fetch_slice(offset, max_bytes, upper, must_return_one)
        )

    def bytes_available(self, offset: int, upper: int) -> int:
        return self.index.bytes_available(offset, upper)

    def first_batch_at_timestamp(self, timestamp: int) -> BatchEntry | None:
        stream = self.objects
        if stream is not None:
            below_wal = min(stream.end_offset, self.wal_start_offset, self.high_watermark)
            rng = stream.first_at_timestamp(timestamp)
            if rng is not None and rng.start < below_wal and rng.end > self.log_start_offset:
                start = max(rng.start, self.log_start_offset)
                return ObjectSpan(
                    stream, self.stream_id, start, below_wal, 0, True, timestamp, rng.max_timestamp
                )
        entry = self.index.first_batch_at_timestamp(timestamp, self.high_watermark)
        if entry is not None and entry.last_offset < self.log_start_offset:
            # Below a DeleteRecords start: the first batch from the start that reaches it.
            entries = self.entries
            for i in range(self.index.first_index_at(self.log_start_offset), len(entries)):
                if entries[i].last_offset >= self.high_watermark:
                    break
                if entries[i].max_timestamp >= timestamp:
                    return entries[i]
            return None
        return entry

    def max_timestamp_entry(self) -> BatchEntry | None:
        entry = self.index.max_timestamp_entry(self.high_watermark)
        if entry is None or entry.last_offset >= self.log_start_offset:
            return entry
        # Below a DeleteRecords start: the largest from the batch holding the start on.
        best: BatchEntry | None = None
        entries = self.entries
        for i in range(self.index.first_index_at(self.log_start_offset), len(entries)):
            if entries[i].last_offset >= self.high_watermark:
                break
            if best is None or entries[i].max_timestamp > best.max_timestamp:
                best = entries[i]
        return best

    def iter_durable(self) -> Iterator[BatchEntry]:
        return self.index.iter_below(self.high_watermark)

    # -- snapshot ----------------------------------------------------------------------------

    def to_snapshot(self) -> dict[str, Any]:
        return {
            "ls": self.log_start_offset,
            "no": self.high_watermark,
            "e": self.leader_epoch,
            "pr": self.producers.to_snapshot(self.high_watermark),
            "tx": self.txns.to_snapshot(self.high_watermark),
        }

    def restore_snapshot(self, snap: dict[str, Any]) -> None:
        # Offsets past the durable HW at snapshot time were not yet acknowledged; the DATA
        # records that follow the snapshot in the WAL bring them back if they were written.
        self.log_start_offset = self.deleted_below = snap["ls"]
        self.index.end_offset = self.high_watermark = snap["no"]
        self.leader_epoch = snap["e"]
        self.producers = ProducerStateTable.from_snapshot(snap["pr"])
        self.txns = PartitionTxns.from_snapshot(snap.get("tx"))
