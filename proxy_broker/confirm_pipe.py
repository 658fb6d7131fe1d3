"""Confirms from one proxy to one main broker: up to N calls in flight, in WAL order.

Appends become durable in the proxy's WAL in order; confirms for one main are sent in that same
order (head of line: a request goes out only once its PREPARED records and all those before it
are durable). Up to `max_in_flight` calls are outstanding at once, and whatever became ready
while every slot was busy goes out together in the next call, so a busy main still gets few,
larger confirms while a lone request no longer waits for someone else's round trip.

RPC requests run as separate tasks on the main and may even arrive out of order, so each call
carries a session id and a sequence number (0, 1, 2, ... per session); the main applies a
session's confirms strictly in `seq` order (main_broker/api/confirm.py), which keeps an idempotent
producer's batches in order. A failed call starts a new session: the main may never have seen
that `seq`, and later calls must not wait behind it. So does a pipe idle for a while: the main
forgets idle sessions, and a restarted main knows none.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from internal_rpc import RpcError, RpcRemoteError, RpcTimeout, RpcUnavailable
from internal_rpc.messages import (
    CONFIRM_VERSION,
    BatchSummary,
    ConfirmParams,
    ConfirmPart,
    ConfirmResult,
    MalformedMessage,
    PartitionOutcome,
)
from proxy_broker.sequence_guard import RESENT, BatchRef
from shared_wal import AppendTicket, WalError, WalPosition

log = logging.getLogger("zonefleet.proxy.confirm")

MAX_PARTS_PER_CALL = 1000
DEFAULT_MAX_IN_FLIGHT = 4
# Far below the main's IDLE_SESSION_SECONDS, and longer than a main takes to restart, so a
# session the main no longer knows is never continued; rare enough to keep its table small.
SESSION_IDLE_RESET_S = 1.0


OnPrepared = Callable[[WalPosition, memoryview], None]
# Told of each part whose client will send it again (True: later batches of its producer
# must wait for that: proxy_broker/sequence_guard.py) or that was confirmed (False).
OnOutcome = Callable[["PreparedPart", bool], None]


class ConfirmClient(Protocol):
    """What the pipe needs of internal_rpc.RpcClient."""

    async def call(
        self, method: str, params: dict[str, Any], *, timeout: float, retries: int, idempotent: bool
    ) -> Any: ...


@dataclass(slots=True)
class PreparedPart:
    """One partition of a request: its batch's header summary, and its PREPARED record (the
    WAL ticket until durable, then the position the confirm names)."""

    topic: str
    partition: int
    batch: BatchSummary
    position: WalPosition | None = None
    ticket: AppendTicket | None = None
    payload: memoryview | None = None  # the bytes, for this proxy's own reads once durable

    def batch_ref(self) -> BatchRef:
        b = self.batch
        return BatchRef(
            self.topic, self.partition, b.producer_id, b.producer_epoch, b.base_sequence
        )


@dataclass
class ConfirmRequest:
    """The partitions of one client Produce request that go to one main."""

    api_version: int
    timeout_ms: int
    parts: list[PreparedPart]
    results: list[PartitionOutcome] = field(default_factory=list)
    prepared: bool = False  # every PREPARED record durable (or one failed): `settle`
    done: trio.Event = field(default_factory=trio.Event)

    def fail(self, code: ErrorCode, message: str) -> None:
        outcome = PartitionOutcome(int(code), error_message=message)
        self.results = [outcome for _ in self.parts]
        self.done.set()

    def settle(self, on_prepared: OnPrepared | None = None) -> bool:
        """True once every PREPARED record is durable (positions filled, `on_prepared` told
        of each) or one failed (the request failed); False while any is pending."""
        if self.prepared:
            return True
        parts = self.parts
        if any(p.ticket is not None and not p.ticket.done for p in parts):
            return False
        for part in parts:
            ticket = part.ticket
            if ticket is None:
                continue
            part.ticket = None
            if ticket.position is None:
                log.error("PREPARED write for %s-%d failed", part.topic, part.partition)
                self.fail(ErrorCode.kafka_storage_error, "the proxy's WAL write failed")
                break
            part.position = ticket.position
            if on_prepared is not None and part.payload is not None:
                on_prepared(ticket.position, part.payload)
        self.prepared = True
        return True

    async def wait_prepared(self, on_prepared: OnPrepared | None = None) -> None:
        for part in self.parts:
            if part.ticket is not None:
                with contextlib.suppress(WalError):
                    await part.ticket.wait()
        self.settle(on_prepared)


def new_session_id() -> str:
    return secrets.token_hex(6)


class ConfirmPipe:
    def __init__(
        self,
        rpc: ConfirmClient,
        main_id: int,
        timeout_s: float,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        on_prepared: OnPrepared | None = None,
        on_outcome: OnOutcome | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.rpc = rpc
        self.main_id = main_id
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        # Told of each PREPARED record once durable (the proxy keeps the bytes for its reads).
        self.on_prepared = on_prepared
        self.on_outcome = on_outcome
        self._calls: dict[tuple[str, int], list[ConfirmRequest]] = {}  # in flight
        self._queue: deque[ConfirmRequest] = deque()
        self._wakeup = trio.Event()
        self._slots = trio.Semaphore(max_in_flight)
        self.session = new_session_id()
        self._next_seq = 0
        self._idle_since: float | None = None  # None while calls are in flight
        self.in_flight = 0
        self.calls = 0
        # The confirm version this main reads: the newest until a main of an earlier release
        # refuses it, then one less each time (version 1: that main reads each payload back).
        self.version = CONFIRM_VERSION

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
                # head can be confirmed before it. This task waits on the WAL tickets itself.
                await self._queue[0].wait_prepared(self.on_prepared)
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

    def _fail(self, requests: list[ConfirmRequest], code: ErrorCode, message: str) -> None:
        for request in requests:
            request.fail(code, message)
            if code in RESENT:
                self._tell(request.parts, True)

    def _tell(self, parts: list[PreparedPart], doubt: bool) -> None:
        if self.on_outcome is not None:
            for part in parts:
                self.on_outcome(part, doubt)

    def _new_session(self) -> None:
        self.session = new_session_id()
        self._next_seq = 0

    def _take_batch(self) -> list[ConfirmRequest]:
        batch: list[ConfirmRequest] = []
        parts = 0
        while (
            self._queue
            and self._queue[0].settle(self.on_prepared)
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
        self._calls[session, seq] = batch
        try:
            await self._call(batch, session, seq)
        finally:
            del self._calls[session, seq]
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle_since = trio.current_time()
            self._slots.release()

    async def _call(self, batch: list[ConfirmRequest], session: str, seq: int) -> None:
        params = ConfirmParams(
            produce_version=batch[0].api_version,
            timeout_ms=max(r.timeout_ms for r in batch),
            parts=tuple(
                ConfirmPart(
                    part.topic,
                    part.partition,
                    pos.writer,
                    pos.segment,
                    pos.position,
                    pos.length,
                    part.batch if self.version >= 2 else None,
                )
                for request in batch
                for part in request.parts
                if (pos := part.position) is not None
            ),
            session=session,
            seq=seq,
        )
        try:
            # Not idempotent: a confirm that may have reached the main is never resent blindly;
            # the client's own retry (deduplicated for idempotent producers) covers it.
            answer = await self.rpc.call(
                "confirm",
                params.to_wire(self.version),
                timeout=self.timeout_s,
                retries=1,
                idempotent=False,
            )
            result = ConfirmResult.from_wire(answer, expected_parts=len(params.parts))
        except (RpcError, MalformedMessage) as exc:
            if session == self.session:
                # The main may never have got this seq; later calls must not wait behind it.
                self._new_session()
            if (
                isinstance(exc, RpcRemoteError)
                and exc.code == "UnsupportedMessageVersion"
                and self.version > 1
            ):
                # A main of an earlier release (a rolling upgrade): it decoded nothing, so the
                # clients' retries go out one version lower.
                self.version -= 1
                log.warning(
                    "main %d refused confirm version %d; sending version %d",
                    self.main_id,
                    self.version + 1,
                    self.version,
                )
            log.warning("confirm %s/%d to main %d failed: %r", session, seq, self.main_id, exc)
            if isinstance(exc, RpcTimeout) or (
                isinstance(exc, RpcUnavailable) and exc.request_sent
            ):
                # The main may have made it durable before it went: a client must retry it as
                # possibly written (same sequence, deduplicated wherever the partition is led
                # next), never as surely not written, which makes librdkafka bump its producer
                # epoch and send it again as new (a duplicate).
                code, message = ErrorCode.request_timed_out, f"main {self.main_id}: {exc}"
            elif isinstance(exc, MalformedMessage):
                code, message = ErrorCode.unknown_server_error, f"main {self.main_id}: {exc}"
            else:
                code, message = ErrorCode.not_leader_or_follower, f"main {self.main_id}: {exc}"
            self._fail(batch, code, message)
            # The main applies a session's confirms in order: the calls still out on this
            # session may never be applied, or only after a failed one. Their batches are in
            # doubt until answered, so no later batch of theirs overtakes them.
            for (other_session, other_seq), riding in self._calls.items():
                if other_session == session and other_seq != seq:
                    for request in riding:
                        self._tell(request.parts, True)
            # What waits in the queue came before the client heard of this failure: sent on
            # now (a new session), a producer's later batch could be appended while this
            # one was not, and librdkafka answers that gap by sending both again as new.
            waiting = [r for r in self._queue if not r.done.is_set()]
            self._queue.clear()
            self._fail(
                waiting,
                ErrorCode.request_timed_out,
                f"main {self.main_id}: an earlier confirm failed: {exc}",
            )
            return
        self.calls += 1
        rows = result.parts
        i = 0
        for request in batch:
            request.results = list(rows[i : i + len(request.parts)])
            i += len(request.parts)
            if self.on_outcome is not None:
                # Told before anyone sees `done`: the main's own answers that the client
                # resends (an earlier confirm of the session never came, the append outlived
                # the timeout, the partition moved), and what it confirmed.
                for part, row in zip(request.parts, request.results, strict=False):
                    self.on_outcome(part, row.error_code in RESENT)
            request.done.set()
