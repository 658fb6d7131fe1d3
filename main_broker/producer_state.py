"""Idempotent-producer state per partition: epoch and the last five batches of each producer.

Pure logic (no I/O): the append path asks `check` before assigning offsets and calls `record`
once offsets are assigned; replay calls `record` for every DATA batch it finds in the WAL.
Semantics follow Apache Kafka's ProducerStateManager.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kio.schema.errors import ErrorCode

MAX_CACHED_BATCHES = 5
NO_PRODUCER_EPOCH = -1
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=MAX_CACHED_BATCHES))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class CheckResult:
    verdict: Verdict
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    duplicate_of: BatchMetadata | None = None


APPEND_OK = CheckResult(Verdict.APPEND)


def next_sequence(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


class ProducerStateTable:
    """State of every idempotent producer that wrote to one partition."""

    __slots__ = ("_producers",)

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def items(self) -> list[tuple[int, ProducerEntry]]:
        return list(self._producers.items())

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int) -> CheckResult:
        entry = self._producers.get(producer_id)
        if entry is None:
            # No state (new producer, or its state aged out): Kafka accepts any sequence.
            return APPEND_OK
        if epoch < entry.epoch:
            return CheckResult(
                Verdict.REJECT,
                ErrorCode.invalid_producer_epoch,
                f"producer {producer_id} epoch {epoch} is older than current epoch {entry.epoch}",
            )
        if epoch == entry.epoch:
            for batch in entry.batches:
                if batch.first_seq == first_seq and batch.last_seq == last_seq:
                    return CheckResult(Verdict.DUPLICATE, duplicate_of=batch)
            if entry.batches and first_seq != next_sequence(entry.last_seq):
                return CheckResult(
                    Verdict.REJECT,
                    ErrorCode.out_of_order_sequence_number,
                    f"out of order sequence for producer {producer_id} at epoch {epoch}: "
                    f"expected {next_sequence(entry.last_seq)}, got {first_seq}",
                )
            return APPEND_OK
        # A bumped epoch must restart its sequence at 0.
        if first_seq != 0:
            return CheckResult(
                Verdict.REJECT,
                ErrorCode.out_of_order_sequence_number,
                f"producer {producer_id} new epoch {epoch} must start at sequence 0, "
                f"got {first_seq}",
            )
        return APPEND_OK

    def record(self, producer_id: int, epoch: int, meta: BatchMetadata) -> None:
        entry = self._producers.get(producer_id)
        if entry is None or epoch != entry.epoch:
            entry = ProducerEntry(epoch=epoch)
            self._producers[producer_id] = entry
        entry.batches.append(meta)

    def bump_epoch(self, producer_id: int, epoch: int) -> None:
        """A transaction marker at `epoch` (the coordinator bumps it to fence a zombie when
        it aborts a timed-out transaction): older epochs are refused from now on."""
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            self._producers[producer_id] = ProducerEntry(epoch=epoch)

    def to_snapshot(self, below_offset: int) -> list[Any]:
        """Producer state of the batches below `below_offset` (the durable ones)."""
        rows: list[Any] = []
        for pid, e in self._producers.items():
            batches = [
                [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                for b in e.batches
                if b.last_offset < below_offset
            ]
            if batches or not e.batches:  # an epoch a marker bumped has no batch yet
                rows.append([pid, e.epoch, batches])
        return rows

    @classmethod
    def from_snapshot(cls, rows: list[Any]) -> ProducerStateTable:
        table = cls()
        for pid, epoch, batches in rows:
            entry = ProducerEntry(epoch=epoch)
            for b in batches:
                entry.batches.append(BatchMetadata(*b))
            table._producers[pid] = entry
        return table
