"""Produce: validate, dedup and append synchronously in arrival order, answer after fsync.

The synchronous part (`begin_produce`) runs in the connection's read loop, so batches from one
connection enter the log in the order the client sent them even when requests are pipelined.
The durability wait runs in the broker's commit nursery, not the connection's, so a client that
disconnects cannot stop the high watermark from advancing over data already written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import (
    ProducePartitionResult,
    decode_produce_request,
    encode_produce_response,
)
from kafka_wire.record_batch import InvalidBatch, validate_produce_records
from kafka_wire.server_loop import CloseConnection, Finish
from main_broker.partition_log import BatchEntry, PartitionLog
from main_broker.producer_state import Verdict
from shared_wal import WalError

if TYPE_CHECKING:
    from main_broker.broker import MainBroker, RequestContext

log = logging.getLogger("zonefleet.main_broker.produce")

DUPLICATE_WAIT_SECONDS = 30.0


class _Pending:
    """One produce request's appends that are waiting for their WAL group commit."""

    __slots__ = ("appends", "done", "duplicates")

    def __init__(self) -> None:
        self.appends: list[tuple[ProducePartitionResult, PartitionLog, BatchEntry, Any]] = []
        self.duplicates: list[tuple[ProducePartitionResult, PartitionLog, int]] = []
        self.done = trio.Event()


def begin_produce(broker: MainBroker, ctx: RequestContext, frame: bytearray) -> Finish:
    header = ctx.header
    try:
        req = decode_produce_request(header.api_version, memoryview(frame), header.size)
    except ValueError as exc:
        raise CloseConnection(f"malformed Produce v{header.api_version}: {exc}") from None
    store = broker.store
    metrics = broker.metrics
    now_ms = int(time.time() * 1000)
    pending = _Pending()
    topics_out: list[tuple[str, list[ProducePartitionResult]]] = []
    bad_acks = req.acks not in (0, 1, -1)
    for topic in req.topics:
        results: list[ProducePartitionResult] = []
        topics_out.append((topic.name, results))
        for part in topic.partitions:
            result = ProducePartitionResult(index=part.index)
            results.append(result)
            plog = store.partition(topic.name, part.index)
            if bad_acks:
                result.error_code = ErrorCode.invalid_required_acks
            elif plog is None:
                result.error_code = ErrorCode.unknown_topic_or_partition
            elif broker.storage_failed:
                result.error_code = ErrorCode.kafka_storage_error
                result.error_message = "the broker's WAL failed; restart it to recover"
            elif part.records is None or len(part.records) == 0:
                result.error_code = ErrorCode.invalid_record
                result.error_message = "empty records"
            else:
                _append_one(broker, plog, part.records, result, pending, now_ms, header.api_version)
                if result.error_code == ErrorCode.none:
                    metrics.bytes_in.labels(topic.name).inc(len(part.records))
            if result.error_code != ErrorCode.none:
                metrics.request_errors.labels("Produce", ErrorCode(result.error_code).name).inc()
    if pending.appends or pending.duplicates:
        broker.commit_nursery.start_soon(_await_durability, broker, pending)
    else:
        pending.done.set()

    if req.acks == 0:

        async def no_response() -> Sequence[bytes] | None:
            return None

        return no_response

    async def respond() -> Sequence[bytes]:
        with trio.move_on_after(max(req.timeout_ms, 0) / 1000 + DUPLICATE_WAIT_SECONDS):
            await pending.done.wait()
        if not pending.done.is_set():
            for result, *_ in pending.appends:
                result.error_code = ErrorCode.request_timed_out
        return [encode_produce_response(header.api_version, header.correlation_id, topics_out)]

    return respond


def _append_one(
    broker: MainBroker,
    plog: PartitionLog,
    records: memoryview,
    result: ProducePartitionResult,
    pending: _Pending,
    now_ms: int,
    api_version: int,
) -> None:
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
    ticket = broker.store.submit_batch(plog, entry, producer)
    result.base_offset = entry.base_offset
    if cfg.log_append_time:
        result.log_append_time_ms = now_ms
    pending.appends.append((result, plog, entry, ticket))


async def _await_durability(broker: MainBroker, pending: _Pending) -> None:
    try:
        for result, plog, entry, ticket in pending.appends:
            try:
                position = await ticket.wait()
            except WalError as exc:
                broker.mark_storage_failed(exc)
                result.error_code = ErrorCode.kafka_storage_error
                result.error_message = "WAL write failed"
                continue
            broker.store.on_durable(plog, entry, position)
        for result, plog, last_offset in pending.duplicates:
            # A retried duplicate is answered only once its original is durable.
            with trio.move_on_after(DUPLICATE_WAIT_SECONDS):
                while plog.high_watermark <= last_offset and not broker.storage_failed:
                    await broker.store.data_arrived.wait()
            if plog.high_watermark <= last_offset:
                result.error_code = ErrorCode.request_timed_out
    finally:
        pending.done.set()
