"""The durable record of a KIP-848 consumer group (Kafka's ConsumerGroupMetadata, member
metadata, target and current member assignment records, in one): the header of a
``consumer_group`` CONTROL record on the main's WAL, and the group rebuilt from it.

The record holds what a restarted coordinator needs to continue the group with no reset: the
group and assignment epochs, the subscribed topic metadata the target was computed for, and
each member's subscription, epochs, reconciliation state, assigned partitions, partitions
pending revocation and target. Sessions and revocation timers are not in it: they start again
at recovery. The format is in docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from main_broker.consumer_assignor import Assignment
from main_broker.consumer_group import ConsumerGroup, ConsumerMember, MemberState

KIND = "consumer_group"
VERSION = 1


def _partitions(a: Assignment) -> list[list[Any]]:
    return [[t, sorted(ps)] for t, ps in sorted(a.items()) if ps]


def _assignment(rows: Any) -> Assignment:
    return {str(t): frozenset(int(p) for p in ps) for t, ps in rows}


def consumer_header(g: ConsumerGroup) -> dict[str, Any]:
    """The record of ``g`` as it is now (no members: Empty, its epochs kept)."""
    return {
        "k": KIND,
        "v": VERSION,
        "g": g.group_id,
        "ge": g.group_epoch,
        "ae": g.assignment_epoch,
        "a": g.assignor_name,
        "sm": [[t, n] for t, n in sorted(g.subscription_metadata.items())],
        "m": [
            [
                m.member_id,
                m.instance_id,
                m.rack_id,
                m.client_id,
                m.client_host,
                list(m.subscribed_names),
                m.subscribed_regex,
                m.server_assignor,
                m.rebalance_timeout_ms,
                m.member_epoch,
                m.previous_member_epoch,
                m.state.value,
                _partitions(m.assigned),
                _partitions(m.revoking),
                _partitions(g.target.get(m.member_id, {})),
            ]
            for m in sorted(g.members.values(), key=lambda m: m.member_id)
        ],
    }


def dead_header(group_id: str) -> dict[str, Any]:
    """The group is gone (DeleteGroups, an empty group without offsets expired, or a classic
    group took the id over)."""
    return {"k": KIND, "v": VERSION, "g": group_id, "s": "Dead"}


def is_dead(header: Mapping[str, Any]) -> bool:
    """Whether ``header`` says the group is gone; ValueError/KeyError/TypeError when it is not
    a record this broker can read (replay skips it, as every unreadable record)."""
    if header.get("v") != VERSION:
        raise ValueError(f"consumer_group record version {header.get('v')!r} is not {VERSION}")
    if header.get("s") == "Dead":
        str(header["g"])
        return True
    rebuild_group(header, 0.0, 1000)  # every field must be readable
    return False


def rebuild_group(header: Mapping[str, Any], now: float, session_timeout_ms: int) -> ConsumerGroup:
    """The group a restarted coordinator serves (not for a Dead record): every member with its
    epochs and partitions, its session starting ``now``, a revocation in progress given the
    member's rebalance timeout from ``now``; the answer to a member's next heartbeat leaves out
    the assignment it holds, as if it had been sent (a member still on its previous epoch is
    sent it again: consumer_group)."""
    g = ConsumerGroup(str(header["g"]), session_timeout_ms)
    g.group_epoch = int(header["ge"])
    g.assignment_epoch = int(header["ae"])
    if g.assignment_epoch > g.group_epoch:
        raise ValueError("consumer_group record with assignment epoch above the group epoch")
    g.assignor_name = str(header["a"])
    g.subscription_metadata = {str(t): int(n) for t, n in header["sm"]}
    session_s = session_timeout_ms / 1000
    for row in header["m"]:
        (mid, iid, rack, cid, host, names, regex, assignor, rebalance_ms) = row[:9]
        (epoch, previous, state, assigned, revoking, target) = row[9:15]
        m = ConsumerMember(
            member_id=str(mid),
            instance_id=None if iid is None else str(iid),
            rack_id=None if rack is None else str(rack),
            client_id=str(cid),
            client_host=str(host),
            subscribed_names=tuple(str(n) for n in names),
            subscribed_regex=None if regex is None else str(regex),
            server_assignor=None if assignor is None else str(assignor),
            rebalance_timeout_ms=int(rebalance_ms),
            session_deadline=now + session_s,
            member_epoch=int(epoch),
            previous_member_epoch=int(previous),
            state=MemberState(state),
            assigned=_assignment(assigned),
            revoking=_assignment(revoking),
        )
        if m.revoking:
            m.revoke_deadline = now + m.rebalance_timeout_ms / 1000
        m.sent = dict(m.assigned)
        g.members[m.member_id] = m
        g.target[m.member_id] = _assignment(target)
        if m.instance_id is not None:
            g.static[m.instance_id] = m.member_id
        for t, ps in (*m.assigned.items(), *m.revoking.items()):
            for p in ps:
                g.owner[(t, p)] = m.member_id
    return g
