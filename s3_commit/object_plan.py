"""Which objects one upload writes: StreamObjects (SO) and one StreamSetObject (SSO).

Pure planning, no I/O (docs/formats.md, "S3 objects"): a stream with at least
``s3.stream.object.split.size`` bytes in this upload gets an SO of its own, and the rest share
one SSO, so a big stream's data stays contiguous and a small stream costs no PUT of its own.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kafka_wire.record_batch import Buffer, parse_batch_header
from s3_commit.object_format import DEFAULT_BLOCK_SIZE, EncodedObject, encode_object

__all__ = [
    "DEFAULT_SPLIT_SIZE",
    "ObjectKind",
    "PlannedObject",
    "StreamRange",
    "UploadPlan",
    "parse_object_key",
    "plan_upload",
    "so_key",
    "sso_key",
]

DEFAULT_SPLIT_SIZE = 8 << 20  # s3.stream.object.split.size
DATA_PREFIX = "data/"
_SO_KEY = re.compile(r"^data/so/([0-9a-f]{16})/(\d{20})-(\d{20})-([0-9a-f]{32})$")
_SSO_KEY = re.compile(r"^data/sso/([0-9a-f]{32})$")
_OBJECT_ID = re.compile(r"^[0-9a-f]{32}$")


class ObjectKind(Enum):
    STREAM = "so"
    STREAM_SET = "sso"


def so_key(stream_id: int, start_offset: int, end_offset: int, object_id: str) -> str:
    """`data/so/<stream id, 16 hex>/<start, 20 digits>-<end, 20 digits>-<32 hex>`: listing
    `data/so/<stream>/` returns a stream's objects in offset order."""
    return f"data/so/{stream_id:016x}/{start_offset:020d}-{end_offset:020d}-{object_id}"


def _check_object_id(object_id: str) -> None:
    if not _OBJECT_ID.match(object_id):
        raise ValueError(f"object id must be 32 lowercase hex digits, got {object_id!r}")


def sso_key(object_id: str) -> str:
    _check_object_id(object_id)
    return f"data/sso/{object_id}"


def parse_object_key(key: str) -> tuple[ObjectKind, int | None, int | None, int | None, str]:
    """(kind, stream id, start, end, object id) of a data key; SSO keys carry no stream.

    ValueError for anything else (an orphan collector must not touch keys it did not write).
    """
    m = _SO_KEY.match(key)
    if m:
        return ObjectKind.STREAM, int(m[1], 16), int(m[2]), int(m[3]), m[4]
    m = _SSO_KEY.match(key)
    if m:
        return ObjectKind.STREAM_SET, None, None, None, m[1]
    raise ValueError(f"not a data object key: {key!r}")


@dataclass(frozen=True, slots=True)
class StreamRange:
    """One stream's share of an object."""

    stream_id: int
    start_offset: int
    end_offset: int  # exclusive
    size: int  # bytes of batches


@dataclass(slots=True)
class PlannedObject:
    kind: ObjectKind
    key: str
    streams: dict[int, list[Buffer]]
    ranges: list[StreamRange] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes of batches (the object adds 36 bytes per block and a 48-byte footer)."""
        return sum(r.size for r in self.ranges)

    def encode(self, block_size: int = DEFAULT_BLOCK_SIZE) -> EncodedObject:
        return encode_object(self.streams, block_size)


@dataclass(slots=True)
class UploadPlan:
    stream_objects: list[PlannedObject]
    stream_set: PlannedObject | None

    @property
    def objects(self) -> list[PlannedObject]:
        return [*self.stream_objects, *([self.stream_set] if self.stream_set else [])]


def _stream_range(stream_id: int, batches: Sequence[Buffer]) -> StreamRange:
    first = parse_batch_header(batches[0])
    last_buf = batches[-1]
    # The last buffer may hold several batches: walk to its last one by their lengths.
    position = 0
    last = parse_batch_header(last_buf)
    while position + last.size < len(last_buf):
        position += last.size
        last = parse_batch_header(last_buf, position)
    size = sum(len(b) for b in batches)
    return StreamRange(stream_id, first.base_offset, last.last_offset + 1, size)


def plan_upload(
    streams: Mapping[int, Sequence[Buffer]],
    split_size: int = DEFAULT_SPLIT_SIZE,
    new_object_id: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> UploadPlan:
    """Split one upload's streams (stream id -> batches in offset order) into objects.

    A stream with at least ``split_size`` bytes of batches gets a StreamObject; the others
    share one StreamSetObject (none when no stream is left for it). Streams with no batches
    are skipped. ``new_object_id`` returns 32 lowercase hex digits, unique per object.
    """
    if split_size <= 0:
        raise ValueError(f"split size must be positive, got {split_size}")
    stream_objects: list[PlannedObject] = []
    shared: dict[int, list[Buffer]] = {}
    shared_ranges: list[StreamRange] = []
    for stream_id in sorted(streams):
        batches = list(streams[stream_id])
        if not batches:
            continue
        rng = _stream_range(stream_id, batches)
        if rng.size >= split_size:
            key = so_key(stream_id, rng.start_offset, rng.end_offset, new_object_id())
            stream_objects.append(
                PlannedObject(ObjectKind.STREAM, key, {stream_id: batches}, [rng])
            )
        else:
            shared[stream_id] = batches
            shared_ranges.append(rng)
    stream_set = None
    if shared:
        stream_set = PlannedObject(
            ObjectKind.STREAM_SET, sso_key(new_object_id()), shared, shared_ranges
        )
    return UploadPlan(stream_objects, stream_set)
