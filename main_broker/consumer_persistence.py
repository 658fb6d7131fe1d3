"""KIP-848 consumer groups kept on the main's WAL, so that the groups a main coordinates outlive
its restart (Kafka keeps them in __consumer_offsets as consumer group records).

The coordinator (``consumer_coordinator``) hands every group a heartbeat or timer may have
changed to a ``ConsumerGroupLog``. A record (``consumer_record``) is written only when the
group's record changed: a new epoch, a member joined, left or expired, an assignment, a
revocation or a subscription changed; a plain heartbeat writes nothing. A heartbeat's answer
waits for the record holding what it tells (a new epoch or assignment) to be durable, so a
restart never hands a partition a member was told it owns to another member. Expiries and
deletions are written in the background: a restart that lost one brings the member back, and
it expires again one session later; a group that lost its Dead record comes back empty.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

from main_broker.consumer_group import ConsumerGroup
from main_broker.consumer_record import consumer_header, dead_header, is_dead, rebuild_group
from main_broker.group_persistence import DurableGroupRecords

if TYPE_CHECKING:
    from main_broker.consumer_coordinator import ConsumerCoordinator
    from shared_wal import AppendTicket, WalWriter

log = logging.getLogger(__name__)


class ConsumerGroupLog(Protocol):
    async def store(self, g: ConsumerGroup) -> None:
        """Return once ``g`` as it is now is durable; raises when it cannot be written."""

    def changed(self, g: ConsumerGroup) -> None:
        """Record ``g`` as it is now, in the background."""

    def gone(self, group_id: str) -> None:
        """Record that the group is gone, in the background."""


class NoConsumerGroupLog:
    """Groups kept in memory only (a coordinator without a WAL, as in unit tests)."""

    async def store(self, g: ConsumerGroup) -> None:
        pass

    def changed(self, g: ConsumerGroup) -> None:
        pass

    def gone(self, group_id: str) -> None:
        pass


class WalConsumerGroups(DurableGroupRecords):
    """``ConsumerGroupLog`` on a main's WAL (``consumer_group`` records), plus restore."""

    kind = "consumer_group"

    def __init__(self, wal: WalWriter) -> None:
        super().__init__(wal)
        # Group id -> the last record submitted (durable or on its way) and its ticket (None:
        # durable since replay); a group whose record is unchanged writes nothing, and waits
        # for the record on its way.
        self._submitted: dict[str, tuple[dict[str, Any], AppendTicket | None]] = {}

    def is_dead(self, header: Mapping[str, Any]) -> bool:
        return is_dead(header)

    def restore(self, coordinator: ConsumerCoordinator) -> int:
        """Rebuild every recorded group in the coordinator (start-up, after replay, on the
        event loop: sessions start now; restored groups get no restart hold); returns how
        many."""
        now = trio.current_time()
        session_ms = coordinator.config.consumer_session_timeout_ms
        for gid, header in self.durable.items():
            coordinator.groups[gid] = rebuild_group(header, now, session_ms)
            self._submitted[gid] = (header, None)
        return len(self.durable)

    def _submit_changed(self, g: ConsumerGroup) -> AppendTicket | None:
        """Submits ``g``'s record when it differs from the last one (synchronously: submit
        order is the order of the changes); the ticket to wait for, or None."""
        header = consumer_header(g)
        last = self._submitted.get(g.group_id)
        if last is not None and last[0] == header:
            return last[1]
        ticket = self._submit(header)
        self._submitted[g.group_id] = (header, ticket)
        return ticket

    async def store(self, g: ConsumerGroup) -> None:
        ticket = self._submit_changed(g)
        if ticket is None:
            return
        try:
            await ticket.wait()
        except BaseException:
            last = self._submitted.get(g.group_id)
            if last is not None and last[1] is ticket:
                # The next heartbeat writes the group again.
                del self._submitted[g.group_id]
            raise

    def changed(self, g: ConsumerGroup) -> None:
        try:
            ticket = self._submit_changed(g)
        except Exception:
            log.exception("group %s: recording its consumer group failed", g.group_id)
            return
        if ticket is not None and not ticket.done:
            self._watch_in_background(ticket, {"g": g.group_id})

    def gone(self, group_id: str) -> None:
        self._submitted.pop(group_id, None)
        self._in_background(dead_header(group_id))
