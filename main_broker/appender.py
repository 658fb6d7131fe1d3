"""The append decision, without I/O: what a main does with one partition's batch.

`Appender` is the protocol core of the produce path, as h11's connection object is for HTTP:
it never touches a socket, a file or trio. For each partition of a request it admits (the
shared rule of `kafka_wire.produce_admission`), validates, deduplicates against the
idempotent producer's state, assigns offsets and answers with a decision:

- `Refusal`: the partition's error answer;
- `Duplicate`: a retry of a batch already in the log, answered with the original's offsets
  once the original is durable;
- `Appended`: offsets assigned and the `WalIntent` the I/O shell must make durable (a DATA
  record with the bytes, or a LINK to the PREPARED record a zone proxy wrote) before the
  answer and the high watermark may show it.

A direct produce hands it the batch bytes; a confirm hands it the header summary the proxy
sent and no bytes (main_broker/api/confirm.py), unless the topic is compacted: only the keyless
record check reads records. The shell is main_broker/append.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kafka_wire.errors import ErrorCode
from kafka_wire.produce_admission import Refusal, produce_admission
from kafka_wire.record_batch import (
    BatchInfo,
    InvalidBatch,
    ProduceLimits,
    check_batch_limits,
    null_key_indexes,
    validate_batch,
)
from main_broker.partition_log import BatchEntry, PartitionLog
from main_broker.producer_state import Verdict
from shared_wal import WalPosition

__all__ = ["Appended", "Appender", "Decision", "Duplicate", "ProducerRow", "Refusal", "WalIntent"]

log = logging.getLogger("zonefleet.main_broker.append")


class ProducerRow(NamedTuple):
    """An idempotent producer's batch, as its DATA or LINK record carries it."""

    producer_id: int
    epoch: int
    base_sequence: int
    last_sequence: int
    append_time_ms: int


