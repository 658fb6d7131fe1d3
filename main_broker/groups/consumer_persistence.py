"""KIP-848 consumer groups kept on the main's WAL, so that the groups a main coordinates outlive
its restart (Kafka keeps them in __consumer_offsets as consumer group records).

The coordinator (``consumer_coordinator``) hands every group a heartbeat or timer may have
changed to a ``ConsumerGroupLog``. A record (``consumer_record``) is written only when
something a restart must keep changed, and holds only the members that changed: a new epoch,
a member joining, leaving or expiring, an assignment, a revocation or a subscription; a plain
heartbeat writes nothing. A heartbeat's answer waits for the record holding what it tells (a
new epoch or assignment) to be durable, so a restart never hands a partition a member was told
it owns to another member. Expiries and deletions are written in the background: a restart
that lost one brings the member back, and it expires again one session later; a group that
lost its Dead record comes back empty.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from main_broker.groups.consumer_group import ConsumerGroup
from main_broker.groups.consumer_record import (
    StoredGroup,
    apply_record,
    dead_header,
    group_fields,
    is_dead,
    member_row,
    rebuild_group,
    record_header,
)
from main_broker.groups.persistence import DurableGroupRecords

if TYPE_CHECKING:
    from main_broker.groups.consumer_coordinator import ConsumerCoordinator
    from shared_wal import AppendTicket, WalWriter

log = logging.getLogger(__name__)


class ConsumerGroupLog(Protocol):
    async def store(self, g: ConsumerGroup, member_id: str | None = None) -> None:
        """Return once ``g`` as it is now is durable; raises when it cannot be written.
        ``member_id``: the member whose heartbeat changed it (nothing else changed unless
        the epochs or the member ids did)."""

    def changed(self, g: ConsumerGroup) -> None:
        """Record ``g`` as it is now, in the background."""

    def gone(self, group_id: str) -> None:
        """Record that the group is gone, in the background."""


class NoConsumerGroupLog:
    """Groups kept in memory only (a coordinator without a WAL, as in unit tests)."""

    async def store(self, g: ConsumerGroup, member_id: str | None = None) -> None:
        pass

    def changed(self, g: ConsumerGroup) -> None:
        pass

    def gone(self, group_id: str) -> None:
        pass


@dataclass
class _Submitted:
    """A group as its records submitted so far (durable or on their way) leave it."""

    fields: dict[str, Any]
    rows: dict[str, list[Any]]
    ticket: AppendTicket | None  # the last one's (None: durable since replay)


class WalConsumerGroups(DurableGroupRecords):
    """``ConsumerGroupLog`` on a main's WAL (``consumer_group`` records), plus restore."""

    kind = "consumer_group"

    def __init__(self, wal: WalWriter) -> None:
        super().__init__(wal)
        self.durable: dict[str, StoredGroup] = {}
        self._submitted: dict[str, _Submitted] = {}

    def _durable_after(self, header: Mapping[str, Any]) -> StoredGroup | None:
        if is_dead(header):
            return None
        return apply_record(self.durable.get(str(header["g"])), header)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {gid: stored.header() for gid, stored in self.durable.items()}

    def restore(self, coordinator: ConsumerCoordinator) -> int:
        """Rebuild every recorded group in the coordinator (start-up, after replay, on the
        event loop: sessions start now, and again when the main serves clients,
        `ConsumerCoordinator.renew_sessions`; restored groups get no restart hold); returns
        how many."""
        now = trio.current_time()
        session_ms = coordinator.config.consumer_session_timeout_ms
        for gid, stored in self.durable.items():
            coordinator.groups[gid] = rebuild_group(stored, now, session_ms)
            self._submitted[gid] = _Submitted(
                {k: stored.fields[k] for k in ("ge", "ae", "a", "sm")}, dict(stored.rows), None
            )
        return len(self.durable)

    def _submit_changed(self, g: ConsumerGroup, member_id: str | None) -> AppendTicket | None:
        """Submits a record of what changed in ``g`` since the last one (synchronously: submit
        order is the order of the changes); the ticket to wait for, or None."""
        gid = g.group_id
        fields = group_fields(g)
        last = self._submitted.get(gid)
        if last is None:
            rows = {mid: member_row(g, m) for mid, m in g.members.items()}
            ticket = self._submit(record_header(gid, fields, rows.values(), full=True))
            self._submitted[gid] = _Submitted(fields, rows, ticket)
            return ticket
        member = g.members.get(member_id) if member_id is not None else None
        if (
            member is not None
            and fields == last.fields
            and len(g.members) == len(last.rows)
            and member.member_id in last.rows
        ):
            # A heartbeat changes the row of the member it serves only, unless it changed the
            # epochs (a new target) or the member ids (a join, a leave, a static member
            # replaced): consumer_group's reconciliation touches no other member. So the
            # group's other rows need not be built.
            changed = {member.member_id: member_row(g, member)}
            left: list[str] = []
        else:
            rows = {mid: member_row(g, m) for mid, m in g.members.items()}
            changed = rows
            left = [mid for mid in last.rows if mid not in rows]
        changed = {mid: row for mid, row in changed.items() if last.rows.get(mid) != row}
        if not changed and not left and fields == last.fields:
            return last.ticket
        ticket = self._submit(record_header(gid, fields, changed.values(), left))
        last.fields = fields
        last.rows.update(changed)
        for mid in left:
            del last.rows[mid]
        last.ticket = ticket
        return ticket

    async def store(self, g: ConsumerGroup, member_id: str | None = None) -> None:
        ticket = self._submit_changed(g, member_id)
        if ticket is None:
            return
        try:
            await ticket.wait()
        except BaseException:
            last = self._submitted.get(g.group_id)
            if last is not None and last.ticket is ticket:
                # The next change writes the whole group again.
                del self._submitted[g.group_id]
            raise

    def changed(self, g: ConsumerGroup) -> None:
        try:
            ticket = self._submit_changed(g, None)
        except Exception:
            self._submitted.pop(g.group_id, None)
            log.exception("group %s: recording its consumer group failed", g.group_id)
            return
        if ticket is not None and not ticket.done:
            self._watch_in_background(ticket, {"g": g.group_id})

    def gone(self, group_id: str) -> None:
        self._submitted.pop(group_id, None)
        self._in_background(dead_header(group_id))
