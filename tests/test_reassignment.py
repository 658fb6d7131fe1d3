"""The pure core of partition reassignment (main_broker/cluster/reassignment.py): the move record in
the cluster document and its golden bytes, the transitions and the errors Kafka gives, the
listing, and which of the source's WAL records the target takes over."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest

from main_broker.cluster.doc import ClusterDoc, DocFormatError
from main_broker.cluster.reassignment import (
    CONTROL,
    DATA,
    FENCING,
    LINK,
    SEALED,
    SNAPSHOT,
    Move,
    MoveRefused,
    Tail,
    TailCollector,
    cancel_move,
    evacuate,
    finish_move,
    ongoing_listing,
    request_move,
    seal_move,
    takeover_header,
    validate_target,
)

TOPIC_ID = bytes(range(16))
OTHER_ID = bytes(range(1, 17))


def _doc() -> ClusterDoc:
    return ClusterDoc("c1").with_topic("orders", TOPIC_ID, 3, {}, [1, 2, 3])


def test_request_seal_finish() -> None:
    doc = _doc()
    leader = doc.topics["orders"].leaders[0]
    target = next(n for n in (1, 2, 3) if n != leader)
    moving = request_move(doc, "orders", 0, target, 1000)
    move = moving.moves[("orders", 0)]
    assert move == Move("orders", 0, leader, target, 1, FENCING, -1, -1, 1000)
    assert moving.topics["orders"].leaders[0] == leader  # the source leads until the end
    assert moving.version == doc.version + 1
    # Asking again for the same target changes nothing (no new version).
    assert request_move(moving, "orders", 0, target, 2000) is moving

    sealed = seal_move(moving, move, 500, 123456)
    assert sealed.moves[("orders", 0)].state == SEALED
    assert (sealed.moves[("orders", 0)].end, sealed.moves[("orders", 0)].wal_end) == (500, 123456)
    assert seal_move(sealed, move, 500, 1) is sealed  # already sealed: the stale copy is a no-op

    done = finish_move(sealed, sealed.moves[("orders", 0)])
    assert done.moves == {}
    assert done.topics["orders"].leaders[0] == target
    assert done.topics["orders"].epochs[0] == 1
    assert done.topics["orders"].epochs[1:] == (0, 0)


def test_cancel_and_redirect() -> None:
    doc = _doc()
    leader = doc.topics["orders"].leaders[1]
    a, b = (n for n in (1, 2, 3) if n != leader)
    with pytest.raises(MoveRefused) as refused:
        cancel_move(doc, "orders", 1)
    assert refused.value.code == 85  # NO_REASSIGNMENT_IN_PROGRESS
    moving = request_move(doc, "orders", 1, a, 0)
    # Before the seal another target replaces the move; naming the leader cancels it.
    redirected = request_move(moving, "orders", 1, b, 0)
    assert redirected.moves[("orders", 1)].target == b
    assert request_move(redirected, "orders", 1, leader, 0).moves == {}
    assert cancel_move(moving, "orders", 1).moves == {}
    # After the seal the target may be mid-takeover: a new target must wait.
    move = moving.moves[("orders", 1)]
    sealed = seal_move(moving, move, 10, 20)
    with pytest.raises(MoveRefused) as refused:
        request_move(sealed, "orders", 1, b, 0)
    assert refused.value.code == 39
    # A cancelled move cannot be finished by a target that had started it.
    with pytest.raises(MoveRefused):
        finish_move(cancel_move(sealed, "orders", 1), sealed.moves[("orders", 1)])


@pytest.mark.parametrize(
    ("replicas", "allow", "code"),
    [
        ([], True, 39),  # INVALID_REPLICA_ASSIGNMENT
        ([1, 1], True, 39),
        ([7], True, 39),
        ([1, 2], True, 38),  # INVALID_REPLICATION_FACTOR: one replica per partition
        ([1, 2], False, 38),
    ],
)
def test_validate_target_refusals(replicas: list[int], allow: bool, code: int) -> None:
    with pytest.raises(MoveRefused) as refused:
        validate_target(replicas, [1, 2, 3], allow)
    assert refused.value.code == code
    assert refused.value.message


def test_unknown_partitions() -> None:
    for topic, partition in (("nope", 0), ("orders", 3), ("orders", -1)):
        with pytest.raises(MoveRefused) as refused:
            request_move(_doc(), topic, partition, 1, 0)
        assert refused.value.code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert validate_target([2], [1, 2, 3], True) == 2


def test_listing_as_kafka() -> None:
    doc = _doc()
    leaders = doc.topics["orders"].leaders
    doc = request_move(doc, "orders", 2, leaders[0] if leaders[0] != leaders[2] else 99, 0)
    move = doc.moves[("orders", 2)]
    row = {
        "partition_index": 2,
        "replicas": [move.target, move.source],
        "adding_replicas": [move.target],
        "removing_replicas": [move.source],
    }
    assert ongoing_listing(doc, None) == [{"name": "orders", "partitions": [row]}]
    assert ongoing_listing(doc, [("orders", [2, 5])]) == [{"name": "orders", "partitions": [row]}]
    assert ongoing_listing(doc, [("orders", [0]), ("nope", [0])]) == []
    # A deleted topic's move is not listed (it leaves the document with the next change).
    gone = doc.without_topic("orders")
    assert ongoing_listing(gone, None) == []
    assert request_move(gone.with_topic("x", OTHER_ID, 1, {}, [1]), "x", 0, 2, 0).moves.keys() == {
        ("x", 0)
    }


def test_golden_document_with_a_move() -> None:
    doc = ClusterDoc("c1").with_topic("orders", bytes(16), 1, {}, [2])
    doc = request_move(doc, "orders", 0, 3, 1700000000000)
    assert doc.to_bytes() == (
        b'{"format":1,"cluster_id":"c1","version":2,"topics":{"orders":{'
        b'"id":"00000000000000000000000000000000","configs":{},"leaders":[2],"epochs":[0]}},'
        b'"reassignments":[{"topic":"orders","partition":0,"from":2,"to":3,"epoch":1,'
        b'"state":"fencing","end":-1,"wal_end":-1,"started_ms":1700000000000}]}'
    )
    assert ClusterDoc.from_bytes(doc.to_bytes()) == doc
    # No move, no key: documents written before reassignment keep their bytes.
    assert b"reassignments" not in finish_move(doc, doc.moves[("orders", 0)]).to_bytes()
    bad = doc.to_bytes().replace(b'"state":"fencing"', b'"state":"dancing"')
    with pytest.raises(DocFormatError):
        ClusterDoc.from_bytes(bad)


# -- the tail ------------------------------------------------------------------------------


def _data(base: int, last: int, pid: int = -1, seq: int = 0, topic: str = "orders") -> Any:
    header: dict[str, Any] = {"t": topic, "p": 0, "b": base, "l": last, "ts": 5}
    if pid >= 0:
        header.update(pid=pid, pe=0, s=seq, ls=seq + last - base, at=9)
    return (DATA, header, f"batch{base}".encode())


def _snapshot(no: int, producers: list[Any], topic_id: bytes = TOPIC_ID) -> Any:
    body = {
        "topics": [
            {
                "n": "orders",
                "id": topic_id,
                "c": {},
                "parts": [{"ls": 0, "no": no, "e": 0, "pr": producers}],
            }
        ],
        "pid_next": 0,
        "offsets": {},
    }
    return (SNAPSHOT, {"k": "snapshot", "v": 1}, msgpack.packb(body, use_bin_type=True))


def _collect(records: list[Any], start: int) -> Any:
    collector = TailCollector("orders", 0, TOPIC_ID, start)
    for rtype, header, payload in records:
        collector.add(rtype, header, payload)
    return collector.result()


def test_tail_from_the_objects_end_with_producer_state() -> None:
    link = (
        LINK,
        {"t": "orders", "p": 0, "b": 20, "l": 24, "ts": 5, "w": "proxy-101", "sz": 80},
        b"",
    )
    records = [
        _snapshot(10, [[7, 0, [[0, 9, 0, 9, 1]]]]),
        _data(10, 14, pid=7, seq=10),
        _data(15, 19),
        link,
        _data(0, 4, topic="other"),  # another partition's record
        _data(25, 29, pid=7, seq=15),
    ]
    tail = _collect(records, 15)
    assert [(b.base_offset, b.is_link) for b in tail.batches] == [
        (15, False),
        (20, True),
        (25, False),
    ]
    assert tail.batches[0].payload == b"batch15"
    assert tail.batches[1].payload is None  # the caller reads the PREPARED record
    assert (tail.start, tail.end, tail.gap) == (15, 30, None)
    # Producer 7: the snapshot's batch and both appended after it, the newest last.
    (row,) = tail.producers
    assert row[0] == 7 and [b[0] for b in row[2]] == [0, 10, 15]
    header = takeover_header(Move("orders", 0, 1, 2, 3), tail)
    assert header == {
        "k": "takeover",
        "t": "orders",
        "p": 0,
        "e": 3,
        "s": 15,
        "ls": 0,
        "pr": tail.producers,
        "tx": {"o": [], "a": []},  # no transactions below the start
    }


def test_tail_everything_uploaded_and_gaps() -> None:
    records = [_snapshot(10, []), _data(10, 14), _data(15, 19)]
    assert _collect(records, 20).batches == []
    assert _collect(records, 20).end == 20
    tail = _collect([_snapshot(0, []), _data(30, 39)], 20)
    assert tail.gap == (20, 30)  # offsets neither the objects nor the WAL hold


def test_tail_ignores_another_topic_of_the_same_name() -> None:
    records = [
        _snapshot(5, [[1, 0, [[0, 4, 0, 4, 1]]]], topic_id=OTHER_ID),
        _data(5, 9),  # the old topic's
        (CONTROL, {"k": "topic_delete", "n": "orders"}, b""),
        _data(10, 12),  # nothing may follow a delete, but if it did it is not ours
        (CONTROL, {"k": "topic_create", "n": "orders", "id": TOPIC_ID, "np": 1, "c": {}}, b""),
        _data(0, 3, pid=4),
    ]
    tail = _collect(records, 0)
    assert [b.base_offset for b in tail.batches] == [0]
    assert [r[0] for r in tail.producers] == [4]


def test_tail_after_an_earlier_takeover_and_delete_records() -> None:
    records = [
        _snapshot(0, []),
        _data(0, 4, pid=1),
        (
            CONTROL,
            {
                "k": "takeover",
                "t": "orders",
                "p": 0,
                "e": 2,
                "s": 50,
                "ls": 0,
                "pr": [[9, 1, [[0, 0, 49, 49, 1]]]],
            },
            b"",
        ),
        _data(50, 59, pid=9, seq=1),
        (CONTROL, {"k": "log_start", "t": "orders", "p": 0, "o": 55}, b""),
    ]
    tail = _collect(records, 50)
    assert [b.base_offset for b in tail.batches] == [50]
    assert [r[0] for r in tail.producers] == [9]  # producer 1 was before the takeover
    assert tail.log_start == 55


def test_evacuate_dead_mains() -> None:
    doc = ClusterDoc("c1").with_topic("orders", TOPIC_ID, 6, {}, [1, 2, 3])
    led_by_2 = [p for p, n in enumerate(doc.topics["orders"].leaders) if n == 2]
    assert len(led_by_2) == 2
    assert evacuate(doc, set(), [1, 2, 3], 0) is doc
    assert evacuate(doc, {2}, [], 0) is doc  # nowhere to go
    moved = evacuate(doc, {2}, [1, 3], 5)
    assert sorted(moved.moves) == [("orders", p) for p in led_by_2]
    # Spread over the least loaded live mains (each leads 2), lowest id first on ties.
    assert sorted(m.target for m in moved.moves.values()) == [1, 3]
    assert all(m.source == 2 and m.epoch == 1 and m.state == FENCING for m in moved.moves.values())
    # Found dead by the controller: the target fences the source's WAL, no seal awaited.
    assert all(m.source_dead for m in moved.moves.values())
    raw = moved.moves[("orders", led_by_2[0])].to_json()
    assert raw["dead"] is True and Move.from_json(raw).source_dead
    assert "dead" not in replace(moved.moves[("orders", led_by_2[0])], source_dead=False).to_json()
    assert evacuate(moved, {2}, [1, 3], 6) is moved  # already moving: nothing new
    # A target that dies: the move is cancelled while its source lives...
    key = ("orders", led_by_2[0])
    dying = moved.moves[key].target
    assert key not in evacuate(moved, {dying}, [n for n in (1, 2, 3) if n != dying], 7).moves
    # ...and goes to a live main when the source is dead too (kept sealed: the seal stands).
    sealed = seal_move(moved, moved.moves[key], 40, 400)
    other = next(n for n in (1, 3) if n != dying)
    again = evacuate(sealed, {2, dying}, [other], 8).moves[key]
    assert (again.target, again.state, again.end, again.epoch) == (other, SEALED, 40, 1)
    # A move requested of a main that then died: no seal is coming either.
    requested = request_move(doc, "orders", led_by_2[1], 1 if led_by_2[1] != 1 else 3, 9)
    key2 = ("orders", led_by_2[1])
    assert not requested.moves[key2].source_dead
    assert evacuate(requested, {2}, [1, 3], 10).moves[key2].source_dead
    # A main found dead whose partitions are being taken over answers probes again for a
    # moment before it sees the fence and stops: never a target (it would never take over).
    fencing = evacuate(doc, {1}, [2, 3], 11)
    assert fencing.moves and all(m.source == 1 for m in fencing.moves.values())
    then = evacuate(fencing, {2}, [1, 3], 12)
    assert {then.moves[("orders", p)].target for p in led_by_2} == {3}
    assert evacuate(fencing, {2, 3}, [1], 13) is fencing  # nowhere else to go: wait


def test_golden_takeover_record_header() -> None:
    """The `takeover` CONTROL header's exact msgpack bytes (docs/formats.md): the target's
    replay reads it, and so does the next target's TailCollector when the partition moves on."""
    txns = {"o": [[8, 98]], "a": [[9, 90, 97]]}
    tail = Tail(100, [], [[7, 0, [[0, 4, 95, 99, 1700000000000]]]], 50, txns=txns)
    header = takeover_header(Move("t", 1, 1, 2, 3), tail)
    assert msgpack.packb(header, use_bin_type=True).hex() == (
        "88"  # fixmap(8)
        "a16b a874616b656f766572"  # "k": "takeover"
        "a174 a174"  # "t": "t"
        "a170 01"  # "p": 1
        "a165 03"  # "e": 3 (the move's leader epoch)
        "a173 64"  # "s": 100 (the adopted objects' end)
        "a26c73 32"  # "ls": 50 (log start floor)
        "a27072 91 93 07 00 91 95 00 04 5f 63 cf0000018bcfe56800"  # "pr": producer rows
        "a27478 82 a16f 91 92 08 62 a161 91 93 09 5a 61"  # "tx": transactions below "s"
    ).replace(" ", "")
