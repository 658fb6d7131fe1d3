"""Fetch (long poll, byte limits, isolation) and ListOffsets, served up to the high watermark."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import FetchPartitionResult, encode_fetch_response
from kafka_wire.record_batch import decode_records_for_tools, parse_batch_header
from kafka_wire.server_loop import Buffer
from main_broker.partition_log import BatchEntry, PartitionLog

if TYPE_CHECKING:
    from main_broker.broker import MainBroker, RequestContext

log = logging.getLogger("zonefleet.main_broker.fetch")

READ_COMMITTED = 1
EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
NO_TOPIC_ID = bytes(16)
MAX_WAIT_CAP_SECONDS = 30.0


@dataclass(slots=True)
class _Want:
    topic: str
    topic_id: bytes
    result: FetchPartitionResult
    plog: PartitionLog | None
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int


def _leader_epoch_error(plog: PartitionLog, requested: int) -> ErrorCode | None:
    if requested < 0 or requested == plog.leader_epoch:
        return None
    if requested < plog.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    return ErrorCode.unknown_leader_epoch


def _parse_wants(
    broker: MainBroker, req: Any, version: int
) -> list[tuple[str, bytes, list[_Want]]]:
    store = broker.store
    topics: list[tuple[str, bytes, list[_Want]]] = []
    for topic in req.topics:
        if version >= 13:
            state = store.topics_by_id.get(topic.topic_id.bytes)
            name = state.name if state else ""
            topic_id = topic.topic_id.bytes
        else:
            state = store.topics.get(topic.topic)
            name = topic.topic
            topic_id = state.topic_id if state else NO_TOPIC_ID
        wants: list[_Want] = []
        for p in topic.partitions:
            plog = (
                state.partitions[p.partition]
                if state and 0 <= p.partition < len(state.partitions)
                else None
            )
            result = FetchPartitionResult(index=p.partition)
            if plog is None:
                result.error_code = (
                    ErrorCode.unknown_topic_id
                    if version >= 13 and state is None
                    else ErrorCode.unknown_topic_or_partition
                )
            wants.append(
                _Want(
                    name,
                    topic_id,
                    result,
                    plog,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    getattr(p, "current_leader_epoch", -1),
                )
            )
        topics.append((name, topic_id, wants))
    return topics


def _select(
    wants: list[tuple[str, bytes, list[_Want]]], max_bytes: int, read_committed: bool
) -> tuple[int, list[tuple[_Want, list[BatchEntry]]]]:
    """Pick batches for every partition; returns (total bytes, selections). No I/O."""
    total = 0
    chosen: list[tuple[_Want, list[BatchEntry]]] = []
    for _, _, parts in wants:
        for want in parts:
            plog = want.plog
            result = want.result
            if plog is None:
                continue
            epoch_error = _leader_epoch_error(plog, want.current_leader_epoch)
            result.high_watermark = plog.high_watermark
            result.last_stable_offset = plog.high_watermark  # no transactions yet: LSO == HW
            result.log_start_offset = plog.log_start_offset
            result.aborted_transactions = [] if read_committed else None
            if epoch_error is not None:
                result.error_code = epoch_error
                continue
            upper = plog.high_watermark
            budget = min(want.partition_max_bytes, max_bytes - total)
            sl = plog.fetch_slice(
                want.fetch_offset, max(budget, 0), upper, must_return_one=total == 0
            )
            result.error_code = sl.error
            if sl.entries:
                chosen.append((want, sl.entries))
                total += sum(e.size for e in sl.entries)
    return total, chosen


async def fetch(broker: MainBroker, ctx: RequestContext, req: Any) -> Sequence[Buffer]:
    header = ctx.header
    version = header.api_version
    store = broker.store
    max_wait = min(req.max_wait.total_seconds(), MAX_WAIT_CAP_SECONDS)
    max_bytes = req.max_bytes if getattr(req, "max_bytes", None) is not None else 2**31 - 1
    read_committed = getattr(req, "isolation_level", 0) == READ_COMMITTED
    session_error = ErrorCode.none
    if getattr(req, "session_id", 0) != 0:
        session_error = ErrorCode.fetch_session_id_not_found
    wants = _parse_wants(broker, req, version)
    deadline = trio.current_time() + max(max_wait, 0.0)
    while True:
        arrived = store.data_arrived
        total, chosen = _select(wants, max_bytes, read_committed)
        any_error = any(w.result.error_code for _, _, parts in wants for w in parts)
        if total >= req.min_bytes or any_error or session_error or trio.current_time() >= deadline:
            break
        with trio.move_on_at(deadline):
            await arrived.wait()
    for want, entries in chosen:
        records: list[Buffer] = [await store.batch_bytes(e) for e in entries]
        want.result.records = records
        broker.metrics.bytes_out.labels(want.topic).inc(sum(len(r) for r in records))
    out_topics = [(name, topic_id, [w.result for w in parts]) for name, topic_id, parts in wants]
    if session_error:
        out_topics = []
    return encode_fetch_response(
        version, header.correlation_id, out_topics, error_code=session_error, session_id=0
    )


async def _record_offset_at(
    broker: MainBroker, entry: BatchEntry, target: int | None
) -> tuple[int, int]:
    """(offset, timestamp) of the first record with timestamp >= target, or of the max timestamp
    record when target is None. Exact for uncompressed batches; a compressed batch answers its
    base offset, which a consumer seeking there handles by skipping earlier records."""
    data = await broker.store.batch_bytes(entry)
    info = parse_batch_header(data, 0)
    if info.timestamp_type_log_append or info.compression != 0:
        return entry.base_offset, entry.max_timestamp
    records = decode_records_for_tools(data)
    if target is None:
        best = max(records, key=lambda r: r[1])
        return best[0], best[1]
    for offset, timestamp, _, _ in records:
        if timestamp >= target:
            return offset, timestamp
    return entry.base_offset, entry.max_timestamp


async def list_offsets(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    topics_out = []
    for topic in req.topics:
        parts_out = []
        for p in topic.partitions:
            out: dict[str, Any] = {
                "partition_index": p.partition_index,
                "error_code": ErrorCode.none,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": -1,
            }
            parts_out.append(out)
            plog = broker.store.partition(topic.name, p.partition_index)
            if plog is None:
                out["error_code"] = ErrorCode.unknown_topic_or_partition
                continue
            epoch_error = _leader_epoch_error(plog, getattr(p, "current_leader_epoch", -1))
            if epoch_error is not None:
                out["error_code"] = epoch_error
                continue
            out["leader_epoch"] = plog.leader_epoch
            ts = p.timestamp
            if ts == EARLIEST:
                out["offset"] = plog.log_start_offset
            elif ts == LATEST:
                out["offset"] = plog.high_watermark
            elif ts == MAX_TIMESTAMP:
                entry = plog.max_timestamp_entry()
                if entry is not None:
                    out["offset"], out["timestamp"] = await _record_offset_at(broker, entry, None)
            elif ts < 0:
                out["error_code"] = ErrorCode.invalid_request
            else:
                entry = plog.first_batch_at_timestamp(ts)
                if entry is not None:
                    out["offset"], out["timestamp"] = await _record_offset_at(broker, entry, ts)
        topics_out.append({"name": topic.name, "partitions": parts_out})
    return {"topics": topics_out}
