"""Traffic accounting: bytes and requests by (from zone, to zone, channel, api), and in the
ledger also by topic.

Every record bumps two Prometheus counters and a per-minute aggregate. `flush` closes the
minutes that have ended and hands their rows to a sink (JSON Lines on disk, see
`telemetry.traffic_sink`), which the cost reports read. Row format (one JSON object per line,
keys in this order; docs/formats.md "Traffic accounting" is the reference)::

    {"minute":"2026-11-22T10:31:00Z","node":"main-1","from_zone":"az1","to_zone":"az2",
     "channel":"confirm-rpc","api":"confirm","topic":"","bytes":1234,"requests":10,
     "cross_zone":true}

`topic` is empty except on the rows of frames split by topic (`record_topics`: Kafka Produce
and Fetch). The Prometheus counters keep the four labels above: the topic rows of one key add
into the same counter, so the label set stays small.

`record` may be called from worker threads (the shared-WAL hook runs there): a plain lock
guards the per-key totals, which costs far less than the request it counts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import trio

from telemetry.metrics import CounterChild, MetricsRegistry

__all__ = [
    "CHANNEL_CONFIRM_RPC",
    "CHANNEL_KAFKA_CLIENT",
    "CHANNEL_RELAY",
    "CHANNEL_RPC",
    "CHANNEL_S3_GET",
    "CHANNEL_S3_PUT",
    "CHANNEL_STATE_STREAM",
    "CHANNEL_WAL_READ",
    "CHANNEL_WAL_WRITE",
    "NO_TOPIC",
    "PSEUDO_ZONES",
    "REGIONAL_ZONE",
    "UNKNOWN_ZONE",
    "TrafficAccounting",
    "TrafficKey",
    "TrafficSink",
    "minute_iso",
]

NO_TOPIC: Final = ""

log = logging.getLogger("zonefleet.telemetry")

TRAFFIC_LABELS = ("from_zone", "to_zone", "channel", "api")
MAX_UNWRITTEN_ROWS: Final = 100_000

CHANNEL_KAFKA_CLIENT: Final = "kafka-client"  # a Kafka listener; api = Kafka API name
CHANNEL_CONFIRM_RPC: Final = "confirm-rpc"  # requests = partitions confirmed
CHANNEL_STATE_STREAM: Final = "state-stream"
CHANNEL_RELAY: Final = "relay"  # api = Kafka API name of the relayed request
CHANNEL_RPC: Final = "rpc"  # other internal RPC (handshakes, control calls); api = method
CHANNEL_WAL_WRITE: Final = "wal-write"
CHANNEL_WAL_READ: Final = "wal-read"
CHANNEL_S3_PUT: Final = "s3-put"  # PUT-class object-store requests
CHANNEL_S3_GET: Final = "s3-get"  # GET-class object-store requests

# The shared file system and the object store are regional services by default (DESIGN.md:
# "a regional shared file system"; S3 in the region costs no transfer), so their traffic is
# booked to this pseudo-zone rather than to an AZ. A fleet may name a real AZ instead.
REGIONAL_ZONE: Final = "regional"
# A Kafka client whose zone no rule resolves.
UNKNOWN_ZONE: Final = "unknown"
PSEUDO_ZONES: Final = frozenset({REGIONAL_ZONE, UNKNOWN_ZONE})


@dataclass(frozen=True, slots=True)
class TrafficKey:
    from_zone: str
    to_zone: str
    channel: str
    api: str

    @property
    def cross_zone(self) -> bool:
        """Both ends are real zones and they differ (pseudo-zones never count as crossing)."""
        return (
            self.from_zone != self.to_zone
            and self.from_zone not in PSEUDO_ZONES
            and self.to_zone not in PSEUDO_ZONES
        )


class TrafficSink(Protocol):
    def write(self, rows: list[dict[str, Any]]) -> None: ...


# The open minute's totals are kept per (TrafficKey, topic): a ledger row.
RowKey = tuple[TrafficKey, str]


class _Slot:
    """Per-row state: the key's cached counter children (shared by every topic of the key)
    and the open minute's totals."""

    __slots__ = ("bytes", "bytes_child", "key", "requests", "requests_child", "topic")

    def __init__(
        self,
        key: TrafficKey,
        topic: str,
        bytes_child: CounterChild,
        requests_child: CounterChild,
    ) -> None:
        self.key = key
        self.topic = topic
        self.bytes_child = bytes_child
        self.requests_child = requests_child
        self.bytes = 0
        self.requests = 0


