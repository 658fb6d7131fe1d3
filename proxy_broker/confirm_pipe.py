"""Confirms from one proxy to one main broker: one call in flight, the rest coalesced.

Appends become durable in the proxy's WAL in order; confirms for one main are sent in that
same order, one RPC at a time, and everything that queued while a call was in flight goes out
together in the next call. Order therefore needs no sequence numbers, and a busy main gets
few, larger confirms.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.rpc import RpcClient, RpcError, RpcTimeout
from shared_wal import WalPosition

log = logging.getLogger("zonefleet.proxy.confirm")

MAX_PARTS_PER_CALL = 1000


@dataclass
class ConfirmRequest:
    """The partitions of one client Produce request that go to one main."""

    api_version: int
    acks: int
    timeout_ms: int
    # (topic, partition, PREPARED position once durable)
    parts: list[tuple[str, int, WalPosition | None]]
    results: list[list[Any]] = field(default_factory=list)
    prepared: trio.Event = field(default_factory=trio.Event)  # every PREPARED record durable
    done: trio.Event = field(default_factory=trio.Event)

    def fail(self, code: ErrorCode, message: str) -> None:
        self.results = [[int(code), -1, -1, -1, message] for _ in self.parts]
        self.done.set()


class ConfirmPipe:
    def __init__(self, rpc: RpcClient, main_id: int, timeout_s: float) -> None:
        self.rpc = rpc
        self.main_id = main_id
        self.timeout_s = timeout_s
        self._queue: deque[ConfirmRequest] = deque()
        self._wakeup = trio.Event()
        self.calls = 0
        self.bytes_sent = 0

    def submit(self, request: ConfirmRequest) -> None:
        self._queue.append(request)
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            if not self._queue:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            # Head of line: PREPARED group commits finish in order, so nothing behind the head
            # can be confirmed before it.
            await self._queue[0].prepared.wait()
            batch = self._take_batch()
            if batch:
                await self._send(batch)

    def _take_batch(self) -> list[ConfirmRequest]:
        batch: list[ConfirmRequest] = []
        parts = 0
        while (
            self._queue
            and self._queue[0].prepared.is_set()
            and (not batch or self._queue[0].api_version == batch[0].api_version)
            and (not batch or parts + len(self._queue[0].parts) <= MAX_PARTS_PER_CALL)
        ):
            request = self._queue.popleft()
            if request.done.is_set():
                continue  # failed while preparing
            batch.append(request)
            parts += len(request.parts)
        return batch

    async def _send(self, batch: list[ConfirmRequest]) -> None:
        params = {
            "acks": max(r.acks for r in batch),
            "tmo": max(r.timeout_ms for r in batch),
            "v": batch[0].api_version,
            "parts": [
                [topic, partition, pos.writer, pos.segment, pos.position, pos.length]
                for request in batch
                for topic, partition, pos in request.parts
                if pos is not None
            ],
        }
        try:
            # Not idempotent: a confirm that may have reached the main is never resent blindly;
            # the client's own retry (deduplicated for idempotent producers) covers it.
            result = await self.rpc.call(
                "confirm", params, timeout=self.timeout_s, retries=1, idempotent=False
            )
        except RpcTimeout as exc:
            log.warning("confirm to main %d timed out: %s", self.main_id, exc)
            for request in batch:
                request.fail(ErrorCode.request_timed_out, f"main {self.main_id} timed out")
            return
        except RpcError as exc:
            log.warning("confirm to main %d failed: %s", self.main_id, exc)
            for request in batch:
                request.fail(ErrorCode.not_leader_or_follower, f"main {self.main_id}: {exc}")
            return
        self.calls += 1
        rows = result["parts"]
        i = 0
        for request in batch:
            request.results = rows[i : i + len(request.parts)]
            i += len(request.parts)
            request.done.set()
