"""A main broker's object manifest: which committed objects hold which offsets of each stream.

Pure data and transitions, no I/O (`s3_commit.manifest_store` keeps it in the object store by
compare-and-swap). One document per main broker, `manifests/<node id>.json`, written only by
that main. An object counts as "in S3" only once a manifest lists it: the uploader PUTs the
objects first and commits the manifest after, so a crash in between leaves orphans (objects no
manifest lists) that `orphan_keys` picks out for deletion, never a manifest naming a missing
object. The bytes are JSON (docs/formats.md, "Object manifest"):

    {"format": 1, "node_id": int, "version": int,
     "streams": [{"topic": str, "topic_id": 32 hex, "partition": int, "log_start": int,
                  "ranges": [[start, end, key, object size, max timestamp, bytes], ...]}]}

"log_start" (written only when above 0) is where retention moved the stream's log start: the
ranges below it are gone, and it outlives them (a stream whose every range expired keeps its
end there, so a restart with an empty WAL continues after it). A range's last element, the
stream's bytes in the object, is absent (-1: unknown) in manifests written before it existed.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from s3_commit.json_fields import expect_int
from s3_commit.object_format import FOOTER_SIZE
from s3_commit.object_plan import parse_object_key

__all__ = [
    "FORMAT",
    "MANIFEST_PREFIX",
    "Manifest",
    "ManifestConflict",
    "ManifestFormatError",
    "ObjectRange",
    "StreamKey",
    "StreamManifest",
    "StreamShare",
    "UploadedObject",
    "manifest_key",
    "new_object_id",
    "object_id_time_ms",
    "orphan_keys",
]

FORMAT = 1
MANIFEST_PREFIX = "manifests/"
_MAX_PARTITION = 0xFFFF  # the stream id keeps 16 bits for the partition
_TIMED_ID_VERSION = "7"


class ManifestFormatError(ValueError):
    """The manifest bytes are not a valid document; the message says where."""


class ManifestConflict(ValueError):
    """An upload's range starts below what the manifest already holds for its stream."""


class StreamKey(NamedTuple):
    topic_id: bytes
    partition: int


@dataclass(frozen=True, slots=True)
class ObjectRange:
    """Offsets [start, end) of one stream inside the object `key` (whole object `size` bytes,
    `nbytes` of them this stream's batches)."""

    start: int
    end: int
    key: str
    size: int
    max_timestamp: int = -1  # of the range's batches; -1 when none carry one
    nbytes: int = -1  # -1: unknown (a manifest written before the field)

    def to_json(self) -> list[Any]:
        return [self.start, self.end, self.key, self.size, self.max_timestamp, self.nbytes]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> ObjectRange:
        """From the 6-element list, or the 5-element one without the stream's bytes."""
        start, end, key, size, max_ts, *rest = raw
        nbytes = rest[0] if rest else -1
        return cls(int(start), int(end), str(key), int(size), int(max_ts), int(nbytes))


@dataclass(frozen=True, slots=True)
class StreamManifest:
    topic: str
    ranges: tuple[ObjectRange, ...]
    # Retention's floor: every range ends above it (0: never moved).
    log_start: int = 0
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(r.start for r in self.ranges))

    @property
    def start_offset(self) -> int:
        return max(self.ranges[0].start, self.log_start) if self.ranges else self.log_start

    @property
    def end_offset(self) -> int:
        """Just past the last committed offset (the log start with no ranges)."""
        return self.ranges[-1].end if self.ranges else self.log_start

    def find(self, offset: int) -> ObjectRange | None:
        """The range holding `offset`; if the offset falls in a gap, the next range (a reader
        continues from there); None at or past the end."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and offset < self.ranges[i].end:
            return self.ranges[i]
        return self.ranges[i + 1] if i + 1 < len(self.ranges) else None

    def first_at_timestamp(self, timestamp: int) -> ObjectRange | None:
        """The first range whose batches reach `timestamp`."""
        for rng in self.ranges:
            if rng.max_timestamp >= timestamp:
                return rng
        return None


@dataclass(frozen=True, slots=True)
class StreamShare:
    """One stream's part of an uploaded object."""

    stream: StreamKey
    topic: str
    start: int
    end: int
    max_timestamp: int = -1
    nbytes: int = -1  # the stream's batch bytes in the object


