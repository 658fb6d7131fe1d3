"""The transaction coordinator's state machine, without I/O (Kafka's TransactionMetadata and
TransactionStateManager rules).

`TxnCoordinatorState` holds every transactional id this main coordinates. Each operation
checks a request against the id's metadata and answers with an error or with the new
metadata (`TxnMetadata`), which the shell (main_broker/txn/coordinator.py) makes durable as
a `txn` CONTROL record before it applies it (`apply`) and answers. Nothing here allocates
producer ids, writes, sends markers or reads a clock: those are the shell's, given in.

States, as Kafka's: EMPTY -> ONGOING (AddPartitions/AddOffsets) -> PREPARE_COMMIT or
PREPARE_ABORT (EndTxn, or a timeout's abort) -> COMPLETE_COMMIT or COMPLETE_ABORT once every
marker is written -> ONGOING again with the next transaction. PREPARE_EPOCH_FENCE is not
used: a fencing InitProducerId writes PREPARE_ABORT with the bumped epoch directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from kafka_wire.errors import ErrorCode

__all__ = [
    "MAX_PRODUCER_EPOCH",
    "TxnCoordinatorState",
    "TxnMetadata",
    "TxnState",
    "valid_transactional_id",
]

MAX_PRODUCER_EPOCH = 32767
# Kafka itself stops only at its string limit (32767); an id this long is a mistake, and every
# record of the transaction state repeats it.
MAX_TRANSACTIONAL_ID_BYTES = 1024

TopicPartition = tuple[str, int]


class TxnState(IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use."""
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1  # when the ongoing transaction began (-1: none)
    update_ms: int = 0
    # The id and epoch before the last InitProducerId (KIP-360: a producer that lost its
    # answer retries with what it had).
    last_producer_id: int = -1
    last_producer_epoch: int = -1

    @property
    def in_prepare(self) -> bool:
        return self.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    def to_record(self) -> dict[str, Any]:
        """The `txn` CONTROL record's body and the SNAPSHOT row (docs/formats.md)."""
        return {
            "id": self.transactional_id,
            "pid": self.producer_id,
            "pe": self.producer_epoch,
            "to": self.timeout_ms,
            "st": int(self.state),
            "tp": sorted([t, p] for t, p in self.partitions),
            "g": sorted(self.groups),
            "ts": self.start_ms,
            "ut": self.update_ms,
            "lp": self.last_producer_id,
            "le": self.last_producer_epoch,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> TxnMetadata:
        return cls(
            str(r["id"]),
            int(r["pid"]),
            int(r["pe"]),
            int(r["to"]),
            TxnState(int(r["st"])),
            frozenset((str(t), int(p)) for t, p in r["tp"]),
            frozenset(str(g) for g in r["g"]),
            int(r["ts"]),
            int(r["ut"]),
            int(r.get("lp", -1)),
            int(r.get("le", -1)),
        )


def valid_transactional_id(tid: str | None) -> bool:
    return bool(tid) and len((tid or "").encode()) <= MAX_TRANSACTIONAL_ID_BYTES


@dataclass(frozen=True, slots=True)
class NeedProducerId:
    """InitProducerId for an id never seen, or whose epoch is exhausted: the shell allocates
    a producer id and calls `init_with`. `previous` is the metadata a KIP-360 retry of this
    request may name (None when the request named no producer)."""

    previous: TxnMetadata | None


@dataclass(slots=True)
class TxnCoordinatorState:
    max_timeout_ms: int
    txns: dict[str, TxnMetadata] = field(default_factory=dict)

    def get(self, tid: str) -> TxnMetadata | None:
        return self.txns.get(tid)

    def apply(self, meta: TxnMetadata) -> None:
        """A `txn` record became durable (or was replayed); DEAD removes the id."""
        if meta.state == TxnState.DEAD:
            self.txns.pop(meta.transactional_id, None)
        else:
            self.txns[meta.transactional_id] = meta

    def expired(self, now_ms: int, expiration_ms: int) -> list[TxnMetadata]:
        """Ids with no transaction under way that nobody used for `expiration_ms` (Kafka's
        transactional.id.expiration.ms), as the DEAD records that remove them."""
        idle = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
        return [
            replace(meta, state=TxnState.DEAD, update_ms=now_ms)
            for meta in self.txns.values()
            if meta.state in idle and now_ms - meta.update_ms > expiration_ms
        ]

    # -- InitProducerId ------------------------------------------------------------------------

    def init_producer_id(
        self,
        tid: str,
        timeout_ms: int,
        expected_pid: int,
        expected_epoch: int,
        now_ms: int,
    ) -> ErrorCode | NeedProducerId | TxnMetadata:
        """An error, a producer id to allocate first, or the new metadata: EMPTY with the
        epoch bumped, or, for an open transaction, PREPARE_ABORT with the epoch bumped (the
        client is answered CONCURRENT_TRANSACTIONS and retries once the abort completes)."""
        if not valid_transactional_id(tid):
            return ErrorCode.invalid_request
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout
        meta = self.txns.get(tid)
        if meta is None:
            return NeedProducerId(None)
        if meta.in_prepare:
            return ErrorCode.concurrent_transactions
        if expected_pid >= 0:
            # KIP-360: the producer says who it was; a retry of a bump already made answers
            # the current id and epoch again.
            if (expected_pid, expected_epoch) == (meta.last_producer_id, meta.last_producer_epoch):
                if meta.state in (TxnState.EMPTY, TxnState.COMPLETE_ABORT):
                    if meta.producer_epoch < MAX_PRODUCER_EPOCH:
                        return meta
                    # A fence took the last epoch, which no producer is given: a new id.
                    return NeedProducerId(meta)
            if expected_pid != meta.producer_id:
                return ErrorCode.producer_fenced
            if expected_epoch != meta.producer_epoch:
                return ErrorCode.producer_fenced
        if meta.state == TxnState.ONGOING:
            return self._abort(meta, now_ms, bump=True)
        # Only a producer that said who it was may retry into the new epoch: a new instance
        # (no expected id) leaves no retry behind, or its zombie, asking with the old id and
        # epoch, would be handed the new epoch too (Kafka's NO_PRODUCER_EPOCH as last epoch).
        retriable = expected_pid >= 0
        if meta.producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
            return NeedProducerId(meta if retriable else None)
        return replace(
            meta,
            producer_epoch=meta.producer_epoch + 1,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=frozenset(),
            groups=frozenset(),
            start_ms=-1,
            update_ms=now_ms,
            last_producer_id=meta.producer_id if retriable else -1,
            last_producer_epoch=meta.producer_epoch if retriable else -1,
        )

    def init_with(
        self, tid: str, producer_id: int, timeout_ms: int, previous: TxnMetadata | None, now_ms: int
    ) -> TxnMetadata:
        return TxnMetadata(
            tid,
            producer_id,
            0,
            timeout_ms,
            TxnState.EMPTY,
            update_ms=now_ms,
            last_producer_id=previous.producer_id if previous else -1,
            last_producer_epoch=previous.producer_epoch if previous else -1,
        )

    # -- a transaction's members ---------------------------------------------------------------

    def _check_producer(self, tid: str, pid: int, epoch: int) -> TxnMetadata | ErrorCode:
        meta = self.txns.get(tid)
        if meta is None:
            return ErrorCode.invalid_producer_id_mapping
        if meta.producer_id != pid:
            return ErrorCode.invalid_producer_id_mapping
        if epoch != meta.producer_epoch:
            return ErrorCode.producer_fenced
        return meta

    def add_partitions(
        self,
        tid: str,
        pid: int,
        epoch: int,
        partitions: frozenset[TopicPartition],
        groups: frozenset[str],
        now_ms: int,
    ) -> ErrorCode | TxnMetadata:
        """AddPartitionsToTxn and AddOffsetsToTxn (a group's offsets join as `groups`): the
        same metadata when nothing is new (no record needed), else the new one."""
        meta = self._check_producer(tid, pid, epoch)
        if isinstance(meta, ErrorCode):
            return meta
        if meta.in_prepare:
            return ErrorCode.concurrent_transactions
        if meta.state == TxnState.DEAD or meta.state == TxnState.PREPARE_EPOCH_FENCE:
            return ErrorCode.invalid_txn_state
        ongoing = meta.state == TxnState.ONGOING
        if ongoing and partitions <= meta.partitions and groups <= meta.groups:
            return meta
        return replace(
            meta,
            state=TxnState.ONGOING,
            partitions=(meta.partitions if ongoing else frozenset()) | partitions,
            groups=(meta.groups if ongoing else frozenset()) | groups,
            start_ms=meta.start_ms if ongoing else now_ms,
            update_ms=now_ms,
        )

    def verify_partitions(
        self, tid: str, pid: int, epoch: int, partitions: frozenset[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """KIP-890's verify-only AddPartitionsToTxn: is each partition in the open
        transaction of this producer id and epoch?"""
        meta = self._check_producer(tid, pid, epoch)
        if isinstance(meta, ErrorCode):
            return dict.fromkeys(partitions, meta)
        if meta.in_prepare:
            return dict.fromkeys(partitions, ErrorCode.concurrent_transactions)
        ongoing = meta.state == TxnState.ONGOING
        return {
            tp: ErrorCode.none if ongoing and tp in meta.partitions else ErrorCode.invalid_txn_state
            for tp in partitions
        }

    # -- the end of a transaction --------------------------------------------------------------

    def end_txn(
        self, tid: str, pid: int, epoch: int, commit: bool, now_ms: int
    ) -> ErrorCode | TxnMetadata:
        """EndTxn: the PREPARE state to write, ErrorCode.none for a retry of an end already
        complete, or the error."""
        meta = self._check_producer(tid, pid, epoch)
        if isinstance(meta, ErrorCode):
            # A timed-out transaction's abort bumped the epoch: the producer is told so.
            return meta
        state = meta.state
        if state == TxnState.ONGOING:
            if commit:
                return replace(meta, state=TxnState.PREPARE_COMMIT, update_ms=now_ms)
            return replace(meta, state=TxnState.PREPARE_ABORT, update_ms=now_ms)
        if state == TxnState.COMPLETE_COMMIT:
            return ErrorCode.none if commit else ErrorCode.invalid_txn_state
        if state == TxnState.COMPLETE_ABORT:
            return ErrorCode.invalid_txn_state if commit else ErrorCode.none
        if state == TxnState.PREPARE_COMMIT:
            return ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state
        if state == TxnState.PREPARE_ABORT:
            return ErrorCode.invalid_txn_state if commit else ErrorCode.concurrent_transactions
        if state == TxnState.EMPTY and not commit:
            # An abort with nothing added (librdkafka aborts an empty transaction this way).
            return ErrorCode.none
        return ErrorCode.invalid_txn_state

    def complete(self, meta: TxnMetadata, now_ms: int) -> TxnMetadata:
        """Every marker of a PREPARE state is written: COMPLETE_COMMIT or COMPLETE_ABORT."""
        done = (
            TxnState.COMPLETE_COMMIT
            if meta.state == TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        return replace(
            meta,
            state=done,
            partitions=frozenset(),
            groups=frozenset(),
            start_ms=-1,
            update_ms=now_ms,
        )

    def _abort(self, meta: TxnMetadata, now_ms: int, bump: bool) -> TxnMetadata:
        epoch = meta.producer_epoch + 1 if bump else meta.producer_epoch
        return replace(
            meta,
            state=TxnState.PREPARE_ABORT,
            # The fence may take the last epoch (32767): no producer is ever given it, and
            # the next InitProducerId finds it exhausted and allocates a new producer id.
            producer_epoch=min(epoch, MAX_PRODUCER_EPOCH),
            update_ms=now_ms,
            last_producer_id=meta.producer_id if bump else meta.last_producer_id,
            last_producer_epoch=meta.producer_epoch if bump else meta.last_producer_epoch,
        )

    def timed_out(self, now_ms: int) -> list[TxnMetadata]:
        """The aborts (epoch bumped, fencing the producer) of the open transactions past
        their timeout."""
        return [
            self._abort(meta, now_ms, bump=True)
            for meta in self.txns.values()
            if meta.state == TxnState.ONGOING and now_ms - meta.start_ms > meta.timeout_ms
        ]

    def pending_markers(self) -> list[TxnMetadata]:
        """PREPARE states whose markers a restart or a move must (re)send."""
        return [meta for meta in self.txns.values() if meta.in_prepare]

    def next_deadline_ms(self) -> int | None:
        deadlines = [
            m.start_ms + m.timeout_ms for m in self.txns.values() if m.state == TxnState.ONGOING
        ]
        return min(deadlines) if deadlines else None

    # -- snapshot ------------------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        return [meta.to_record() for meta in self.txns.values()]

    def restore(self, rows: list[dict[str, Any]]) -> None:
        self.txns = {}
        for row in rows:
            meta = TxnMetadata.from_record(row)
            self.txns[meta.transactional_id] = meta
