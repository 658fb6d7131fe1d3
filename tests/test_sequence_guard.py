"""proxy_broker.sequence_guard: an idempotent producer's batches stay in order through a proxy
while one of them is in doubt (the netns partition test read a record twice: a batch went to
a partition's new owner while the two before it waited on the old one, the main answered
OUT_OF_ORDER_SEQUENCE_NUMBER, and librdkafka bumped its epoch and sent the written one again)."""

from __future__ import annotations

from proxy_broker.sequence_guard import BatchRef, SequenceGuard


class _Req:
    def __init__(self, answered: bool = False) -> None:
        self.answered = answered

    def done(self) -> bool:
        return self.answered


def _admit(
    guard: SequenceGuard,
    seq: int,
    owner: int,
    req: _Req,
    *,
    epoch: int = 0,
    now: float = 0.0,
    pid: int = 7,
) -> bool:
    return guard.admit(BatchRef("t", 0, pid, epoch, seq), owner, now, req.done) is None


def test_a_batch_may_not_overtake_earlier_ones_waiting_on_the_previous_owner() -> None:
    guard = SequenceGuard()
    r55, r56, r57 = _Req(), _Req(), _Req()
    assert _admit(guard, 55, 2, r55) and _admit(guard, 56, 2, r56)
    # The partition moved to main 1 while 55 and 56 wait on main 2.
    assert not _admit(guard, 57, 1, r57)
    assert guard.refused == 1
    # 55 and 56 are answered "possibly written" (moved): 58 is refused too...
    r55.answered = r56.answered = True
    guard.in_doubt(BatchRef("t", 0, 7, 0, 56), 0.1)
    guard.in_doubt(BatchRef("t", 0, 7, 0, 55), 0.1)
    assert not _admit(guard, 58, 1, _Req())
    # ...until the client retries from the first batch in doubt, in order.
    assert _admit(guard, 55, 1, _Req()) and _admit(guard, 56, 1, _Req())
    assert _admit(guard, 57, 1, _Req())


def test_a_batch_refused_behind_earlier_ones_that_were_then_written_passes_on_retry() -> None:
    guard = SequenceGuard()
    r1 = _Req()
    assert _admit(guard, 1, 2, r1)
    assert not _admit(guard, 2, 1, _Req())  # moved while 1 waits on main 2
    r1.answered = True  # main 2 confirmed it before the move
    assert _admit(guard, 2, 1, _Req())  # the resend


def test_pipelined_batches_to_one_owner_pass_and_a_doubt_refuses_later_ones() -> None:
    guard = SequenceGuard()
    reqs = [_Req() for _ in range(5)]
    assert all(_admit(guard, s, 2, r) for s, r in enumerate(reqs))
    guard.in_doubt(BatchRef("t", 0, 7, 0, 3), 1.0)
    assert not _admit(guard, 5, 2, _Req(), now=1.0)
    assert _admit(guard, 3, 2, _Req(), now=1.1)  # the retry lifts it
    assert _admit(guard, 5, 2, _Req(), now=1.2)


def test_a_new_epoch_an_expired_doubt_and_other_producers_are_not_held() -> None:
    guard = SequenceGuard(expires_s=30.0)
    assert _admit(guard, 0, 2, _Req())
    guard.in_doubt(BatchRef("t", 0, 7, 0, 0), 0.0)
    assert not _admit(guard, 1, 2, _Req(), now=1.0)
    assert _admit(guard, 9, 2, _Req(), pid=8)  # another producer
    assert guard.admit(BatchRef("t", 1, 7, 0, 9), 2, 1.0, _Req().done) is None  # another partition
    assert guard.admit(BatchRef("t", 0, -1, -1, -1), 1, 1.0, _Req().done) is None  # not idempotent
    assert _admit(guard, 1, 2, _Req(), now=31.0)  # the client gave it up: the main decides
    guard.in_doubt(BatchRef("t", 0, 7, 0, 1), 31.0)
    assert _admit(guard, 0, 2, _Req(), epoch=1, now=32.0)  # a bumped epoch starts afresh
    guard.in_doubt(BatchRef("t", 0, 7, 0, 0), 32.0)  # a doubt of the old epoch is ignored
    assert _admit(guard, 1, 2, _Req(), epoch=1, now=32.0)


def test_entries_are_bounded() -> None:
    guard = SequenceGuard(max_entries=3)
    for pid in range(10):
        assert _admit(guard, 0, 1, _Req(), pid=pid)
    assert len(guard) == 3


def test_a_batch_in_doubt_that_is_confirmed_after_all_holds_nothing_back() -> None:
    """A confirm riding a session that another failed call broke is in doubt until answered;
    confirmed, it leaves the set, and only what is still in doubt holds later batches."""
    guard = SequenceGuard()
    for seq in (4, 5):
        assert _admit(guard, seq, 2, _Req())
    guard.in_doubt(BatchRef("t", 0, 7, 0, 5), 1.0)
    guard.in_doubt(BatchRef("t", 0, 7, 0, 4), 1.0)
    guard.settled(BatchRef("t", 0, 7, 0, 4))  # written after all
    assert not _admit(guard, 6, 2, _Req(), now=1.1)  # 5 is still in doubt
    guard.settled(BatchRef("t", 0, 7, 0, 5))
    assert _admit(guard, 6, 2, _Req(), now=1.2)


def test_a_client_that_moved_past_the_doubt_is_held_back_once() -> None:
    """The batch in doubt was acknowledged on another path (the client's zone main led the
    partition for a while, so the retry never came through this proxy): the client's first
    batch here waits (it may have been sent before the client heard), its resend passes (the
    failover bench's producers stalled 23 s until the doubt expired; a cap of 4 refusals let
    a later batch overtake a held one and the main answered OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    guard = SequenceGuard()
    assert _admit(guard, 49, 1, _Req(answered=True))
    guard.in_doubt(BatchRef("t", 0, 7, 0, 49), 0.0)
    assert not _admit(guard, 429, 1, _Req(), now=1.0)
    assert not _admit(guard, 430, 1, _Req(), now=1.0)  # sent before it heard, too
    assert _admit(guard, 429, 1, _Req(), now=1.1)  # the resend from its first unacknowledged
    assert _admit(guard, 430, 1, _Req(), now=1.2)
    assert _admit(guard, 431, 1, _Req(), now=1.3)


def test_a_batch_refused_behind_the_previous_owner_holds_later_ones_until_resent() -> None:
    """Refused (never written) while batch 1 waited on the previous owner, which then
    confirmed it: batch 3, sent before the client heard of 2's refusal, must not overtake
    2 at the new owner (OUT_OF_ORDER_SEQUENCE_NUMBER makes librdkafka bump its epoch for
    every partition: the failover bench read 3 records twice)."""
    guard = SequenceGuard()
    r1 = _Req()
    assert _admit(guard, 1, 2, r1)
    assert not _admit(guard, 2, 1, _Req(), now=1.0)
    r1.answered = True  # confirmed by the previous owner
    assert not _admit(guard, 3, 1, _Req(), now=1.0)
    assert _admit(guard, 2, 1, _Req(), now=1.1)  # the client's resend
    assert _admit(guard, 3, 1, _Req(), now=1.2)
