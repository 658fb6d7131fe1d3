"""A main's manifest as state-stream rows: a full copy for a new subscriber, then only the
streams an upload (or a removal) changed. Pure, no I/O.

Proxies keep a mirror of each main's manifest from these rows, so they can read offsets their
WAL mirror no longer holds from the same objects (issue 4, "Read path, for mains and proxies").
The rows cross zones, so a delta names only the ranges added and the objects removed per
stream, never the whole stream. One row per changed stream (msgpack):

    [topic_id (16 bytes), partition,
     [[start, end, object key, object size, max timestamp], ...],   # ranges added
     [object key, ...]]                                            # ranges removed

A stream holds at most one range per object (an upload writes a stream's batches as one
contiguous share of each object), so an object key names a stream's range.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from s3_commit.manifest import Manifest, ObjectRange, StreamKey, StreamManifest

__all__ = ["ManifestRow", "apply_manifest_rows", "manifest_delta_rows", "manifest_rows"]

ManifestRow = list[Any]


def _row(key: StreamKey, added: Iterable[ObjectRange], removed: Iterable[str]) -> ManifestRow:
    return [key.topic_id, key.partition, [r.to_json() for r in added], sorted(removed)]


def manifest_rows(manifest: Manifest | None) -> list[ManifestRow]:
    """Every stream with all its ranges (the full frame a subscriber starts from)."""
    if manifest is None:
        return []
    return [_row(key, stream.ranges, ()) for key, stream in sorted(manifest.streams.items())]


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
        if added or removed:
            rows.append(_row(key, added, removed))
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
        topic_id, partition, added_raw, removed = row
        key = StreamKey(bytes(topic_id), int(partition))
        current = streams.get(key)
        gone = set(removed)
        ranges = [r for r in (current.ranges if current is not None else ()) if r.key not in gone]
        for raw in added_raw:
            start, end, obj_key, size, max_ts = raw
            if not 0 <= start < end:
                raise ValueError(f"bad range [{start}, {end}) of {obj_key}")
            ranges.append(ObjectRange(int(start), int(end), str(obj_key), int(size), int(max_ts)))
        ranges.sort(key=lambda r: r.start)
        for a, b in itertools.pairwise(ranges):
            if b.start < a.end:
                raise ValueError(
                    f"stream {key.topic_id.hex()}/{key.partition}: [{b.start}, {b.end}) of "
                    f"{b.key} overlaps [{a.start}, {a.end}) of {a.key}"
                )
        if ranges:
            topic = current.topic if current is not None else ""
            streams[key] = StreamManifest(topic, tuple(ranges))
        else:
            streams.pop(key, None)
    return replace(manifest, version=manifest.version + 1, streams=streams)