@dataclass(frozen=True, slots=True)
class UploadedObject:
    key: str
    size: int
    shares: tuple[StreamShare, ...]


def manifest_key(node_id: int) -> str:
    return f"{MANIFEST_PREFIX}{node_id}.json"


@dataclass(frozen=True)
class Manifest:
    node_id: int
    version: int = 0
    streams: dict[StreamKey, StreamManifest] = field(default_factory=dict)
    # Replaced objects (compaction) -> when their writer may delete them (Unix ms).
    retired: dict[str, int] = field(default_factory=dict)

    # -- lookups -------------------------------------------------------------------------------

    def stream(self, topic_id: bytes, partition: int) -> StreamManifest | None:
        return self.streams.get(StreamKey(topic_id, partition))

    def find(self, topic_id: bytes, partition: int, offset: int) -> ObjectRange | None:
        stream = self.stream(topic_id, partition)
        return stream.find(offset) if stream is not None else None

    def end_offset(self, topic_id: bytes, partition: int) -> int:
        """The committed end of a stream: everything below it is in objects (0: nothing)."""
        stream = self.stream(topic_id, partition)
        return stream.end_offset if stream is not None else 0

    def keys(self) -> set[str]:
        return {r.key for s in self.streams.values() for r in s.ranges}

    def referenced_keys(self) -> set[str]:
        """Every object an orphan sweep must keep: the listed ones and the retired ones."""
        return self.keys() | self.retired.keys()

    def object_sizes(self) -> dict[str, int]:
        return {r.key: r.size for s in self.streams.values() for r in s.ranges}

    # -- transitions ---------------------------------------------------------------------------

    def holds(self, objects: Sequence[UploadedObject]) -> bool:
        """Whether every object of an upload is already listed (a commit whose answer was lost
        may have gone through)."""
        keys = self.keys()
        return all(o.key in keys for o in objects)

    def with_upload(self, objects: Sequence[UploadedObject]) -> Manifest:
        """The manifest with one committed upload added (itself when it is already there).

        Each share must start at or after its stream's end: a gap is allowed (data the WAL
        lost before it was uploaded), an overlap raises ManifestConflict.
        """
        if self.holds(objects):
            return self
        added: dict[StreamKey, list[ObjectRange]] = {}
        topics: dict[StreamKey, str] = {}
        for obj in objects:
            for share in obj.shares:
                if share.end <= share.start:
                    raise ValueError(f"empty range [{share.start}, {share.end}) in {obj.key}")
                added.setdefault(share.stream, []).append(
                    ObjectRange(
                        share.start,
                        share.end,
                        obj.key,
                        obj.size,
                        share.max_timestamp,
                        share.nbytes,
                    )
                )
                topics[share.stream] = share.topic
        streams = dict(self.streams)
        for key, new_ranges in added.items():
            new_ranges.sort(key=lambda r: r.start)
            current = streams.get(key)
            end = current.end_offset if current is not None else None
            for rng in new_ranges:
                if end is not None and rng.start < end:
                    raise ManifestConflict(
                        f"stream {key.topic_id.hex()}/{key.partition}: range "
                        f"[{rng.start}, {rng.end}) of {rng.key} starts below the committed "
                        f"end {end}"
                    )
                end = rng.end
            old = current.ranges if current is not None else ()
            log_start = current.log_start if current is not None else 0
            streams[key] = StreamManifest(topics[key], (*old, *new_ranges), log_start)
        return replace(self, version=self.version + 1, streams=streams)

    def without_objects(self, keys: Iterable[str]) -> Manifest:
        """The manifest with these objects' ranges removed (compaction swaps, retention)."""
        gone = set(keys)
        streams: dict[StreamKey, StreamManifest] = {}
        for key, stream in self.streams.items():
            ranges = tuple(r for r in stream.ranges if r.key not in gone)
            if ranges or stream.log_start > 0:
                streams[key] = StreamManifest(stream.topic, ranges, stream.log_start)
        if streams == self.streams:
            return self
        return replace(self, version=self.version + 1, streams=streams)

    def with_log_start(self, key: StreamKey, offset: int) -> Manifest:
        """Retention: the stream's log start moved to `offset`, its ranges that end at or below
        it gone (whole ranges only: one straddling `offset` stays). Itself when nothing moves
        or the stream is not listed."""
        stream = self.streams.get(key)
        if stream is None or offset <= stream.log_start:
            return self
        ranges = tuple(r for r in stream.ranges if r.end > offset)
        streams = dict(self.streams)
        streams[key] = StreamManifest(stream.topic, ranges, offset)
        return replace(self, version=self.version + 1, streams=streams)

    def with_stream(self, key: StreamKey, stream: StreamManifest) -> Manifest:
        """A partition reassignment: the stream as its previous leader's manifest holds it
        replaces ours (itself when they are equal)."""
        if self.streams.get(key) == stream:
            return self
        return replace(self, version=self.version + 1, streams={**self.streams, key: stream})

    def without_streams(self, keys: Iterable[StreamKey]) -> Manifest:
        """The manifest without these streams at all (their topic was deleted)."""
        gone = set(keys) & self.streams.keys()
        if not gone:
            return self
        streams = {k: s for k, s in self.streams.items() if k not in gone}
        return replace(self, version=self.version + 1, streams=streams)

    # -- bytes ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        ordered = sorted(self.streams.items(), key=lambda kv: (kv[1].topic, kv[0]))
        body = {
            "format": FORMAT,
            "node_id": self.node_id,
            "version": self.version,
            "streams": [
                {
                    "topic": stream.topic,
                    "topic_id": key.topic_id.hex(),
                    "partition": key.partition,
                    **({"log_start": stream.log_start} if stream.log_start > 0 else {}),
                    "ranges": [r.to_json() for r in stream.ranges],
                }
                for key, stream in ordered
            ],
        }
        if self.retired:
            body["retired"] = [[k, t] for k, t in sorted(self.retired.items())]
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise ManifestFormatError(f"manifest is not JSON: {exc}") from None
        return cls.from_json(raw)

    @classmethod
    def from_json(cls, raw: Any) -> Manifest:
        if not isinstance(raw, dict):
            raise ManifestFormatError("manifest is not a JSON object")
        if raw.get("format") != FORMAT:
            raise ManifestFormatError(f"unknown manifest format {raw.get('format')!r}")
        node_id = _int(raw.get("node_id"), "node_id")
        version = _int(raw.get("version"), "version")
        if version < 0:
            raise ManifestFormatError(f"negative version {version}")
        streams_raw = raw.get("streams")
        if not isinstance(streams_raw, list):
            raise ManifestFormatError("streams is not a list")
        streams: dict[StreamKey, StreamManifest] = {}
        for i, s in enumerate(streams_raw):
            key, stream = _parse_stream(s, f"streams[{i}]")
            if key in streams:
                raise ManifestFormatError(
                    f"streams[{i}]: stream {key.topic_id.hex()}/{key.partition} listed twice"
                )
            streams[key] = stream
        return cls(node_id, version, streams, _parse_retired(raw.get("retired", [])))


