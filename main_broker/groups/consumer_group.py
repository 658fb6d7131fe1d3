"""One KIP-848 consumer group: members, epochs, the target assignment and reconciliation.

Pure state with no I/O and no clock of its own: callers pass ``now`` (seconds) and the topics
that exist. ``main_broker.groups.consumer_coordinator`` drives it from requests and timers.

The rules (KIP-848):
- every change of membership, subscription or subscribed topic metadata bumps the group epoch,
  and the target assignment is recomputed for that epoch;
- a member moves to the target epoch only once it holds no partition the target takes away:
  first it is told to revoke them (keeping its epoch), and it acknowledges by heartbeating with
  an owned-partition list without them;
- a partition is handed to its new owner only after the previous owner released it, so no
  partition is ever assigned to two members at once.
"""

from __future__ import annotations

import enum
import functools
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import re2
from kio.schema.errors import ErrorCode

from main_broker.groups.consumer_assignor import ASSIGNORS, DEFAULT_ASSIGNOR, Assignment, assign

NONE = int(ErrorCode.none)
UNKNOWN_MEMBER_ID = int(ErrorCode.unknown_member_id)
FENCED_MEMBER_EPOCH = int(ErrorCode.fenced_member_epoch)
FENCED_INSTANCE_ID = int(ErrorCode.fenced_instance_id)
UNRELEASED_INSTANCE_ID = int(ErrorCode.unreleased_instance_id)
UNSUPPORTED_ASSIGNOR = int(ErrorCode.unsupported_assignor)
INVALID_REQUEST = int(ErrorCode.invalid_request)
INVALID_REGULAR_EXPRESSION = int(ErrorCode.invalid_regular_expression)
STALE_MEMBER_EPOCH = int(ErrorCode.stale_member_epoch)
UNSUPPORTED_VERSION = int(ErrorCode.unsupported_version)

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

TopicPartition = tuple[str, int]


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a client's bad pattern is answered, not logged by RE2


@functools.lru_cache(maxsize=1024)
def topic_regex(pattern: str) -> re2._Regexp:
    """A member's SubscribedTopicRegex, compiled as Kafka does with RE2 (RE2J): linear time,
    so a pattern like (a+)+b cannot stall the event loop on a long topic name as Python's
    backtracking `re` would; raises re2.error for one RE2 refuses (backreferences...)."""
    return re2.compile(pattern, _RE2_OPTIONS)


def regex_error(pattern: str) -> str | None:
    """Kafka's INVALID_REGULAR_EXPRESSION message for a pattern RE2 refuses, or None."""
    try:
        topic_regex(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        return f"SubscribedTopicRegex `{pattern}` is not a valid regular expression: {reason}."
    return None


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass
class HeartbeatInput:
    """A ConsumerGroupHeartbeat with topic names (the edge resolves topic ids)."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: Sequence[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    # What the member owns now; None when unchanged since its last heartbeat.
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass
class HeartbeatResult:
    error_code: int
    member_id: str
    member_epoch: int
    error_message: str | None = None
    # The member's whole current assignment, or None when it has not changed.
    assignment: Assignment | None = None


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_names: tuple[str, ...]
    subscribed_regex: str | None
    server_assignor: str | None
    rebalance_timeout_ms: int
    session_deadline: float
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    revoke_deadline: float | None = None
    # The assignment the member was last sent: an unchanged one is left out of answers.
    sent: Assignment | None = None

    def subscribed(self, topics: Mapping[str, int]) -> frozenset[str]:
        names = {t for t in self.subscribed_names if t in topics}
        if self.subscribed_regex:
            pattern = topic_regex(self.subscribed_regex)
            names.update(t for t in topics if pattern.fullmatch(t))
        return frozenset(names)


def new_member_id() -> str:
    """Kafka's Uuid.toString form: 22 characters of URL-safe base64."""
    return urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _pairs(a: Assignment) -> set[TopicPartition]:
    return {(t, p) for t, ps in a.items() for p in ps}


def _assignment(pairs: set[TopicPartition]) -> Assignment:
    out: dict[str, set[int]] = {}
    for t, p in pairs:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in sorted(out.items())}


