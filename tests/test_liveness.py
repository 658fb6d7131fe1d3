"""The pure core of telling a dead main from a slow one (main_broker/cluster/liveness.py)."""

from __future__ import annotations

from main_broker.cluster.liveness import (
    FAILURES_TO_DEAD,
    READS_FRESH_S,
    REFUSED_TO_DEAD,
    ProbeOutcome,
    ProbeTracker,
    reads_fresh,
)


def test_refused_connections_condemn_fast_timeouts_slowly() -> None:
    tracker = ProbeTracker()
    assert not tracker.answering(2)
    tracker.record(2, ProbeOutcome.ANSWERED)
    tracker.record(3, ProbeOutcome.ANSWERED)
    assert tracker.answering(2)
    for _ in range(REFUSED_TO_DEAD - 1):
        tracker.record(2, ProbeOutcome.REFUSED, "refused")
    assert tracker.suspected(2) and not tracker.dead(2) and not tracker.answering(2)
    tracker.record(2, ProbeOutcome.REFUSED, "refused")
    assert tracker.dead(2) and tracker.gone(2)
    assert "refused" in tracker.why(2)
    # A paused main only times out: found dead after more failures, and never "gone" (its
    # lease is not taken early: it may still act until the lease expires).
    for _ in range(FAILURES_TO_DEAD - 1):
        tracker.record(3, ProbeOutcome.FAILED, "timed out")
        assert not tracker.dead(3)
    tracker.record(3, ProbeOutcome.FAILED, "timed out")
    assert tracker.dead(3) and not tracker.gone(3)
    # An answer clears it.
    tracker.record(3, ProbeOutcome.ANSWERED)
    assert not tracker.dead(3) and not tracker.suspected(3)


def test_a_refusal_after_a_timeout_starts_the_refused_count_again() -> None:
    tracker = ProbeTracker()
    tracker.record(2, ProbeOutcome.ANSWERED)
    tracker.record(2, ProbeOutcome.REFUSED)
    tracker.record(2, ProbeOutcome.FAILED)
    tracker.record(2, ProbeOutcome.REFUSED)
    assert not tracker.dead(2)


def test_a_main_never_seen_up_is_not_condemned_by_probes() -> None:
    """Mains of a fleet start one after another: the first one's probes of the next are
    refused until it listens. The registrations' heartbeats cover a main that never came up."""
    tracker = ProbeTracker()
    for _ in range(FAILURES_TO_DEAD * 2):
        tracker.record(4, ProbeOutcome.REFUSED)
    assert not tracker.dead(4) and not tracker.gone(4) and tracker.suspected(4)
    tracker.forget(4)
    assert not tracker.suspected(4) and tracker.why(4) == "answering"


def test_reads_are_fresh_only_shortly_after_a_look_for_a_fence() -> None:
    assert not reads_fresh(100.0, None)
    assert reads_fresh(100.0, 100.0 - READS_FRESH_S + 0.01)
    assert not reads_fresh(100.0, 100.0 - READS_FRESH_S)  # e.g. just resumed after SIGSTOP


def test_a_main_that_reaches_few_others_by_timeouts_may_be_the_one_cut_off() -> None:
    tracker = ProbeTracker()
    for node in (2, 3):
        tracker.record(node, ProbeOutcome.ANSWERED)
    for _ in range(FAILURES_TO_DEAD):
        tracker.record(2, ProbeOutcome.FAILED, "timed out")
    assert not tracker.in_minority([2, 3])  # one of two: main 2 is paused or cut off
    for _ in range(FAILURES_TO_DEAD):
        tracker.record(3, ProbeOutcome.FAILED, "timed out")
    assert tracker.in_minority([2, 3])  # both: more likely this main is the one cut off
    for _ in range(REFUSED_TO_DEAD):
        tracker.record(3, ProbeOutcome.REFUSED, "refused")
    assert not tracker.in_minority([2, 3])  # main 3's host answered: it is gone, not far
    # Two mains: a timeout cannot tell which one is cut off; a refusal can.
    pair = ProbeTracker()
    pair.record(2, ProbeOutcome.ANSWERED)
    for _ in range(FAILURES_TO_DEAD):
        pair.record(2, ProbeOutcome.FAILED)
    assert pair.in_minority([2])


def test_a_main_is_seen_once_it_answered() -> None:
    tracker = ProbeTracker()
    assert not tracker.seen(2)
    tracker.record(2, ProbeOutcome.REFUSED, "starting")
    assert not tracker.seen(2) and not tracker.dead(2)
    tracker.record(2, ProbeOutcome.ANSWERED)
    tracker.record(2, ProbeOutcome.REFUSED, "killed")
    assert tracker.seen(2) and not tracker.answering(2)
