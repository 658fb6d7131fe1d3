"""Keeps an idempotent producer's batches in sequence order through a zone proxy while the
fate of one of them is unknown.

A Kafka leader handles one connection's requests in order, so a producer's batch N+1 is
never appended while batch N was not. A proxy confirms each batch with the partition's
owner, and two things can break that order: a confirm that failed in a way that leaves it
possibly written (answered REQUEST_TIMED_OUT) while later batches of the same producer go on
to be confirmed, and a partition that moved to another main while earlier batches wait for
the old one. The main then answers a later batch OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka,
seeing a batch before it in doubt, bumps its epoch and sends everything unacknowledged again
as new: a batch that was written after all is written twice.

So, per partition and producer: a batch whose earlier batches wait on another main, or that
comes after a batch in doubt, is refused with REQUEST_TIMED_OUT without being sent (it is
surely not written; the client retries it in order). A batch is in doubt once answered with
an error its client sends it again for (REQUEST_TIMED_OUT: possibly written;
NOT_LEADER_OR_FOLLOWER), or while its confirm rides a session another failed call broke.
The client's retry from the lowest batch in doubt (a base sequence at or below it) lifts the
refusal; so do a resend past it (the client had it acknowledged on another path), a new
producer epoch, and DOUBT_EXPIRES_S. No I/O: the proxy's produce path and its
confirm pipes call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from kio.schema.errors import ErrorCode

DOUBT_EXPIRES_S = 30.0
# Answers after which a client sends the batch again with its sequence: REQUEST_TIMED_OUT
# (possibly written) and NOT_LEADER_OR_FOLLOWER (not written). A later batch confirmed before
# that retry would leave a gap, which librdkafka answers with an epoch bump even after the
# latter, so both hold later batches back.
RESENT = frozenset({ErrorCode.request_timed_out, ErrorCode.not_leader_or_follower})
MAX_PRODUCERS = 100_000  # (partition, producer) entries kept; the oldest go first

Key = tuple[str, int, int]  # topic, partition, producer id


class BatchRef(NamedTuple):
    """One producer batch of one partition, as the guard tells batches apart."""

    topic: str
    partition: int
    producer_id: int
    epoch: int
    base_sequence: int


@dataclass(slots=True)
class _Pending:
    base_sequence: int
    owner: int
    done: Callable[[], bool]  # answered (or failed) by now


@dataclass(slots=True)
class _ProducerState:
    epoch: int
    pending: list[_Pending] = field(default_factory=list)
    # Base sequences of batches in doubt: answered with one of RESENT, or riding on a confirm
    # call whose session another failed call broke. A later batch waits for the client's
    # retry from the lowest; a batch in doubt that is confirmed after all leaves the set.
    doubts: set[int] = field(default_factory=set)
    doubt_at: float = 0.0
    highest: int = -1  # the highest base sequence seen (admitted or held)


class SequenceGuard:
    def __init__(self, expires_s: float = DOUBT_EXPIRES_S, max_entries: int = MAX_PRODUCERS):
        self.expires_s = expires_s
        self.max_entries = max_entries
        self._states: dict[Key, _ProducerState] = {}
        self.refused = 0

    def admit(
        self, batch: BatchRef, owner: int, now: float, done: Callable[[], bool]
    ) -> str | None:
        """None when this batch may be prepared and confirmed with `owner`; otherwise why
        not (answer it REQUEST_TIMED_OUT now). `done` tells later whether its confirm was
        answered."""
        topic, partition, producer_id, epoch, base_sequence = batch
        if producer_id < 0:
            return None
        key = (topic, partition, producer_id)
        state = self._states.get(key)
        if state is not None and epoch < state.epoch:
            return None  # an older epoch: the main fences it
        if state is None or epoch > state.epoch:
            state = _ProducerState(epoch)
            self._put(key, state)
        state.pending = [p for p in state.pending if not p.done()]
        resent = base_sequence <= state.highest
        state.highest = max(state.highest, base_sequence)
        if state.doubts:
            # Clients resend from their first unacknowledged batch once they heard of a
            # failure (librdkafka and Java drain what is in flight first): a resend past the
            # batch in doubt means the client had that one acknowledged on another path (its
            # zone main led the partition for a while) or gave it up. A batch never seen
            # before may have been sent before the client heard: it waits.
            if (
                base_sequence <= min(state.doubts)
                or resent
                or now - state.doubt_at >= self.expires_s
            ):
                state.doubts.clear()
            else:
                return self._refuse(
                    state, base_sequence, now, f"batch {min(state.doubts)} is in doubt"
                )
        if any(p.owner != owner for p in state.pending):
            # Earlier batches wait on the partition's previous owner: this one must not
            # overtake them at the new one. Their answers say whether any is in doubt.
            waiting = sorted((p.base_sequence, p.owner) for p in state.pending)
            return self._refuse(
                state, base_sequence, now, f"batches {waiting} wait on the previous owner"
            )
        state.pending.append(_Pending(base_sequence, owner, done))
        return None

    def _refuse(self, state: _ProducerState, base_sequence: int, now: float, why: str) -> str:
        # The refused batch is answered REQUEST_TIMED_OUT, so the client sends it again: a
        # later batch must not be confirmed first (the main would answer
        # OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka bumps its epoch for the whole
        # producer, so a written batch in doubt on another partition is written twice).
        self.refused += 1
        state.doubts.add(base_sequence)
        state.doubt_at = now
        return f"{why}: the client retries from it"

    def in_doubt(self, batch: BatchRef, now: float) -> None:
        """The batch was answered with one of RESENT, or its confirm may not be applied in
        order: later ones wait for its retry."""
        state = self._state(batch)
        if state is not None:
            state.doubts.add(batch.base_sequence)
            state.doubt_at = now

    def settled(self, batch: BatchRef) -> None:
        """The batch was confirmed (written, or refused for good): no longer in doubt."""
        state = self._state(batch)
        if state is not None:
            state.doubts.discard(batch.base_sequence)

    def _state(self, batch: BatchRef) -> _ProducerState | None:
        if batch.producer_id < 0:
            return None
        state = self._states.get((batch.topic, batch.partition, batch.producer_id))
        return state if state is not None and state.epoch == batch.epoch else None

    def _put(self, key: Key, state: _ProducerState) -> None:
        self._states.pop(key, None)
        self._states[key] = state
        while len(self._states) > self.max_entries:
            del self._states[next(iter(self._states))]

    def __len__(self) -> int:
        return len(self._states)
