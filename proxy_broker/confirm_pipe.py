"""Confirms from one proxy to one main broker: up to N calls in flight, in WAL order.

Appends become durable in the proxy's WAL in order; confirms for one main are sent in that same
order (head of line: a request goes out only once its PREPARED records and all those before it
are durable). Up to `max_in_flight` calls are outstanding at once, and whatever became ready
while every slot was busy goes out together in the next call, so a busy main still gets few,
larger confirms while a lone request no longer waits for someone else's round trip.

RPC requests run as separate tasks on the main and may even arrive out of order, so each call
carries a session id and a sequence number (0, 1, 2, ... per session); the main applies a
session's confirms strictly in `seq` order (main_broker/confirm.py), which keeps an idempotent
producer's batches in order. A failed call starts a new session: the main may never have seen
that `seq`, and later calls must not wait behind it. So does a pipe idle for a while: the main
forgets idle sessions, and a restarted main knows none.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from internal_rpc import RpcError, RpcTimeout
from internal_rpc.messages import (
    ConfirmParams,
    ConfirmPart,
    ConfirmResult,
    MalformedMessage,
    PartitionOutcome,
)
from shared_wal import WalPosition

log = logging.getLogger("zonefleet.proxy.confirm")

MAX_PARTS_PER_CALL = 1000
DEFAULT_MAX_IN_FLIGHT = 4
# Far below the main's IDLE_SESSION_SECONDS, and longer than a main takes to restart, so a
# session the main no longer knows is never continued; rare enough to keep its table small.
SESSION_IDLE_RESET_S = 1.0


class ConfirmClient(Protocol):
    """What the pipe needs of internal_rpc.RpcClient."""

    async def call(
        self, method: str, params: dict[str, Any], *, timeout: float, retries: int, idempotent: bool
    ) -> Any: ...


@dataclass
class ConfirmRequest:
    """The partitions of one client Produce request that go to one main."""

    api_version: int
    timeout_ms: int
    # (topic, partition, PREPARED position once durable)
    parts: list[tuple[str, int, WalPosition | None]]
    results: list[PartitionOutcome] = field(default_factory=list)
    prepared: trio.Event = field(default_factory=trio.Event)  # every PREPARED record durable
    done: trio.Event = field(default_factory=trio.Event)

    def fail(self, code: ErrorCode, message: str) -> None:
        outcome = PartitionOutcome(int(code), error_message=message)
        self.results = [outcome for _ in self.parts]
        self.done.set()


def new_session_id() -> str:
    return secrets.token_hex(6)


class ConfirmPipe:
    def __init__(
        self,
        rpc: ConfirmClient,
        main_id: int,
        timeout_s: float,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.rpc = rpc
        self.main_id = main_id
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self._queue: deque[ConfirmRequest] = deque()
        self._wakeup = trio.Event()
        self._slots = trio.Semaphore(max_in_flight)
        self.session = new_session_id()
        self._next_seq = 0
        self._idle_since: float | None = None  # None while calls are in flight
        self.in_flight = 0
        self.calls = 0

    def submit(self, request: ConfirmRequest) -> None:
        self._queue.append(request)
        self._wakeup.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                if not self._queue:
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                # Head of line: PREPARED group commits finish in order, so nothing behind the
                # head can be confirmed before it.
                await self._queue[0].prepared.wait()
                await self._slots.acquire()
                batch = self._take_batch()
                if not batch:
                    self._slots.release()
                    continue
                session, seq = self._next_ticket()
                self.in_flight += 1
                self._idle_since = None
                nursery.start_soon(self._send, batch, session, seq)

    def _next_ticket(self) -> tuple[str, int]:
        idle_since = self._idle_since
        if idle_since is not None and trio.current_time() - idle_since >= SESSION_IDLE_RESET_S:
            self._new_session()
        seq = self._next_seq
        self._next_seq += 1
        return self.session, seq

    def _new_session(self) -> None:
        self.session = new_session_id()
        self._next_seq = 0

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

    async def _send(self, batch: list[ConfirmRequest], session: str, seq: int) -> None:
        try:
            await self._call(batch, session, seq)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle_since = trio.current_time()
            self._slots.release()

    async def _call(self, batch: list[ConfirmRequest], session: str, seq: int) -> None:
        params = ConfirmParams(
            produce_version=batch[0].api_version,
            timeout_ms=max(r.timeout_ms for r in batch),
            parts=tuple(
                ConfirmPart(topic, partition, pos.writer, pos.segment, pos.position, pos.length)
                for request in batch
                for topic, partition, pos in request.parts
                if pos is not None
            ),
            session=session,
            seq=seq,
        )
        try:
            # Not idempotent: a confirm that may have reached the main is never resent blindly;
            # the client's own retry (deduplicated for idempotent producers) covers it.
            answer = await self.rpc.call(
                "confirm", params.to_wire(), timeout=self.timeout_s, retries=1, idempotent=False
            )
            result = ConfirmResult.from_wire(answer, expected_parts=len(params.parts))
        except (RpcError, MalformedMessage) as exc:
            if session == self.session:
                # The main may never have got this seq; later calls must not wait behind it.
                self._new_session()
            log.warning("confirm %s/%d to main %d failed: %r", session, seq, self.main_id, exc)
            if isinstance(exc, RpcTimeout):
                code, message = ErrorCode.request_timed_out, f"main {self.main_id} timed out"
            elif isinstance(exc, MalformedMessage):
                code, message = ErrorCode.unknown_server_error, f"main {self.main_id}: {exc}"
            else:
                code, message = ErrorCode.not_leader_or_follower, f"main {self.main_id}: {exc}"
            for request in batch:
                request.fail(code, message)
            return
        self.calls += 1
        rows = result.parts
        i = 0
        for request in batch:
            request.results = list(rows[i : i + len(request.parts)])
            i += len(request.parts)
            request.done.set()
