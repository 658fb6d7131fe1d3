"""Topic retention over committed objects, and DeleteTopics' removal of a topic's streams:
which ranges expire, the manifest without them, and which objects may then go. Pure, no I/O
(`main_broker.objects.retention` runs it on the leading main).

Kafka's semantics with object ranges for segments: time retention (`retention.ms`) drops the
oldest ranges whose newest batch is older than now - retention.ms, stopping at the first that
is not; size retention (`retention.bytes`) drops the oldest range while what stays (the other
ranges plus the WAL batches above them) still holds at least retention.bytes. Either way whole
ranges go, oldest first, and never data not yet in an object (the active segment); -1 means
unlimited. The partition's log start moves to the end of the last range dropped, and the
manifest keeps it (`StreamManifest.log_start`) after the ranges are gone.

An object goes only once no stream references it: a StreamSetObject shared by several streams
stays until every range in it expired (or its topics were deleted). It then joins the manifest's
`retired` objects with a delete-after time, exactly as compaction's replaced sources do, and is
deleted (by the main's object tier, `main_broker.objects.compaction`) once that time passed: a
reader still using the previous manifest finishes first, and no orphan sweep takes it meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from s3_commit.manifest import Manifest, ObjectRange, StreamKey, StreamManifest, object_id_time_ms
from s3_commit.object_plan import parse_object_key

__all__ = [
    "StreamRetention",
    "apply_log_starts",
    "apply_retention",
    "expired_log_start",
    "pending_log_starts",
    "range_bytes",
    "range_time_ms",
    "retire_unreferenced",
    "unreferenced",
    "without_topics",
]


@dataclass(frozen=True, slots=True)
class StreamRetention:
    """One partition's limits (-1: unlimited) and its WAL bytes above the objects."""

    retention_ms: int
    retention_bytes: int
    wal_bytes: int = 0

    @property
    def unlimited(self) -> bool:
        return self.retention_ms < 0 and self.retention_bytes < 0


def range_bytes(rng: ObjectRange) -> int:
    """The stream's bytes in the range; for a range from a manifest written before they were
    recorded, the whole object (a stream's share is never more)."""
    return rng.nbytes if rng.nbytes >= 0 else rng.size


def range_time_ms(rng: ObjectRange) -> int | None:
    """The range's newest timestamp; for batches without one (-1), when its object was
    written (Kafka falls back to a segment's modification time); None when neither is known."""
    if rng.max_timestamp >= 0:
        return rng.max_timestamp
    try:
        return object_id_time_ms(parse_object_key(rng.key)[4])
    except ValueError:
        return None


def expired_log_start(stream: StreamManifest, limits: StreamRetention, now_ms: int) -> int | None:
    """The stream's new log start (the end of the last range that goes), or None when no
    range expired."""
    ranges = stream.ranges
    by_time = 0
    if limits.retention_ms >= 0:
        cutoff = now_ms - limits.retention_ms
        for rng in ranges:
            ts = range_time_ms(rng)
            if ts is None or ts >= cutoff:
                break
            by_time += 1
    by_size = 0
    if limits.retention_bytes >= 0:
        excess = sum(range_bytes(r) for r in ranges) + limits.wal_bytes - limits.retention_bytes
        for rng in ranges:
            size = range_bytes(rng)
            if excess - size < 0:
                break
            excess -= size
            by_size += 1
    dropped = max(by_time, by_size)
    return ranges[dropped - 1].end if dropped else None


def apply_retention(
    manifest: Manifest, limits: Mapping[StreamKey, StreamRetention], now_ms: int
) -> Manifest:
    """The manifest after retention of the streams in `limits` (the partitions this main
    leads); itself when nothing expired. Re-evaluated on whatever manifest a CAS retry gives."""
    for key, stream_limits in limits.items():
        stream = manifest.streams.get(key)
        if stream is None or stream_limits.unlimited:
            continue
        start = expired_log_start(stream, stream_limits, now_ms)
        if start is not None:
            manifest = manifest.with_log_start(key, start)
    return manifest


def apply_log_starts(manifest: Manifest, requests: Mapping[StreamKey, int]) -> Manifest:
    """DeleteRecords on the objects: each stream's log start moves to the requested offset,
    but never past what its objects hold (the rest of the move waits for later uploads: a
    manifest's ranges never end below its log start). Itself when nothing moves."""
    for key, offset in requests.items():
        stream = manifest.streams.get(key)
        if stream is not None:
            manifest = manifest.with_log_start(key, min(offset, stream.end_offset))
    return manifest


def pending_log_starts(
    manifest: Manifest, requests: Mapping[StreamKey, int], live: Collection[bytes]
) -> dict[StreamKey, int]:
    """The requests `manifest` does not fulfil yet, for topics still `live`."""
    out = {}
    for key, offset in requests.items():
        stream = manifest.streams.get(key)
        if key.topic_id in live and (stream is None or stream.log_start < offset):
            out[key] = offset
    return out


def without_topics(
    manifest: Manifest, deleted: Collection[bytes], live: Collection[bytes] | None = None
) -> Manifest:
    """The manifest without the streams of deleted topics: those whose topic id is in
    `deleted` and, when the set of live topic ids is known (`live`: the cluster metadata),
    every stream whose topic is not live."""
    gone = [
        key
        for key in manifest.streams
        if key.topic_id in deleted or (live is not None and key.topic_id not in live)
    ]
    return manifest.without_streams(gone)


def unreferenced(old: Manifest, new: Manifest) -> set[str]:
    """The objects `old` listed in a stream that `new` lists in none."""
    return old.keys() - new.keys()


def retire_unreferenced(old: Manifest, new: Manifest, delete_after_ms: int) -> Manifest:
    """`new` with the objects it stopped listing (since `old`) retired until
    `delete_after_ms`; itself when there are none."""
    gone = unreferenced(old, new) - new.retired.keys()
    if not gone:
        return new
    retired = dict(new.retired)
    retired.update(dict.fromkeys(gone, delete_after_ms))
    return replace(new, retired=retired)
