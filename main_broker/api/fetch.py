"""Fetch (long poll, byte limits, isolation) and ListOffsets, served up to the high watermark."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.fetch_serving import PartitionReadError, leader_epoch_error, serve_fetch
from kafka_wire.leader_epochs import offsets_for_leader_epochs
from kafka_wire.record_batch import decode_records_for_tools, parse_batch_header
from kafka_wire.server_loop import Buffer
from main_broker.api.zone_redirect import misplaced
from main_broker.log_store import TopicState
from main_broker.partition_log import BatchEntry, leader_error

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

log = logging.getLogger("zonefleet.main_broker.fetch")

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4  # KIP-405, ListOffsets v8+: the first offset the WAL (the "local log") holds
LATEST_TIERED = -5  # KIP-1005, v9+: the last offset the object store (the "remote" tier) holds
# After a pause, how long a fetch waits for this main to vouch for its leadership again.
UNVOUCHED_WAIT_S = 1.0


class _LookupTimedOut(Exception):
    """A ListOffsets v10+ lookup outlasted the request's TimeoutMs (KIP-1075)."""


async def _record_offset_by(
    broker: BrokerServices, entry: BatchEntry, target: int | None, deadline: float
) -> tuple[int, int]:
    with trio.move_on_at(deadline):
        return await _record_offset_at(broker, entry, target)
    raise _LookupTimedOut


class _BrokerFetchSource:
    """The main broker's LogStore and metrics as a `kafka_wire.fetch_serving.FetchSource`."""

    __slots__ = ("_broker",)

    def __init__(self, broker: BrokerServices) -> None:
        self._broker = broker

    def topic_by_name(self, name: str) -> TopicState | None:
        return self._broker.store.topics.get(name)

    def topic_by_id(self, topic_id: bytes) -> TopicState | None:
        return self._broker.store.topics_by_id.get(topic_id)

    @property
    def data_arrived(self) -> trio.Event:
        return self._broker.store.data_arrived

    async def batches_bytes(self, entries: Sequence[BatchEntry]) -> list[Buffer]:
        return await self._broker.store.batches.batches_bytes(entries)

    def on_bytes_out(self, topic: str, nbytes: int) -> None:
        self._broker.metrics.bytes_out.labels(topic).inc(nbytes)


class _NotLed:
    """A partition as a main that cannot vouch for its leadership answers it."""

    __slots__ = ()
    owned = False


class _NotLedTopic:
    __slots__ = ("name", "partitions", "topic_id")

    def __init__(self, state: TopicState) -> None:
        self.name = state.name
        self.topic_id = state.topic_id
        self.partitions = [_NotLed()] * len(state.partitions)


class _UnvouchedFetchSource(_BrokerFetchSource):
    """Every partition NOT_LEADER_OR_FOLLOWER: after a pause this main has not yet looked
    whether another took its partitions over (main_broker/cluster/liveness.py)."""

    def topic_by_name(self, name: str) -> Any:
        state = super().topic_by_name(name)
        return None if state is None else _NotLedTopic(state)

    def topic_by_id(self, topic_id: bytes) -> Any:
        state = super().topic_by_id(topic_id)
        return None if state is None else _NotLedTopic(state)


class _ZonePartitions:
    """A topic's partitions as the client's zone view has them: the ones it gives to another
    node (its zone's proxy) read as not led here. Checked as the request names them."""

    __slots__ = ("_broker", "_ctx", "_name", "_partitions")

    def __init__(
        self, broker: BrokerServices, ctx: RequestContext, name: str, partitions: Sequence[Any]
    ) -> None:
        self._broker = broker
        self._ctx = ctx
        self._name = name
        self._partitions = partitions

    def __len__(self) -> int:
        return len(self._partitions)

    def __getitem__(self, index: int) -> Any:
        if misplaced(self._broker, self._ctx, [(self._name, index)]):
            return _NotLed()
        return self._partitions[index]


class _ZoneTopic:
    __slots__ = ("name", "partitions", "topic_id")

    def __init__(self, state: TopicState, partitions: _ZonePartitions) -> None:
        self.name = state.name
        self.topic_id = state.topic_id
        self.partitions = partitions


