"""Partition reassignment, the pure core: the move record in the cluster metadata document,
its transitions, and which of the old leader's WAL records the new leader takes over.

No I/O here (main_broker/cluster/handoff.py does it). A move of partition P from main A to main B:

1. `request_move` (AlterPartitionReassignments on any main) adds a move to the document by
   CAS, state `fencing`, with the next leader epoch. `leaders[P]` still names A.
2. A sees it and stops appending to P (NOT_LEADER_OR_FOLLOWER); once its appends to P are
   durable it records, by CAS, state `sealed` with P's end offset and its WAL end
   (`seal_move`).
3. B takes P over: it adopts A's object ranges of P into its own manifest, replays the records
   of P from A's WAL that the objects do not hold (`TailCollector`) into its own WAL with the
   original offsets and producer state, then `finish_move` sets `leaders[P] = B` and
   `epochs[P]` to the move's epoch and drops the move, in one CAS.

A dead A never seals: B proceeds without the seal once the move has been in the document for
the fence window and A's registration is dead (handoff.py says why that is safe).
Cancelling (`cancel_move`) drops the move while `leaders[P]` still names A; A resumes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from main_broker.partition_txns import PartitionTxns
from main_broker.producer_state import BatchMetadata, ProducerStateTable
from shared_wal import broker_records as wal_records

if TYPE_CHECKING:
    from main_broker.cluster.doc import ClusterDoc

__all__ = [
    "FENCING",
    "SEALED",
    "Move",
    "MoveRefused",
    "Tail",
    "TailCollector",
    "cancel_move",
    "evacuate",
    "finish_move",
    "moves_from_json",
    "moves_to_json",
    "ongoing_listing",
    "request_move",
    "seal_move",
    "snapshot_starts_tails",
    "takeover_header",
    "validate_target",
]

FENCING = "fencing"
SEALED = "sealed"
STATES = (FENCING, SEALED)

# Kafka error codes the admin handlers answer (kio.schema.errors.ErrorCode values).
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
NO_REASSIGNMENT_IN_PROGRESS = 85

PartitionKey = tuple[str, int]


class MoveRefused(Exception):
    """A reassignment request Kafka would refuse: `code` is the Kafka error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Move:
    topic: str
    partition: int
    source: int  # the leading main (the document's leaders[partition] until the move ends)
    target: int
    epoch: int  # the leader epoch the target leads with
    state: str = FENCING
    end: int = -1  # sealed: the partition's end offset at the source
    wal_end: int = -1  # sealed: the source's WAL end after its last append to the partition
    started_ms: int = 0
    # The controller found the source dead: the target fences the source's WAL and takes the
    # partition over without waiting for a seal.
    source_dead: bool = False

    @property
    def key(self) -> PartitionKey:
        return (self.topic, self.partition)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "from": self.source,
            "to": self.target,
            "epoch": self.epoch,
            "state": self.state,
            "end": self.end,
            "wal_end": self.wal_end,
            "started_ms": self.started_ms,
            **({"dead": True} if self.source_dead else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Move:
        move = cls(
            str(raw["topic"]),
            int(raw["partition"]),
            int(raw["from"]),
            int(raw["to"]),
            int(raw["epoch"]),
            str(raw["state"]),
            int(raw["end"]),
            int(raw["wal_end"]),
            int(raw["started_ms"]),
            raw.get("dead") is True,
        )
        if move.state not in STATES or move.partition < 0 or move.source == move.target:
            raise ValueError(f"bad reassignment entry {dict(raw)!r}")
        return move


def moves_to_json(moves: Mapping[PartitionKey, Move]) -> list[dict[str, Any]]:
    return [moves[k].to_json() for k in sorted(moves)]


def moves_from_json(raw: Iterable[Mapping[str, Any]]) -> dict[PartitionKey, Move]:
    out: dict[PartitionKey, Move] = {}
    for item in raw:
        move = Move.from_json(item)
        if move.key in out:
            raise ValueError(f"partition {move.key} is moved twice")
        out[move.key] = move
    return out


# -- requests ---------------------------------------------------------------------------------


def validate_target(replicas: list[int], mains: Iterable[int], allow_rf_change: bool) -> int:
    """The main a replica list names; raises MoveRefused as Kafka would answer."""
    if not replicas:
        raise MoveRefused(
            INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty list."
        )
    if len(set(replicas)) != len(replicas):
        raise MoveRefused(
            INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes a broker more than once.",
        )
    known = set(mains)
    for node in replicas:
        if node not in known:
            raise MoveRefused(
                INVALID_REPLICA_ASSIGNMENT,
                f"The manual partition assignment includes broker {node}, but no such "
                "broker is registered.",
            )
    if len(replicas) != 1:
        if not allow_rf_change:
            message = f"The replication factor is changed from 1 to {len(replicas)}"
        else:
            message = (
                "zonefleet keeps one replica per partition (its data is in the shared WAL and "
                f"object storage): name one main broker, not {len(replicas)}"
            )
        raise MoveRefused(INVALID_REPLICATION_FACTOR, message)
    return replicas[0]


def _partition_leader(doc: ClusterDoc, topic: str, partition: int) -> tuple[int, int]:
    meta = doc.topics.get(topic)
    if meta is None:
        raise MoveRefused(UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {topic}.")
    if not 0 <= partition < len(meta.leaders):
        raise MoveRefused(
            UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find partition {topic}:{partition}."
        )
    return meta.leaders[partition], meta.epochs[partition]


def _with_moves(doc: ClusterDoc, moves: dict[PartitionKey, Move]) -> ClusterDoc:
    # Moves of partitions that no longer exist (a deleted topic) go with any change.
    live = {
        k: m
        for k, m in moves.items()
        if k[0] in doc.topics and k[1] < len(doc.topics[k[0]].leaders)
    }
    return replace(doc, version=doc.version + 1, moves=live)


def request_move(
    doc: ClusterDoc, topic: str, partition: int, target: int, now_ms: int
) -> ClusterDoc:
    """The document with P moving to `target` (itself when nothing changes): a request naming
    the current leader cancels a move under way (Kafka: the target equals the replicas, so
    nothing is left to do); one naming another main replaces a move not sealed yet."""
    leader, epoch = _partition_leader(doc, topic, partition)
    moves = dict(doc.moves)
    current = moves.get((topic, partition))
    if target == leader:
        if current is None:
            return doc
        del moves[(topic, partition)]
        return _with_moves(doc, moves)
    if current is not None and current.target == target:
        return doc
    if current is not None and current.state == SEALED:
        # The source is done; the target may be mid-takeover. A new target waits its turn.
        raise MoveRefused(
            INVALID_REPLICA_ASSIGNMENT,
            f"{topic}:{partition} is being handed over to broker {current.target}; "
            "retry once it completes",
        )
    moves[(topic, partition)] = Move(
        topic, partition, leader, target, epoch + 1, FENCING, -1, -1, now_ms
    )
    return _with_moves(doc, moves)


def cancel_move(doc: ClusterDoc, topic: str, partition: int) -> ClusterDoc:
    """Replicas null: drop the move; NO_REASSIGNMENT_IN_PROGRESS when there is none."""
    _partition_leader(doc, topic, partition)
    moves = dict(doc.moves)
    if moves.pop((topic, partition), None) is None:
        raise MoveRefused(NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress.")
    return _with_moves(doc, moves)


def seal_move(doc: ClusterDoc, move: Move, end: int, wal_end: int) -> ClusterDoc:
    """The source's appends to P are durable up to `end`: record it (itself when the move is
    gone or changed meanwhile: a cancel or a new request won)."""
    current = doc.moves.get(move.key)
    if current != move or move.state != FENCING:
        return doc
    moves = dict(doc.moves)
    moves[move.key] = replace(move, state=SEALED, end=end, wal_end=wal_end)
    return _with_moves(doc, moves)


def finish_move(doc: ClusterDoc, move: Move) -> ClusterDoc:
    """The target leads P from now on. Raises MoveRefused when the move is no longer the one
    the target took over (cancelled, or replaced before it was sealed)."""
    current = doc.moves.get(move.key)
    if current is None or (current.target, current.epoch) != (move.target, move.epoch):
        raise MoveRefused(NO_REASSIGNMENT_IN_PROGRESS, f"the move of {move.key} was withdrawn")
    meta = doc.topics[move.topic]
    leaders = list(meta.leaders)
    epochs = list(meta.epochs)
    leaders[move.partition] = move.target
    epochs[move.partition] = move.epoch
    topics = {**doc.topics, move.topic: replace(meta, leaders=tuple(leaders), epochs=tuple(epochs))}
    moves = {k: m for k, m in doc.moves.items() if k != move.key}
    return _with_moves(replace(doc, topics=topics), moves)


def evacuate(doc: ClusterDoc, dead: set[int], live: list[int], now_ms: int) -> ClusterDoc:
    """The controller's moves off dead mains (itself when there is nothing to do): every
    partition a dead main leads that is not moving yet gets a move to the live main that
    leads the fewest partitions (moves under way counted at their target; ties: lowest id).
    A move whose target died is cancelled when its source lives (the source resumes), and
    goes to such a main when both died (sealed or not: the dead target never finished, and
    it cannot finish a move that names another main). Every move off a dead main is marked
    `source_dead`: its target fences the source's WAL rather than waiting for a seal.

    A main that is the source of a `source_dead` move is never a target, even when it answers
    probes again: its WAL is fenced, and it stops as soon as it notices."""
    being_fenced = {m.source for m in doc.moves.values() if m.source_dead}
    live = [n for n in live if n not in being_fenced]
    if not dead or not live:
        return doc
    load = dict.fromkeys(live, 0)
    for meta in doc.topics.values():
        for leader in meta.leaders:
            if leader in load:
                load[leader] += 1
    for move in doc.moves.values():
        if move.target in load:
            load[move.target] += 1

    def least_loaded() -> int:
        target = min(live, key=lambda n: (load[n], n))
        load[target] += 1
        return target

    moves = dict(doc.moves)
    for key in sorted(moves):
        move = moves[key]
        if move.target not in dead:
            if move.source in dead and not move.source_dead:
                moves[key] = replace(move, source_dead=True)  # no seal is coming
            continue
        if move.source in dead:
            moves[key] = replace(move, target=least_loaded(), source_dead=True)
        else:
            del moves[key]  # cancelled: the live source leads on
    for name in sorted(doc.topics):
        meta = doc.topics[name]
        for partition, leader in enumerate(meta.leaders):
            if leader in dead and (name, partition) not in moves:
                epoch = meta.epochs[partition] + 1
                target = least_loaded()
                moves[(name, partition)] = Move(
                    name, partition, leader, target, epoch, FENCING, -1, -1, now_ms, True
                )
    if moves == doc.moves:
        return doc
    return _with_moves(doc, moves)


def ongoing_listing(
    doc: ClusterDoc, wanted: list[tuple[str, list[int]]] | None
) -> list[dict[str, Any]]:
    """ListPartitionReassignments' topics: during a move Kafka lists the replicas as target
    then source, adding the target and removing the source. Unknown topics and partitions,
    and partitions not moving, are left out (as Kafka does)."""
    by_topic: dict[str, list[Move]] = {}
    for key in sorted(doc.moves):
        move = doc.moves[key]
        if move.topic in doc.topics:  # a move of a deleted topic ends with the next change
            by_topic.setdefault(move.topic, []).append(move)
    if wanted is None:
        chosen = by_topic
    else:
        chosen = {}
        for name, partitions in wanted:
            picked = [m for m in by_topic.get(name, []) if m.partition in set(partitions)]
            if picked:
                chosen[name] = picked
    return [
        {
            "name": name,
            "partitions": [
                {
                    "partition_index": m.partition,
                    "replicas": [m.target, m.source],
                    "adding_replicas": [m.target],
                    "removing_replicas": [m.source],
                }
                for m in moves
            ],
        }
        for name, moves in chosen.items()
    ]


# -- what the target takes over from the source's WAL ----------------------------------------

# WAL record types (shared_wal.RecordType), repeated so this module needs no I/O package.
DATA, LINK, CONTROL, SNAPSHOT = 1, 3, 4, 6


@dataclass(slots=True)
class TailBatch:
    """One batch of P the objects do not hold: its DATA/LINK header and, for DATA, the
    payload (a LINK's payload is read from the proxy's PREPARED record by the caller)."""

    header: dict[str, Any]
    payload: bytes | bytearray | memoryview | None
    is_link: bool

    @property
    def base_offset(self) -> int:
        return int(self.header["b"])

    @property
    def last_offset(self) -> int:
        return int(self.header["l"])

    def data_header(self) -> dict[str, Any]:
        """The DATA record header the target writes for it: the same offsets, timestamp and
        producer keys (a LINK's pointer keys are gone: the target's record holds the bytes)."""
        h = self.header
        if "cm" in h:  # a transaction marker
            return wal_records.marker_header(
                h["t"], h["p"], h["b"], h["ts"], h["pid"], h["pe"], bool(h["cm"])
            )
        producer = None
        if int(h.get("pid", -1)) >= 0:
            producer = (h["pid"], h["pe"], h["s"], h["ls"], h.get("at", 0))
        return wal_records.data_header(
            h["t"], h["p"], h["b"], h["l"], h["ts"], producer, bool(h.get("tx"))
        )


@dataclass(slots=True)
class Tail:
    start: int  # the first offset the target's own log holds (the adopted objects' end)
    batches: list[TailBatch] = field(default_factory=list)
    producers: list[Any] = field(default_factory=list)  # ProducerStateTable snapshot rows
    log_start: int = 0  # DeleteRecords / snapshot floor seen in the source's WAL
    gap: tuple[int, int] | None = None  # [from, to): offsets neither objects nor WAL hold
    # PartitionTxns snapshot of the offsets below `start` (the tail's batches bring the rest)
    txns: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.batches[-1].last_offset + 1 if self.batches else self.start


def snapshot_starts_tails(
    payload: bytes | memoryview, wants: Iterable[tuple[str, int, bytes, int]]
) -> bool:
    """Whether a takeover scan may start at the segment this SNAPSHOT heads: for every wanted
    (topic, partition, topic id, start offset), the state it holds ends at or below the start,
    so every batch the target needs follows it, and its producer state covers what precedes.
    A topic it lacks, or holds under another id, is one whose records all follow."""
    import msgpack  # the snapshot body's encoding (shared_wal.broker_records)

    body = msgpack.unpackb(bytes(payload), raw=False)
    topics = {t.get("n"): t for t in body.get("topics", ())}
    for topic, partition, topic_id, start in wants:
        held = topics.get(topic)
        if held is None or bytes(held["id"]) != topic_id:
            continue
        parts = held.get("parts", ())
        if partition < len(parts) and int(parts[partition].get("no", 0)) > start:
            return False
    return True


class TailCollector:
    """Feed it the source WAL's records oldest first (`add`), then `result()`.

    A record belongs to P when it is a DATA or LINK of (topic, partition) written while the
    topic had P's topic id: a `topic_delete` of the name or a `topic_create` with another id
    starts over (the records before it were another topic's of the same name). Producer state
    comes from the first SNAPSHOT (the batches below the oldest retained segment) and then
    from every batch after it, as the source's own replay rebuilds it; a `takeover` record of
    P (the source took P over itself once) resets it to what that record carries.
    """

    def __init__(self, topic: str, partition: int, topic_id: bytes, start: int) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.start = start
        self._first = True
        self._ours = True  # False after a record says the name belongs to another topic
        self._reset()

    def _reset(self) -> None:
        self.producers = ProducerStateTable()
        self.txns = PartitionTxns()
        self.batches: list[TailBatch] = []
        self.next_offset = 0
        self.log_start = 0

    def add(self, rtype: int, header: Mapping[str, Any], payload: bytes | memoryview) -> None:
        first, self._first = self._first, False
        if rtype == SNAPSHOT:
            if first:
                self._snapshot(payload)
            return
        if rtype == CONTROL:
            self._control(header)
            return
        if rtype not in (DATA, LINK) or not self._ours:
            return
        if header.get("t") != self.topic or header.get("p") != self.partition:
            return
        base, last = int(header["b"]), int(header["l"])
        if base < self.next_offset:
            return  # covered already (a snapshot or an earlier copy)
        self.next_offset = last + 1
        pid = int(header.get("pid", -1))
        if "cm" in header:
            self.producers.bump_epoch(pid, int(header["pe"]))
            if base < self.start:  # the target replays the tail's markers itself
                self.txns.on_marker(pid, base, bool(header["cm"]))
        elif pid >= 0:
            if header.get("tx") and base < self.start:
                self.txns.on_transactional_batch(pid, base)
            meta = BatchMetadata(
                int(header["s"]), int(header["ls"]), base, last, int(header.get("at", 0))
            )
            self.producers.record(pid, int(header["pe"]), meta)
        if base >= self.start:
            data = None if rtype == LINK else payload
            self.batches.append(TailBatch(dict(header), data, rtype == LINK))

    def _snapshot(self, payload: bytes | memoryview) -> None:
        import msgpack  # the snapshot body's encoding (shared_wal.broker_records)

        body = msgpack.unpackb(bytes(payload), raw=False)
        for topic in body.get("topics", ()):
            if topic.get("n") != self.topic:
                continue
            self._ours = bytes(topic["id"]) == self.topic_id
            parts = topic.get("parts", ())
            if self._ours and self.partition < len(parts):
                snap = parts[self.partition]
                self.producers = ProducerStateTable.from_snapshot(snap.get("pr", []))
                self.txns = PartitionTxns.from_snapshot(snap.get("tx"))
                self.next_offset = int(snap.get("no", 0))
                self.log_start = int(snap.get("ls", 0))

    def _control(self, header: Mapping[str, Any]) -> None:
        kind = header.get("k")
        if kind == "topic_delete" and header.get("n") == self.topic:
            self._reset()
            self._ours = False
        elif kind == "topic_create" and header.get("n") == self.topic:
            if bytes(header["id"]) != self.topic_id or not self._ours:
                self._reset()
            self._ours = bytes(header["id"]) == self.topic_id
        elif kind == "takeover" and (header.get("t"), header.get("p")) == (
            self.topic,
            self.partition,
        ):
            if self._ours:
                self._reset()
                self.producers = ProducerStateTable.from_snapshot(header.get("pr", []))
                self.txns = PartitionTxns.from_snapshot(header.get("tx"))
                self.next_offset = int(header["s"])
                self.log_start = int(header.get("ls", 0))
        elif kind == "log_start" and (header.get("t"), header.get("p")) == (
            self.topic,
            self.partition,
        ):
            self.log_start = max(self.log_start, int(header["o"]))

    def result(self) -> Tail:
        """What the target takes: the batches from `start` on (contiguous, checked), the
        producer state of everything the source appended, the log start floor."""
        tail = Tail(self.start, list(self.batches), [], self.log_start)
        if tail.batches and tail.batches[0].base_offset > self.start:
            tail.gap = (self.start, tail.batches[0].base_offset)
        tail.producers = self.producers.to_snapshot(max(tail.end, self.next_offset))
        tail.txns = self.txns.to_snapshot(self.start)
        return tail


def takeover_header(move: Move, tail: Tail) -> dict[str, Any]:
    """The CONTROL record the target writes before the tail's DATA records: replay resets P
    to it (start offset, leader epoch, producer state, log start floor)."""
    return {
        "k": "takeover",
        "t": move.topic,
        "p": move.partition,
        "e": move.epoch,
        "s": tail.start,
        "ls": tail.log_start,
        "pr": tail.producers,
        "tx": tail.txns,
    }
