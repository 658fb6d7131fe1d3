"""The durable records of a KIP-848 consumer group (main_broker.groups.consumer_record): golden
bytes of `consumer_group` CONTROL headers (docs/formats.md), records adding up (partial ones,
replayed again after a snapshot), and the group rebuilt from them carrying on exactly as the group
they were recorded from."""

from __future__ import annotations

import msgpack
import pytest

from main_broker.groups.consumer_assignor import Assignment
from main_broker.groups.consumer_group import ConsumerGroup, HeartbeatInput, MemberState
from main_broker.groups.consumer_record import (
    StoredGroup,
    apply_record,
    consumer_header,
    dead_header,
    group_fields,
    is_dead,
    member_row,
    rebuild_group,
    record_header,
)
from shared_wal.record import pack_header

TOPICS = {"t": 2}
SESSION_MS = 45_000


def _join(g: ConsumerGroup, mid: str, now: float = 0.0, **kw: object) -> None:
    req = HeartbeatInput(
        member_id=mid,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=["t"],
        client_id="c",
        client_host="/10.0.0.1",
        **kw,  # type: ignore[arg-type]
    )
    assert g.heartbeat(req, TOPICS, now).error_code == 0


def _beat(
    g: ConsumerGroup, mid: str, epoch: int, owned: Assignment | None = None, now: float = 1.0
) -> tuple[int, int, Assignment | None]:
    r = g.heartbeat(HeartbeatInput(member_id=mid, member_epoch=epoch, owned=owned), TOPICS, now)
    return r.error_code, r.member_epoch, r.assignment


def _rebuilt(g: ConsumerGroup, now: float) -> ConsumerGroup:
    return rebuild_group(apply_record(None, consumer_header(g)), now, SESSION_MS)


def test_golden_headers() -> None:
    """The bytes docs/formats.md shows (spaces added there): a full record, a partial one (the
    member left), Dead."""
    g = ConsumerGroup("g", SESSION_MS)
    _join(g, "m1", instance_id="i1", rack_id="r1")
    header = pack_header(consumer_header(g))
    assert header.hex(" ") == (
        "8a a1 6b ae 63 6f 6e 73 75 6d 65 72 5f 67 72 6f 75 70 a1 76 01 a1 67 a1 67 a2 67 65 01"
        " a2 61 65 01 a1 61 a7 75 6e 69 66 6f 72 6d a2 73 6d 91 92 a1 74 02 a1 66 c3 a1 6d 91 9f"
        " a2 6d 31 a2 69 31 a2 72 31 a1 63 a9 2f 31 30 2e 30 2e 30 2e 31 91 a1 74 c0 c0 cd 75 30"
        " 01 00 a6 73 74 61 62 6c 65 91 92 a1 74 92 00 01 90 91 92 a1 74 92 00 01 a1 78 90"
    )
    assert msgpack.unpackb(header) == {
        "k": "consumer_group",
        "v": 1,
        "g": "g",
        "ge": 1,
        "ae": 1,
        "a": "uniform",
        "sm": [["t", 2]],
        "f": True,
        "x": [],
        "m": [
            [
                "m1",
                "i1",
                "r1",
                "c",
                "/10.0.0.1",
                ["t"],
                None,
                None,
                30000,
                1,
                0,
                "stable",
                [["t", [0, 1]]],
                [],
                [["t", [0, 1]]],
            ]
        ],
    }
    assert g.heartbeat(HeartbeatInput("m1", -1), TOPICS, 1.0).member_epoch == -1
    left = pack_header(record_header("g", group_fields(g), [], ["m1"]))
    assert left.hex(" ") == (
        "8a a1 6b ae 63 6f 6e 73 75 6d 65 72 5f 67 72 6f 75 70 a1 76 01 a1 67 a1 67 a2 67 65 02"
        " a2 61 65 02 a1 61 a7 75 6e 69 66 6f 72 6d a2 73 6d 90 a1 66 c2 a1 6d 90 a1 78 91 a2 6d"
        " 31"
    )
    stored = apply_record(apply_record(None, msgpack.unpackb(header)), msgpack.unpackb(left))
    assert stored.header() == consumer_header(g)
    dead = pack_header(dead_header("g"))
    assert dead.hex(" ") == (
        "84 a1 6b ae 63 6f 6e 73 75 6d 65 72 5f 67 72 6f 75 70 a1 76 01 a1 67 a1 67 a1 73 a4 44"
        " 65 61 64"
    )
    assert is_dead(msgpack.unpackb(dead)) is True
    assert is_dead(msgpack.unpackb(header)) is False


def test_unreadable_records_raise_and_change_nothing() -> None:
    g = ConsumerGroup("g", SESSION_MS)
    _join(g, "m1")
    good = consumer_header(g)
    with pytest.raises(ValueError):
        is_dead({**good, "v": 2})
    stored = apply_record(None, good)
    kept = stored.header()
    row = good["m"][0]
    for bad, error in [
        ({k: v for k, v in good.items() if k != "ae"}, KeyError),
        ({**good, "ae": 5}, ValueError),  # an assignment epoch the group epoch never reached
        ({**good, "f": False, "m": [[*row[:11], "dancing", *row[12:]]]}, ValueError),
        ({**good, "f": False, "m": [row[:14]]}, ValueError),
        ({**good, "f": False, "m": [[*row[:14], [["t", "x"]]]]}, ValueError),
    ]:
        with pytest.raises(error):
            apply_record(stored, bad)
        assert stored.header() == kept
    with pytest.raises(ValueError):  # a partial record needs what came before it
        apply_record(None, {**good, "f": False})


