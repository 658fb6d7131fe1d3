from kio.schema.errors import ErrorCode

from main_broker.producer_state import (
    INT32_MAX,
    BatchMetadata,
    ProducerStateTable,
    Verdict,
    next_sequence,
)


def _rec(t: ProducerStateTable, pid: int, epoch: int, first: int, last: int, off: int) -> None:
    t.record(pid, epoch, BatchMetadata(first, last, off, off + last - first, 0))


def test_new_producer_accepts_any_sequence() -> None:
    t = ProducerStateTable()
    assert t.check(7, 0, 42, 45).verdict is Verdict.APPEND


def test_in_sequence_duplicate_and_gap() -> None:
    t = ProducerStateTable()
    _rec(t, 7, 0, 0, 4, 100)
    assert t.check(7, 0, 5, 9).verdict is Verdict.APPEND
    dup = t.check(7, 0, 0, 4)
    assert dup.verdict is Verdict.DUPLICATE and dup.duplicate_of is not None
    assert dup.duplicate_of.first_offset == 100
    gap = t.check(7, 0, 7, 9)
    assert gap.verdict is Verdict.REJECT
    assert gap.error == ErrorCode.out_of_order_sequence_number


def test_only_last_five_batches_are_remembered() -> None:
    t = ProducerStateTable()
    for i in range(7):
        _rec(t, 1, 0, i * 10, i * 10 + 9, i * 10)
    assert t.check(1, 0, 20, 29).verdict is Verdict.DUPLICATE
    # The first two batches aged out: a retry of them is now out of order, as in Kafka.
    assert t.check(1, 0, 0, 9).verdict is Verdict.REJECT


def test_epochs() -> None:
    t = ProducerStateTable()
    _rec(t, 1, 3, 0, 0, 0)
    old = t.check(1, 2, 1, 1)
    assert old.verdict is Verdict.REJECT and old.error == ErrorCode.invalid_producer_epoch
    assert t.check(1, 4, 0, 0).verdict is Verdict.APPEND
    bumped = t.check(1, 4, 5, 5)
    assert bumped.verdict is Verdict.REJECT
    assert bumped.error == ErrorCode.out_of_order_sequence_number


def test_sequence_wraps() -> None:
    assert next_sequence(INT32_MAX) == 0
    t = ProducerStateTable()
    _rec(t, 1, 0, INT32_MAX - 1, INT32_MAX, 0)
    assert t.check(1, 0, 0, 3).verdict is Verdict.APPEND


def test_snapshot_keeps_only_durable_batches() -> None:
    t = ProducerStateTable()
    _rec(t, 1, 0, 0, 4, 0)
    _rec(t, 1, 0, 5, 9, 5)
    restored = ProducerStateTable.from_snapshot(t.to_snapshot(below_offset=5))
    assert restored.check(1, 0, 0, 4).verdict is Verdict.DUPLICATE
    assert restored.check(1, 0, 5, 9).verdict is Verdict.APPEND
