"""A main's manifest as state-stream rows: a full copy for a new subscriber, then only the
streams an upload (or a removal, or retention) changed. Pure, no I/O.

Proxies keep a mirror of each main's manifest from these rows, so they can read offsets their
WAL mirror no longer holds from the same objects (issue 4, "Read path, for mains and proxies").
The rows cross zones, so a delta names only the ranges added and the objects removed per
stream, never the whole stream. One row per changed stream (msgpack):

    [topic_id (16 bytes), partition,
     [[start, end, object key, object size, max timestamp, bytes], ...],   # ranges added
     [object key, ...],                                                   # ranges removed
     log start]                          # the stream's manifest log start; -1: stream gone

A stream holds at most one range per object (an upload writes a stream's batches as one
contiguous share of each object), so an object key names a stream's range. Rows of 4 elements
(from a main before the log start existed) leave it alone; ranges of 5 elements have no bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from s3_commit.manifest import Manifest, ObjectRange, StreamKey, StreamManifest

__all__ = [
    "STREAM_GONE",
    "ManifestRow",
    "apply_manifest_rows",
    "manifest_delta_rows",
    "manifest_rows",
]

ManifestRow = list[Any]


STREAM_GONE = -1


def _row(
    key: StreamKey, added: Iterable[ObjectRange], removed: Iterable[str], log_start: int
) -> ManifestRow:
    return [key.topic_id, key.partition, [r.to_json() for r in added], sorted(removed), log_start]


def manifest_rows(manifest: Manifest | None) -> list[ManifestRow]:
    """Every stream with all its ranges (the full frame a subscriber starts from)."""
    if manifest is None:
        return []
    return [
        _row(key, stream.ranges, (), stream.log_start)
        for key, stream in sorted(manifest.streams.items())
    ]


def manifest_delta_rows(old: Manifest | None, new: Manifest | None) -> list[ManifestRow]:
    """The rows that turn a mirror of `old` into one of `new`: changed streams only."""
    if old is new:
        return []
    before = old.streams if old is not None else {}
    after = new.streams if new is not None else {}
    rows: list[ManifestRow] = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key), after.get(key)
        if was is now:
            continue
        old_ranges = set(was.ranges) if was is not None else set()
        new_ranges = now.ranges if now is not None else ()
        added = [r for r in new_ranges if r not in old_ranges]
        kept = set(new_ranges)
        removed = {r.key for r in old_ranges if r not in kept}
        log_start = now.log_start if now is not None else STREAM_GONE
        old_start = was.log_start if was is not None else STREAM_GONE
        if added or removed or log_start != old_start:
            rows.append(_row(key, added, removed, log_start))
    return rows


def apply_manifest_rows(manifest: Manifest, rows: Sequence[ManifestRow]) -> Manifest:
    """The mirror after these rows (a new Manifest; the given one is not changed).

    Raises ValueError on a malformed row or ranges that would overlap, so that a proxy never
    serves from a manifest it could not follow (it resubscribes and starts from a full frame).
    """
    if not rows:
        return manifest
    streams = dict(manifest.streams)
    for row in rows:
        topic_id, partition, added_raw, removed, *rest = row
        key = StreamKey(bytes(topic_id), int(partition))
        current = streams.get(key)
        log_start = current.log_start if current is not None else 0
        if rest:
            log_start = int(rest[0])
        if log_start == STREAM_GONE:
            streams.pop(key, None)
            continue
        gone = set(removed)
        ranges = [r for r in (current.ranges if current is not None else ()) if r.key not in gone]
        for raw in added_raw:
            rng = ObjectRange.from_json(raw)
            if not 0 <= rng.start < rng.end:
                raise ValueError(f"bad range [{rng.start}, {rng.end}) of {rng.key}")
            ranges.append(rng)
        ranges.sort(key=lambda r: r.start)
        for a, b in itertools.pairwise(ranges):
            if b.start < a.end:
                raise ValueError(
                    f"stream {key.topic_id.hex()}/{key.partition}: [{b.start}, {b.end}) of "
                    f"{b.key} overlaps [{a.start}, {a.end}) of {a.key}"
                )
        if ranges and ranges[0].end <= log_start:
            raise ValueError(
                f"stream {key.topic_id.hex()}/{key.partition}: [{ranges[0].start}, "
                f"{ranges[0].end}) of {ranges[0].key} lies below the log start {log_start}"
            )
        if ranges or log_start > 0:
            topic = current.topic if current is not None else ""
            streams[key] = StreamManifest(topic, tuple(ranges), log_start)
        else:
            streams.pop(key, None)
    return replace(manifest, version=manifest.version + 1, streams=streams)
