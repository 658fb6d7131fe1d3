"""The append path every write goes through, whether a client produced it to this broker or a
zone proxy confirmed a payload it had already written to the shared WAL.

`append_partition` runs synchronously, in arrival order: validate, dedup, assign offsets, queue
the WAL record. `PendingAppends.start` then waits for the group commit in the broker's commit
nursery (not the caller's), so a caller that goes away cannot stop the high watermark from
advancing over data already written.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import ProducePartitionResult
from kafka_wire.record_batch import (
    BatchInfo,
    InvalidBatch,
    null_key_indexes,
    validate_produce_records,
)
from main_broker.partition_log import BatchEntry, PartitionLog
from main_broker.producer_state import Verdict
from shared_wal import AppendTicket, WalError, WalPosition

if TYPE_CHECKING:
    from main_broker.broker import MainBroker

log = logging.getLogger("zonefleet.main_broker.append")

DUPLICATE_WAIT_SECONDS = 30.0


PendingAppend = tuple[ProducePartitionResult, PartitionLog, BatchEntry, AppendTicket]


class PendingAppends:
    """The appends of one request that wait for their WAL group commit."""

    __slots__ = ("appends", "done", "duplicates")

    def __init__(self) -> None:
        self.appends: list[PendingAppend] = []
        self.duplicates: list[tuple[ProducePartitionResult, PartitionLog, int]] = []
        self.done = trio.Event()

    def start(self, broker: MainBroker) -> None:
        if self.appends or self.duplicates:
            broker.commit_nursery.start_soon(self._await_durability, broker)
        else:
            self.done.set()

    async def wait(self, timeout_s: float) -> None:
        """Wait for durability; appends still pending after the timeout get REQUEST_TIMED_OUT."""
        with trio.move_on_after(max(timeout_s, 0.0) + DUPLICATE_WAIT_SECONDS):
            await self.done.wait()
        if not self.done.is_set():
            for result, *_ in self.appends:
                result.error_code = ErrorCode.request_timed_out

    async def _await_durability(self, broker: MainBroker) -> None:
        try:
            for result, plog, entry, ticket in self.appends:
                try:
                    position = await ticket.wait()
                except WalError as exc:
                    broker.mark_storage_failed(exc)
                    result.error_code = ErrorCode.kafka_storage_error
                    result.error_message = "WAL write failed"
                    continue
                broker.store.on_durable(plog, entry, position)
                if broker.cluster is not None and not broker.cluster.may_acknowledge(plog):
                    # Durable, but another main may already have taken the partition over
                    # from a WAL read before this landed: the client must not count on it.
                    result.error_code = ErrorCode.not_leader_or_follower
            for result, plog, last_offset in self.duplicates:
                # A retried duplicate is answered only once its original is durable.
                with trio.move_on_after(DUPLICATE_WAIT_SECONDS):
                    while plog.high_watermark <= last_offset and not broker.storage_failed:
                        await broker.store.data_arrived.wait()
                if plog.high_watermark <= last_offset:
                    result.error_code = ErrorCode.request_timed_out
        finally:
            self.done.set()


def may_append(broker: MainBroker, plog: PartitionLog) -> bool:
    """Whether this main appends to the partition: it leads it, no reassignment is moving it
    away, and (clustered) its copy of the metadata is recent enough that no other main can
    have taken the partition over (main_broker/handoff.py)."""
    return plog.owned and not plog.fenced and (broker.cluster is None or broker.cluster.fresh())


def append_partition(
    broker: MainBroker,
    plog: PartitionLog,
    records: memoryview,
    result: ProducePartitionResult,
    pending: PendingAppends,
    now_ms: int,
    api_version: int,
    prepared: WalPosition | None = None,
) -> None:
    """Validate, dedup and append one partition's batch; fills `result` (sync, no checkpoint).

    `records` must be writable: offsets (and LogAppendTime stamps) are patched in place.
    """
    cfg = plog.config
    try:
        batch = validate_produce_records(
            records,
            now_ms=now_ms,
            log_append_time=cfg.log_append_time,
            timestamp_before_max_ms=cfg.timestamp_before_max_ms,
            timestamp_after_max_ms=cfg.timestamp_after_max_ms,
            max_message_bytes=cfg.max_message_bytes,
            api_version=api_version,
        )
    except InvalidBatch as exc:
        result.error_code = exc.error_code
        result.error_message = exc.message
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
        return
    if cfg.compacted and _refuse_null_keys(plog, records, batch, result):
        return
    if batch.is_transactional:
        result.error_code = ErrorCode.transactional_id_authorization_failed
        result.error_message = "transactional produce is not supported yet"
        return
    check = plog.check_producer(batch)
    if check.verdict is Verdict.REJECT:
        result.error_code = check.error
        result.error_message = check.message
        return
    result.log_start_offset = plog.log_start_offset
    if check.verdict is Verdict.DUPLICATE:
        assert check.duplicate_of is not None
        result.base_offset = check.duplicate_of.first_offset
        pending.duplicates.append((result, plog, check.duplicate_of.last_offset))
        return
    entry = plog.append(records, batch, now_ms)
    producer = None
    if batch.producer_id >= 0:
        producer = (
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.last_sequence,
            now_ms,
        )
    ticket = broker.store.submit_batch(plog, entry, producer, prepared)
    result.base_offset = entry.base_offset
    if cfg.log_append_time:
        result.log_append_time_ms = now_ms
    pending.appends.append((result, plog, entry, ticket))


def _refuse_null_keys(
    plog: PartitionLog, records: memoryview, batch: BatchInfo, result: ProducePartitionResult
) -> bool:
    """A compacted topic refuses records without a key, as Kafka's LogValidator does: the
    whole batch fails with INVALID_RECORD and a record error per keyless record. The only
    place the append path reads records, and only for compacted topics."""
    try:
        missing = null_key_indexes(records, batch)
    except InvalidBatch as exc:
        result.error_code, result.error_message = exc.error_code, exc.message
        return True
    if not missing:
        return False
    message = (
        f"Compacted topic cannot accept message without key in topic partition "
        f"{plog.topic}-{plog.partition}."
    )
    result.error_code = ErrorCode.invalid_record
    result.record_errors = [(index, message) for index in missing]
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{message}')" for i in missing[:3])
    result.error_message = (
        f"One or more records have been rejected due to {len(missing)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]"
    )
    return True