def _int(value: Any, where: str) -> int:
    return expect_int(value, where, ManifestFormatError)


def _parse_retired(raw: Any) -> dict[str, int]:
    if not isinstance(raw, list):
        raise ManifestFormatError("retired is not a list")
    retired: dict[str, int] = {}
    for i, item in enumerate(raw):
        at = f"retired[{i}]"
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
            raise ManifestFormatError(f"{at}: expected [object key, delete after ms]")
        try:
            parse_object_key(item[0])
        except ValueError:
            raise ManifestFormatError(f"{at}: {item[0]!r} is not a data object key") from None
        retired[item[0]] = _int(item[1], f"{at} delete after")
    return retired


def _parse_stream(raw: Any, where: str) -> tuple[StreamKey, StreamManifest]:
    if not isinstance(raw, dict):
        raise ManifestFormatError(f"{where}: not an object")
    topic = raw.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ManifestFormatError(f"{where}: bad topic {topic!r}")
    topic_hex = raw.get("topic_id")
    try:
        topic_id = bytes.fromhex(topic_hex) if isinstance(topic_hex, str) else b""
    except ValueError:
        topic_id = b""
    if len(topic_id) != 16:
        raise ManifestFormatError(f"{where}: topic_id must be 32 hex digits, got {topic_hex!r}")
    partition = _int(raw.get("partition"), f"{where}.partition")
    if not 0 <= partition <= _MAX_PARTITION:
        raise ManifestFormatError(f"{where}: partition {partition} out of range")
    log_start = _int(raw.get("log_start", 0), f"{where}.log_start")
    if log_start < 0:
        raise ManifestFormatError(f"{where}: negative log_start {log_start}")
    ranges_raw = raw.get("ranges")
    if not isinstance(ranges_raw, list) or not (ranges_raw or log_start > 0):
        raise ManifestFormatError(f"{where}: ranges must be a non-empty list")
    ranges: list[ObjectRange] = []
    for j, r in enumerate(ranges_raw):
        at = f"{where}.ranges[{j}]"
        if not isinstance(r, list) or len(r) not in (5, 6):
            raise ManifestFormatError(
                f"{at}: expected [start, end, key, size, max timestamp, bytes]"
            )
        start, end = _int(r[0], f"{at} start"), _int(r[1], f"{at} end")
        key, size, max_ts = r[2], _int(r[3], f"{at} size"), _int(r[4], f"{at} max timestamp")
        nbytes = _int(r[5], f"{at} bytes") if len(r) == 6 else -1
        if not isinstance(key, str):
            raise ManifestFormatError(f"{at}: key is not a string")
        try:
            parse_object_key(key)
        except ValueError:
            raise ManifestFormatError(f"{at}: {key!r} is not a data object key") from None
        if not 0 <= start < end:
            raise ManifestFormatError(f"{at}: bad offsets [{start}, {end})")
        if size < FOOTER_SIZE:
            raise ManifestFormatError(f"{at}: object size {size} cannot hold a footer")
        if nbytes < -1 or nbytes > size:
            raise ManifestFormatError(f"{at}: {nbytes} bytes do not fit the object's {size}")
        if end <= log_start:
            raise ManifestFormatError(f"{at}: [{start}, {end}) lies below the log start")
        if ranges and start < ranges[-1].end:
            raise ManifestFormatError(
                f"{at}: [{start}, {end}) overlaps or precedes the previous range, which ends at "
                f"{ranges[-1].end}"
            )
        ranges.append(ObjectRange(start, end, key, size, max_ts, nbytes))
    return StreamKey(topic_id, partition), StreamManifest(topic, tuple(ranges), log_start)


