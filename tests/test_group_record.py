"""The durable record of a classic group's membership (main_broker.groups.record): golden bytes
of the `classic_group` CONTROL header (docs/formats.md), decoding, and the group rebuilt from it."""

from __future__ import annotations

import msgpack
import pytest

from main_broker.groups.classic import ClassicGroup, ClassicMember, GroupState
from main_broker.groups.record import (
    GroupRecord,
    StoredMember,
    dead_header,
    decode_group,
    group_header,
    rebuild_group,
)
from shared_wal.record import pack_header


def _member(mid: str, instance: str | None, client: str, assignment: bytes) -> ClassicMember:
    return ClassicMember(
        member_id=mid,
        group_instance_id=instance,
        client_id=client,
        client_host="/10.0.0.1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        protocol_type="consumer",
        protocols=[("roundrobin", b"rr"), ("range", b"\x00\x01")],
        session_deadline=0.0,
        is_new=False,
        assignment=assignment,
    )


def _stable() -> ClassicGroup:
    g = ClassicGroup(
        "g",
        state=GroupState.STABLE,
        generation=3,
        protocol_type="consumer",
        protocol_name="range",
        leader_id="a-1",
    )
    g.members["a-1"] = _member("a-1", "i1", "a", b"\x02")
    g.static_members["i1"] = "a-1"
    return g


def test_golden_stable_empty_and_dead_headers() -> None:
    """The bytes docs/formats.md shows (spaces added there)."""
    stable = pack_header(group_header(_stable()))
    assert stable.hex(" ") == (
        "89 a1 6b ad 63 6c 61 73 73 69 63 5f 67 72 6f 75 70 a1 76 01 a1 67 a1 67 a1 73 a6 53 74"
        " 61 62 6c 65 a3 67 65 6e 03 a2 70 74 a8 63 6f 6e 73 75 6d 65 72 a2 70 6e a5 72 61 6e 67"
        " 65 a1 6c a3 61 2d 31 a1 6d 91 98 a3 61 2d 31 a2 69 31 a1 61 a9 2f 31 30 2e 30 2e 30 2e"
        " 31 cd 27 10 cd 75 30 c4 02 00 01 c4 01 02"
    )
    assert msgpack.unpackb(stable) == {
        "k": "classic_group",
        "v": 1,
        "g": "g",
        "s": "Stable",
        "gen": 3,
        "pt": "consumer",
        "pn": "range",
        "l": "a-1",
        # Only the chosen protocol's metadata is kept, as Kafka's GroupMetadata does.
        "m": [["a-1", "i1", "a", "/10.0.0.1", 10_000, 30_000, b"\x00\x01", b"\x02"]],
    }
    empty = ClassicGroup("g", state=GroupState.EMPTY, generation=4)
    assert pack_header(group_header(empty)).hex() == (
        "85a16bad636c61737369635f67726f7570a17601a167a167a173a5456d707479a367656e04"
    )
    assert pack_header(dead_header("g")).hex() == (
        "84a16bad636c61737369635f67726f7570a17601a167a167a173a444656164"
    )


def test_the_leaders_assignments_replace_the_members_current_ones() -> None:
    g = _stable()
    g.state = GroupState.COMPLETING_REBALANCE  # the leader's SyncGroup writes before Stable
    header = group_header(g, {"a-1": b"new", "gone": b"x"})
    assert header["s"] == "Stable"
    assert header["m"][0][7] == b"new"
    assert group_header(g, {})["m"][0][7] == b""


def test_decode_round_trips_through_msgpack() -> None:
    wire = msgpack.unpackb(pack_header(group_header(_stable())), raw=False)
    assert decode_group(wire) == GroupRecord(
        group_id="g",
        state=GroupState.STABLE,
        generation=3,
        protocol_type="consumer",
        protocol_name="range",
        leader_id="a-1",
        members=(
            StoredMember("a-1", "i1", "a", "/10.0.0.1", 10_000, 30_000, b"\x00\x01", b"\x02"),
        ),
    )
    assert decode_group(dead_header("h")) == GroupRecord("h", GroupState.DEAD)
    empty = decode_group(group_header(ClassicGroup("e", state=GroupState.EMPTY, generation=7)))
    assert empty == GroupRecord("e", GroupState.EMPTY, generation=7)


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},
        {"v": None},
        {"s": "PreparingRebalance"},
        {"s": "Stable", "m": []},
        {"gen": "x"},
        {"m": [["a-1", None, "a", "h", 1, 2, b""]]},  # a member field missing
    ],
)
def test_unreadable_records_raise(change: dict[str, object]) -> None:
    header = {**group_header(_stable()), **change}
    with pytest.raises((ValueError, TypeError, KeyError)):
        decode_group(header)


def test_rebuilt_stable_group_keeps_generation_members_and_static_ids() -> None:
    two = _stable()
    two.members["b-2"] = _member("b-2", None, "b", b"\x03")
    record = decode_group(group_header(two))
    g = rebuild_group(record, now=100.0, empty_retention_s=600.0)
    assert (g.state, g.generation, g.protocol_type, g.protocol_name, g.leader_id) == (
        GroupState.STABLE,
        3,
        "consumer",
        "range",
        "a-1",
    )
    assert list(g.members) == ["a-1", "b-2"]  # join order kept: the leader's plan follows it
    a, b = g.members["a-1"], g.members["b-2"]
    assert g.static_members == {"i1": "a-1"}
    assert (a.client_id, a.client_host, a.session_timeout_ms, a.rebalance_timeout_ms) == (
        "a",
        "/10.0.0.1",
        10_000,
        30_000,
    )
    assert a.protocols == [("range", b"\x00\x01")] and a.protocol_type == "consumer"
    assert (a.assignment, b.assignment) == (b"\x02", b"\x03")
    # Sessions start at recovery: a member that died meanwhile expires one timeout later.
    assert a.session_deadline == b.session_deadline == 110.0
    assert not a.is_new and a.join_reply is None and a.sync_reply is None
    assert not g.pending_sync and g.join_deadline is None and g.sync_deadline is None
    assert g.empty_deadline is None
    # What DescribeGroups shows is what the group showed before.
    assert g.described() == two.described()
    # Members of before may commit with the generation of before.
    assert g.commit_error(3, "b-2", None) == 0
    assert g.commit_error(2, "b-2", None) != 0


def test_rebuilt_empty_group_and_a_leader_that_is_not_a_member() -> None:
    g = rebuild_group(GroupRecord("e", GroupState.EMPTY, generation=9), 5.0, 600.0)
    assert (g.state, g.generation, g.members, g.protocol_name) == (GroupState.EMPTY, 9, {}, None)
    assert g.empty_deadline == 605.0  # forgotten as a group that just emptied, unless offsets
    header = group_header(_stable())
    header["l"] = "someone-else"
    assert rebuild_group(decode_group(header), 0.0, 600.0).leader_id == "a-1"
    with pytest.raises(ValueError):
        rebuild_group(GroupRecord("d", GroupState.DEAD), 0.0, 600.0)
