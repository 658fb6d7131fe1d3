"""One partition's transactions: the open ones (for the last stable offset) and the aborted
ones (for `read_committed` fetches), as Kafka's ProducerStateManager and TransactionIndex.

Pure logic (no I/O). A transactional batch of a producer with no open transaction on the
partition opens one at its base offset; the producer's marker (a COMMIT or ABORT control
batch) closes it. The last stable offset is the first offset of the oldest open transaction
(the high watermark when none is open). An aborted transaction is remembered as
(producer id, first offset, last offset = its ABORT marker's offset) until the log start
passes its marker.
"""

from __future__ import annotations

import bisect
from typing import Any, NamedTuple

__all__ = ["AbortedTxn", "PartitionTxns"]


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


class PartitionTxns:
    __slots__ = ("_aborted", "_allowed", "_open")

    def __init__(self) -> None:
        # producer id -> the epoch its coordinator said may open a transaction here
        # (KIP-890's verification, pushed: main_broker/txn/markers.py `allow`). Memory only:
        # after a restart or a move a producer's first transactional batch is refused until
        # its coordinator adds the partition again, and the client aborts and retries.
        self._allowed: dict[int, int] = {}
        # producer id -> first offset of its open transaction; dicts keep insertion order,
        # so the first value is the oldest (offsets are assigned in order).
        self._open: dict[int, int] = {}
        self._aborted: list[AbortedTxn] = []  # by last offset

    # -- the append path ----------------------------------------------------------------------

    def is_open(self, producer_id: int) -> bool:
        return producer_id in self._open

    def allow(self, producer_id: int, epoch: int) -> None:
        """The coordinator added this partition to the producer's transaction at `epoch`."""
        self._allowed[producer_id] = epoch

    def may_open(self, producer_id: int, epoch: int) -> bool:
        """Whether a transactional batch may open a transaction: its coordinator added the
        partition at this epoch (a batch that comes after its transaction's marker, a retry
        or a zombie's, would otherwise open one nobody ends and hold the LSO for ever)."""
        return self._allowed.get(producer_id) == epoch

    def on_transactional_batch(self, producer_id: int, base_offset: int) -> None:
        """A transactional data batch at `base_offset`: it opens the producer's transaction
        unless one is open already."""
        self._open.setdefault(producer_id, base_offset)

    def on_marker(self, producer_id: int, marker_offset: int, commit: bool) -> AbortedTxn | None:
        """The producer's marker at `marker_offset` closes its open transaction; returns the
        aborted transaction it records, if any (an ABORT with records before it)."""
        first = self._open.pop(producer_id, None)
        self._allowed.pop(producer_id, None)
        if commit or first is None:
            return None
        aborted = AbortedTxn(producer_id, first, marker_offset)
        if self._aborted and self._aborted[-1].last_offset > marker_offset:
            bisect.insort(self._aborted, aborted, key=lambda a: a.last_offset)
        else:
            self._aborted.append(aborted)
        return aborted

    # -- the read path ------------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None when none is open)."""
        if not self._open:
            return None
        return min(self._open.values())

    def open_producers(self) -> dict[int, int]:
        return dict(self._open)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions a fetch of [start, end) must be told of: those with
        records in that range (first offset below `end`, marker at or after `start`)."""
        aborted = self._aborted
        i = bisect.bisect_left(aborted, start, key=lambda a: a.last_offset)
        return [a for a in aborted[i:] if a.first_offset < end]

    @property
    def aborted(self) -> list[AbortedTxn]:
        return list(self._aborted)

    def trim(self, log_start: int) -> bool:
        """Forget aborted transactions whose marker lies below the log start; True when any
        went."""
        aborted = self._aborted
        i = bisect.bisect_left(aborted, log_start, key=lambda a: a.last_offset)
        if i:
            del aborted[:i]
        return bool(i)

    def reset(self, open_txns: dict[int, int], aborted: list[AbortedTxn]) -> None:
        self._open = dict(sorted(open_txns.items(), key=lambda kv: kv[1]))
        self._aborted = sorted(aborted, key=lambda a: a.last_offset)

    # -- snapshot (the partition's SNAPSHOT entry, its takeover header) ------------------------

    def to_snapshot(self, below_offset: int) -> dict[str, Any]:
        """The state as of `below_offset` (the high watermark of a SNAPSHOT, a takeover's
        start): the records from it on are replayed after the snapshot, so a transaction
        they open is left out, and one whose ABORT marker they hold is still open."""
        opened = {pid: first for pid, first in self._open.items() if first < below_offset}
        aborted = []
        for a in self._aborted:
            if a.last_offset < below_offset:
                aborted.append(list(a))
            elif a.first_offset < below_offset:
                opened.setdefault(a.producer_id, a.first_offset)
        return {"o": [[pid, first] for pid, first in opened.items()], "a": aborted}

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any] | None) -> PartitionTxns:
        txns = cls()
        if snap:
            txns.reset(
                {int(pid): int(first) for pid, first in snap.get("o", [])},
                [AbortedTxn(int(p), int(f), int(last)) for p, f, last in snap.get("a", [])],
            )
        return txns
