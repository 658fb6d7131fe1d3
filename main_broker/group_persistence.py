"""Classic group membership kept on the main's WAL, so that the groups a main coordinates outlive
its restart (Kafka keeps them in __consumer_offsets as GroupMetadata records).

The coordinator (``group_coordinator``) tells a ``MembershipLog`` about each completed generation
(awaited: the members get their assignments only once it is durable), each group that became
Empty and each group that is gone. ``WalMembership`` writes them as ``classic_group`` CONTROL
records (``group_record``), through the same WAL writer and ``on_durable`` hook as the offset
commits; it keeps the last durable record of every group for the WAL snapshot, reads them
back on replay, and after replay rebuilds the groups in the coordinator.

When a generation's record cannot be written, the members waiting in SyncGroup get
COORDINATOR_NOT_AVAILABLE (as from Kafka when it cannot store the group) and the group
rebalances; the offsets, written by their own records, are not touched. An Empty or Dead
record, or the record of a static member replaced in a Stable group, that fails is only
logged: after a restart the group comes back as its last durable record says (a replaced
static member's old id then; the new one gets UNKNOWN_MEMBER_ID and rejoins with its instance
id), and members that are gone expire after their session timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

from main_broker.classic_group import ClassicGroup, GroupState
from main_broker.group_record import dead_header, decode_group, group_header, rebuild_group
from shared_wal import RecordType

if TYPE_CHECKING:
    from main_broker.group_coordinator import GroupCoordinator
    from shared_wal import AppendTicket, WalWriter

log = logging.getLogger(__name__)


class MembershipLog(Protocol):
    async def store_generation(
        self, g: ClassicGroup, assignments: Mapping[str, bytes], applied: Callable[[], None]
    ) -> None:
        """Make the generation ``g`` is completing durable with these assignments; ``applied``
        runs as it becomes durable (not if it fails). Raises when it cannot be written."""

    def group_changed(self, g: ClassicGroup) -> None:
        """Record ``g`` as it is now (Empty, or Stable with other member ids), in the background."""

    def group_gone(self, group_id: str) -> None:
        """Record that the group is gone, in the background."""


class NoMembershipLog:
    """Membership kept in memory only (a coordinator without a WAL, as in unit tests)."""

    async def store_generation(
        self, g: ClassicGroup, assignments: Mapping[str, bytes], applied: Callable[[], None]
    ) -> None:
        applied()

    def group_changed(self, g: ClassicGroup) -> None:
        pass

    def group_gone(self, group_id: str) -> None:
        pass


class WalMembership:
    """``MembershipLog`` on a main's WAL, plus replay, snapshot and restore."""

    def __init__(self, wal: WalWriter) -> None:
        self.wal = wal
        # Group id -> its last durable record header (Dead ones dropped): what a snapshot holds.
        self.durable: dict[str, dict[str, Any]] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Hosts the background writes (their failures are logged); runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- replay, snapshot, restore (plain state) ----------------------------------------------

    def load(self, header: Mapping[str, Any]) -> None:
        """A ``classic_group`` record from replay, a snapshot, or one that just became durable."""
        try:
            record = decode_group(header)
        except (KeyError, TypeError, ValueError) as exc:
            # Skipped alone: a snapshot holding it still restores everything else.
            log.error("skipping unreadable classic_group record %r: %r", header.get("g"), exc)
            return
        if record.state is GroupState.DEAD:
            self.durable.pop(record.group_id, None)
        else:
            self.durable[record.group_id] = dict(header)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {gid: dict(h) for gid, h in self.durable.items()}

    def restore(self, coordinator: GroupCoordinator) -> int:
        """Rebuild every recorded group in the coordinator (start-up, after replay, on the
        event loop: sessions start now); returns how many."""
        now = trio.current_time()
        retention_s = coordinator.config.empty_group_retention_ms / 1000
        for header in self.durable.values():
            coordinator.adopt(rebuild_group(decode_group(header), now, retention_s))
        return len(self.durable)

    # -- writing ------------------------------------------------------------------------------

    def _submit(self, header: dict[str, Any], applied: Callable[[], None]) -> AppendTicket:
        def durable() -> None:
            self.load(header)
            applied()

        return self.wal.submit(RecordType.CONTROL, header, on_durable=durable)

    async def store_generation(
        self, g: ClassicGroup, assignments: Mapping[str, bytes], applied: Callable[[], None]
    ) -> None:
        await self._submit(group_header(g, assignments), applied).wait()

    def group_changed(self, g: ClassicGroup) -> None:
        self._in_background(group_header(g))

    def group_gone(self, group_id: str) -> None:
        self._in_background(dead_header(group_id))

    def _in_background(self, header: dict[str, Any]) -> None:
        try:
            ticket = self._submit(header, lambda: None)
        except Exception:
            log.exception("group %s: recording its membership failed", header["g"])
            return
        if self._nursery is not None:
            self._nursery.start_soon(self._watch, ticket, header)

    async def _watch(self, ticket: AppendTicket, header: dict[str, Any]) -> None:
        try:
            await ticket.wait()
        except Exception:
            log.exception("group %s: recording it %s failed", header["g"], header["s"])
