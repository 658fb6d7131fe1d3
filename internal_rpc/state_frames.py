"""The state stream's frames (main -> each subscribed zone proxy, stream ``state``), typed.

`main_broker/state_stream.py` builds a `StateFrame` per push and sends `to_wire()`;
`proxy_broker/mirror.py` reads each push with `StateFrame.from_wire()`, which checks it strictly
and raises `MalformedMessage` naming the field at fault (the proxy then logs it and subscribes
again, for a full frame). docs/formats.md, "State stream", has the byte layout and a golden
example; the golden tests are in tests/test_state_frames.py.

A subscriber first gets one full frame (`full` true: every key), then one delta per coalesced
change, with only `wal_end` and whichever of `topics`, `deleted`, `parts`, `objects` is not
empty, and `links` when it changed. Every frame carries `mv` (the shape's version); a frame
without it is version 1, the shape a main of the previous release sent, which is this one minus
`mv`, so mains and proxies of both releases interoperate (a previous-release proxy ignores `mv`).

The frames go to every proxy every few milliseconds under load, so the rows are NamedTuples
(tuples on the wire and in memory: no per-row dict, no copy to encode) and the decoder checks
the common shape with one test per field before taking the slow path that names a fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, NamedTuple

from internal_rpc.messages import (
    MalformedMessage,
    _bytes,
    _int,
    _list,
    _map,
    _str,
    _version,
)

__all__ = [
    "STATE_FRAME_VERSION",
    "STATE_SUBSCRIPTION_VERSION",
    "STREAM_GONE",
    "ObjectRangeRow",
    "ObjectStreamRow",
    "PartitionRow",
    "StateFrame",
    "StateSubscription",
    "TopicRow",
]

# 2: the keys of every delta are one letter (`we` for `wal_end`, `p` for `parts`), and a
# partition row whose last stable offset and log end equal its high watermark (no open
# transaction, nothing uncommitted) leaves them out. A delta crosses zones to every proxy on
# every group commit. A proxy asks for it (`StateSubscription`); a main sends a subscriber that
# did not ask version 1.
STATE_FRAME_VERSION: Final = 2
STATE_SUBSCRIPTION_VERSION: Final = 1
STREAM_GONE: Final = -1  # an ObjectStreamRow's log start when the stream is gone


class TopicRow(NamedTuple):
    """A topic, new or changed. Wire: `name: [topic_id, partition count, configs, leaders]`
    in the frame's `topics` map. `leaders` (the main node id leading each partition) is None
    for a 3-element entry (a main from before partitions moved between mains: it leads all)."""

    name: str
    topic_id: bytes
    partition_count: int
    configs: dict[str, str]
    leaders: tuple[int, ...] | None

    def wire_entry(self) -> list[Any]:
        entry = [self.topic_id, self.partition_count, self.configs]
        if self.leaders is not None:
            entry.append(self.leaders)
        return entry

    @classmethod
    def from_wire(cls, name: object, entry: object, what: str = "topic") -> TopicRow:
        name = _str(name, f"{what} name")
        what = f"{what}[{name!r}]"
        fields = _list(entry, what, (3, 4))
        configs = _map(fields[2], f"{what}.configs")
        for key, value in configs.items():
            _str(key, f"{what}.configs key")
            _str(value, f"{what}.configs[{key!r}]")
        leaders = None
        if len(fields) == 4:
            raw = _list(fields[3], f"{what}.leaders")
            leaders = tuple(_int(v, f"{what}.leaders[{i}]") for i, v in enumerate(raw))
        return cls(
            name,
            _bytes(fields[0], f"{what}.topic_id"),
            _int(fields[1], f"{what}.partition_count"),
            configs,
            leaders,
        )


_PARTITION_FIELDS: Final = (
    "topic",
    "partition",
    "leader_epoch",
    "high_watermark",
    "last_stable_offset",
    "log_start_offset",
    "log_end_offset",
)


class PartitionRow(NamedTuple):
    """A partition whose state changed. Wire: the 7 fields, in this order, as an array; from
    frame version 2, `[topic, partition, leader epoch, high watermark, log start offset]` when
    the last stable offset and the log end equal the high watermark."""

    topic: str
    partition: int
    leader_epoch: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    log_end_offset: int

    def to_wire(self, version: int = STATE_FRAME_VERSION) -> tuple[Any, ...]:
        if version >= 2 and self.last_stable_offset == self.high_watermark == self.log_end_offset:
            return (
                self.topic,
                self.partition,
                self.leader_epoch,
                self.high_watermark,
                self.log_start_offset,
            )
        return self

    @classmethod
    def from_wire(
        cls, row: object, what: str = "part", version: int = STATE_FRAME_VERSION
    ) -> PartitionRow:
        fields = _widened(_list(row, what, (5, 7) if version >= 2 else (7,)))
        _str(fields[0], f"{what}.topic")
        for value, name in zip(fields[1:], _PARTITION_FIELDS[1:], strict=True):
            _int(value, f"{what}.{name}")
        return tuple.__new__(cls, fields)


def _widened(row: Any) -> Any:
    """A version 2 short row `[topic, partition, epoch, hw, log start]` as the 7 fields (the
    last stable offset and log end are the high watermark); any other value as it is."""
    if type(row) is list and len(row) == 5:
        return [row[0], row[1], row[2], row[3], row[3], row[4], row[3]]
    return row


def _partition_rows(rows: list[Any], version: int, what: str) -> tuple[PartitionRow, ...]:
    """The hot path of a delta: one identity test per field and no Python call per row (the
    rows are then made in C); a frame that fails them is read again row by row through
    `PartitionRow.from_wire`, which names the row and field at fault."""
    if version >= 2:
        rows = [_widened(row) for row in rows]
    try:
        for t, p, e, hw, lso, ls, leo in rows:
            if not (
                type(t) is str
                and type(p) is int
                and type(e) is int
                and type(hw) is int
                and type(lso) is int
                and type(ls) is int
                and type(leo) is int
            ):
                break
        else:
            return tuple(map(tuple.__new__, repeat(PartitionRow, len(rows)), rows))
    except (TypeError, ValueError):  # a row that is no array, or not of 7 elements
        pass
    for i, row in enumerate(rows):
        PartitionRow.from_wire(row, f"{what}[{i}]", version)
    raise MalformedMessage(f"{what} has a row that is not a partition row")


class ObjectRangeRow(NamedTuple):
    """One object range of a stream (s3_commit.manifest.ObjectRange). Wire: 6 elements, or 5
    (from a main before ranges counted their bytes: `nbytes` is then -1)."""

    start: int
    end: int
    key: str
    size: int
    max_timestamp: int
    nbytes: int = -1

    @classmethod
    def from_wire(cls, row: object, what: str = "range") -> ObjectRangeRow:
        fields = _list(row, what, (5, 6))
        return cls(
            _int(fields[0], f"{what}.start"),
            _int(fields[1], f"{what}.end"),
            _str(fields[2], f"{what}.key"),
            _int(fields[3], f"{what}.size"),
            _int(fields[4], f"{what}.max_timestamp"),
            _int(fields[5], f"{what}.nbytes") if len(fields) == 6 else -1,
        )


class ObjectStreamRow(NamedTuple):
    """One stream of the main's object manifest that changed (s3_commit/manifest_delta.py):
    the ranges added, the object keys whose ranges went, and the stream's log start
    (`STREAM_GONE`: the stream is gone; None in a 4-element row from a main before the log
    start existed, which leaves it alone)."""

    topic_id: bytes
    partition: int
    added: tuple[ObjectRangeRow, ...]
    removed: tuple[str, ...]
    log_start: int | None

    def to_wire(self) -> list[Any]:
        row = [self.topic_id, self.partition, self.added, self.removed]
        if self.log_start is not None:
            row.append(self.log_start)
        return row

    @classmethod
    def of(cls, row: list[Any]) -> ObjectStreamRow:
        """From a row of s3_commit.manifest_delta (trusted: the main built it)."""
        topic_id, partition, added, removed, *rest = row
        return cls(
            topic_id,
            partition,
            tuple(ObjectRangeRow(*r) for r in added),
            tuple(removed),
            rest[0] if rest else None,
        )

    @classmethod
    def from_wire(cls, row: object, what: str = "objects") -> ObjectStreamRow:
        fields = _list(row, what, (4, 5))
        added = _list(fields[2], f"{what}.added")
        removed = _list(fields[3], f"{what}.removed")
        return cls(
            _bytes(fields[0], f"{what}.topic_id"),
            _int(fields[1], f"{what}.partition"),
            tuple(ObjectRangeRow.from_wire(r, f"{what}.added[{i}]") for i, r in enumerate(added)),
            tuple(_str(k, f"{what}.removed[{i}]") for i, k in enumerate(removed)),
            _int(fields[4], f"{what}.log_start") if len(fields) == 5 else None,
        )


class AbortedRow(NamedTuple):
    """A partition's aborted transactions, all of them (issue 13): a read_committed fetch
    a proxy serves names those in its range. Wire: [topic, partition, [[producer id, first
    offset, last offset (the ABORT marker's)], ...]]."""

    topic: str
    partition: int
    aborted: tuple[tuple[int, int, int], ...]

    def to_wire(self) -> list[Any]:
        return [self.topic, self.partition, [list(a) for a in self.aborted]]

    @classmethod
    def from_wire(cls, row: object, what: str = "txns") -> AbortedRow:
        fields = _list(row, what, (3,))
        aborted = []
        for i, entry in enumerate(_list(fields[2], f"{what}.aborted")):
            pid, first, last = _list(entry, f"{what}.aborted[{i}]", (3,))
            aborted.append(
                (
                    _int(pid, f"{what}.aborted[{i}].producer_id"),
                    _int(first, f"{what}.aborted[{i}].first_offset"),
                    _int(last, f"{what}.aborted[{i}].last_offset"),
                )
            )
        return cls(
            _str(fields[0], f"{what}.topic"), _int(fields[1], f"{what}.partition"), tuple(aborted)
        )


@dataclass(frozen=True, slots=True)
class StateFrame:
    """One push of the state stream. `node` and `writer` (the main's node id and WAL writer
    id) are set in a full frame only. `links` is the main's links floor (per proxy WAL writer,
    the lowest PREPARED offset a LINK still needs): always in a full frame (None there: the
    main sent none, which blocks the proxy's trim), in a delta only when it changed."""

    wal_end: int
    full: bool = False
    node: int | None = None
    writer: str | None = None
    topics: tuple[TopicRow, ...] = ()
    deleted: tuple[str, ...] = ()
    parts: tuple[PartitionRow, ...] = ()
    objects: tuple[ObjectStreamRow, ...] = ()
    links: dict[str, int] | None = None
    # Partitions whose aborted transactions changed (a full frame: every one with any).
    # Optional and last: a proxy of the previous release ignores it (mv stays 1).
    txns: tuple[AbortedRow, ...] = ()

    def to_wire(self, version: int = STATE_FRAME_VERSION) -> dict[str, Any]:
        """Keys in this order; a delta leaves out `full`, `node`, `writer` and what is empty
        (it crosses zones on every group commit: only what a subscriber lacks)."""
        msg: dict[str, Any] = {"mv": version}
        full = self.full
        if full:
            if self.node is None or self.writer is None:
                raise MalformedMessage("state: a full frame names its node and writer")
            msg["full"] = True
            msg["node"] = self.node
            msg["writer"] = self.writer
        msg["we" if version >= 2 else "wal_end"] = self.wal_end
        if full or self.topics:
            msg["topics"] = {t.name: t.wire_entry() for t in self.topics}
        if full or self.deleted:
            msg["deleted"] = self.deleted
        if full or self.parts:
            if version >= 2:
                msg["p"] = [row.to_wire(version) for row in self.parts]
            else:
                msg["parts"] = self.parts
        if full or self.objects:
            msg["objects"] = [row.to_wire() for row in self.objects]
        if self.links is not None:
            msg["links"] = self.links
        if self.txns:
            msg["txns"] = [row.to_wire() for row in self.txns]
        return msg

    @classmethod
    def from_wire(cls, msg: object) -> StateFrame:
        frame = _map(msg, "state")
        version = _version(frame, "state", STATE_FRAME_VERSION)
        wal_end_key, parts_key = ("we", "p") if version >= 2 else ("wal_end", "parts")
        full = frame.get("full", False)
        if type(full) is not bool:
            raise MalformedMessage(f"state.full must be a boolean, not {type(full).__name__}")
        if wal_end_key not in frame:
            raise MalformedMessage(f"state.{wal_end_key} is missing")
        wal_end = _int(frame[wal_end_key], f"state.{wal_end_key}")
        node = writer = None
        if full:
            for key in ("node", "writer", "topics"):
                if key not in frame:
                    raise MalformedMessage(f"state.{key} is missing from a full frame")
            node = _int(frame["node"], "state.node")
            writer = _str(frame["writer"], "state.writer")
        topics: tuple[TopicRow, ...] = ()
        if "topics" in frame:
            entries = _map(frame["topics"], "state.topics")
            topics = tuple(
                TopicRow.from_wire(name, entry, "state.topics") for name, entry in entries.items()
            )
        deleted: tuple[str, ...] = ()
        if "deleted" in frame:
            names = _list(frame["deleted"], "state.deleted")
            deleted = tuple(_str(n, f"state.deleted[{i}]") for i, n in enumerate(names))
        parts: tuple[PartitionRow, ...] = ()
        if parts_key in frame:
            what = f"state.{parts_key}"
            parts = _partition_rows(_list(frame[parts_key], what), version, what)
        objects: tuple[ObjectStreamRow, ...] = ()
        if "objects" in frame:
            rows = _list(frame["objects"], "state.objects")
            objects = tuple(
                ObjectStreamRow.from_wire(row, f"state.objects[{i}]") for i, row in enumerate(rows)
            )
        links = None
        if "links" in frame:
            links = _map(frame["links"], "state.links")
            for key, value in links.items():
                _str(key, "state.links key")
                _int(value, f"state.links[{key!r}]")
        txns: tuple[AbortedRow, ...] = ()
        if "txns" in frame:
            rows = _list(frame["txns"], "state.txns")
            txns = tuple(AbortedRow.from_wire(r, f"state.txns[{i}]") for i, r in enumerate(rows))
        return cls(wal_end, full, node, writer, topics, deleted, parts, objects, links, txns)


@dataclass(frozen=True, slots=True)
class StateSubscription:
    """The params of a `state` subscription: the highest frame version the subscriber reads.
    `{}` (what a proxy of an earlier release sends) asks for version 1; a main of an earlier
    release ignores the params and sends version 1, which every proxy reads."""

    frames: int = STATE_FRAME_VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"mv": STATE_SUBSCRIPTION_VERSION, "frames": self.frames}

    @classmethod
    def from_wire(cls, msg: object) -> StateSubscription:
        params = _map(msg, "state subscription")
        _version(params, "state subscription", STATE_SUBSCRIPTION_VERSION)
        frames = _int(params.get("frames", 1), "state subscription.frames")
        if frames < 1:
            raise MalformedMessage(f"state subscription.frames must be at least 1, not {frames}")
        return cls(min(frames, STATE_FRAME_VERSION))
