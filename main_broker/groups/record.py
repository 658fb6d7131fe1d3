"""The durable record of a classic group's membership (Kafka's GroupMetadata value): the header
of a ``classic_group`` CONTROL record on the main's WAL, and the group rebuilt from it.

A coordinator writes one when a generation completes (the leader's SyncGroup: Stable), when
the group becomes Empty, and when it is gone (Dead). The last one per group wins; replay and
the WAL snapshot keep it, so a restarted coordinator still knows every member: they keep
heartbeating with the same generation instead of rejoining. The format is in docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from main_broker.groups.classic import ClassicGroup, ClassicMember, GroupState

KIND = "classic_group"
VERSION = 1

# Only these are ever written; the in-between states are not worth a record (a coordinator
# restarted then goes back to the last Stable generation, as Kafka's does).
_STORED = {GroupState.STABLE.value, GroupState.EMPTY.value, GroupState.DEAD.value}


@dataclass(frozen=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    subscription: bytes  # the member's metadata for the group's protocol
    assignment: bytes


@dataclass(frozen=True)
class GroupRecord:
    group_id: str
    state: GroupState
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: tuple[StoredMember, ...] = ()


def group_header(g: ClassicGroup, assignments: Mapping[str, bytes] | None = None) -> dict[str, Any]:
    """The record of ``g`` as it is (Stable or Empty); ``assignments`` (member id -> bytes)
    stand in for the members' current ones: the leader's SyncGroup writes them before
    handing them out."""
    if g.state is GroupState.EMPTY or not g.members:
        return {"k": KIND, "v": VERSION, "g": g.group_id, "s": "Empty", "gen": g.generation}
    given = assignments if assignments is not None else {}
    return {
        "k": KIND,
        "v": VERSION,
        "g": g.group_id,
        "s": "Stable",
        "gen": g.generation,
        "pt": g.protocol_type,
        "pn": g.protocol_name,
        "l": g.leader_id,
        "m": [
            [
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.session_timeout_ms,
                m.rebalance_timeout_ms,
                m.metadata_for(g.protocol_name),
                given.get(m.member_id, b"") if assignments is not None else m.assignment,
            ]
            for m in g.members.values()
        ],
    }


def dead_header(group_id: str) -> dict[str, Any]:
    """The group is gone (DeleteGroups, or an Empty group without offsets expired)."""
    return {"k": KIND, "v": VERSION, "g": group_id, "s": "Dead"}


def decode_group(header: Mapping[str, Any]) -> GroupRecord:
    """The record in a ``classic_group`` header; ValueError/KeyError/TypeError when it is not
    one this broker can read (replay skips it, as every unreadable record)."""
    if header.get("v") != VERSION:
        raise ValueError(f"classic_group record version {header.get('v')!r} is not {VERSION}")
    state = str(header["s"])
    if state not in _STORED:
        raise ValueError(f"classic_group record state {state!r}")
    group_id = str(header["g"])
    if state == "Dead":
        return GroupRecord(group_id, GroupState.DEAD)
    members = tuple(
        StoredMember(
            member_id=str(mid),
            group_instance_id=None if iid is None else str(iid),
            client_id=str(cid),
            client_host=str(host),
            session_timeout_ms=int(session),
            rebalance_timeout_ms=int(rebalance),
            subscription=bytes(sub),
            assignment=bytes(asg),
        )
        for mid, iid, cid, host, session, rebalance, sub, asg in header.get("m", [])
    )
    if state == "Stable" and not members:
        raise ValueError("a Stable classic_group record without members")
    return GroupRecord(
        group_id=group_id,
        state=GroupState(state),
        generation=int(header["gen"]),
        protocol_type=_opt_str(header.get("pt")),
        protocol_name=_opt_str(header.get("pn")),
        leader_id=_opt_str(header.get("l")),
        members=members,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def rebuild_group(record: GroupRecord, now: float, empty_retention_s: float) -> ClassicGroup:
    """The group a restarted coordinator serves: Stable with the stored members, each member's
    session starting ``now`` (one that died meanwhile expires after its session timeout, and
    a rebalance follows); or Empty with its generation, kept ``empty_retention_s`` (unless it
    has offsets) as a group that just emptied. Not for a Dead record."""
    if record.state is GroupState.DEAD:
        raise ValueError("a Dead group is not rebuilt")
    g = ClassicGroup(record.group_id, state=record.state, generation=record.generation)
    if record.state is GroupState.EMPTY:
        g.empty_deadline = now + empty_retention_s
        return g
    g.protocol_type = record.protocol_type
    g.protocol_name = record.protocol_name
    for s in record.members:
        g.members[s.member_id] = ClassicMember(
            member_id=s.member_id,
            group_instance_id=s.group_instance_id,
            client_id=s.client_id,
            client_host=s.client_host,
            session_timeout_ms=s.session_timeout_ms,
            rebalance_timeout_ms=s.rebalance_timeout_ms,
            protocol_type=record.protocol_type or "",
            # Kafka keeps only the chosen protocol's metadata too; a joiner is checked against it.
            protocols=[(record.protocol_name or "", s.subscription)],
            session_deadline=now + s.session_timeout_ms / 1000,
            is_new=False,
            assignment=s.assignment,
        )
        if s.group_instance_id is not None:
            g.static_members[s.group_instance_id] = s.member_id
    g.leader_id = record.leader_id if record.leader_id in g.members else next(iter(g.members))
    return g