def minute_iso(minute: int) -> str:
    """The UTC start of epoch minute `minute`, as "YYYY-MM-DDTHH:MM:00Z"."""
    return datetime.fromtimestamp(minute * 60, tz=UTC).strftime("%Y-%m-%dT%H:%M:00Z")


class TrafficAccounting:
    """Counts traffic for one node; cheap enough to call once per request."""

    def __init__(
        self,
        registry: MetricsRegistry,
        node_id: str,
        sink: TrafficSink | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.sink = sink
        self._clock = clock
        self._bytes = registry.counter(
            "zonefleet_traffic_bytes_total",
            "Bytes sent, by source zone, destination zone, channel and API.",
            TRAFFIC_LABELS,
        )
        self._requests = registry.counter(
            "zonefleet_traffic_requests_total",
            "Requests (messages) sent, by source zone, destination zone, channel and API.",
            TRAFFIC_LABELS,
        )
        self._slots: dict[tuple[str, str, str, str, str], _Slot] = {}
        self._lock = threading.Lock()
        self._minute = int(clock() // 60)
        # Minutes that ended but were not flushed yet: minute -> {row key: (bytes, requests)}.
        self._closed: dict[int, dict[RowKey, tuple[int, int]]] = {}
        self._unwritten: list[dict[str, Any]] = []

    def record(
        self,
        from_zone: str,
        to_zone: str,
        channel: str,
        api: str,
        nbytes: int,
        requests: int = 1,
        topic: str = NO_TOPIC,
    ) -> None:
        """Count `requests` requests totalling `nbytes` bytes sent from `from_zone` to `to_zone`.

        Thread-safe. Counters only go up: negative values raise ValueError.
        """
        if nbytes < 0 or requests < 0:
            raise ValueError("traffic counts only go up")
        minute = int(self._clock() // 60)
        with self._lock:
            # A clock stepping backwards is charged to the open minute rather than reopening one.
            if minute > self._minute:
                self._roll(minute)
            slot = self._slots.get((from_zone, to_zone, channel, api, topic))
            if slot is None:
                slot = self._new_slot(from_zone, to_zone, channel, api, topic)
            slot.bytes += nbytes
            slot.requests += requests
            slot.bytes_child.inc(nbytes)
            slot.requests_child.inc(requests)

    def record_topics(
        self,
        from_zone: str,
        to_zone: str,
        channel: str,
        api: str,
        topic_bytes: Sequence[tuple[str, int]],
        requests: int = 1,
    ) -> None:
        """Count one message split by topic: each (topic, bytes) of `topic_bytes` to its
        topic's row, `requests` to the first topic's row only (so requests still count
        messages), and the sums to the key's Prometheus counters. Thread-safe.
        """
        total = 0
        for _, nbytes in topic_bytes:
            if nbytes < 0:
                raise ValueError("traffic counts only go up")
            total += nbytes
        if requests < 0:
            raise ValueError("traffic counts only go up")
        if not topic_bytes:
            topic_bytes = ((NO_TOPIC, 0),)
        minute = int(self._clock() // 60)
        slots = self._slots
        with self._lock:
            if minute > self._minute:
                self._roll(minute)
            first: _Slot | None = None
            for topic, nbytes in topic_bytes:
                slot = slots.get((from_zone, to_zone, channel, api, topic))
                if slot is None:
                    slot = self._new_slot(from_zone, to_zone, channel, api, topic)
                slot.bytes += nbytes
                if first is None:
                    first = slot
            assert first is not None
            first.requests += requests
            first.bytes_child.inc(total)
            first.requests_child.inc(requests)

    def totals(self) -> dict[TrafficKey, tuple[int, int]]:
        """Cumulative (bytes, requests) per key since start, as Prometheus exposes them (every
        topic of a key together)."""
        with self._lock:
            return {
                slot.key: (int(slot.bytes_child.value), int(slot.requests_child.value))
                for slot in self._slots.values()
            }

    def _new_slot(self, from_zone: str, to_zone: str, channel: str, api: str, topic: str) -> _Slot:
        labels = (from_zone, to_zone, channel, api)
        slot = _Slot(
            TrafficKey(*labels), topic, self._bytes.labels(*labels), self._requests.labels(*labels)
        )
        self._slots[(*labels, topic)] = slot
        return slot

    def _roll(self, minute: int) -> None:
        """Move the open minute's totals to the closed set and open `minute`."""
        totals: dict[RowKey, tuple[int, int]] = {}
        for slot in self._slots.values():
            # Topic rows after the first of a frame carry bytes with no requests: kept too.
            if slot.bytes or slot.requests:
                totals[(slot.key, slot.topic)] = (slot.bytes, slot.requests)
                slot.bytes = 0
                slot.requests = 0
        if totals:
            closed = self._closed.setdefault(self._minute, {})
            for key, (b, r) in totals.items():
                ob, orq = closed.get(key, (0, 0))
                closed[key] = (ob + b, orq + r)
        self._minute = minute

    def collect(
        self, now_s: float | None = None, *, include_open: bool = False
    ) -> list[dict[str, Any]]:
        """Close the minutes that ended before `now_s` and return their rows, without writing.

        `include_open` also closes the current minute (for shutdown); later records to that
        minute then produce a second row for it, which readers must sum.
        """
        now = self._clock() if now_s is None else now_s
        minute = int(now // 60)
        with self._lock:
            if minute > self._minute:
                self._roll(minute)
            elif include_open:
                self._roll(self._minute)
            closed, self._closed = self._closed, {}
        rows: list[dict[str, Any]] = []
        for m in sorted(closed):
            when = minute_iso(m)
            totals = closed[m]
            for row_key in sorted(totals, key=_row_order):
                nbytes, nreq = totals[row_key]
                key, topic = row_key
                rows.append(
                    {
                        "minute": when,
                        "node": self.node_id,
                        "from_zone": key.from_zone,
                        "to_zone": key.to_zone,
                        "channel": key.channel,
                        "api": key.api,
                        "topic": topic,
                        "bytes": nbytes,
                        "requests": nreq,
                        "cross_zone": key.cross_zone,
                    }
                )
        return rows

    def flush(
        self, now_s: float | None = None, *, include_open: bool = False
    ) -> list[dict[str, Any]]:
        """Close finished minutes; write their rows to the sink (blocking) and return them.

        Rows a failed write could not store are kept and written with the next flush.
        """
        rows = self._unwritten + self.collect(now_s, include_open=include_open)
        self._unwritten = []
        if rows and self.sink is not None:
            self._write(self.sink.write, rows)
        return rows

    async def flush_async(
        self,
        now_s: float | None = None,
        *,
        include_open: bool = False,
        limiter: trio.CapacityLimiter | None = None,
    ) -> list[dict[str, Any]]:
        """Like `flush`, but the sink write runs in a worker thread (collection stays here)."""
        rows = self._unwritten + self.collect(now_s, include_open=include_open)
        self._unwritten = []
        sink = self.sink
        if rows and sink is not None:
            try:
                await trio.to_thread.run_sync(sink.write, rows, limiter=limiter)
            except BaseException:
                self._keep_unwritten(rows)
                raise
        return rows

    def _write(
        self, write: Callable[[list[dict[str, Any]]], None], rows: list[dict[str, Any]]
    ) -> None:
        try:
            write(rows)
        except BaseException:
            self._keep_unwritten(rows)
            raise

    def _keep_unwritten(self, rows: list[dict[str, Any]]) -> None:
        # Bounded: a sink that never recovers must not grow the heap without limit.
        self._unwritten = rows[-MAX_UNWRITTEN_ROWS:]

    async def run_flusher(
        self,
        interval_s: float = 15.0,
        *,
        limiter: trio.CapacityLimiter | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Flush every `interval_s` until cancelled; on cancellation flush everything left.

        A failing sink is logged and retried on the next tick; it never stops the node.
        """
        task_status.started()
        try:
            while True:
                await trio.sleep(interval_s)
                try:
                    await self.flush_async(limiter=limiter)
                except Exception:
                    log.exception("traffic accounting: writing rows of %s failed", self.node_id)
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self.flush_async(include_open=True, limiter=limiter)
                except Exception:
                    log.exception("traffic accounting: final flush of %s failed", self.node_id)


def _row_order(row_key: RowKey) -> tuple[str, str, str, str, str]:
    key, topic = row_key
    return (key.from_zone, key.to_zone, key.channel, key.api, topic)
