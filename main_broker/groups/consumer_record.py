"""The durable record of a KIP-848 consumer group (as Kafka's ConsumerGroupMetadata, member
metadata, target assignment and current member assignment records): the header of a
``consumer_group`` CONTROL record on the main's WAL, what the records add up to, and the group
rebuilt from that.

A record carries the group's fields (group and assignment epochs, the assignor in use, the
subscribed topic metadata the target was computed for) and the rows of the members that
changed (subscription, epochs, reconciliation state, assigned partitions, partitions pending
revocation, target), with the ids of members that left; a full record carries every member
and replaces what was there. Sessions and revocation timers are not in it: they start again
at recovery. The format is in docs/formats.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from main_broker.groups.consumer_assignor import Assignment
from main_broker.groups.consumer_group import ConsumerGroup, ConsumerMember, MemberState

KIND = "consumer_group"
VERSION = 1


def _partitions(a: Assignment) -> list[list[Any]]:
    return [[t, sorted(ps)] for t, ps in sorted(a.items()) if ps]


def _assignment(rows: Any) -> Assignment:
    return {str(t): frozenset(int(p) for p in ps) for t, ps in rows}


def group_fields(g: ConsumerGroup) -> dict[str, Any]:
    return {
        "ge": g.group_epoch,
        "ae": g.assignment_epoch,
        "a": g.assignor_name,
        "sm": [[t, n] for t, n in sorted(g.subscription_metadata.items())],
    }


def member_row(g: ConsumerGroup, m: ConsumerMember) -> list[Any]:
    return [
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


def record_header(
    group_id: str,
    fields: Mapping[str, Any],
    rows: Iterable[list[Any]],
    left: Iterable[str] = (),
    full: bool = False,
) -> dict[str, Any]:
    """A record: the group's fields, the rows of members that changed (every member when
    ``full``) and the ids of those that ``left``."""
    return {
        "k": KIND,
        "v": VERSION,
        "g": group_id,
        **fields,
        "f": full,
        "m": sorted(rows, key=lambda row: str(row[0])),
        "x": sorted(left),
    }


def consumer_header(g: ConsumerGroup) -> dict[str, Any]:
    """The full record of ``g`` as it is now (no members: Empty, its epochs kept)."""
    rows = (member_row(g, m) for m in g.members.values())
    return record_header(g.group_id, group_fields(g), rows, full=True)


def dead_header(group_id: str) -> dict[str, Any]:
    """The group is gone (DeleteGroups, an empty group without offsets expired, or a classic
    group took the id over)."""
    return {"k": KIND, "v": VERSION, "g": group_id, "s": "Dead"}


def is_dead(header: Mapping[str, Any]) -> bool:
    """Whether ``header`` says the group is gone; ValueError/KeyError/TypeError when it is not
    a record this broker can read (replay skips it, as every unreadable record)."""
    if header.get("v") != VERSION:
        raise ValueError(f"consumer_group record version {header.get('v')!r} is not {VERSION}")
    str(header["g"])
    return header.get("s") == "Dead"


@dataclass
class StoredGroup:
    """What a group's records add up to: its fields and member rows by id."""

    fields: dict[str, Any]
    rows: dict[str, list[Any]] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        """As one full record (the WAL snapshot holds these)."""
        return record_header(
            self.fields["g"], _fields_of(self.fields), self.rows.values(), (), True
        )


def _fields_of(header: Mapping[str, Any]) -> dict[str, Any]:
    group_epoch, assignment_epoch = int(header["ge"]), int(header["ae"])
    if assignment_epoch > group_epoch:
        raise ValueError("consumer_group record with assignment epoch above the group epoch")
    return {
        "ge": group_epoch,
        "ae": assignment_epoch,
        "a": str(header["a"]),
        "sm": [[str(t), int(n)] for t, n in header["sm"]],
    }


def apply_record(stored: StoredGroup | None, header: Mapping[str, Any]) -> StoredGroup:
    """``stored`` with a (not Dead) record applied; raises ValueError/KeyError/TypeError for
    one that cannot be read or applied (a partial record with nothing before it), leaving
    ``stored`` as it was. Applying the records that follow a snapshot again on what the
    snapshot holds gives the same group (the last row written per member wins)."""
    fields = {"g": str(header["g"]), **_fields_of(header)}
    rows = [list(row) for row in header["m"]]
    for row in rows:
        _member(row, 0.0)  # every row must be readable before anything changes
    left = [str(mid) for mid in header["x"]]
    if header["f"]:
        stored = StoredGroup(fields)
    elif stored is None:
        raise ValueError("a partial consumer_group record for a group without records")
    stored.fields = fields
    for row in rows:
        stored.rows[str(row[0])] = row
    for mid in left:
        stored.rows.pop(mid, None)
    return stored


def _member(row: list[Any], now: float) -> ConsumerMember:
    (mid, iid, rack, cid, host, names, regex, assignor, rebalance_ms) = row[:9]
    (epoch, previous, state, assigned, revoking, target) = row[9:]
    _assignment(target)  # read by rebuild_group; unreadable, the row is refused here
    return ConsumerMember(
        member_id=str(mid),
        instance_id=None if iid is None else str(iid),
        rack_id=None if rack is None else str(rack),
        client_id=str(cid),
        client_host=str(host),
        subscribed_names=tuple(str(n) for n in names),
        subscribed_regex=None if regex is None else str(regex),
        server_assignor=None if assignor is None else str(assignor),
        rebalance_timeout_ms=int(rebalance_ms),
        session_deadline=now,
        member_epoch=int(epoch),
        previous_member_epoch=int(previous),
        state=MemberState(state),
        assigned=_assignment(assigned),
        revoking=_assignment(revoking),
    )


def rebuild_group(stored: StoredGroup, now: float, session_timeout_ms: int) -> ConsumerGroup:
    """The group a restarted coordinator serves: every member with its epochs and partitions,
    its session starting ``now``, a revocation in progress given the member's rebalance timeout
    from ``now``; the answer to a member's next heartbeat leaves out the assignment it holds,
    as if it had been sent (a member still on its previous epoch is sent it again:
    consumer_group)."""
    f = stored.fields
    g = ConsumerGroup(f["g"], session_timeout_ms)
    g.group_epoch, g.assignment_epoch, g.assignor_name = f["ge"], f["ae"], f["a"]
    g.subscription_metadata = {t: n for t, n in f["sm"]}
    for row in sorted(stored.rows.values(), key=lambda row: str(row[0])):
        m = _member(row, now + session_timeout_ms / 1000)
        if m.revoking:
            m.revoke_deadline = now + m.rebalance_timeout_ms / 1000
        m.sent = dict(m.assigned)
        g.members[m.member_id] = m
        g.target[m.member_id] = _assignment(row[14])
        if m.instance_id is not None:
            g.static[m.instance_id] = m.member_id
        for t, ps in (*m.assigned.items(), *m.revoking.items()):
            for p in ps:
                g.owner[(t, p)] = m.member_id
    return g