class _ZoneFetchSource(_BrokerFetchSource):
    """NOT_LEADER_OR_FOLLOWER for the partitions the client's zone view gives to its zone's
    proxy (a client back from a fallback: main_broker/api/zone_redirect.py)."""

    __slots__ = ("_ctx",)

    def __init__(self, broker: BrokerServices, ctx: RequestContext) -> None:
        super().__init__(broker)
        self._ctx = ctx

    def _routed(self, state: TopicState | None) -> Any:
        if state is None or not self._broker.config.zone_proxies:
            return state
        partitions = _ZonePartitions(self._broker, self._ctx, state.name, state.partitions)
        return _ZoneTopic(state, partitions)

    def topic_by_name(self, name: str) -> Any:
        return self._routed(super().topic_by_name(name))

    def topic_by_id(self, topic_id: bytes) -> Any:
        return self._routed(super().topic_by_id(topic_id))


async def fetch(broker: BrokerServices, ctx: RequestContext, req: Any) -> Sequence[Buffer]:
    header = ctx.header
    source: _BrokerFetchSource = _ZoneFetchSource(broker, ctx)
    cluster = broker.cluster
    if not cluster.reads_fresh() and not await cluster.wait_reads_fresh(UNVOUCHED_WAIT_S):
        source = _UnvouchedFetchSource(broker)
    return await serve_fetch(
        source,
        header.api_version,
        header.correlation_id,
        req,
        broker.leader_hints(ctx),
        quota=broker.quotas.fetch_quota(ctx.conn, header.client_id)
        if broker.direct_client(ctx)
        else None,
    )


async def offset_for_leader_epoch(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    return offsets_for_leader_epochs(_BrokerFetchSource(broker), req)


async def _record_offset_at(
    broker: BrokerServices, entry: BatchEntry, target: int | None
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


async def list_offsets(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    timeout_ms = getattr(req, "timeout_ms", None)  # v10+: bounds reads of older batches
    deadline = trio.current_time() + timeout_ms / 1000 if timeout_ms is not None else math.inf
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
            if (error := leader_error(plog)) is not None:
                out["error_code"] = error
                continue
            assert plog is not None
            epoch_error = leader_epoch_error(
                plog.leader_epoch, getattr(p, "current_leader_epoch", -1)
            )
            if epoch_error is not None:
                out["error_code"] = epoch_error
                continue
            out["leader_epoch"] = plog.leader_epoch
            ts = p.timestamp
            try:
                if ts == EARLIEST:
                    out["offset"] = plog.log_start_offset
                elif ts == LATEST:
                    read_committed = getattr(req, "isolation_level", 0) == 1
                    out["offset"] = (
                        plog.last_stable_offset if read_committed else plog.high_watermark
                    )
                elif ts == EARLIEST_LOCAL and ctx.header.api_version >= 8:
                    out["offset"] = max(plog.wal_start_offset, plog.log_start_offset)
                elif ts == LATEST_TIERED and ctx.header.api_version >= 9:
                    stream = plog.objects  # none without an object store: "tiering is off"
                    if stream is None or stream.end_offset <= stream.start_offset:
                        out["leader_epoch"] = -1
                    else:
                        out["offset"] = stream.end_offset - 1
                elif ts == MAX_TIMESTAMP:
                    entry = plog.max_timestamp_entry()
                    if entry is not None:
                        found = await _record_offset_by(broker, entry, None, deadline)
                        out["offset"], out["timestamp"] = found
                elif ts < 0:
                    out["error_code"] = ErrorCode.invalid_request
                else:
                    entry = plog.first_batch_at_timestamp(ts)
                    if entry is not None:
                        found = await _record_offset_by(broker, entry, ts, deadline)
                        out["offset"], out["timestamp"] = found
                        # A batch DeleteRecords cut through: never an offset below the start.
                        out["offset"] = max(out["offset"], plog.log_start_offset)
            except PartitionReadError as exc:  # logged where the read failed
                out["error_code"] = exc.error_code
            except _LookupTimedOut:
                out["error_code"] = ErrorCode.request_timed_out
        topics_out.append({"name": topic.name, "partitions": parts_out})
    return {"topics": topics_out}
