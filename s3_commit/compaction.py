"""Background compaction of a main's objects: which objects to rewrite, the batches the new
objects carry, and the manifest swap. Pure, no I/O and no trio (the main's
`main_broker.objects.compaction` does the GETs, PUTs, CAS and deletes).

Two kinds of job (issue 4, "Compaction and retention"):

- **merge**: StreamSetObjects below `small_object_bytes` (uploads an interval triggered in a
  quiet period) are rewritten together, at most `max_object_bytes` of them;
- **split**: a StreamSetObject holding a stream's share of at least the split size is rewritten
  so that the share gets a StreamObject of its own.

Either way the new objects are laid out by `plan_upload`, so a merge whose stream reaches the
split size splits it too. A stream holds at most one range per object (`manifest_delta`'s
rows name a range by its object), so a merge only groups objects whose ranges of each common
stream are adjacent: they become one range of the new object. An object whose range would
leave a gap (or would sit on the far side of an object outside the group) waits for another
group. The swap (`apply_compaction`) replaces the sources' ranges with ranges over exactly the
same offsets, and retires the sources: they stay referenced (no orphan sweep takes them) until
their writer deletes them after a delay, for readers that still use the previous manifest.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from kafka_wire.record_batch import Buffer
from s3_commit.manifest import (
    Manifest,
    ObjectRange,
    StreamKey,
    StreamManifest,
    StreamShare,
    UploadedObject,
)
from s3_commit.object_format import (
    CorruptObject,
    block_view,
    check_block,
    decode_object,
    stream_id_for,
)
from s3_commit.object_plan import DEFAULT_SPLIT_SIZE, ObjectKind, UploadPlan, parse_object_key

__all__ = [
    "DEFAULT_COMPACTION_INTERVAL_S",
    "DEFAULT_DELETE_DELAY_S",
    "DEFAULT_MAX_OBJECT_BYTES",
    "DEFAULT_SMALL_OBJECT_BYTES",
    "CompactionAbandoned",
    "CompactionJob",
    "CompactionSettings",
    "CorruptSource",
    "JobKind",
    "SourceRange",
    "apply_compaction",
    "collect_stream_batches",
    "compacted_objects",
    "due_retired",
    "plan_compaction",
    "without_retired",
]

# Uploads at the default threshold are about 500 MiB; an SSO far below that came from the
# upload interval in a quiet period. Below 32 MiB the per-object costs (a footer/index GET per
# reader, an index cache slot, a LIST and DELETE entry, a manifest row per stream) stop being
# negligible next to the bytes, so such objects are merged.
DEFAULT_SMALL_OBJECT_BYTES = 32 << 20
# The compactor holds a job's sources and its output in memory (whole objects), so this bounds
# its footprint to about twice the figure.
DEFAULT_MAX_OBJECT_BYTES = 128 << 20
# Quiet periods upload every 60 s: a pass every 5 min merges about five of them at once, so a
# byte is rewritten a few times at most before its object passes the small size.
DEFAULT_COMPACTION_INTERVAL_S = 300.0
# A proxy learns of a swap on the state stream within a second or so; a fetch that picked a
# source object just before is done long before this.
DEFAULT_DELETE_DELAY_S = 30.0


class CompactionAbandoned(Exception):
    """The manifest no longer lists a source object as planned (retention or DeleteTopics
    removed or changed it meanwhile): the job is dropped, its new objects are orphans."""


class CorruptSource(CorruptObject):
    """A source object is not what its manifest ranges say (a bad block, missing batches)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key


class JobKind(Enum):
    MERGE = "merge"
    SPLIT = "split"
    CLEAN = "clean"  # the log cleaner's rewrite of one object (main_broker/objects/cleaner.py)


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    small_object_bytes: int = DEFAULT_SMALL_OBJECT_BYTES
    max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES
    split_size: int = DEFAULT_SPLIT_SIZE


