"""Offsets a transactional producer committed (TxnOffsetCommit), pending until its
transaction ends, as Kafka's pending transactional offsets in the group coordinator.

TxnOffsetCommit writes a `txn_offsets` CONTROL record and the offsets wait here, per group
and producer id. The transaction's end reaches the group's coordinator as a marker
(main_broker/txn/markers.py): a COMMIT commits them as ordinary offsets (an `offsets` record,
through the group's `OffsetTable`), an ABORT drops them; either way a `txn_offsets_end` record
follows. A crash between the two replays the pending offsets again, and the coordinator,
which still has the transaction in a PREPARE state, sends the marker again: committing the
same offsets twice is harmless.

While a group has pending offsets for a partition, an OffsetFetch that requires stable
offsets gets UNSTABLE_OFFSET_COMMIT for it (KIP-447), so a new consumer does not start
from offsets about to change.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from main_broker.groups.offsets import OffsetTuple
from shared_wal import RecordType

if TYPE_CHECKING:
    from main_broker.groups.offsets import OffsetTable
    from main_broker.log_store import LogStore

log = logging.getLogger(__name__)

TXN_OFFSETS_KIND = "txn_offsets"
TXN_OFFSETS_END_KIND = "txn_offsets_end"


class PendingTxnOffsets:
    """A `StoreParticipant` (section `txn_offsets`): group -> producer id -> offsets."""

    snapshot_section = "txn_offsets"
    record_kinds = frozenset({TXN_OFFSETS_KIND, TXN_OFFSETS_END_KIND})

    def __init__(self, store: LogStore, table: OffsetTable, metadata_max_bytes: int) -> None:
        self._store = store
        self._table = table
        self._metadata_max_bytes = metadata_max_bytes
        self._pending: dict[str, dict[int, dict[tuple[str, int], OffsetTuple]]] = {}
        # (group, producer id) -> the epoch whose coordinator added the group's offsets to its
        # transaction (AddOffsetsToTxn; main_broker/txn/markers.py `allow`). Memory only, as
        # a partition's (main_broker/partition_txns.py).
        self._allowed: dict[tuple[str, int], int] = {}

    def allow(self, group_id: str, producer_id: int, epoch: int) -> None:
        self._allowed[(group_id, producer_id)] = epoch

    def may_commit(self, group_id: str, producer_id: int, epoch: int) -> bool:
        """Whether a TxnOffsetCommit of this producer may add offsets: its coordinator added
        the group at this epoch, or its transaction has offsets pending here already."""
        if producer_id in self._pending.get(group_id, {}):
            return True
        return self._allowed.get((group_id, producer_id)) == epoch

    # -- requests ------------------------------------------------------------------------------

    async def add(self, group_id: str, producer_id: int, offsets: list[OffsetTuple]) -> None:
        """TxnOffsetCommit: durable when this returns (raises when the WAL fails)."""
        header = {
            "k": TXN_OFFSETS_KIND,
            "g": group_id,
            "pid": producer_id,
            "o": [list(o) for o in offsets],
        }
        await self._store.wal.append(
            RecordType.CONTROL, header, on_durable=lambda: self._add(group_id, producer_id, offsets)
        )

    async def complete(self, group_id: str, producer_id: int, commit: bool) -> None:
        """The producer's transaction ended: commit or drop its offsets for the group."""
        self._allowed.pop((group_id, producer_id), None)
        pending = self._pending.get(group_id, {}).get(producer_id)
        if pending is None:
            return  # a marker sent again after a completion that was durable
        if commit:
            offsets = [(t, p, o, e, m) for t, p, o, e, m in pending.values()]
            errors = await self._table.commit(group_id, offsets, self._metadata_max_bytes)
            failed = [key for key, code in errors.items() if code not in (0, 3)]
            if failed:
                # UNKNOWN_TOPIC_OR_PARTITION (3) is a deleted topic: nothing to keep for it.
                raise OSError(f"group {group_id}: committing transactional offsets failed")
        header = {"k": TXN_OFFSETS_END_KIND, "g": group_id, "pid": producer_id, "c": commit}
        await self._store.wal.append(
            RecordType.CONTROL, header, on_durable=lambda: self._end(group_id, producer_id)
        )

    def unstable_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """The group's partitions with offsets pending in an open transaction."""
        return {key for offsets in self._pending.get(group_id, {}).values() for key in offsets}

    # -- state ---------------------------------------------------------------------------------

    def _add(self, group_id: str, producer_id: int, offsets: list[OffsetTuple]) -> None:
        mine = self._pending.setdefault(group_id, {}).setdefault(producer_id, {})
        for t, p, o, e, m in offsets:
            mine[(t, p)] = (t, p, o, e, m)

    def _end(self, group_id: str, producer_id: int) -> None:
        group = self._pending.get(group_id)
        if group is not None:
            group.pop(producer_id, None)
            if not group:
                del self._pending[group_id]

    def snapshot(self) -> dict[str, Any]:
        return {
            g: [[pid, [list(o) for o in offsets.values()]] for pid, offsets in by_pid.items()]
            for g, by_pid in self._pending.items()
        }

    def restore(self, section: dict[str, Any]) -> None:
        self._pending = {}
        for group_id, rows in section.items():
            for pid, offsets in rows:
                self._add(str(group_id), int(pid), [_offset(o) for o in offsets])

    def replay(self, header: dict[str, Any]) -> None:
        group_id, pid = str(header["g"]), int(header["pid"])
        if header["k"] == TXN_OFFSETS_KIND:
            self._add(group_id, pid, [_offset(o) for o in header["o"]])
        else:
            self._end(group_id, pid)


def _offset(row: list[Any]) -> OffsetTuple:
    t, p, o, e, m = row
    return (str(t), int(p), int(o), int(e), str(m))
