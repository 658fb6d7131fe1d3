"""The confirm RPC: a zone proxy has written a Produce payload to the shared WAL (a PREPARED
record in its own writer directory) and asks this main broker, the partition's leader, to
append it. The confirm carries each batch's header summary (the proxy checked the framing and
CRC of the bytes it holds), so the main runs exactly the append decision a direct client gets
(main_broker/appender.py) without reading the payload back; its own WAL records only a LINK
(metadata, no payload). The bytes are read later, off this path (main_broker/linked_payloads.py).

The messages are `internal_rpc.messages.ConfirmParams` (about 110 bytes for one partition)
and `ConfirmResult` (one `PartitionOutcome` per part, in request order); their byte layouts
are in docs/formats.md, "Confirm".

A caller that keeps one confirm in flight per main may send no `seq`. The zone proxy
pipelines confirms (several calls in flight, proxy_broker/confirm_pipe.py) and numbers them
per session from 0: RPC requests run as separate tasks, so the main applies them strictly in
`seq` order, which keeps an idempotent producer's batches in order. The proxy starts a new
session after a failed call and after a second with nothing in flight, so the sessions it
continues are ones this main still knows (idle ones expire here; a restart forgets them all).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from kio.schema.errors import ErrorCode

from internal_rpc.messages import ConfirmParams, ConfirmPart, ConfirmResult, PartitionOutcome
from kafka_wire.hot_codecs import ProducePartitionResult
from main_broker.append import PendingAppends, append_partition
from shared_wal import WalError, WalPosition

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices

log = logging.getLogger("zonefleet.main_broker.confirm")

SEQUENCE_WAIT_SECONDS = 10.0
IDLE_SESSION_SECONDS = 300.0


@dataclass
class _Session:
    next_seq: int
    advanced: trio.Event = field(default_factory=trio.Event)
    last_used: float = 0.0
    parked: int = 0  # confirms of the session waiting in wait_turn for an earlier seq


class ConfirmSequencer:
    """Admits each proxy session's confirms in `seq` order."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}

    async def wait_turn(self, session: str, seq: int) -> bool:
        """True once every earlier confirm of the session was applied; False on timeout."""
        now = trio.current_time()
        state = self._sessions.get(session)
        if state is None:
            self._expire(now)
            # Sessions start at 0: a proxy opens a new one after a failed call or an idle spell.
            state = self._sessions[session] = _Session(next_seq=0)
        state.last_used = now
        with trio.move_on_after(SEQUENCE_WAIT_SECONDS):
            while state.next_seq < seq:
                state.parked += 1
                try:
                    await state.advanced.wait()
                finally:
                    state.parked -= 1
        return state.next_seq >= seq

    def parked(self, session: str) -> int:
        """How many confirms of `session` wait in `wait_turn` right now (read-only; lets a
        test see a confirm that arrived early wait for its turn)."""
        state = self._sessions.get(session)
        return state.parked if state is not None else 0

    def done(self, session: str, seq: int) -> None:
        state = self._sessions.get(session)
        if state is not None and seq >= state.next_seq:
            state.next_seq = seq + 1
            state.advanced.set()
            state.advanced = trio.Event()

    def _expire(self, now: float) -> None:
        stale = [k for k, s in self._sessions.items() if now - s.last_used > IDLE_SESSION_SECONDS]
        for key in stale:
            del self._sessions[key]


def _answer(results: list[ProducePartitionResult]) -> dict[str, Any]:
    return ConfirmResult(tuple(PartitionOutcome.of(r) for r in results)).to_wire()


def _needs_records(broker: BrokerServices, part: ConfirmPart) -> bool:
    """Whether the decision needs the batch's bytes: a confirm of the previous version (no
    header summary), or a compacted topic's batch (the keyless record check)."""
    if part.batch is None:
        return True
    plog = broker.store.partition(part.topic, part.partition)
    return plog is not None and plog.config.compacted


async def handle_confirm(broker: BrokerServices, params: dict[str, Any]) -> dict[str, Any]:
    """The `confirm` RPC handler: `params` is a `ConfirmParams` on the wire (a malformed one
    raises `MalformedMessage`, which the caller gets as the error), the answer a
    `ConfirmResult`. The appender decides each part from its header summary; the payload is
    read here only when `_needs_records` says so."""
    confirm = ConfirmParams.from_wire(params)
    parts = confirm.parts
    results = [ProducePartitionResult(index=p.partition) for p in parts]
    positions = [WalPosition(p.writer, p.segment, p.position, p.length) for p in parts]
    payloads: dict[int, bytearray | Exception] = {}
    wanted = [i for i, part in enumerate(parts) if _needs_records(broker, part)]
    if wanted:
        batches = broker.store.batches

        def read_wanted() -> dict[int, bytearray | Exception]:
            out: dict[int, bytearray | Exception] = {}
            for i in wanted:
                try:
                    out[i] = batches.read_prepared(positions[i])
                except (WalError, OSError) as exc:
                    out[i] = exc
            return out

        payloads = await trio.to_thread.run_sync(read_wanted, limiter=batches.limiter)
    session, seq = confirm.session, confirm.seq
    in_turn = True
    if session is not None and seq is not None:
        in_turn = await broker.confirms.wait_turn(session, seq)
    pending = PendingAppends()
    try:
        if not in_turn:
            for result in results:
                result.error_code = ErrorCode.request_timed_out
                result.error_message = "an earlier confirm of this proxy session never arrived"
            return _answer(results)
        now_ms = int(time.time() * 1000)
        appender = broker.appender
        for i, (part, position, result) in enumerate(zip(parts, positions, results, strict=True)):
            payload = payloads.get(i)
            if isinstance(payload, Exception):
                log.warning(
                    "confirm for %s-%d: cannot read %s: %s",
                    part.topic,
                    part.partition,
                    position,
                    payload,
                )
                result.error_code = ErrorCode.kafka_storage_error
                result.error_message = f"cannot read the prepared payload: {payload}"
                continue
            batch = None if part.batch is None else part.batch.batch_info()
            records = None if payload is None else memoryview(payload)
            size = batch.size if batch is not None else len(records or b"")
            decision = appender.decide(
                part.topic,
                part.partition,
                acks=-1,
                records_size=size,
                now_ms=now_ms,
                api_version=confirm.produce_version,
                records=records,
                batch=batch,
                prepared=position,
            )
            append_partition(broker, decision, result, pending)
            if result.error_code == ErrorCode.out_of_order_sequence_number:
                # A gap, through a proxy: an earlier batch of this producer is still on its way
                # or failed at the proxy (a Kafka leader reads one connection in order; a proxy
                # confirms each batch on its own). OUT_OF_ORDER_SEQUENCE_NUMBER makes
                # librdkafka bump its epoch for every partition and send what is not
                # acknowledged again as new: duplicates wherever a written batch was in doubt.
                # "Possibly written" makes it resend this partition's batches in order.
                result.error_code = ErrorCode.request_timed_out
                result.error_message = (
                    f"an earlier batch of this producer has not reached {part.topic}-"
                    f"{part.partition} yet ({result.error_message}): send again in order"
                )
            if result.error_code == ErrorCode.none:
                broker.metrics.bytes_in.labels(part.topic).inc(size)
    finally:
        if session is not None and seq is not None:
            broker.confirms.done(session, seq)
    await pending.wait(broker, confirm.timeout_ms / 1000)
    return _answer(results)