@dataclass(frozen=True, slots=True)
class SourceRange:
    """One stream's range in a source object, as the job was planned."""

    stream: StreamKey
    topic: str
    range: ObjectRange


@dataclass(frozen=True, slots=True)
class CompactionJob:
    kind: JobKind
    sources: tuple[str, ...]  # object keys
    ranges: tuple[SourceRange, ...]  # every range of every source

    @property
    def source_bytes(self) -> int:
        return sum({r.range.key: r.range.size for r in self.ranges}.values())

    def stream_ranges(self) -> dict[StreamKey, list[ObjectRange]]:
        """Per stream its source ranges in offset order (adjacent: one interval)."""
        out: dict[StreamKey, list[ObjectRange]] = {}
        for r in self.ranges:
            out.setdefault(r.stream, []).append(r.range)
        for ranges in out.values():
            ranges.sort(key=lambda r: r.start)
        return out

    def topics(self) -> dict[StreamKey, str]:
        return {r.stream: r.topic for r in self.ranges}


def _objects(manifest: Manifest) -> dict[str, list[SourceRange]]:
    out: dict[str, list[SourceRange]] = {}
    for key, stream in manifest.streams.items():
        for rng in stream.ranges:
            out.setdefault(rng.key, []).append(SourceRange(key, stream.topic, rng))
    return out


def _is_sso(key: str) -> bool:
    return parse_object_key(key)[0] is ObjectKind.STREAM_SET


# -- planning -----------------------------------------------------------------------------------


def plan_compaction(
    manifest: Manifest, settings: CompactionSettings, skip: Collection[str] = ()
) -> CompactionJob | None:
    """The next job, or None: a merge of small SSOs first (it also splits what reaches the split
    size), else the split of one SSO. Objects in `skip` (unreadable, say) take part in none."""
    by_object = {k: v for k, v in _objects(manifest).items() if _is_sso(k) and k not in skip}
    small = sorted(
        k for k, ranges in by_object.items() if ranges[0].range.size < settings.small_object_bytes
    )
    group = _merge_group(small, by_object, settings.max_object_bytes)
    if len(group) >= 2:
        return _job(JobKind.MERGE, group, by_object)
    for key in sorted(by_object):
        # The share's bytes are known only for ranges written with them (-1: unknown).
        if any(r.range.nbytes >= settings.split_size for r in by_object[key]):
            return _job(JobKind.SPLIT, [key], by_object)
    return None


def _job(kind: JobKind, keys: list[str], by_object: dict[str, list[SourceRange]]) -> CompactionJob:
    return CompactionJob(kind, tuple(keys), tuple(r for k in keys for r in by_object[k]))


def _merge_group(
    candidates: list[str], by_object: dict[str, list[SourceRange]], max_bytes: int
) -> list[str]:
    """The first group of at least two objects: from each candidate in turn as its seed,
    greedily the objects that keep each stream's ranges in the group one interval, up to
    `max_bytes` in all. Passes repeat while one adds an object, since the candidates' order
    (object id, i.e. creation time) is not offset order once merged objects exist. A seed
    that takes no other object is dropped (a group that could hold it would be rare: one whose
    other members fill a gap between the seed and each of them)."""
    left = list(candidates)
    while len(left) >= 2:
        seed = left.pop(0)
        group = _grow(seed, left, by_object, max_bytes)
        if len(group) >= 2:
            return group
    return []


def _grow(
    seed: str, left: list[str], by_object: dict[str, list[SourceRange]], max_bytes: int
) -> list[str]:
    group: list[str] = []
    total = 0
    spans: dict[StreamKey, tuple[int, int]] = {}
    stream_ids: dict[int, StreamKey] = {}

    def add(key: str) -> None:
        nonlocal total
        group.append(key)
        total += by_object[key][0].range.size
        for r in by_object[key]:
            lo, hi = spans.get(r.stream, (r.range.start, r.range.end))
            spans[r.stream] = (min(lo, r.range.start), max(hi, r.range.end))
            stream_ids[stream_id_for(*r.stream)] = r.stream

    if not _fits(by_object[seed], {}, {}):
        return []
    add(seed)
    added = True
    while added:
        added = False
        for key in list(left):
            ranges = by_object[key]
            if total + ranges[0].range.size > max_bytes or not _fits(ranges, spans, stream_ids):
                continue
            left.remove(key)
            add(key)
            added = True
    return group


