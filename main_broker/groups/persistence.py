"""Classic group membership kept on the main's WAL, so that the groups a main coordinates outlive
its restart (Kafka keeps them in __consumer_offsets as GroupMetadata records).

The coordinator (``group_coordinator``) tells a ``MembershipLog`` about each completed generation
(awaited: the members get their assignments only once it is durable), each group that became
Empty and each group that is gone. ``WalMembership`` writes them as ``classic_group`` CONTROL
records (``group_record``), through the same WAL writer and ``on_durable`` hook as the offset
commits; it keeps the last durable record of every group for the WAL snapshot, reads them
back on replay, and after replay rebuilds the groups in the coordinator. That bookkeeping
(``DurableGroupRecords``) keeps the KIP-848 groups' records too (``consumer_persistence``).

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

from main_broker.groups.classic import ClassicGroup, GroupState
from main_broker.groups.record import dead_header, decode_group, group_header, rebuild_group
from shared_wal import RecordType

if TYPE_CHECKING:
    from main_broker.groups.coordinator import GroupCoordinator
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


class DurableGroupRecords:
    """What the durable records of every group of one kind (``classic_group`` or
    ``consumer_group``) on a main's WAL add up to: what replay and the snapshot bring back,
    what a restarted coordinator rebuilds. Writes go through the WAL writer with
    ``on_durable``; the background ones are watched (their failures logged) by ``run``."""

    kind = ""

    def __init__(self, wal: WalWriter) -> None:
        self.wal = wal
        # Group id -> what its durable records add up to (gone ones dropped).
        self.durable: dict[str, Any] = {}
        self._nursery: trio.Nursery | None = None

    def _durable_after(self, header: Mapping[str, Any]) -> Any:
        """What the group's entry in ``durable`` becomes with this record (None: the group is
        gone); raises KeyError/TypeError/ValueError for one this broker cannot read."""
        raise NotImplementedError

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Hosts the background writes (their failures are logged); runs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- replay, snapshot (plain state) --------------------------------------------------------

    def load(self, header: Mapping[str, Any]) -> None:
        """A record from replay, a snapshot, or one that just became durable."""
        try:
            after = self._durable_after(header)
        except (KeyError, TypeError, ValueError) as exc:
            # Skipped alone: a snapshot holding it still restores everything else.
            log.error("skipping unreadable %s record %r: %r", self.kind, header.get("g"), exc)
            return
        if after is None:
            self.durable.pop(str(header["g"]), None)
        else:
            self.durable[str(header["g"])] = after

    # -- writing ------------------------------------------------------------------------------

    def _submit(
        self, header: dict[str, Any], applied: Callable[[], None] = lambda: None
    ) -> AppendTicket:
        def durable() -> None:
            self.load(header)
            applied()

        return self.wal.submit(RecordType.CONTROL, header, on_durable=durable)

    def _in_background(self, header: dict[str, Any]) -> AppendTicket | None:
        try:
            ticket = self._submit(header)
        except Exception:
            log.exception("group %s: recording its %s failed", header["g"], self.kind)
            return None
        self._watch_in_background(ticket, header)
        return ticket

    def _watch_in_background(self, ticket: AppendTicket, header: dict[str, Any]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._watch, ticket, header)

    async def _watch(self, ticket: AppendTicket, header: dict[str, Any]) -> None:
        try:
            await ticket.wait()
        except Exception:
            log.exception("group %s: recording it %s failed", header["g"], header.get("s", ""))


class WalMembership(DurableGroupRecords):
    """``MembershipLog`` on a main's WAL (``classic_group`` records), plus restore."""

    kind = "classic_group"

    def _durable_after(self, header: Mapping[str, Any]) -> dict[str, Any] | None:
        # The last record is the whole group.
        return None if decode_group(header).state is GroupState.DEAD else dict(header)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {gid: dict(h) for gid, h in self.durable.items()}

    def restore(self, coordinator: GroupCoordinator) -> int:
        """Rebuild every recorded group in the coordinator (start-up, after replay, on the
        event loop: sessions start now, and again when the main serves clients,
        `GroupCoordinator.renew_sessions`); returns how many."""
        now = trio.current_time()
        retention_s = coordinator.config.empty_group_retention_ms / 1000
        for header in self.durable.values():
            coordinator.adopt(rebuild_group(decode_group(header), now, retention_s))
        return len(self.durable)

    async def store_generation(
        self, g: ClassicGroup, assignments: Mapping[str, bytes], applied: Callable[[], None]
    ) -> None:
        await self._submit(group_header(g, assignments), applied).wait()

    def group_changed(self, g: ClassicGroup) -> None:
        self._in_background(group_header(g))

    def group_gone(self, group_id: str) -> None:
        self._in_background(dead_header(group_id))
