"""The classic group protocol's state: members, the group, and the JoinGroup/SyncGroup answers
that parked requests wait for. The state machine driving them is ``group_coordinator``."""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from kio.schema.errors import ErrorCode

log = logging.getLogger(__name__)

NONE = int(ErrorCode.none)
ILLEGAL_GENERATION = int(ErrorCode.illegal_generation)
INCONSISTENT_GROUP_PROTOCOL = int(ErrorCode.inconsistent_group_protocol)
INVALID_GROUP_ID = int(ErrorCode.invalid_group_id)
UNKNOWN_MEMBER_ID = int(ErrorCode.unknown_member_id)
INVALID_SESSION_TIMEOUT = int(ErrorCode.invalid_session_timeout)
REBALANCE_IN_PROGRESS = int(ErrorCode.rebalance_in_progress)
MEMBER_ID_REQUIRED = int(ErrorCode.member_id_required)
GROUP_MAX_SIZE_REACHED = int(ErrorCode.group_max_size_reached)
GROUP_ID_NOT_FOUND = int(ErrorCode.group_id_not_found)
FENCED_INSTANCE_ID = int(ErrorCode.fenced_instance_id)
NOT_COORDINATOR = int(ErrorCode.not_coordinator)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.coordinator_not_available)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Reply:
    """A response that a pending JoinGroup/SyncGroup call waits for."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: dict[str, Any] = {}

    def send(self, value: dict[str, Any]) -> None:
        if not self.event.is_set():
            self.value = value
            self.event.set()

    async def wait(self) -> dict[str, Any]:
        await self.event.wait()
        return self.value


@dataclass(eq=False)
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_deadline: float
    is_new: bool = True
    assignment: bytes = b""
    join_reply: Reply | None = None
    sync_reply: Reply | None = None

    def metadata_for(self, protocol: str | None) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: dict[str, float] = field(default_factory=dict)  # member id -> expiry
    pending_sync: set[str] = field(default_factory=set)
    join_deadline: float | None = None
    in_initial_delay: bool = False
    initial_remaining_s: float = 0.0
    new_member_added: bool = False
    sync_deadline: float | None = None
    empty_deadline: float | None = None
    # When the current rebalance began (trio clock), for the timings the coordinator logs.
    rebalance_started: float = 0.0

    def rebalance_timeout_s(self) -> float:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0) / 1000

    def supports(self, protocol_type: str, protocols: Sequence[tuple[str, bytes]], me: str) -> bool:
        if not protocol_type or not protocols:
            return False
        others = [m for m in self.members.values() if m.member_id != me]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        return any(all(any(n == p for n, _ in m.protocols) for m in others) for p, _ in protocols)

    def select_protocol(self) -> str:
        members = list(self.members.values())
        candidates = {n for n, _ in members[0].protocols}
        for m in members[1:]:
            candidates &= {n for n, _ in m.protocols}
        votes: dict[str, int] = {}
        for m in members:
            vote = next((n for n, _ in m.protocols if n in candidates), m.protocols[0][0])
            votes[vote] = votes.get(vote, 0) + 1
        # Ties go to the protocol voted for first (dict order), i.e. the earliest member's choice.
        return max(votes, key=lambda n: votes[n])

    def subscribed_topics(self) -> set[str]:
        """The topics a "consumer" group's members subscribe to (Kafka decodes each member's
        ConsumerProtocolSubscription); empty when a member's metadata does not parse."""
        if self.protocol_type != "consumer" or self.state is GroupState.EMPTY:
            return set()
        topics: set[str] = set()
        for m in self.members.values():
            names = subscription_topics(m.metadata_for(self.protocol_name))
            if names is None:
                return set()
            topics.update(names)
        return topics

    def commit_error(self, generation: int, member_id: str, instance_id: str | None) -> int:
        """Whether this committer may commit offsets for the group (OffsetCommit)."""
        if instance_id is not None and self.static_members.get(instance_id, member_id) != member_id:
            return FENCED_INSTANCE_ID
        if generation < 0 and self.state is GroupState.EMPTY:
            return NONE  # the group only uses Kafka to store offsets
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ILLEGAL_GENERATION
        if self.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def hand_out(self, generation: int, given: dict[str, bytes]) -> None:
        """The leader's assignments for ``generation`` are durable: the group is Stable."""
        if self.state is not GroupState.COMPLETING_REBALANCE or self.generation != generation:
            return  # a rebalance began meanwhile and answered the waiting members
        for m in self.members.values():
            m.assignment = given.get(m.member_id, b"")
            if m.sync_reply is not None:
                m.sync_reply.send(sync_response(NONE, self, m.assignment))
                m.sync_reply = None
        self.state = GroupState.STABLE
        if not self.pending_sync:
            self.sync_deadline = None
        log.info(
            "group %s: generation %d stable %.3f s after its rebalance began",
            self.group_id,
            generation,
            trio.current_time() - self.rebalance_started,
        )

    def refuse_sync(self, generation: int, error: int) -> bool:
        """``generation`` could not be made durable: answer the waiting SyncGroups with
        ``error``; True when the group must rebalance."""
        if self.state is not GroupState.COMPLETING_REBALANCE or self.generation != generation:
            return False
        for m in self.members.values():
            if m.sync_reply is not None:
                m.sync_reply.send(sync_response(error))
                m.sync_reply = None
        return True

    def listed(self) -> dict[str, Any]:
        """The group as ListGroups shows it."""
        return {
            "group_id": self.group_id,
            "protocol_type": self.protocol_type or "",
            "group_state": self.state.value,
            "group_type": "classic",
        }

    def described(self) -> dict[str, Any]:
        """The group's DescribeGroups fields (state, protocol, members)."""
        stable = self.state is GroupState.STABLE
        return {
            "group_state": self.state.value,
            "protocol_type": self.protocol_type or "",
            "protocol_data": (self.protocol_name or "") if stable else "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    # Kafka shows metadata and assignment only for a Stable group.
                    "member_metadata": m.metadata_for(self.protocol_name) if stable else b"",
                    "member_assignment": m.assignment if stable else b"",
                }
                for m in self.members.values()
            ],
        }

    def member_list(self) -> list[dict[str, Any]]:
        return [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata_for(self.protocol_name),
            }
            for m in self.members.values()
        ]


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topic names of a ConsumerProtocolSubscription (any version: they all start with
    version INT16 and topics ARRAY[STRING]), or None if it does not parse."""
    try:
        _, count = struct.unpack_from(">hi", metadata, 0)
        pos, topics = 6, []
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                return None
            topics.append(metadata[pos : pos + size].decode())
            pos += size
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def join_response(
    error: int,
    member_id: str,
    group: ClassicGroup | None = None,
    members: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    ok = group is not None and error == NONE
    return {
        "error_code": error,
        "generation_id": group.generation if ok and group else -1,
        "protocol_type": group.protocol_type if ok and group else None,
        "protocol_name": group.protocol_name if ok and group else None,
        "leader": (group.leader_id or "") if ok and group else "",
        "skip_assignment": False,
        "member_id": member_id,
        "members": members or [],
    }


def sync_response(
    error: int, group: ClassicGroup | None = None, assignment: bytes = b""
) -> dict[str, Any]:
    return {
        "error_code": error,
        "protocol_type": group.protocol_type if group and error == NONE else None,
        "protocol_name": group.protocol_name if group and error == NONE else None,
        "assignment": assignment,
    }