class ConsumerGroup:
    def __init__(self, group_id: str, session_timeout_ms: int) -> None:
        self.group_id = group_id
        self.session_timeout_s = session_timeout_ms / 1000
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.assignor_name = DEFAULT_ASSIGNOR
        self.members: dict[str, ConsumerMember] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, Assignment] = {}
        self.subscription_metadata: dict[str, int] = {}
        self._dirty = False  # membership or subscriptions changed since the last epoch
        # Until then no partition is handed out: members of a group's life before the
        # coordinator restarted that was not restored may still hold them (consumer_coordinator).
        self.hold_until = float("-inf")
        # Who holds each partition now (assigned or still revoking it).
        self.owner: dict[TopicPartition, str] = {}

    # -------------------------------------------------------------------- views
    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(
            m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members.values()
            if m.member_epoch != STATIC_LEAVE_EPOCH
        ):
            return "Reconciling"
        return "Stable"

    def subscribed_topics(self) -> set[str]:
        return set(self.subscription_metadata)

    def validate_commit(
        self, member_id: str, member_epoch: int, commit_version: int | None = None
    ) -> int:
        """OffsetCommit (`commit_version`: its request version) or OffsetFetch by a member:
        its current epoch is its generation. Kafka's order: the member, then the version (a
        KIP-848 member commits with v9+), then the epoch."""
        if member_epoch < 0 and not member_id and not self.members:
            return NONE  # an admin or a consumer without group management, on an empty group
        member = self.members.get(member_id)
        if member is None:
            return UNKNOWN_MEMBER_ID
        if commit_version is not None and commit_version < 9:
            return UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return STALE_MEMBER_EPOCH
        return NONE

    # --------------------------------------------------------------- heartbeat
    def heartbeat(
        self, req: HeartbeatInput, topics: Mapping[str, int], now: float
    ) -> HeartbeatResult:
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, topics)
        if req.server_assignor is not None and req.server_assignor not in ASSIGNORS:
            return self._error(req, UNSUPPORTED_ASSIGNOR, f"unknown assignor {req.server_assignor}")
        if req.subscribed_topic_regex:
            bad = regex_error(req.subscribed_topic_regex)
            if bad is not None:
                return self._error(req, INVALID_REGULAR_EXPRESSION, bad)
        joining = req.member_epoch == 0
        if joining:
            result = self._join(req, now)
            if isinstance(result, HeartbeatResult):
                return result
            member = result
        else:
            found = self._existing(req)
            if isinstance(found, HeartbeatResult):
                return found
            member = found
            if self._update_subscription(member, req):
                self._dirty = True
        member.session_deadline = now + self.session_timeout_s
        self._refresh_target(topics)
        self._reconcile(member, req.owned, now)
        # As Kafka: the assignment goes out when it changed, or to a full request (a join, or
        # a member resyncing after an error, which sends every optional field); and to a member
        # behind on its epoch (it missed our last answer, e.g. one cut off by a restart).
        changed = (
            member.sent is None
            or _pairs(member.sent) != _pairs(member.assigned)
            or req.member_epoch != member.member_epoch
        )
        full = joining or (
            req.rebalance_timeout_ms != -1
            and req.subscribed_topic_names is not None
            and req.owned is not None
        )
        member.sent = dict(member.assigned)
        return HeartbeatResult(
            NONE,
            member.member_id,
            member.member_epoch,
            assignment=dict(member.assigned) if changed or full else None,
        )

    def _error(self, req: HeartbeatInput, code: int, message: str | None = None) -> HeartbeatResult:
        return HeartbeatResult(code, req.member_id, req.member_epoch, message)

    def _join(self, req: HeartbeatInput, now: float) -> ConsumerMember | HeartbeatResult:
        if req.subscribed_topic_names is None and not req.subscribed_topic_regex:
            return self._error(req, INVALID_REQUEST, "a joining member must subscribe")
        if req.rebalance_timeout_ms < 0:
            return self._error(
                req, INVALID_REQUEST, "a joining member must give RebalanceTimeoutMs"
            )
        member_id = req.member_id or new_member_id()
        spec = ConsumerMember(
            member_id=member_id,
            instance_id=req.instance_id,
            rack_id=req.rack_id,
            client_id=req.client_id,
            client_host=req.client_host,
            subscribed_names=tuple(req.subscribed_topic_names or ()),
            subscribed_regex=req.subscribed_topic_regex or None,
            server_assignor=req.server_assignor,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_deadline=now + self.session_timeout_s,
        )
        if req.instance_id is not None and req.instance_id in self.static:
            old = self.members[self.static[req.instance_id]]
            if old.member_id != member_id and old.member_epoch != STATIC_LEAVE_EPOCH:
                return self._error(
                    req, UNRELEASED_INSTANCE_ID, f"instance {req.instance_id} is still in use"
                )
            return self._replace_static(old, spec)
        old_self = self.members.get(member_id)
        if old_self is not None:
            # Epoch 0 again: the member gave up what it owned (or never got our answer).
            self._remove(old_self)
        self.members[member_id] = spec
        if spec.instance_id is not None:
            self.static[spec.instance_id] = member_id
        self._dirty = True
        return spec

    def _replace_static(self, old: ConsumerMember, spec: ConsumerMember) -> ConsumerMember:
        """KIP-345 under KIP-848: a static member back within its session keeps its epoch and
        assignment, so nobody else rebalances."""
        spec.member_epoch = old.member_epoch if old.member_epoch > 0 else old.previous_member_epoch
        spec.member_epoch = max(spec.member_epoch, 0)
        spec.previous_member_epoch = old.previous_member_epoch
        spec.state = old.state
        spec.assigned = old.assigned
        spec.revoking = old.revoking
        spec.revoke_deadline = old.revoke_deadline
        del self.members[old.member_id]
        self.members[spec.member_id] = spec
        assert spec.instance_id is not None
        self.static[spec.instance_id] = spec.member_id
        for tp, holder in self.owner.items():
            if holder == old.member_id:
                self.owner[tp] = spec.member_id
        if old.member_id in self.target:
            self.target[spec.member_id] = self.target.pop(old.member_id)
        if (
            spec.subscribed_names != old.subscribed_names
            or spec.subscribed_regex != old.subscribed_regex
            or spec.server_assignor != old.server_assignor
        ):
            self._dirty = True
        return spec

    def _existing(self, req: HeartbeatInput) -> ConsumerMember | HeartbeatResult:
        member = self.members.get(req.member_id)
        if member is None:
            return self._error(req, UNKNOWN_MEMBER_ID, f"unknown member {req.member_id}")
        if req.instance_id is not None and self.static.get(req.instance_id) != req.member_id:
            return self._error(req, FENCED_INSTANCE_ID)
        if req.member_epoch > member.member_epoch:
            return self._error(req, FENCED_MEMBER_EPOCH, f"epoch is {member.member_epoch}")
        if req.member_epoch < member.member_epoch and (
            req.member_epoch != member.previous_member_epoch
            or (req.owned is not None and not _pairs(req.owned) <= _pairs(member.assigned))
        ):
            return self._error(req, FENCED_MEMBER_EPOCH, f"epoch is {member.member_epoch}")
        return member

    def _update_subscription(self, member: ConsumerMember, req: HeartbeatInput) -> bool:
        changed = False
        if req.subscribed_topic_names is not None:
            names = tuple(req.subscribed_topic_names)
            changed |= names != member.subscribed_names
            member.subscribed_names = names
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            changed |= regex != member.subscribed_regex
            member.subscribed_regex = regex
        if req.server_assignor is not None:
            changed |= req.server_assignor != member.server_assignor
            member.server_assignor = req.server_assignor
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        return changed

    def _leave(self, req: HeartbeatInput, topics: Mapping[str, int]) -> HeartbeatResult:
        member = self.members.get(req.member_id)
        if member is None and req.instance_id is not None and req.instance_id in self.static:
            member = self.members[self.static[req.instance_id]]
        if member is None:
            return self._error(req, UNKNOWN_MEMBER_ID, f"unknown member {req.member_id}")
        if req.instance_id is not None and self.static.get(req.instance_id) != member.member_id:
            return self._error(req, FENCED_INSTANCE_ID)
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # It keeps its partitions until its session expires or it comes back.
            if member.member_epoch > 0:
                member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH
            return HeartbeatResult(NONE, member.member_id, STATIC_LEAVE_EPOCH)
        self._remove(member)
        self._dirty = True
        self._refresh_target(topics)
        return HeartbeatResult(NONE, member.member_id, LEAVE_EPOCH)

    def _remove(self, member: ConsumerMember) -> None:
        del self.members[member.member_id]
        self.target.pop(member.member_id, None)
        if (
            member.instance_id is not None
            and self.static.get(member.instance_id) == member.member_id
        ):
            del self.static[member.instance_id]
        for tp in _pairs(member.assigned) | _pairs(member.revoking):
            if self.owner.get(tp) == member.member_id:
                del self.owner[tp]

    # --------------------------------------------------------------- assignment
    def _refresh_target(self, topics: Mapping[str, int]) -> None:
        subscriptions = {mid: m.subscribed(topics) for mid, m in self.members.items()}
        metadata = {t: topics[t] for subs in subscriptions.values() for t in subs}
        if metadata != self.subscription_metadata:
            self.subscription_metadata = metadata
            self._dirty = True
        if self._dirty:
            # However many changes one request or timer made, they make one new epoch.
            self.group_epoch += 1
            self._dirty = False
        if self.group_epoch <= self.assignment_epoch:
            return
        self.assignor_name = self._preferred_assignor()
        self.target = assign(self.assignor_name, subscriptions, metadata, self.target)
        self.assignment_epoch = self.group_epoch

    def _preferred_assignor(self) -> str:
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return DEFAULT_ASSIGNOR
        return max(sorted(votes), key=lambda name: votes[name])

    def _reconcile(self, member: ConsumerMember, owned: Assignment | None, now: float) -> None:
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            revoking = _pairs(member.revoking)
            if owned is None or _pairs(owned) & revoking:
                return  # still revoking
            for tp in revoking:
                if self.owner.get(tp) == member.member_id:
                    del self.owner[tp]
            member.revoking = {}
            member.revoke_deadline = None
            member.state = MemberState.STABLE
        if member.member_epoch == self.assignment_epoch and member.state is MemberState.STABLE:
            return
        target = _pairs(self.target.get(member.member_id, {}))
        current = _pairs(member.assigned)
        to_revoke = current - target
        if to_revoke:
            member.assigned = _assignment(current & target)
            member.revoking = _assignment(to_revoke)
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revoke_deadline = now + member.rebalance_timeout_ms / 1000
            return
        new = target - current
        free = {tp for tp in new if self.owner.get(tp, member.member_id) == member.member_id}
        if now < self.hold_until:
            free = set()
        for tp in free:
            self.owner[tp] = member.member_id
        member.assigned = _assignment(current | free)
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        member.state = MemberState.STABLE if free == new else MemberState.UNRELEASED_PARTITIONS

    # ------------------------------------------------------------------ timers
    def next_deadline(self) -> float:
        best = float("inf")
        for m in self.members.values():
            best = min(best, m.session_deadline)
            if m.revoke_deadline is not None:
                best = min(best, m.revoke_deadline)
        return best

    def expire(self, now: float, topics: Mapping[str, int]) -> list[str]:
        """Remove members whose session or revocation time ran out; returns their ids."""
        gone = [
            m
            for m in self.members.values()
            if m.session_deadline <= now
            or (m.revoke_deadline is not None and m.revoke_deadline <= now)
        ]
        for m in gone:
            self._remove(m)
        if gone:
            self._dirty = True
            self._refresh_target(topics)
        return [m.member_id for m in gone]