# -- object ids and orphans -------------------------------------------------------------------


def new_object_id(now_ms: int | None = None) -> str:
    """32 lowercase hex digits: 12 of creation time in ms, "7", then 19 random (a UUIDv7-like
    id without dashes), so an orphan sweep can tell an abandoned object from one whose upload
    is still in flight."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{ms & (2**48 - 1):012x}{_TIMED_ID_VERSION}{os.urandom(10).hex()[:19]}"


def object_id_time_ms(object_id: str) -> int | None:
    """The creation time of an id from `new_object_id`; None for any other id."""
    if len(object_id) != 32 or object_id[12] != _TIMED_ID_VERSION:
        return None
    try:
        return int(object_id[:12], 16)
    except ValueError:
        return None


def orphan_keys(
    listed: Iterable[str], referenced: set[str], now_ms: int, grace_ms: int
) -> list[str]:
    """The data objects no manifest references and that are older than `grace_ms`.

    Only keys of the documented data scheme with a dated object id qualify: an object younger
    than the grace period may belong to an upload whose manifest commit has not happened yet,
    and a key the sweep cannot date or parse is never touched.
    """
    out: list[str] = []
    for key in listed:
        if key in referenced:
            continue
        try:
            object_id = parse_object_key(key)[4]
        except ValueError:
            continue
        created = object_id_time_ms(object_id)
        if created is None or now_ms - created < grace_ms:
            continue
        out.append(key)
    return out