def test_partial_records_add_up_and_replay_again_after_a_snapshot() -> None:
    """Records written as a group changes (full, then only the changed rows) add up to the
    group; applying the records after a snapshot again on the snapshot's group changes
    nothing (replay may meet records the snapshot already holds)."""
    g = ConsumerGroup("g", SESSION_MS)
    records = []
    rows: dict[str, list[object]] = {}

    def record() -> None:
        now = {mid: member_row(g, m) for mid, m in g.members.items()}
        changed = [row for mid, row in now.items() if rows.get(mid) != row]
        left = [mid for mid in rows if mid not in now]
        records.append(record_header("g", group_fields(g), changed, left, full=not records))
        rows.clear()
        rows.update(now)

    _join(g, "m1")
    record()
    _join(g, "m2", now=1.0)
    record()
    g.heartbeat(HeartbeatInput("m1", 1), TOPICS, 1.0)  # told to revoke
    record()
    assert len(records[-1]["m"]) == 1  # only m1 changed
    owned = g.members["m1"].assigned
    g.heartbeat(HeartbeatInput("m1", 1, owned=owned), TOPICS, 1.0)
    record()
    g.heartbeat(HeartbeatInput("m2", 2), TOPICS, 1.0)
    record()
    g.heartbeat(HeartbeatInput("m1", -1), TOPICS, 2.0)
    record()
    assert records[-1]["x"] == ["m1"]

    stored: StoredGroup | None = None
    for header in records:
        stored = apply_record(stored, header)
    assert stored is not None and stored.header() == consumer_header(g)
    for cut in range(len(records)):
        snap: StoredGroup | None = None
        for header in records[: cut + 1]:
            snap = apply_record(snap, header)
        assert snap is not None
        again = apply_record(None, snap.header())  # what the snapshot holds
        for header in records[cut - 1 if cut else 0 :]:
            again = apply_record(again, header)
        assert again.header() == consumer_header(g)


def test_a_rebuilt_group_in_the_middle_of_a_revocation_carries_on_as_the_original() -> None:
    """m1 holds both partitions; m2 joins: m1 is revoking one, m2 waits for it. Recorded and
    rebuilt, the group answers the next heartbeats exactly as the original does."""
    g = ConsumerGroup("g", SESSION_MS)
    _join(g, "m1", instance_id="i1")
    assert _beat(g, "m1", 1) == (0, 1, None)
    _join(g, "m2", now=1.0)
    assert g.heartbeat(HeartbeatInput("m1", 1), TOPICS, 1.0).assignment is not None
    m1 = g.members["m1"]
    assert m1.state is MemberState.UNREVOKED_PARTITIONS and m1.revoking
    assert g.members["m2"].state is MemberState.UNRELEASED_PARTITIONS

    copy = _rebuilt(g, 100.0)
    assert consumer_header(copy) == consumer_header(g)
    assert copy.state == g.state == "Reconciling"
    assert copy.owner == g.owner and copy.static == {"i1": "m1"}
    # Sessions and the revocation's deadline start at recovery.
    assert copy.members["m1"].session_deadline == 100.0 + SESSION_MS / 1000
    assert copy.members["m1"].revoke_deadline == 100.0 + 30.0
    assert copy.members["m2"].revoke_deadline is None

    kept = dict(m1.assigned)
    for group in (g, copy):
        # A plain heartbeat of the epoch the member holds: no reset, no new assignment.
        assert _beat(group, "m2", 2, now=101.0) == (0, 2, None)
        # m1 releases; then m2 gets the released partition, both stable at epoch 2.
        assert _beat(group, "m1", 1, owned=kept, now=101.0)[:2] == (0, 2)
        code, epoch, given = _beat(group, "m2", 2, now=101.0)
        assert (code, epoch) == (0, 2) and given is not None and len(given["t"]) == 1
        assert group.state == "Stable"
    assert consumer_header(copy) == consumer_header(g)


def test_a_member_that_missed_its_answer_gets_the_assignment_again() -> None:
    """The record is durable before the answer goes out; a restart may cut the answer off.
    The member then heartbeats with its previous epoch and is sent its assignment."""
    g = ConsumerGroup("g", SESSION_MS)
    _join(g, "m1")
    assert _beat(g, "m1", 1) == (0, 1, None)
    _join(g, "m2", now=1.0)
    # m1 revokes one partition: the answer with epoch 2 is what the restart cuts off.
    owned = {"t": frozenset(g.members["m1"].assigned["t"])}
    g.heartbeat(HeartbeatInput("m1", 1), TOPICS, 1.0)
    assert _beat(g, "m1", 1, owned=g.members["m1"].assigned, now=1.0)[1] == 2
    copy = _rebuilt(g, 50.0)
    code, epoch, given = _beat(copy, "m1", 1, owned=copy.members["m1"].assigned, now=50.0)
    assert (code, epoch) == (0, 2) and given == copy.members["m1"].assigned
    assert given != owned
    # With its current epoch it is not sent it again.
    assert _beat(copy, "m1", 2, now=51.0) == (0, 2, None)


def test_an_empty_group_keeps_its_epochs() -> None:
    g = ConsumerGroup("g", SESSION_MS)
    _join(g, "m1")
    assert g.heartbeat(HeartbeatInput("m1", -1), TOPICS, 1.0).member_epoch == -1
    header = consumer_header(g)
    assert header["m"] == [] and header["ge"] == 2
    copy = rebuild_group(apply_record(None, header), 5.0, SESSION_MS)
    assert copy.state == "Empty" and copy.group_epoch == 2 and copy.assignment_epoch == 2
    # A new member continues from the recorded epoch.
    _join(copy, "m3", now=6.0)
    assert copy.members["m3"].member_epoch == 3
