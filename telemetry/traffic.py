"""Traffic accounting: bytes and requests by (from zone, to zone, channel, api).

Every record bumps two Prometheus counters and a per-minute aggregate. `flush` closes the
minutes that have ended and hands their rows to a sink (JSON Lines on disk), which the cost
reports read. Row format (one JSON object per line, keys in this order)::

    {"minute": "2026-11-22T10:31:00Z", "node": "main-1", "from_zone": "use1-az1",
     "to_zone": "use1-az2", "channel": "confirm", "api": "produce", "bytes": 1234,
     "requests": 10, "cross_zone": true}
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import trio

from telemetry.metrics import CounterChild, MetricsRegistry

__all__ = [
    "JsonlTrafficSink",
    "TrafficAccounting",
    "TrafficKey",
    "TrafficSink",
    "minute_iso",
]

TRAFFIC_LABELS = ("from_zone", "to_zone", "channel", "api")


@dataclass(frozen=True, slots=True)
class TrafficKey:
    from_zone: str
    to_zone: str
    channel: str
    api: str

    @property
    def cross_zone(self) -> bool:
        return self.from_zone != self.to_zone


class TrafficSink(Protocol):
    def write(self, rows: list[dict[str, Any]]) -> None: ...


class _Slot:
    """Per-key state: the cached counter children and the open minute's totals."""

    __slots__ = ("bytes", "bytes_child", "key", "requests", "requests_child")

    def __init__(self, key: TrafficKey, bytes_child: CounterChild, requests_child: CounterChild):
        self.key = key
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
        self._slots: dict[tuple[str, str, str, str], _Slot] = {}
        self._minute = int(clock() // 60)
        # Minutes that ended but were not flushed yet: minute -> {key: (bytes, requests)}.
        self._closed: dict[int, dict[TrafficKey, tuple[int, int]]] = {}

    def record(self, from_zone: str, to_zone: str, channel: str, api: str, nbytes: int) -> None:
        """Count one request of `nbytes` bytes sent from `from_zone` to `to_zone`."""
        minute = int(self._clock() // 60)
        # A clock stepping backwards is charged to the open minute rather than reopening one.
        if minute > self._minute:
            self._roll(minute)
        slot = self._slots.get((from_zone, to_zone, channel, api))
        if slot is None:
            slot = self._new_slot(from_zone, to_zone, channel, api)
        slot.bytes += nbytes
        slot.requests += 1
        slot.bytes_child.inc(nbytes)
        slot.requests_child.inc()

    def _new_slot(self, from_zone: str, to_zone: str, channel: str, api: str) -> _Slot:
        values = (from_zone, to_zone, channel, api)
        slot = _Slot(
            TrafficKey(*values), self._bytes.labels(*values), self._requests.labels(*values)
        )
        self._slots[values] = slot
        return slot

    def _roll(self, minute: int) -> None:
        """Move the open minute's totals to the closed set and open `minute`."""
        totals: dict[TrafficKey, tuple[int, int]] = {}
        for slot in self._slots.values():
            if slot.requests:
                totals[slot.key] = (slot.bytes, slot.requests)
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
        if minute > self._minute:
            self._roll(minute)
        elif include_open:
            self._roll(self._minute)
        rows: list[dict[str, Any]] = []
        for m in sorted(self._closed):
            when = minute_iso(m)
            totals = self._closed[m]
            for key in sorted(totals, key=_key_order):
                nbytes, nreq = totals[key]
                rows.append(
                    {
                        "minute": when,
                        "node": self.node_id,
                        "from_zone": key.from_zone,
                        "to_zone": key.to_zone,
                        "channel": key.channel,
                        "api": key.api,
                        "bytes": nbytes,
                        "requests": nreq,
                        "cross_zone": key.cross_zone,
                    }
                )
        self._closed.clear()
        return rows

    def flush(
        self, now_s: float | None = None, *, include_open: bool = False
    ) -> list[dict[str, Any]]:
        """Close finished minutes; write their rows to the sink (blocking) and return them."""
        rows = self.collect(now_s, include_open=include_open)
        if rows and self.sink is not None:
            self.sink.write(rows)
        return rows

    async def flush_async(
        self,
        now_s: float | None = None,
        *,
        include_open: bool = False,
        limiter: trio.CapacityLimiter | None = None,
    ) -> list[dict[str, Any]]:
        """Like `flush`, but the sink write runs in a worker thread (collection stays here)."""
        rows = self.collect(now_s, include_open=include_open)
        sink = self.sink
        if rows and sink is not None:
            await trio.to_thread.run_sync(sink.write, rows, limiter=limiter)
        return rows

    async def run_flusher(
        self,
        interval_s: float = 15.0,
        *,
        limiter: trio.CapacityLimiter | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Flush every `interval_s` until cancelled; on cancellation flush everything left."""
        task_status.started()
        try:
            while True:
                await trio.sleep(interval_s)
                await self.flush_async(limiter=limiter)
        finally:
            with trio.CancelScope(shield=True):
                await self.flush_async(include_open=True, limiter=limiter)


def _key_order(key: TrafficKey) -> tuple[str, str, str, str]:
    return (key.from_zone, key.to_zone, key.channel, key.api)


class JsonlTrafficSink:
    """Appends rows as JSON Lines to one file (created with its directory if missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        # One write call per batch keeps a batch contiguous even with several appenders.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data)