def _fits(
    ranges: list[SourceRange],
    spans: dict[StreamKey, tuple[int, int]],
    stream_ids: dict[int, StreamKey],
) -> bool:
    seen: set[StreamKey] = set()
    for r in ranges:
        if r.stream in seen:
            return False  # two ranges of one stream in one object: never written so, left alone
        seen.add(r.stream)
        other = stream_ids.get(stream_id_for(*r.stream))
        if other is not None and other != r.stream:
            return False  # two topics whose stream ids collide cannot share an object
        span = spans.get(r.stream)
        if span is not None and r.range.end != span[0] and r.range.start != span[1]:
            return False
    return True


# -- the new objects' bytes ---------------------------------------------------------------------


def collect_stream_batches(
    job: CompactionJob, objects: Mapping[str, Buffer]
) -> dict[int, list[memoryview]]:
    """Per stream id, the batches of the job's ranges in offset order, as views into the source
    objects (whole objects, by key). Every block read is checked (sizes, offsets, CRC-32C), and
    the batches must cover each range: CorruptObject otherwise, and the job is dropped."""
    out: dict[int, list[memoryview]] = {}
    indexes = {}
    for key in job.sources:
        try:
            indexes[key] = decode_object(objects[key])
        except (CorruptObject, ValueError) as exc:
            raise CorruptSource(key, str(exc)) from None
    for stream, ranges in job.stream_ranges().items():
        stream_id = stream_id_for(*stream)
        batches: list[memoryview] = []
        next_offset = -1
        for rng in ranges:
            data = objects[rng.key]
            first: int | None = None
            for entry in indexes[rng.key].entries_for(stream_id):
                if entry.end_offset <= rng.start or entry.start_offset >= rng.end:
                    continue
                try:
                    infos = check_block(block_view(data, entry), entry)
                except CorruptObject as exc:
                    raise CorruptSource(rng.key, str(exc)) from None
                for info in infos:
                    if info.last_offset < rng.start or info.base_offset >= rng.end:
                        continue
                    if info.base_offset < next_offset:
                        raise CorruptSource(
                            rng.key,
                            f"stream {stream_id:#x} batch at {info.base_offset} overlaps "
                            f"offset {next_offset - 1}",
                        )
                    first = info.base_offset if first is None else first
                    start = entry.position + info.position
                    batches.append(memoryview(data)[start : start + info.size])
                    next_offset = info.last_offset + 1
            if first is None or first > rng.start or next_offset < rng.end:
                raise CorruptSource(
                    rng.key,
                    f"the batches of stream {stream_id:#x} do not cover its range "
                    f"[{rng.start}, {rng.end})",
                )
        out[stream_id] = batches
    return out


def compacted_objects(
    job: CompactionJob, plan: UploadPlan, sizes: Mapping[str, int]
) -> list[UploadedObject]:
    """The planned objects (`plan_upload` over `collect_stream_batches`) as the manifest will
    list them: each stream's range is exactly the union of its source ranges. `sizes`: the
    encoded size of each new object, by key."""
    topics = job.topics()
    by_id = {stream_id_for(*s): s for s in topics}
    wanted = job.stream_ranges()
    out: list[UploadedObject] = []
    for obj in plan.objects:
        shares: list[StreamShare] = []
        for part in obj.ranges:
            stream = by_id[part.stream_id]
            ranges = wanted[stream]
            lo, hi = ranges[0].start, ranges[-1].end
            if part.start_offset > lo or part.end_offset < hi:
                raise ValueError(
                    f"stream {part.stream_id:#x}: batches [{part.start_offset}, "
                    f"{part.end_offset}) do not cover [{lo}, {hi})"
                )
            max_ts = max(r.max_timestamp for r in ranges)
            shares.append(StreamShare(stream, topics[stream], lo, hi, max_ts, part.size))
        out.append(UploadedObject(obj.key, sizes[obj.key], tuple(shares)))
    return out


