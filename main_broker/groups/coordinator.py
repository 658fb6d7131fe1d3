"""Kafka's classic consumer-group coordinator: membership state machine, rebalance and session
timers, and the OffsetCommit/OffsetFetch entry points (offsets live in an ``OffsetTable``)."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from kafka_wire.acl.rules import ResourceType, authorized_operations
from main_broker.group_config import GroupConfig
from main_broker.groups.classic import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_ID_NOT_FOUND,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    ClassicGroup,
    ClassicMember,
    GroupState,
    Reply,
    join_response,
    sync_response,
)
from main_broker.groups.offsets import (
    CommittedOffset,
    OffsetCommitTuple,
    OffsetStore,
    OffsetTable,
    OffsetTuple,
    commit_response,
)
from main_broker.groups.persistence import MembershipLog, NoMembershipLog

__all__ = [
    "CommittedOffset",
    "GroupConfig",
    "GroupCoordinator",
    "GroupState",
    "OffsetStore",
    "OffsetTuple",
]

log = logging.getLogger(__name__)


class GroupCoordinator:
    """Classic group protocol for every group this broker coordinates."""

    def __init__(self, config: GroupConfig, store: OffsetStore) -> None:
        self.config = config
        self.store = store
        self._groups: dict[str, ClassicGroup] = {}
        self._wakeup = trio.Event()
        self._next_wake = -math.inf  # until run() starts, nobody needs waking
        self.offsets = OffsetTable(store)
        # Where membership is made durable (main_broker.groups.persistence).
        self.membership: MembershipLog = NoMembershipLog()
        # With several main brokers each group has one coordinator; the others refuse it.
        self.owns: Callable[[str], bool] = lambda group_id: True
        # A KIP-848 consumer group with members holds the id
        # (main_broker.groups.consumer_coordinator).
        self.consumer_in_use: Callable[[str], bool] = lambda group_id: False
        # A new classic group takes over the id from an empty KIP-848 group (offsets stay).
        self.drop_consumer: Callable[[str], None] = lambda group_id: None
        # The group's partitions with offsets an open transaction will commit
        # (main_broker.groups.txn_offsets): OffsetFetch with require_stable withholds them.
        self.unstable_offsets: Callable[[str], set[tuple[str, int]]] = lambda group_id: set()

    # ----------------------------------------------------------------- timers
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Fire session, rebalance, sync and cleanup deadlines forever."""
        task_status.started()
        while True:
            self._fire_timers(trio.current_time())
            self._next_wake = self._next_deadline()
            self._wakeup = trio.Event()
            with trio.move_on_at(self._next_wake):
                await self._wakeup.wait()

    def renew_sessions(self, now: float) -> None:
        """Starts every member's session again at `now`, the moment the main serves clients
        after a restart: the members of groups restored from the WAL could not heartbeat
        while it was starting (under load that took seconds), so their sessions run from
        when they can. A member whose session ends later keeps it."""
        for g in self._groups.values():
            for m in g.members.values():
                m.session_deadline = max(m.session_deadline, now + m.session_timeout_ms / 1000)

    def _arm(self, deadline: float) -> None:
        if deadline < self._next_wake:
            self._wakeup.set()

    def _next_deadline(self) -> float:
        best = math.inf
        for g in self._groups.values():
            for d in (g.join_deadline, g.sync_deadline, g.empty_deadline):
                if d is not None and d < best:
                    best = d
            for d in g.pending_members.values():
                best = min(best, d)
            for m in g.members.values():
                best = min(best, m.session_deadline)
        return best

    def _fire_timers(self, now: float) -> None:
        for g in list(self._groups.values()):
            for mid, expiry in list(g.pending_members.items()):
                if expiry <= now:
                    del g.pending_members[mid]
                    if g.state is GroupState.PREPARING_REBALANCE:
                        self._maybe_complete_join(g)
            for m in list(g.members.values()):
                if m.session_deadline > now or g.members.get(m.member_id) is not m:
                    continue
                if not m.is_new and (m.join_reply is not None or m.sync_reply is not None):
                    # Kafka keeps members alive while their join/sync is parked here.
                    m.session_deadline = now + m.session_timeout_ms / 1000
                    continue
                log.info("group %s: member %s session expired", g.group_id, m.member_id)
                self._remove_member_and_update(g, m)
            if g.join_deadline is not None and g.join_deadline <= now:
                self._on_join_timer(g, now)
            if g.sync_deadline is not None and g.sync_deadline <= now:
                g.sync_deadline = None
                for mid in list(g.pending_sync):
                    member = g.members.get(mid)
                    if member is not None:
                        log.info("group %s: member %s never synced", g.group_id, mid)
                        self._remove_member_and_update(g, member)
            if g.empty_deadline is not None and g.empty_deadline <= now:
                g.empty_deadline = None
                if (
                    g.state is GroupState.EMPTY
                    and not self.offsets.has_offsets(g.group_id)
                    and not g.pending_members
                ):
                    g.state = GroupState.DEAD
                    del self._groups[g.group_id]
                    self.membership.group_gone(g.group_id)

    def _on_join_timer(self, g: ClassicGroup, now: float) -> None:
        g.join_deadline = None
        if g.in_initial_delay and g.new_member_added and g.initial_remaining_s > 0:
            # New members keep arriving: wait another initial delay, within the rebalance timeout.
            delay = self.config.group_initial_rebalance_delay_ms / 1000
            g.new_member_added = False
            g.join_deadline = now + min(delay, g.initial_remaining_s)
            g.initial_remaining_s = max(g.initial_remaining_s - delay, 0.0)
            return
        self._complete_join(g)

    # ------------------------------------------------------------- rebalance
    def _set_empty(self, g: ClassicGroup) -> None:
        g.state = GroupState.EMPTY
        g.empty_deadline = trio.current_time() + self.config.empty_group_retention_ms / 1000
        self._arm(g.empty_deadline)

    def _prepare_rebalance(self, g: ClassicGroup) -> None:
        if g.state is GroupState.COMPLETING_REBALANCE:
            for m in g.members.values():
                m.assignment = b""
                if m.sync_reply is not None:
                    m.sync_reply.send(sync_response(REBALANCE_IN_PROGRESS))
                    m.sync_reply = None
        g.pending_sync.clear()
        g.sync_deadline = None
        g.empty_deadline = None
        now = trio.current_time()
        timeout = g.rebalance_timeout_s()
        if g.state is GroupState.EMPTY:
            delay = self.config.group_initial_rebalance_delay_ms / 1000
            g.in_initial_delay = True
            g.new_member_added = False
            g.initial_remaining_s = max(timeout - delay, 0.0)
            g.join_deadline = now + min(delay, timeout)
        else:
            g.in_initial_delay = False
            g.join_deadline = now + timeout
        g.state = GroupState.PREPARING_REBALANCE
        g.rebalance_started = now
        self._arm(g.join_deadline)

    def _maybe_prepare_rebalance(self, g: ClassicGroup) -> None:
        if g.state in (GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(g)
        self._maybe_complete_join(g)

    def _maybe_complete_join(self, g: ClassicGroup) -> None:
        if (
            g.state is GroupState.PREPARING_REBALANCE
            and not g.in_initial_delay
            and not g.pending_members
            and all(m.join_reply is not None for m in g.members.values())
        ):
            self._complete_join(g)

    def _complete_join(self, g: ClassicGroup) -> None:
        g.join_deadline = None
        g.in_initial_delay = False
        for m in list(g.members.values()):
            if m.join_reply is None and m.group_instance_id is None:
                self._remove_member(g, m)
        joined = [m for m in g.members.values() if m.join_reply is not None]
        now = trio.current_time()
        if not joined and g.members:
            # Only static members that have not rejoined: wait for them or their session expiry.
            g.join_deadline = now + max(g.rebalance_timeout_s(), 0.01)
            self._arm(g.join_deadline)
            return
        if g.leader_id not in {m.member_id for m in joined}:
            g.leader_id = joined[0].member_id if joined else None
        g.generation += 1
        if not g.members:
            g.protocol_name = None
            self._set_empty(g)
            self.membership.group_changed(g)
            return
        g.protocol_name = g.select_protocol()
        g.state = GroupState.COMPLETING_REBALANCE
        for m in g.members.values():
            if m.join_reply is not None:
                members = g.member_list() if m.member_id == g.leader_id else []
                m.join_reply.send(join_response(NONE, m.member_id, g, members))
                m.join_reply = None
            m.is_new = False
            m.session_deadline = now + m.session_timeout_ms / 1000
            g.pending_sync.add(m.member_id)
        g.sync_deadline = now + g.rebalance_timeout_s()
        self._arm(g.sync_deadline)
        log.info(
            "group %s: generation %d joined by %d members %.3f s after its rebalance began",
            g.group_id,
            g.generation,
            len(joined),
            now - g.rebalance_started,
        )

    def _remove_member(self, g: ClassicGroup, m: ClassicMember) -> None:
        del g.members[m.member_id]
        if (
            m.group_instance_id is not None
            and g.static_members.get(m.group_instance_id) == m.member_id
        ):
            del g.static_members[m.group_instance_id]
        g.pending_sync.discard(m.member_id)
        if g.leader_id == m.member_id:
            g.leader_id = next(iter(g.members), None)

    def _remove_member_and_update(
        self, g: ClassicGroup, m: ClassicMember, error: int = UNKNOWN_MEMBER_ID
    ) -> None:
        if m.join_reply is not None:
            m.join_reply.send(join_response(error, m.member_id))
            m.join_reply = None
        if m.sync_reply is not None:
            m.sync_reply.send(sync_response(error))
            m.sync_reply = None
        self._remove_member(g, m)
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(g)
        elif g.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(g)

    def _validate_member(
        self,
        g: ClassicGroup,
        member_id: str,
        instance_id: str | None,
        generation: int | None = None,
    ) -> int:
        if instance_id is not None and g.static_members.get(instance_id, member_id) != member_id:
            return FENCED_INSTANCE_ID
        if member_id not in g.members:
            return UNKNOWN_MEMBER_ID
        if generation is not None and generation != g.generation:
            return ILLEGAL_GENERATION
        return NONE

    def _heartbeat(self, m: ClassicMember) -> None:
        m.session_deadline = trio.current_time() + m.session_timeout_ms / 1000

    # ------------------------------------------------------------- JoinGroup
    async def join_group(
        self,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """JoinGroup; returns the response dict once the rebalance completes (or at once)."""
        cfg = self.config
        if not group_id:
            return join_response(INVALID_GROUP_ID, member_id)
        if not self.owns(group_id):
            return join_response(NOT_COORDINATOR, member_id)
        if (
            not cfg.group_min_session_timeout_ms
            <= session_timeout_ms
            <= cfg.group_max_session_timeout_ms
        ):
            return join_response(INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        if self.consumer_in_use(group_id):
            return join_response(INCONSISTENT_GROUP_PROTOCOL, member_id)
        self.drop_consumer(group_id)
        g = self._groups.get(group_id)
        if g is None:
            if member_id:
                return join_response(UNKNOWN_MEMBER_ID, member_id)
            g = self._groups[group_id] = ClassicGroup(group_id)
            self._set_empty(g)
        if reason:
            log.debug("group %s: join by %r: %s", group_id, member_id, reason)
        spec = ClassicMember(
            member_id=member_id,
            group_instance_id=group_instance_id,
            client_id=client_id,
            client_host=client_host,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            protocol_type=protocol_type,
            protocols=list(protocols),
            session_deadline=0.0,
        )
        if not member_id:
            result = self._join_new_member(g, spec, require_known_member_id)
        else:
            result = self._join_known_member(g, spec)
        if g.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(g)
        return result if isinstance(result, dict) else await result.wait()

    def _join_new_member(
        self, g: ClassicGroup, spec: ClassicMember, require_known: bool
    ) -> dict[str, Any] | Reply:
        instance = spec.group_instance_id
        old_id = g.static_members.get(instance) if instance is not None else None
        # A restarted static member is checked against the others, not against its old self.
        if not g.supports(spec.protocol_type, spec.protocols, old_id or ""):
            return join_response(INCONSISTENT_GROUP_PROTOCOL, "")
        spec.member_id = f"{spec.client_id}-{uuid.uuid4()}"
        if old_id is not None:
            return self._replace_static_member(g, g.members[old_id], spec)
        if len(g.members) + len(g.pending_members) >= self.config.group_max_size:
            return join_response(GROUP_MAX_SIZE_REACHED, "")
        if spec.group_instance_id is None and require_known:
            # KIP-394: hand out the id first, so a client that never reads the answer adds nobody.
            expiry = trio.current_time() + spec.session_timeout_ms / 1000
            g.pending_members[spec.member_id] = expiry
            self._arm(expiry)
            return join_response(MEMBER_ID_REQUIRED, spec.member_id)
        return self._add_member_and_rebalance(g, spec)

    def _join_known_member(self, g: ClassicGroup, spec: ClassicMember) -> dict[str, Any] | Reply:
        mid = spec.member_id
        if mid in g.pending_members and spec.group_instance_id is None:
            if not g.supports(spec.protocol_type, spec.protocols, mid):
                return join_response(INCONSISTENT_GROUP_PROTOCOL, mid)
            del g.pending_members[mid]
            return self._add_member_and_rebalance(g, spec)
        error = self._validate_member(g, mid, spec.group_instance_id)
        if error != NONE:
            return join_response(error, mid)
        if not g.supports(spec.protocol_type, spec.protocols, mid):
            return join_response(INCONSISTENT_GROUP_PROTOCOL, mid)
        m = g.members[mid]
        unchanged = m.protocols == spec.protocols and m.protocol_type == spec.protocol_type
        if g.state is GroupState.COMPLETING_REBALANCE and unchanged:
            # It probably lost the JoinGroup response: give it the current generation again.
            members = g.member_list() if mid == g.leader_id else []
            return join_response(NONE, mid, g, members)
        if g.state is GroupState.STABLE and unchanged and mid != g.leader_id:
            return join_response(NONE, mid, g)
        m.protocols = spec.protocols
        m.protocol_type = spec.protocol_type
        m.session_timeout_ms = spec.session_timeout_ms
        m.rebalance_timeout_ms = spec.rebalance_timeout_ms
        reply = m.join_reply = m.join_reply or Reply()
        self._maybe_prepare_rebalance(g)
        return reply

    def _add_member_and_rebalance(self, g: ClassicGroup, spec: ClassicMember) -> Reply:
        now = trio.current_time()
        spec.session_deadline = now + self.config.new_member_join_timeout_ms / 1000
        # Kept here: the rebalance may complete (and clear spec.join_reply) before we return.
        reply = spec.join_reply = Reply()
        if not g.members:
            g.protocol_type = spec.protocol_type
        if g.state is GroupState.PREPARING_REBALANCE and g.generation == 0:
            g.new_member_added = True
        g.members[spec.member_id] = spec
        if spec.group_instance_id is not None:
            g.static_members[spec.group_instance_id] = spec.member_id
        if g.leader_id is None:
            g.leader_id = spec.member_id
        self._arm(spec.session_deadline)
        self._maybe_prepare_rebalance(g)
        return reply

    def _replace_static_member(
        self, g: ClassicGroup, old: ClassicMember, spec: ClassicMember
    ) -> dict[str, Any] | Reply:
        """KIP-345: a known instance id rejoined with a new member id; fence the old one."""
        assert spec.group_instance_id is not None
        for reply, resp in (
            (old.join_reply, join_response(FENCED_INSTANCE_ID, old.member_id)),
            (old.sync_reply, sync_response(FENCED_INSTANCE_ID)),
        ):
            if reply is not None:
                reply.send(resp)
        unchanged = old.protocols == spec.protocols and old.protocol_type == spec.protocol_type
        old_leader = g.leader_id
        spec.assignment = old.assignment
        spec.is_new = False
        self._heartbeat(spec)
        # Keep the member's position in the group's join order.
        g.members = {(spec.member_id if k == old.member_id else k): v for k, v in g.members.items()}
        g.members[spec.member_id] = spec
        g.static_members[spec.group_instance_id] = spec.member_id
        if g.pending_sync and old.member_id in g.pending_sync:
            g.pending_sync.discard(old.member_id)
            g.pending_sync.add(spec.member_id)
        if g.leader_id == old.member_id:
            g.leader_id = spec.member_id
        if g.state is GroupState.STABLE and unchanged:
            self.membership.group_changed(g)
            # The old leader id is returned so that nobody runs a pointless assignment.
            resp = join_response(NONE, spec.member_id, g)
            resp["leader"] = old_leader or ""
            return resp
        spec.join_reply = Reply()
        if g.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(g)
        return spec.join_reply

    # ------------------------------------------------------ Sync / Heartbeat
    async def sync_group(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: Sequence[tuple[str, bytes]] = (),
    ) -> dict[str, Any]:
        """SyncGroup; followers wait here until the leader has sent the assignments."""
        if not group_id:
            return sync_response(INVALID_GROUP_ID)
        if not self.owns(group_id):
            return sync_response(NOT_COORDINATOR)
        g = self._groups.get(group_id)
        if g is None:
            return sync_response(UNKNOWN_MEMBER_ID)
        error = self._validate_member(g, member_id, group_instance_id, generation_id)
        if error == NONE and (
            (protocol_type is not None and protocol_type != g.protocol_type)
            or (protocol_name is not None and protocol_name != g.protocol_name)
        ):
            error = INCONSISTENT_GROUP_PROTOCOL
        if error != NONE:
            return sync_response(error)
        if g.state is GroupState.PREPARING_REBALANCE:
            return sync_response(REBALANCE_IN_PROGRESS)
        m = g.members[member_id]
        g.pending_sync.discard(member_id)
        self._heartbeat(m)
        if g.state is GroupState.STABLE:
            return sync_response(NONE, g, m.assignment)
        if m.sync_reply is not None:
            m.sync_reply.send(sync_response(REBALANCE_IN_PROGRESS))
        reply = m.sync_reply = Reply()
        if member_id == g.leader_id:
            given, gen = dict(assignments), g.generation
            try:
                # Handed out as the generation becomes durable, even if this call is cancelled
                # meanwhile (a failure nobody sees leaves it to the sync deadline).
                await self.membership.store_generation(g, given, lambda: g.hand_out(gen, given))
            except Exception:
                log.exception("group %s: storing generation %d failed", group_id, gen)
                if g.refuse_sync(gen, COORDINATOR_NOT_AVAILABLE):
                    self._maybe_prepare_rebalance(g)
        return await reply.wait()

    async def heartbeat(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> dict[str, Any]:
        """Heartbeat: keeps the session alive and tells members about a rebalance."""
        if not group_id:
            return {"error_code": INVALID_GROUP_ID}
        if not self.owns(group_id):
            return {"error_code": NOT_COORDINATOR}
        g = self._groups.get(group_id)
        if g is None:
            return {"error_code": UNKNOWN_MEMBER_ID}
        error = self._validate_member(g, member_id, group_instance_id, generation_id)
        if error == NONE:
            self._heartbeat(g.members[member_id])
            if g.state is GroupState.PREPARING_REBALANCE:
                error = REBALANCE_IN_PROGRESS
        return {"error_code": error}

    async def leave_group(
        self, *, group_id: str, members: Sequence[tuple[str, str | None]], reason: str | None = None
    ) -> dict[str, Any]:
        """LeaveGroup for a batch of (member_id, group_instance_id)."""
        if not group_id:
            return {"error_code": INVALID_GROUP_ID, "members": []}
        if not self.owns(group_id):
            return {"error_code": NOT_COORDINATOR, "members": []}
        g = self._groups.get(group_id)
        results = []
        for member_id, instance_id in members:
            error = NONE
            if g is None:
                error = UNKNOWN_MEMBER_ID
            elif not member_id:
                current = g.static_members.get(instance_id) if instance_id is not None else None
                if current is None:
                    error = UNKNOWN_MEMBER_ID
                else:
                    self._remove_member_and_update(g, g.members[current])
            elif member_id in g.pending_members:
                del g.pending_members[member_id]
                self._maybe_complete_join(g)
            else:
                error = self._validate_member(g, member_id, instance_id)
                if error == NONE:
                    self._remove_member_and_update(g, g.members[member_id])
            results.append(
                {"member_id": member_id, "group_instance_id": instance_id, "error_code": error}
            )
        if reason:
            log.debug("group %s: leave: %s", group_id, reason)
        return {"error_code": NONE, "members": results}

    # --------------------------------------------------------------- offsets
    async def commit_offsets(
        self,
        *,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Sequence[OffsetCommitTuple],
    ) -> dict[str, Any]:
        """OffsetCommit; returns {"topics": [{name, partitions: [{partition_index, error_code}]}]}.

        Offsets are (topic, partition, offset, leader_epoch, metadata or None)."""
        g = self._groups.get(group_id)
        error = NONE
        if not self.owns(group_id):
            error = NOT_COORDINATOR
        elif g is None:
            if generation_id < 0:
                g = self._groups[group_id] = ClassicGroup(group_id)
                self._set_empty(g)
            else:
                error = ILLEGAL_GENERATION
        else:
            error = g.commit_error(generation_id, member_id, group_instance_id)
            if error == NONE and member_id in g.members:
                self._heartbeat(g.members[member_id])
        if error != NONE:
            errors = {(topic, partition): error for topic, partition, *_ in offsets}
        else:
            errors = await self.offsets.commit(
                group_id, offsets, self.config.offset_metadata_max_bytes
            )
            if NONE in errors.values():
                # The group may have expired while the store was persisting; offsets need one.
                self._ensure_group(group_id)
        return commit_response(errors)

    def adopt(self, g: ClassicGroup) -> None:
        """A group rebuilt from its durable record (start-up, before ``run``: no arming)."""
        self._groups[g.group_id] = g

    def _ensure_group(self, group_id: str) -> None:
        if group_id not in self._groups:
            self._groups[group_id] = ClassicGroup(group_id)

    def load_offsets(self, group_id: str, offsets: Iterable[OffsetTuple]) -> None:
        """Replay durable offsets (broker start-up, before serving)."""
        self._ensure_group(group_id)
        self.offsets.load(group_id, offsets)

    def committed_offsets(self) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
        return self.offsets.committed()

    def delete_topic_offsets(self, topic: str) -> None:
        self.offsets.delete_topic(topic)
        for g in self._groups.values():
            if (
                not self.offsets.has_offsets(g.group_id)
                and g.state is GroupState.EMPTY
                and g.empty_deadline is None
            ):
                self._set_empty(g)

    def fetch_offsets(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]] | None
    ) -> dict[str, Any]:
        """OffsetFetch for one group; ``topics=None`` means every partition it has offsets for."""
        if not self.owns(group_id):
            return {"error_code": NOT_COORDINATOR, "topics": []}
        return self.offsets.fetch(group_id, topics)

    # ------------------------------------------------------- group admin
    def group(self, group_id: str) -> ClassicGroup | None:
        return self._groups.get(group_id)

    def in_use(self, group_id: str) -> bool:
        """Members (or members about to join) hold the group id."""
        g = self._groups.get(group_id)
        return g is not None and bool(g.members or g.pending_members)

    def forget_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None) -> None:
        """Replay of a deleted group (``partitions=None``) or of an OffsetDelete."""
        self.offsets.forget(group_id, partitions)
        if partitions is None and not self.in_use(group_id):
            self.remove_group(group_id)

    def remove_group(self, group_id: str) -> None:
        g = self._groups.pop(group_id, None)
        if g is not None:
            g.state = GroupState.DEAD

    # ------------------------------------------------------ List / Describe
    def list_groups(
        self, states_filter: Sequence[str] = (), types_filter: Sequence[str] = ()
    ) -> dict[str, Any]:
        states = {s.lower() for s in states_filter}
        types = {t.lower() for t in types_filter}
        groups = [
            g.listed()
            for g in self._groups.values()
            if g.state is not GroupState.DEAD
            and (not states or g.state.value.lower() in states)
            and (not types or "classic" in types)
        ]
        return {"error_code": NONE, "groups": groups}

    def describe_groups(
        self,
        group_ids: Sequence[str],
        include_authorized_operations: bool = False,
        not_found_error: bool = False,
    ) -> dict[str, Any]:
        """DescribeGroups; a group this coordinator does not have is "Dead", and with
        `not_found_error` (v6+, KIP-1043) fails with GROUP_ID_NOT_FOUND, as Kafka answers."""
        ops = authorized_operations(ResourceType.GROUP, include_authorized_operations)
        out = []
        for gid in group_ids:
            g = self._groups.get(gid)
            desc: dict[str, Any] = {
                "error_code": (
                    INVALID_GROUP_ID if not gid else NONE if self.owns(gid) else NOT_COORDINATOR
                ),
                "error_message": None,
                "group_id": gid,
                "group_state": GroupState.DEAD.value,
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
                "authorized_operations": ops,
            }
            if g is not None and gid and desc["error_code"] == NONE:
                desc.update(g.described())
            elif not_found_error and desc["error_code"] == NONE:
                desc["error_code"] = GROUP_ID_NOT_FOUND
                desc["error_message"] = f"Group {gid} not found."
            out.append(desc)
        return {"groups": out}
