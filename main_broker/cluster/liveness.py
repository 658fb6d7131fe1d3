"""Telling a dead main from a slow one, the pure core (main_broker/cluster/watch.py does the
I/O).

The controller probes every other main once a second, and at once when a proxy or a main
reports that it lost its connection to one. A main is found dead when its RPC port refused
the connection `REFUSED_TO_DEAD` times in a row (nothing listens there: the process is gone),
or when `FAILURES_TO_DEAD` probes in a row failed in any way (timeouts: it is paused, or cut
off). An answer resets the count. Only a main seen answering before can be found dead: one
that never answered yet may be starting (a fleet's mains start one after another), and the
registrations' heartbeats cover it. A report alone never condemns a main: it only brings the
next probe forward. A controller that finds most of the others dead by timeouts alone
(`in_minority`) may be the one cut off: it gives its lease up and moves nothing.

A main serves reads only while its last look for a fence on its own WAL that found none began
less than `READS_FRESH_S` ago (`reads_fresh`): after a pause it waits for the next look, so it
never serves a partition that another main took over while it was stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "FAILURES_TO_DEAD",
    "REFUSED_TO_DEAD",
    "ProbeOutcome",
    "ProbeTracker",
    "reads_fresh",
]

REFUSED_TO_DEAD = 2
FAILURES_TO_DEAD = 5
FENCE_CHECK_S = 0.5
READS_FRESH_S = FENCE_CHECK_S + 1.0


class ProbeOutcome(Enum):
    ANSWERED = "answered"
    REFUSED = "refused"  # connection refused: no process on the port
    FAILED = "failed"  # timed out, reset, or answered by someone else


@dataclass(slots=True)
class _Record:
    answered: bool = False  # ever: a main not seen up yet may still be starting
    refused: int = 0
    failed: int = 0
    last_error: str = ""


@dataclass(slots=True)
class ProbeTracker:
    """Consecutive probe failures per main, and the verdict."""

    records: dict[int, _Record] = field(default_factory=dict)

    def record(self, node: int, outcome: ProbeOutcome, error: str = "") -> None:
        rec = self.records.setdefault(node, _Record())
        if outcome is ProbeOutcome.ANSWERED:
            rec.answered = True
            rec.refused = rec.failed = 0
            rec.last_error = ""
            return
        rec.failed += 1
        rec.refused = rec.refused + 1 if outcome is ProbeOutcome.REFUSED else 0
        rec.last_error = error

    def dead(self, node: int) -> bool:
        rec = self.records.get(node)
        return (
            rec is not None
            and rec.answered
            and (rec.refused >= REFUSED_TO_DEAD or rec.failed >= FAILURES_TO_DEAD)
        )

    def gone(self, node: int) -> bool:
        """Dead, and known to have no process on its port (its lease may be taken early)."""
        rec = self.records.get(node)
        return rec is not None and rec.answered and rec.refused >= REFUSED_TO_DEAD

    def answering(self, node: int) -> bool:
        """Answered its latest probe."""
        rec = self.records.get(node)
        return rec is not None and rec.answered and rec.failed == 0

    def seen(self, node: int) -> bool:
        """Answered a probe at least once (only such a main can be found dead)."""
        rec = self.records.get(node)
        return rec is not None and rec.answered

    def suspected(self, node: int) -> bool:
        rec = self.records.get(node)
        return rec is not None and rec.failed > 0

    def in_minority(self, others: list[int]) -> bool:
        """Whether most of `others` are dead by timeouts alone (a refusal proves the other
        process gone; a timeout may be this node's own network): this node may be the one
        cut off."""
        unreachable = [n for n in others if self.dead(n) and not self.gone(n)]
        return 2 * len(unreachable) > len(others)

    def why(self, node: int) -> str:
        rec = self.records.get(node)
        if rec is None:
            return "answering"
        if rec.refused:
            return f"{rec.refused} probes refused ({rec.last_error})"
        return f"{rec.failed} probes failed ({rec.last_error})"

    def forget(self, node: int) -> None:
        self.records.pop(node, None)


def reads_fresh(now: float, unfenced_check_started: float | None) -> bool:
    """Whether a main may serve reads: its last fence check that found none began less than
    READS_FRESH_S ago (None: none yet)."""
    return unfenced_check_started is not None and now - unfenced_check_started < READS_FRESH_S