# -- the manifest swap --------------------------------------------------------------------------


def apply_compaction(
    manifest: Manifest, job: CompactionJob, outputs: Sequence[UploadedObject], retire_at_ms: int
) -> Manifest:
    """The manifest with the job's sources replaced by `outputs` and retired until
    `retire_at_ms`. Itself when the swap is already there (a CAS whose answer was lost).

    Raises CompactionAbandoned when a source is no longer listed with the ranges planned, and
    ValueError when the outputs would not cover exactly the same offsets (a bug).
    """
    listed = manifest.keys()
    sources = set(job.sources)
    if all(o.key in listed for o in outputs) and not sources & listed:
        return manifest
    current = _objects(manifest)
    for key in job.sources:
        planned = {(r.stream, r.range) for r in job.ranges if r.range.key == key}
        now = {(r.stream, r.range) for r in current.get(key, ())}
        if now != planned:
            raise CompactionAbandoned(f"{key} changed since the compaction was planned")
    added: dict[StreamKey, list[ObjectRange]] = {}
    for obj in outputs:
        if obj.key in listed:
            raise ValueError(f"new object {obj.key} is listed already")
        for share in obj.shares:
            added.setdefault(share.stream, []).append(
                ObjectRange(
                    share.start, share.end, obj.key, obj.size, share.max_timestamp, share.nbytes
                )
            )
    streams = dict(manifest.streams)
    for stream_key in job.stream_ranges().keys() | added.keys():
        old = streams.get(stream_key)
        if old is None:
            raise ValueError(f"stream {stream_key} of a new object is not listed")
        removed = [r for r in old.ranges if r.key in sources]
        new = added.get(stream_key, [])
        if _cover(removed) != _cover(new):
            raise ValueError(
                f"stream {stream_key.topic_id.hex()}/{stream_key.partition}: new ranges "
                f"{_cover(new)} do not cover the replaced {_cover(removed)}"
            )
        ranges = sorted(
            [r for r in old.ranges if r.key not in sources] + new, key=lambda r: r.start
        )
        for a, b in itertools.pairwise(ranges):
            if b.start < a.end:
                raise ValueError(f"[{b.start}, {b.end}) of {b.key} overlaps {a.key}")
        streams[stream_key] = StreamManifest(old.topic, tuple(ranges), old.log_start)
    retired = dict(manifest.retired)
    retired.update(dict.fromkeys(job.sources, retire_at_ms))
    return replace(manifest, version=manifest.version + 1, streams=streams, retired=retired)


def _cover(ranges: Sequence[ObjectRange]) -> list[tuple[int, int]]:
    """The offsets the ranges cover, as sorted disjoint intervals (adjacent ones joined)."""
    out: list[tuple[int, int]] = []
    for r in sorted(ranges, key=lambda r: r.start):
        if out and r.start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], r.end))
        else:
            out.append((r.start, r.end))
    return out


def without_retired(manifest: Manifest, keys: Collection[str]) -> Manifest:
    """The manifest once these retired objects were deleted (itself when none is retired)."""
    gone = set(keys) & manifest.retired.keys()
    if not gone:
        return manifest
    retired = {k: t for k, t in manifest.retired.items() if k not in gone}
    return replace(manifest, version=manifest.version + 1, retired=retired)


def due_retired(manifest: Manifest, now_ms: int) -> list[str]:
    """The retired objects whose delay has passed."""
    return sorted(k for k, t in manifest.retired.items() if t <= now_ms)
