"""The confirm RPC: a zone proxy has written a Produce payload to the shared WAL (a PREPARED
record in its own writer directory) and asks this main broker, the partition's leader, to
append it. The main reads the payload from the shared file system and runs exactly the append
logic a direct client gets; its own WAL records only a LINK (metadata, no payload).

The messages are `internal_rpc.messages.ConfirmParams` (about 100 bytes for one partition)
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

from internal_rpc.messages import ConfirmParams, ConfirmResult, PartitionOutcome
from kafka_wire.errors import WAL_FULL, WAL_FULL_MESSAGE
from kafka_wire.hot_codecs import ProducePartitionResult
from main_broker.append import PendingAppends, append_partition, may_append
from shared_wal import WalError, WalPosition

if TYPE_CHECKING:
    from main_broker.broker import MainBroker

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


async def handle_confirm(broker: MainBroker, params: dict[str, Any]) -> dict[str, Any]:
    """The `confirm` RPC handler: `params` is a `ConfirmParams` on the wire (a malformed one
    raises `MalformedMessage`, which the caller gets as the error), the answer a
    `ConfirmResult`."""
    confirm = ConfirmParams.from_wire(params)
    parts = confirm.parts
    version = confirm.produce_version
    results = [ProducePartitionResult(index=p.partition) for p in parts]
    positions = [WalPosition(p.writer, p.segment, p.position, p.length) for p in parts]

    def read_all() -> list[bytearray | Exception]:
        out: list[bytearray | Exception] = []
        for position in positions:
            try:
                out.append(broker.store.batches.read_prepared(position))
            except (WalError, OSError) as exc:
                out.append(exc)
        return out

    payloads = await trio.to_thread.run_sync(read_all, limiter=broker.store.batches.limiter)
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
        for part, position, payload, result in zip(
            parts, positions, payloads, results, strict=True
        ):
            topic = part.topic
            plog = broker.store.partition(topic, result.index)
            if isinstance(payload, Exception):
                log.warning(
                    "confirm for %s-%d: cannot read %s: %s", topic, result.index, position, payload
                )
                result.error_code = ErrorCode.kafka_storage_error
                result.error_message = f"cannot read the prepared payload: {payload}"
            elif plog is None or not may_append(broker, plog):
                result.error_code = ErrorCode.not_leader_or_follower
            elif broker.storage_failed:
                result.error_code = ErrorCode.kafka_storage_error
            elif broker.store.wal.full:
                result.error_code, result.error_message = WAL_FULL, WAL_FULL_MESSAGE
            else:
                append_partition(
                    broker, plog, memoryview(payload), result, pending, now_ms, version, position
                )
                if result.error_code == ErrorCode.none:
                    broker.metrics.bytes_in.labels(topic).inc(len(payload))
    finally:
        if session is not None and seq is not None:
            broker.confirms.done(session, seq)
    pending.start(broker)
    await pending.wait(confirm.timeout_ms / 1000)
    return _answer(results)