@dataclass(frozen=True, slots=True)
class WalIntent:
    """The WAL record an accepted batch needs: a LINK to `prepared` (a zone proxy's PREPARED
    record) when set, else a DATA record carrying `entry.data`."""

    plog: PartitionLog
    entry: BatchEntry
    producer: ProducerRow | None
    prepared: WalPosition | None
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class Appended:
    intent: WalIntent
    log_start_offset: int
    log_append_time_ms: int  # -1 unless the topic stamps LogAppendTime

    @property
    def base_offset(self) -> int:
        return self.intent.entry.base_offset


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retried batch already appended at `base_offset`..`last_offset`."""

    plog: PartitionLog
    base_offset: int
    last_offset: int
    log_start_offset: int


Decision = Refusal | Duplicate | Appended


class Appender:
    """Admission and the append decision for the partitions this main leads.

    `partition` finds a partition's log; `leads` says whether this main may append to it now
    (it leads it, no move is fencing it, its metadata is fresh); `storage_failure` says why
    the WAL takes no writes (None when it does); `wal_full` whether it is at its cap. All four
    are the broker's answers at the moment of the call: the appender keeps no state of its own
    beyond what the partition logs hold (offsets, producer state).
    """

    def __init__(
        self,
        partition: Callable[[str, int], PartitionLog | None],
        leads: Callable[[PartitionLog], bool],
        storage_failure: Callable[[], str | None],
        wal_full: Callable[[], bool],
    ) -> None:
        self._partition = partition
        self._leads = leads
        self._storage_failure = storage_failure
        self._wal_full = wal_full

    def admit(
        self, topic: str, partition: int, *, acks: int, records_size: int | None, confirmed: bool
    ) -> PartitionLog | Refusal:
        """The partition's log when a batch may be appended to it. A `confirmed` batch comes
        from a zone proxy that believed this main leads the partition: a partition unknown
        here is then answered NOT_LEADER_OR_FOLLOWER, so the proxy refreshes its view."""
        plog = self._partition(topic, partition)
        refusal = produce_admission(
            acks=acks,
            known=plog is not None or confirmed,
            leads=plog is not None and self._leads(plog),
            storage_failure=self._storage_failure(),
            wal_full=self._wal_full(),
            records_size=records_size,
        )
        if refusal is not None:
            return refusal
        assert plog is not None
        return plog

    def decide(
        self,
        topic: str,
        partition: int,
        *,
        acks: int,
        records_size: int | None,
        now_ms: int,
        api_version: int,
        records: memoryview | None = None,
        batch: BatchInfo | None = None,
        prepared: WalPosition | None = None,
    ) -> Decision:
        """Admit, then decide: what a direct produce (`records`) and a confirm (`batch`,
        `prepared`) do for each partition. The decision's effects on the partition (offsets,
        producer state) are made; its WAL intent is for the caller to submit."""
        admitted = self.admit(
            topic, partition, acks=acks, records_size=records_size, confirmed=prepared is not None
        )
        if isinstance(admitted, Refusal):
            return admitted
        return self._decide(admitted, now_ms, api_version, records, batch, prepared)

    def _decide(
        self,
        plog: PartitionLog,
        now_ms: int,
        api_version: int,
        records: memoryview | None,
        batch: BatchInfo | None,
        prepared: WalPosition | None,
    ) -> Decision:
        """Decide one batch of an admitted partition. `records` (writable: offsets are patched
        in place) are validated whole; a confirm gives the proxy-checked header `batch` and
        the PREPARED record's position instead, and `records` only for a compacted topic."""
        cfg = plog.config
        limits = ProduceLimits(
            now_ms,
            cfg.log_append_time,
            cfg.timestamp_before_max_ms,
            cfg.timestamp_after_max_ms,
            cfg.max_message_bytes,
            api_version,
        )
        try:
            if batch is not None:
                check_batch_limits(batch, limits)
            elif records is not None:
                batch = validate_batch(records, limits)
            else:
                raise ValueError("append needs the records or their batch header")
        except InvalidBatch as exc:
            log.info(
                "rejected batch for %s-%d: %s",
                plog.topic,
                plog.partition,
                exc.message,
                extra={
                    "topic": plog.topic,
                    "partition": plog.partition,
                    "error": ErrorCode(exc.error_code).name,
                },
            )
            return Refusal(exc.error_code, exc.message)
        if cfg.compacted:
            if records is None:
                raise ValueError("a compacted topic's batch needs its records (keyless check)")
            refusal = _refuse_null_keys(plog, records, batch)
            if refusal is not None:
                return refusal
        check = plog.check_producer(batch)
        if check.verdict is Verdict.REJECT:
            return Refusal(check.error, check.message)
        if check.verdict is Verdict.DUPLICATE:
            original = check.duplicate_of
            assert original is not None
            return Duplicate(
                plog, original.first_offset, original.last_offset, plog.log_start_offset
            )
        entry = plog.append(records, batch, now_ms)
        producer = None
        if batch.producer_id >= 0:
            producer = ProducerRow(
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                batch.last_sequence,
                now_ms,
            )
        return Appended(
            WalIntent(plog, entry, producer, prepared, batch.is_transactional),
            plog.log_start_offset,
            now_ms if cfg.log_append_time else -1,
        )


def _refuse_null_keys(plog: PartitionLog, records: memoryview, batch: BatchInfo) -> Refusal | None:
    """A compacted topic refuses records without a key, as Kafka's LogValidator does: the
    whole batch fails with INVALID_RECORD and a record error per keyless record."""
    try:
        missing = null_key_indexes(records, batch)
    except InvalidBatch as exc:
        return Refusal(exc.error_code, exc.message)
    if not missing:
        return None
    message = (
        f"Compacted topic cannot accept message without key in topic partition "
        f"{plog.topic}-{plog.partition}."
    )
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{message}')" for i in missing[:3])
    return Refusal(
        ErrorCode.invalid_record,
        f"One or more records have been rejected due to {len(missing)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]",
        tuple((index, message) for index in missing),
    )
