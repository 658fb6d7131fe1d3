"""The transaction coordinator's state machine (main_broker.txn.state), driven directly: every
transition and error code of Kafka's TransactionCoordinator and TransactionMetadata
(InitProducerId with KIP-360 retries and epoch exhaustion, AddPartitionsToTxn and its
KIP-890 verify-only form, EndTxn, timeouts), and the `txn` CONTROL record (golden bytes,
docs/formats.md "CONTROL")."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_wire.errors import ErrorCode
from main_broker.txn.state import (
    MAX_PRODUCER_EPOCH,
    MAX_TRANSACTIONAL_ID_BYTES,
    NeedProducerId,
    TxnCoordinatorState,
    TxnMetadata,
    TxnState,
    valid_transactional_id,
)

T0 = 1_764_201_600_000
TIMEOUT = 60_000
MAX_TIMEOUT = 900_000
TID = "tx-1"
PID = 4000
A = ("orders", 0)
B = ("orders", 1)


def _state() -> TxnCoordinatorState:
    return TxnCoordinatorState(MAX_TIMEOUT)


def _ok(state: TxnCoordinatorState, decided: object) -> TxnMetadata:
    """A decision that is new metadata: made durable (applied) as the shell does."""
    assert isinstance(decided, TxnMetadata), decided
    state.apply(decided)
    return decided


def _new(state: TxnCoordinatorState, tid: str = TID, pid: int = PID) -> TxnMetadata:
    need = state.init_producer_id(tid, TIMEOUT, -1, -1, T0)
    assert need == NeedProducerId(None)
    return _ok(state, state.init_with(tid, pid, TIMEOUT, None, T0))


def _ongoing(state: TxnCoordinatorState, *parts: tuple[str, int]) -> TxnMetadata:
    _new(state)
    return _ok(
        state,
        state.add_partitions(TID, PID, 0, frozenset(parts or (A,)), frozenset(), T0 + 10),
    )


def _at_epoch(state: TxnCoordinatorState, epoch: int, txn: TxnState) -> TxnMetadata:
    meta = TxnMetadata(TID, PID, epoch, TIMEOUT, txn, update_ms=T0)
    if txn in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
        meta = TxnMetadata(TID, PID, epoch, TIMEOUT, txn, frozenset({A}), start_ms=T0)
    state.apply(meta)
    return meta


# -- InitProducerId ----------------------------------------------------------------------------


def test_a_new_id_gets_a_producer_id_at_epoch_0() -> None:
    state = _state()
    meta = _new(state)
    assert meta == TxnMetadata(TID, PID, 0, TIMEOUT, TxnState.EMPTY, update_ms=T0)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (-1, -1)
    assert state.get(TID) is meta and state.get("other") is None


@pytest.mark.parametrize(
    "tid",
    ["", None, "x" * (MAX_TRANSACTIONAL_ID_BYTES + 1), "é" * (MAX_TRANSACTIONAL_ID_BYTES // 2 + 1)],
)
def test_an_empty_or_too_long_transactional_id_is_an_invalid_request(tid: str | None) -> None:
    assert not valid_transactional_id(tid)
    state = _state()
    # Checked before the timeout, as Kafka (INVALID_REQUEST first).
    assert state.init_producer_id(tid, 0, -1, -1, T0) == ErrorCode.invalid_request  # type: ignore[arg-type]


def test_the_longest_transactional_id_is_accepted() -> None:
    tid = "x" * MAX_TRANSACTIONAL_ID_BYTES
    assert valid_transactional_id(tid)
    assert _state().init_producer_id(tid, TIMEOUT, -1, -1, T0) == NeedProducerId(None)


@pytest.mark.parametrize("timeout_ms", [0, -1, MAX_TIMEOUT + 1])
def test_a_timeout_outside_1_to_the_maximum_is_invalid(timeout_ms: int) -> None:
    state = _state()
    assert state.init_producer_id(TID, timeout_ms, -1, -1, T0) == (
        ErrorCode.invalid_transaction_timeout
    )
    _new(state)
    assert state.init_producer_id(TID, timeout_ms, -1, -1, T0) == (
        ErrorCode.invalid_transaction_timeout
    )
    assert isinstance(state.init_producer_id(TID, MAX_TIMEOUT, -1, -1, T0), TxnMetadata)


@pytest.mark.parametrize(
    "done", [TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT]
)
def test_a_new_instance_bumps_the_epoch_and_fences_the_old_one(done: TxnState) -> None:
    state = _state()
    _at_epoch(state, 3, done)
    meta = _ok(state, state.init_producer_id(TID, 30_000, -1, -1, T0 + 5))
    assert meta == TxnMetadata(TID, PID, 4, 30_000, TxnState.EMPTY, update_ms=T0 + 5)
    # The zombie (epoch 3) is fenced everywhere, KIP-360 InitProducerId included: a new
    # instance leaves no retry of a bump behind (Kafka: last epoch NO_PRODUCER_EPOCH).
    assert state.init_producer_id(TID, TIMEOUT, PID, 3, T0) == ErrorCode.producer_fenced
    assert state.add_partitions(TID, PID, 3, frozenset({A}), frozenset(), T0) == (
        ErrorCode.producer_fenced
    )
    assert state.end_txn(TID, PID, 3, True, T0) == ErrorCode.producer_fenced


def test_kip_360_bump_and_its_retry() -> None:
    state = _state()
    _at_epoch(state, 3, TxnState.COMPLETE_ABORT)
    bumped = _ok(state, state.init_producer_id(TID, TIMEOUT, PID, 3, T0 + 5))
    assert (bumped.producer_epoch, bumped.state) == (4, TxnState.EMPTY)
    assert (bumped.last_producer_id, bumped.last_producer_epoch) == (PID, 3)
    # The answer was lost: the retry names the same id and epoch and gets the same answer
    # (the very metadata: the shell writes nothing).
    assert state.init_producer_id(TID, TIMEOUT, PID, 3, T0 + 6) is bumped
    # The producer that has epoch 4 bumps again.
    again = _ok(state, state.init_producer_id(TID, TIMEOUT, PID, 4, T0 + 7))
    assert (again.producer_epoch, again.last_producer_epoch) == (5, 4)
    # Anything else is a zombie.
    assert state.init_producer_id(TID, TIMEOUT, PID, 3, T0) == ErrorCode.producer_fenced
    assert state.init_producer_id(TID, TIMEOUT, PID, 6, T0) == ErrorCode.producer_fenced
    assert state.init_producer_id(TID, TIMEOUT, PID + 1, 5, T0) == ErrorCode.producer_fenced


def test_a_retry_after_the_bumped_epoch_began_a_transaction_is_fenced() -> None:
    state = _state()
    _at_epoch(state, 3, TxnState.EMPTY)
    _ok(state, state.init_producer_id(TID, TIMEOUT, PID, 3, T0))
    _ok(state, state.add_partitions(TID, PID, 4, frozenset({A}), frozenset(), T0))
    assert state.init_producer_id(TID, TIMEOUT, PID, 3, T0) == ErrorCode.producer_fenced


def test_init_with_an_open_transaction_aborts_it_with_the_epoch_bumped() -> None:
    state = _state()
    ongoing = _ongoing(state, A, B)
    fence = _ok(state, state.init_producer_id(TID, TIMEOUT, -1, -1, T0 + 20))
    assert fence == TxnMetadata(
        TID,
        PID,
        1,
        TIMEOUT,
        TxnState.PREPARE_ABORT,
        frozenset({A, B}),
        start_ms=ongoing.start_ms,
        update_ms=T0 + 20,
        last_producer_id=PID,
        last_producer_epoch=0,
    )
    # The old epoch is fenced at once; the new instance retries (CONCURRENT_TRANSACTIONS)
    # until the abort's markers are written.
    assert state.end_txn(TID, PID, 0, True, T0) == ErrorCode.producer_fenced
    assert state.init_producer_id(TID, TIMEOUT, -1, -1, T0) == ErrorCode.concurrent_transactions
    assert state.pending_markers() == [fence]
    done = _ok(state, state.complete(fence, T0 + 30))
    assert (done.state, done.partitions, done.start_ms) == (
        TxnState.COMPLETE_ABORT,
        frozenset(),
        -1,
    )
    fresh = _ok(state, state.init_producer_id(TID, TIMEOUT, -1, -1, T0 + 40))
    assert (fresh.producer_epoch, fresh.state) == (2, TxnState.EMPTY)
    assert state.pending_markers() == []


def test_a_kip_360_init_with_an_open_transaction_aborts_it_and_its_retry_gets_the_fence() -> None:
    """The producer that asks with its own id and epoch is not a zombie: once the abort is
    complete its retry is answered the epoch the abort bumped to."""
    state = _state()
    _ongoing(state)
    fence = _ok(state, state.init_producer_id(TID, TIMEOUT, PID, 0, T0 + 20))
    assert (fence.state, fence.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    done = _ok(state, state.complete(fence, T0 + 30))
    assert state.init_producer_id(TID, TIMEOUT, PID, 0, T0 + 40) is done


@pytest.mark.parametrize("prepare", [TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT])
def test_init_during_a_prepare_state_is_concurrent_transactions(prepare: TxnState) -> None:
    state = _state()
    _at_epoch(state, 3, prepare)
    for expected in ((-1, -1), (PID, 3)):
        assert state.init_producer_id(TID, TIMEOUT, *expected, T0) == (
            ErrorCode.concurrent_transactions
        )


def test_epoch_exhaustion_allocates_a_new_producer_id() -> None:
    state = _state()
    _at_epoch(state, MAX_PRODUCER_EPOCH - 2, TxnState.COMPLETE_COMMIT)
    last = _ok(state, state.init_producer_id(TID, TIMEOUT, -1, -1, T0))
    assert last.producer_epoch == MAX_PRODUCER_EPOCH - 1  # 32766: the last one handed out
    # KIP-360: the producer names itself; the rotation keeps it for the retry.
    need = state.init_producer_id(TID, TIMEOUT, PID, MAX_PRODUCER_EPOCH - 1, T0 + 1)
    assert need == NeedProducerId(last)
    assert isinstance(need, NeedProducerId)
    rotated = _ok(state, state.init_with(TID, PID + 1, TIMEOUT, need.previous, T0 + 1))
    assert rotated == TxnMetadata(
        TID,
        PID + 1,
        0,
        TIMEOUT,
        TxnState.EMPTY,
        update_ms=T0 + 1,
        last_producer_id=PID,
        last_producer_epoch=MAX_PRODUCER_EPOCH - 1,
    )
    assert state.init_producer_id(TID, TIMEOUT, PID, MAX_PRODUCER_EPOCH - 1, T0 + 2) is rotated
    assert state.init_producer_id(TID, TIMEOUT, PID, 5, T0 + 2) == ErrorCode.producer_fenced
    # The new id's epochs go on from 0.
    assert _ok(state, state.init_producer_id(TID, TIMEOUT, PID + 1, 0, T0 + 3)).producer_epoch == 1


def test_epoch_exhaustion_for_a_new_instance_leaves_no_retry() -> None:
    state = _state()
    _at_epoch(state, MAX_PRODUCER_EPOCH - 1, TxnState.EMPTY)
    need = state.init_producer_id(TID, TIMEOUT, -1, -1, T0)
    assert need == NeedProducerId(None)
    rotated = _ok(state, state.init_with(TID, PID + 1, TIMEOUT, None, T0))
    assert (rotated.last_producer_id, rotated.last_producer_epoch) == (-1, -1)
    assert state.init_producer_id(TID, TIMEOUT, PID, MAX_PRODUCER_EPOCH - 1, T0) == (
        ErrorCode.producer_fenced
    )


# -- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------------------


def test_add_partitions_opens_and_widens_the_transaction() -> None:
    state = _state()
    _new(state)
    first = _ok(state, state.add_partitions(TID, PID, 0, frozenset({A}), frozenset(), T0 + 10))
    assert (first.state, first.partitions, first.start_ms) == (
        TxnState.ONGOING,
        frozenset({A}),
        T0 + 10,
    )
    # Nothing new: the same metadata, no record to write.
    assert state.add_partitions(TID, PID, 0, frozenset({A}), frozenset(), T0 + 11) is first
    assert state.add_partitions(TID, PID, 0, frozenset(), frozenset(), T0 + 11) is first
    wider = _ok(state, state.add_partitions(TID, PID, 0, frozenset({B}), frozenset({"g"}), T0 + 12))
    assert (wider.partitions, wider.groups) == (frozenset({A, B}), frozenset({"g"}))
    assert (wider.start_ms, wider.update_ms) == (T0 + 10, T0 + 12)
    assert state.add_partitions(TID, PID, 0, frozenset({A}), frozenset({"g"}), T0) is wider


@pytest.mark.parametrize("done", [TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT])
def test_the_next_transaction_starts_afresh(done: TxnState) -> None:
    state = _state()
    state.apply(TxnMetadata(TID, PID, 2, TIMEOUT, done, frozenset(), frozenset(), -1, T0, PID, 1))
    meta = _ok(state, state.add_partitions(TID, PID, 2, frozenset(), frozenset({"g"}), T0 + 50))
    assert (meta.state, meta.partitions, meta.groups, meta.start_ms) == (
        TxnState.ONGOING,
        frozenset(),
        frozenset({"g"}),
        T0 + 50,
    )


def test_add_partitions_errors() -> None:
    state = _state()
    parts = frozenset({A})
    assert state.add_partitions(TID, PID, 0, parts, frozenset(), T0) == (
        ErrorCode.invalid_producer_id_mapping
    )
    _at_epoch(state, 3, TxnState.EMPTY)
    assert state.add_partitions(TID, PID + 1, 3, parts, frozenset(), T0) == (
        ErrorCode.invalid_producer_id_mapping
    )
    for epoch in (2, 4):  # an older epoch is a zombie; a newer one was never handed out
        assert state.add_partitions(TID, PID, epoch, parts, frozenset(), T0) == (
            ErrorCode.producer_fenced
        )
    for prepare in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
        _at_epoch(state, 3, prepare)
        assert state.add_partitions(TID, PID, 3, frozenset({B}), frozenset(), T0) == (
            ErrorCode.concurrent_transactions
        )
    _at_epoch(state, 3, TxnState.PREPARE_EPOCH_FENCE)
    assert state.add_partitions(TID, PID, 3, parts, frozenset(), T0) == (
        ErrorCode.invalid_txn_state
    )
    # A DEAD record removes the id (an expired one): it is unknown from then on.
    _at_epoch(state, 3, TxnState.DEAD)
    assert state.get(TID) is None
    assert state.add_partitions(TID, PID, 3, parts, frozenset(), T0) == (
        ErrorCode.invalid_producer_id_mapping
    )


def test_verify_only_add_partitions() -> None:
    """KIP-890: a partition leader asks whether partitions are in the open transaction."""
    state = _state()
    _ongoing(state, A)
    both = frozenset({A, B})
    assert state.verify_partitions(TID, PID, 0, both) == {
        A: ErrorCode.none,
        B: ErrorCode.invalid_txn_state,
    }
    assert state.verify_partitions(TID, PID, 1, both) == dict.fromkeys(
        both, ErrorCode.producer_fenced
    )
    assert state.verify_partitions(TID, PID + 1, 0, both) == dict.fromkeys(
        both, ErrorCode.invalid_producer_id_mapping
    )
    assert state.verify_partitions("nope", PID, 0, both) == dict.fromkeys(
        both, ErrorCode.invalid_producer_id_mapping
    )
    # Verifying writes nothing.
    assert state.get(TID) is not None and state.get(TID).partitions == frozenset({A})  # type: ignore[union-attr]
    # As Kafka: a transaction being ended answers CONCURRENT_TRANSACTIONS (retriable).
    _ok(state, state.end_txn(TID, PID, 0, True, T0 + 20))
    assert state.verify_partitions(TID, PID, 0, both) == dict.fromkeys(
        both, ErrorCode.concurrent_transactions
    )
    _at_epoch(state, 0, TxnState.EMPTY)
    assert state.verify_partitions(TID, PID, 0, frozenset({A})) == {A: ErrorCode.invalid_txn_state}


# -- EndTxn -------------------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_prepares_then_completes(commit: bool) -> None:
    state = _state()
    _new(state)
    ongoing = _ok(state, state.add_partitions(TID, PID, 0, frozenset({A, B}), frozenset({"g"}), T0))
    prepared = _ok(state, state.end_txn(TID, PID, 0, commit, T0 + 30))
    want = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    assert prepared == TxnMetadata(
        TID, PID, 0, TIMEOUT, want, ongoing.partitions, ongoing.groups, T0, T0 + 30
    )
    assert prepared.in_prepare and state.pending_markers() == [prepared]
    done = _ok(state, state.complete(prepared, T0 + 40))
    assert done == TxnMetadata(
        TID,
        PID,
        0,
        TIMEOUT,
        TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
        update_ms=T0 + 40,
    )
    # A retry of the same end, once complete, is answered none; the other end is refused.
    assert state.end_txn(TID, PID, 0, commit, T0 + 50) == ErrorCode.none
    assert state.end_txn(TID, PID, 0, not commit, T0 + 50) == ErrorCode.invalid_txn_state
    assert state.get(TID) is done


@pytest.mark.parametrize(
    ("at", "commit", "code"),
    [
        (TxnState.PREPARE_COMMIT, True, ErrorCode.concurrent_transactions),
        (TxnState.PREPARE_COMMIT, False, ErrorCode.invalid_txn_state),
        (TxnState.PREPARE_ABORT, False, ErrorCode.concurrent_transactions),
        (TxnState.PREPARE_ABORT, True, ErrorCode.invalid_txn_state),
        (TxnState.COMPLETE_COMMIT, True, ErrorCode.none),
        (TxnState.COMPLETE_COMMIT, False, ErrorCode.invalid_txn_state),
        (TxnState.COMPLETE_ABORT, False, ErrorCode.none),
        (TxnState.COMPLETE_ABORT, True, ErrorCode.invalid_txn_state),  # commit after abort
        (TxnState.EMPTY, True, ErrorCode.invalid_txn_state),
        # Kafka answers INVALID_TXN_STATE here too; librdkafka aborts an empty transaction.
        (TxnState.EMPTY, False, ErrorCode.none),
        (TxnState.PREPARE_EPOCH_FENCE, False, ErrorCode.invalid_txn_state),
    ],
)
def test_end_txn_outside_ongoing(at: TxnState, commit: bool, code: ErrorCode) -> None:
    state = _state()
    meta = _at_epoch(state, 3, at)
    assert state.end_txn(TID, PID, 3, commit, T0) == code
    assert state.get(TID) is meta  # nothing changes


def test_end_txn_of_a_zombie_or_a_stranger() -> None:
    state = _state()
    assert state.end_txn(TID, PID, 0, True, T0) == ErrorCode.invalid_producer_id_mapping
    _at_epoch(state, 3, TxnState.ONGOING)
    assert state.end_txn(TID, PID, 2, True, T0) == ErrorCode.producer_fenced
    assert state.end_txn(TID, PID, 4, True, T0) == ErrorCode.producer_fenced
    assert state.end_txn(TID, PID + 1, 3, True, T0) == ErrorCode.invalid_producer_id_mapping


def test_prepare_commit_always_ends_in_commit() -> None:
    """Once PREPARE_COMMIT is durable nothing turns it into an abort: not a timeout, not a
    new instance, not an abort request. Only its completion moves it, to COMPLETE_COMMIT."""
    state = _state()
    _ongoing(state)
    prepared = _ok(state, state.end_txn(TID, PID, 0, True, T0 + 20))
    assert state.timed_out(T0 + 10 * TIMEOUT) == []
    assert state.next_deadline_ms() is None
    assert state.init_producer_id(TID, TIMEOUT, -1, -1, T0) == ErrorCode.concurrent_transactions
    assert state.end_txn(TID, PID, 0, False, T0) == ErrorCode.invalid_txn_state
    assert state.get(TID) is prepared
    assert state.complete(prepared, T0 + 30).state == TxnState.COMPLETE_COMMIT


# -- timeouts -----------------------------------------------------------------------------------


def test_a_timed_out_transaction_is_aborted_with_the_epoch_bumped() -> None:
    state = _state()
    ongoing = _ongoing(state, A)
    start = ongoing.start_ms
    assert state.next_deadline_ms() == start + TIMEOUT
    assert state.timed_out(start + TIMEOUT) == []  # Kafka: start + timeout < now
    (abort,) = state.timed_out(start + TIMEOUT + 1)
    assert abort == TxnMetadata(
        TID,
        PID,
        1,
        TIMEOUT,
        TxnState.PREPARE_ABORT,
        frozenset({A}),
        start_ms=start,
        update_ms=start + TIMEOUT + 1,
        last_producer_id=PID,
        last_producer_epoch=0,
    )
    state.apply(abort)
    assert state.next_deadline_ms() is None and state.timed_out(start + 2 * TIMEOUT) == []
    # The producer that let it time out is fenced.
    assert state.end_txn(TID, PID, 0, True, T0) == ErrorCode.producer_fenced
    assert state.add_partitions(TID, PID, 0, frozenset({B}), frozenset(), T0) == (
        ErrorCode.producer_fenced
    )


def test_only_ongoing_transactions_time_out() -> None:
    state = _state()
    for i, txn in enumerate(TxnState):
        state.apply(TxnMetadata(f"t{i}", i, 0, 10, txn, frozenset({A}), start_ms=T0))
    aborted = state.timed_out(T0 + 1000)
    assert [m.transactional_id for m in aborted] == [f"t{int(TxnState.ONGOING)}"]
    assert state.next_deadline_ms() == T0 + 10


def test_a_timeout_at_the_last_epoch_fences_with_the_very_last_one() -> None:
    """Epoch 32766 is the last handed out; the fence takes 32767, so the producer is fenced
    (before, the epoch stayed at 32766: no fence, and the shell, seeing no bump, never
    aborted the transaction). 32767 is never handed out: the next InitProducerId, a KIP-360
    retry of the fenced producer included, allocates a new producer id."""
    state = _state()
    _at_epoch(state, MAX_PRODUCER_EPOCH - 1, TxnState.ONGOING)
    (abort,) = state.timed_out(T0 + TIMEOUT + 1)
    assert abort.producer_epoch == MAX_PRODUCER_EPOCH
    state.apply(abort)
    assert state.end_txn(TID, PID, MAX_PRODUCER_EPOCH - 1, True, T0) == ErrorCode.producer_fenced
    done = _ok(state, state.complete(abort, T0))
    assert state.init_producer_id(TID, TIMEOUT, -1, -1, T0) == NeedProducerId(None)
    assert state.init_producer_id(TID, TIMEOUT, PID, MAX_PRODUCER_EPOCH - 1, T0) == (
        NeedProducerId(done)
    )


def test_a_new_instance_fencing_at_the_last_epoch() -> None:
    state = _state()
    _at_epoch(state, MAX_PRODUCER_EPOCH - 1, TxnState.ONGOING)
    fence = _ok(state, state.init_producer_id(TID, TIMEOUT, -1, -1, T0))
    assert (fence.state, fence.producer_epoch) == (TxnState.PREPARE_ABORT, MAX_PRODUCER_EPOCH)
    _ok(state, state.complete(fence, T0))
    assert state.init_producer_id(TID, TIMEOUT, -1, -1, T0) == NeedProducerId(None)


# -- records, snapshots -------------------------------------------------------------------------

FULL = TxnMetadata(
    "tx-1",
    4000,
    3,
    60000,
    TxnState.PREPARE_COMMIT,
    frozenset({("orders", 1), ("orders", 0), ("audit", 2)}),
    frozenset({"g2", "g1"}),
    1764201600000,
    1764201600500,
    4000,
    2,
)
# {"id": "tx-1", "pid": 4000, "pe": 3, "to": 60000, "st": 2,
#  "tp": [["audit", 2], ["orders", 0], ["orders", 1]], "g": ["g1", "g2"],
#  "ts": 1764201600000, "ut": 1764201600500, "lp": 4000, "le": 2}
RECORD_GOLDEN = (
    "8b"
    "a26964a474782d31"  # "id": "tx-1"
    "a3706964cd0fa0"  # "pid": 4000
    "a2706503"  # "pe": 3
    "a2746fcdea60"  # "to": 60000
    "a2737402"  # "st": 2 (PREPARE_COMMIT)
    "a27470"
    "93"
    "92a5617564697402"
    "92a66f726465727300"
    "92a66f726465727301"  # "tp": sorted [topic, partition]
    "a16792a26731a26732"  # "g": ["g1", "g2"]
    "a27473cf0000019ac29c1400"  # "ts"
    "a27574cf0000019ac29c15f4"  # "ut"
    "a26c70cd0fa0"  # "lp": 4000
    "a26c6502"  # "le": 2
)
# The CONTROL record's header: {"k": "txn", "x": <the record>}.
CONTROL_GOLDEN = "82a16ba374786ea178" + RECORD_GOLDEN
EMPTY_GOLDEN = (
    "8ba26964a3782d31a3706964cd0fa0a2706500a2746fcdea60a2737400a2747090a16790"
    "a27473ffa27574cf0000019ac29c1400a26c70ffa26c65ff"
)


def test_golden_txn_record() -> None:
    packed = msgpack.packb(FULL.to_record(), use_bin_type=True)
    assert packed.hex() == RECORD_GOLDEN
    assert TxnMetadata.from_record(msgpack.unpackb(packed, raw=False)) == FULL
    header = {"k": "txn", "x": FULL.to_record()}
    assert msgpack.packb(header, use_bin_type=True).hex() == CONTROL_GOLDEN
    empty = TxnMetadata("x-1", 4000, 0, 60000, TxnState.EMPTY, update_ms=1764201600000)
    assert msgpack.packb(empty.to_record(), use_bin_type=True).hex() == EMPTY_GOLDEN


def test_a_record_of_the_first_release_has_no_last_producer() -> None:
    row = FULL.to_record()
    del row["lp"], row["le"]
    assert TxnMetadata.from_record(row) == replace(
        FULL, last_producer_id=-1, last_producer_epoch=-1
    )


def test_snapshot_and_restore() -> None:
    state = _state()
    _ongoing(state, A, B)
    state.apply(TxnMetadata("other", 5, 1, 1000, TxnState.COMPLETE_ABORT))
    rows = msgpack.unpackb(msgpack.packb(state.snapshot(), use_bin_type=True), raw=False)
    again = _state()
    again.apply(FULL)  # restore replaces what was there
    again.restore(rows)
    assert again.txns == state.txns


def test_state_names_as_kafka_lists_them() -> None:
    assert [s.kafka_name for s in TxnState] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ]


# -- a property: fencing ------------------------------------------------------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["init", "init360", "add", "commit", "abort", "complete", "tick"]),
        st.integers(0, 3),  # which client instance acts
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_no_two_instances_ever_hold_the_same_epoch(ops: list[tuple[str, int]]) -> None:
    """Clients (instances of one transactional id) each keep the (producer id, epoch) they
    were last answered. Whatever they do, the coordinator answers no (id, epoch) to two
    instances, and only the holder of the current one may change a transaction."""
    state = _state()
    now = T0
    held: dict[int, tuple[int, int]] = {}
    next_pid = PID
    for op, who in ops:
        now += 25_000
        meta = state.get(TID)
        pid, epoch = held.get(who, (-1, -1))
        if op in ("init", "init360"):
            expected = (pid, epoch) if op == "init360" else (-1, -1)
            decided = state.init_producer_id(TID, TIMEOUT, *expected, now)
            if isinstance(decided, NeedProducerId):
                decided = state.init_with(TID, next_pid, TIMEOUT, decided.previous, now)
                next_pid += 1
            if isinstance(decided, TxnMetadata):
                if decided is not meta:
                    state.apply(decided)
                if decided.state != TxnState.PREPARE_ABORT:
                    answer = (decided.producer_id, decided.producer_epoch)
                    holders = [w for w, h in held.items() if h == answer and w != who]
                    assert not holders, (who, answer, held)
                    held[who] = answer
        elif op == "add" and who in held:
            decided = state.add_partitions(TID, pid, epoch, frozenset({A}), frozenset(), now)
            if isinstance(decided, TxnMetadata):
                assert meta is not None and (meta.producer_id, meta.producer_epoch) == (pid, epoch)
                state.apply(decided)
        elif op in ("commit", "abort") and who in held:
            decided = state.end_txn(TID, pid, epoch, op == "commit", now)
            if isinstance(decided, TxnMetadata):
                assert meta is not None and (meta.producer_id, meta.producer_epoch) == (pid, epoch)
                state.apply(decided)
        elif op == "complete" and meta is not None and meta.in_prepare:
            state.apply(state.complete(meta, now))
        elif op == "tick":
            for aborted in state.timed_out(now + 3 * TIMEOUT):
                assert aborted.producer_epoch == aborted.last_producer_epoch + 1
                state.apply(aborted)
        current = state.get(TID)
        if current is not None:
            assert 0 <= current.producer_epoch <= MAX_PRODUCER_EPOCH


def test_idle_ids_expire_and_a_dead_record_removes_them() -> None:
    from main_broker.txn.state import TxnCoordinatorState, TxnMetadata, TxnState

    state = TxnCoordinatorState(60_000)
    idle = TxnMetadata("idle", 1, 0, 1000, TxnState.COMPLETE_COMMIT, update_ms=0)
    busy = TxnMetadata("busy", 2, 0, 1000, TxnState.ONGOING, start_ms=0, update_ms=0)
    recent = TxnMetadata("recent", 3, 0, 1000, TxnState.EMPTY, update_ms=9_000)
    for meta in (idle, busy, recent):
        state.apply(meta)
    dead = state.expired(10_000, 5_000)
    # Only an id with nothing under way, unused for longer than the expiration.
    assert [(m.transactional_id, m.state) for m in dead] == [("idle", TxnState.DEAD)]
    state.apply(dead[0])
    assert state.get("idle") is None and state.get("busy") is not None
    # The DEAD record round-trips, so replay removes the id too.
    again = TxnCoordinatorState(60_000)
    again.apply(idle)
    again.apply(TxnMetadata.from_record(dead[0].to_record()))
    assert again.get("idle") is None
