"""The log cleaner's core (issue 13, "Log compaction"): which part of a compacted stream's
objects to clean, the offset map of its dirty section, and the rewriting of batches. Pure, no
I/O and no trio; `main_broker.objects.cleaner` does the GETs, PUTs and the manifest swap (the
object compaction's, `s3_commit.compaction.apply_compaction`).

Kafka's semantics (LogCleaner, Cleaner, LogCleanerManager), on object ranges instead of
segments:

- **Sections.** A stream's objects from its log start are the *clean* section up to the
  cleaner's checkpoint (`first_dirty`) and the *dirty* section above it, up to the cleanable
  end: the first of the stream's committed end, the partition's last stable offset, and the
  start of the first object range holding a record younger than `min.compaction.lag.ms` (the
  range's max timestamp; Kafka uses segments' the same way). The WAL part above the objects is
  Kafka's active segment: never cleaned.
- **When.** dirty / (clean + dirty) bytes >= `min.cleanable.dirty.ratio`, or the first dirty
  range's max timestamp is older than `max.compaction.lag.ms` (so its oldest record is too:
  forced, whatever the ratio). Bytes of a range cut by the checkpoint are split by offsets.
- **Offset map.** Built from the dirty section only, key -> latest offset, skipping control
  batches and the records of aborted transactions. When the keys outgrow the map's budget the
  section stops at the batch that did not fit (its base offset is the cleaning's end, and the
  next checkpoint): Kafka's rule, at batch instead of segment granularity. A key the full map
  took from that very batch points above the end; the records it shadows below are still
  superseded by a record that stays (nothing at or above the end is touched).
- **Which records stay.** Every batch below the end, clean section included, is filtered: a
  record stays when its key is absent from the map or maps to an offset at or below its own
  (the latest); keyless records go (a compacted topic refuses them, but a topic may have been
  switched to compact). Records at or above the end are never touched.
- **Offsets.** A rewritten batch keeps its base offset, its last offset delta, its producer
  fields and base timestamp, and each kept record's bytes (so their offset and timestamp
  deltas): consumers see the original offsets, with gaps. A batch none of whose records stay
  is dropped, except at the edges of an object range: there an empty batch (no records, no
  producer id, not transactional) keeps the range's first and last offsets, since the
  manifest's range and the object's index must still start and end there (Kafka writes
  empty batches too, for producer state; consumers skip them).
- **Tombstones** (KIP-534, Kafka >= 3.1). A batch that keeps a tombstone and has no delete
  horizon yet is rewritten with one: attribute bit 0x40 set and its base timestamp set to the
  time of this cleaning plus `delete.retention.ms` (the kept records' timestamp deltas are
  rewritten so their timestamps do not change). A later cleaning drops the tombstones of a
  batch whose horizon has passed. So a tombstone lives at least `delete.retention.ms` after the
  first cleaning that kept it as its key's latest record.
- **Transactions** (Kafka's CleanedTransactionMetadata). Given the partition's aborted
  transactions (producer id, first offset, ABORT marker's offset), a transactional batch inside
  one is dropped. A marker may go once no batch of its transaction was seen in this pass
  (ABORT: none of its batches were left to drop; COMMIT: none of its batches remain); such a
  marker first gets a delete horizon as above, and goes in a cleaning after it passed.
"""

from __future__ import annotations

import bisect
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from crc32c import crc32c

from kafka_wire.compression import SNAPPY, DecompressionError, compress, decompress
from kafka_wire.record_batch import (
    BATCH_HEADER_SIZE,
    COMPRESSION_NONE,
    LOG_OVERHEAD,
    BatchInfo,
    Buffer,
    parse_batch_header,
)
from s3_commit.manifest import ObjectRange, StreamKey, StreamManifest
from s3_commit.offset_map import OffsetMap

__all__ = [
    "CHECKPOINT_PREFIX",
    "DEFAULT_CLEANER_INTERVAL_S",
    "DEFAULT_DEDUPE_BUFFER_BYTES",
    "DELETE_HORIZON_BIT",
    "LONG_MAX",
    "AbortedTxnRow",
    "CleanStats",
    "CleanableSection",
    "CleaningPolicy",
    "CorruptRecords",
    "MapResult",
    "StreamCleaner",
    "build_offset_map",
    "checkpoint_key",
    "cleanable_section",
    "decode_checkpoints",
    "empty_batch",
    "encode_checkpoints",
]

DEFAULT_DEDUPE_BUFFER_BYTES = 16 << 20  # Kafka: log.cleaner.dedupe.buffer.size (128 MiB / threads)
DEFAULT_CLEANER_INTERVAL_S = 15.0  # Kafka: log.cleaner.backoff.ms
LONG_MAX = 2**63 - 1
DELETE_HORIZON_BIT = 0x40  # Kafka's DefaultRecordBatch.DELETE_HORIZON_FLAG_MASK

_CONTROL_BIT = 0x20
_TRANSACTIONAL_BIT = 0x10
_COMPRESSION_MASK = 0x07
_ABORT = 0
_COMMIT = 1
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
# snappy-java's stream header (magic, version 1, compatible version 1), as Java producers write
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")


class CorruptRecords(ValueError):
    """A batch's records do not parse (the object passed its CRC checks: a writer's bug)."""


class AbortedTxnRow(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


@dataclass(frozen=True, slots=True)
class CleaningPolicy:
    """A topic's cleaner settings (Kafka's defaults)."""

    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86_400_000


# -- choosing what to clean ---------------------------------------------------------------------


def _range_bytes(rng: ObjectRange) -> int:
    return rng.nbytes if rng.nbytes >= 0 else rng.size


def _bytes_between(rng: ObjectRange, lo: int, hi: int) -> float:
    """The range's bytes in offsets [lo, hi), pro rata."""
    a, b = max(rng.start, lo), min(rng.end, hi)
    if b <= a:
        return 0.0
    return _range_bytes(rng) * (b - a) / (rng.end - rng.start)


@dataclass(frozen=True, slots=True)
class CleanableSection:
    """A stream's clean section [log_start, first_dirty) and dirty one [first_dirty, end)."""

    log_start: int
    first_dirty: int
    end: int
    clean_bytes: float
    dirty_bytes: float
    forced: bool  # max.compaction.lag.ms passed for the first dirty range
    ranges: tuple[ObjectRange, ...]  # the object ranges a cleaning rewrites (start < end)

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total > 0 else 0.0

    def due(self, policy: CleaningPolicy) -> bool:
        if self.end <= self.first_dirty or self.dirty_bytes <= 0:
            return False
        return self.forced or self.dirty_ratio >= policy.min_cleanable_dirty_ratio


def cleanable_section(
    stream: StreamManifest,
    first_dirty: int,
    upper: int,
    now_ms: int,
    policy: CleaningPolicy,
) -> CleanableSection:
    """The stream's sections for a cleaning at `now_ms`: `first_dirty` is the cleaner's
    checkpoint (0 when it has none), `upper` what must stay untouched from there (the
    partition's last stable offset)."""
    log_start = stream.start_offset
    end = min(upper, stream.end_offset)
    if policy.min_compaction_lag_ms > 0:
        young = now_ms - policy.min_compaction_lag_ms
        for rng in stream.ranges:
            if rng.max_timestamp > young:
                end = min(end, rng.start)
                break
    end = max(end, log_start)
    first_dirty = min(max(first_dirty, log_start), end)
    clean = dirty = 0.0
    forced = False
    max_lag = policy.max_compaction_lag_ms
    first_seen = False
    for rng in stream.ranges:
        if rng.start >= end:
            break
        clean += _bytes_between(rng, log_start, first_dirty)
        part = _bytes_between(rng, first_dirty, end)
        dirty += part
        if part > 0 and not first_seen:
            first_seen = True
            forced = max_lag < LONG_MAX and 0 <= rng.max_timestamp <= now_ms - max_lag
    ranges = tuple(r for r in stream.ranges if r.start < end)
    return CleanableSection(log_start, first_dirty, end, clean, dirty, forced, ranges)


# -- records ------------------------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at `pos` and the position after it (IndexError past the end)."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    n = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecords(f"varint longer than 10 bytes at {pos}")


def _zigzag(value: int, out: bytearray) -> None:
    n = (value << 1) ^ (value >> 63)
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _body(batch: memoryview, info: BatchInfo) -> bytes:
    raw = batch[BATCH_HEADER_SIZE : info.size]
    codec = info.attributes & _COMPRESSION_MASK
    if codec == COMPRESSION_NONE:
        return bytes(raw)
    try:
        return decompress(codec, raw)
    except DecompressionError as exc:
        raise CorruptRecords(f"batch at {info.base_offset}: {exc}") from None


# A record as the filter sees it: (start, end, offset delta, key, is a tombstone); start is
# its length varint's position in the batch's (decompressed) records section.
_Record = tuple[int, int, int, bytes | None, bool]


def _records(body: bytes, info: BatchInfo) -> list[_Record]:
    out: list[_Record] = []
    append = out.append
    pos = 0
    size = len(body)
    try:
        for _ in range(info.record_count):
            start = pos
            b = body[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif body[pos + 1] < 0x80:
                n = (b & 0x7F) | body[pos + 1] << 7
                length = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                length, pos = _varint(body, pos)
            end = pos + length
            if length < 0 or end > size:
                raise CorruptRecords(f"batch at {info.base_offset}: a record overruns it")
            pos += 1  # the record's attributes
            while body[pos] >= 0x80:  # the timestamp delta, skipped
                pos += 1
            pos += 1
            b = body[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = _varint(body, pos)
            b = body[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                key_len, pos = _varint(body, pos)
            key = None
            if key_len >= 0:
                key = body[pos : pos + key_len]
                pos += key_len
            b = body[pos]
            tombstone = b == 1 if b < 0x80 else _varint(body, pos)[0] < 0  # zigzag -1 is 1
            append((start, end, offset_delta, key, tombstone))
            pos = end
    except IndexError:
        raise CorruptRecords(f"batch at {info.base_offset}: records overrun it") from None
    return out


def _keys(body: bytes, info: BatchInfo) -> tuple[list[bytes], list[int]]:
    """The keys of the keyed records and their offset deltas: the map build's lean scan
    (one-byte varints, the norm for attributes, offset deltas and key lengths, inline)."""
    keys: list[bytes] = []
    deltas: list[int] = []
    pos = 0
    size = len(body)
    try:
        for _ in range(info.record_count):
            b = body[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif body[pos + 1] < 0x80:
                n = (b & 0x7F) | body[pos + 1] << 7
                length = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                length, pos = _varint(body, pos)
            end = pos + length
            if length < 0 or end > size:
                raise CorruptRecords(f"batch at {info.base_offset}: a record overruns it")
            pos += 1  # the record's attributes
            while body[pos] >= 0x80:  # the timestamp delta, skipped
                pos += 1
            pos += 1
            b = body[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = _varint(body, pos)
            b = body[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                key_len, pos = _varint(body, pos)
            if key_len >= 0:
                keys.append(body[pos : pos + key_len])
                deltas.append(offset_delta)
            pos = end
    except IndexError:
        raise CorruptRecords(f"batch at {info.base_offset}: records overrun it") from None
    return keys, deltas


def _iter_batches(buffers: Iterable[Buffer]) -> Iterable[tuple[memoryview, BatchInfo]]:
    for buf in buffers:
        view = memoryview(buf)
        pos = 0
        while pos < len(view):
            info = parse_batch_header(view, pos)
            yield view[pos : pos + info.size], info
            pos += info.size


def _control_type(body: bytes, info: BatchInfo) -> int | None:
    """The marker's control type (0 ABORT, 1 COMMIT), None for an empty or odd batch."""
    if info.record_count < 1:
        return None
    records = _records(body, info)
    key = records[0][3]
    if key is None or len(key) < 4:
        return None
    return int.from_bytes(key[2:4], "big", signed=True)


# -- aborted transactions -----------------------------------------------------------------------


class _AbortedIndex:
    """A partition's aborted transactions, consumed in offset order (Kafka's
    `consumeAbortedTxnsUpTo`)."""

    def __init__(self, aborted: Iterable[tuple[int, int, int]]) -> None:
        self._rows = sorted((AbortedTxnRow(*a) for a in aborted), key=lambda a: a.first_offset)
        self._next = 0
        # producer id -> (its aborted txn, whether a batch of it was seen in this pass)
        self.ongoing: dict[int, tuple[AbortedTxnRow, bool]] = {}

    def consume_up_to(self, offset: int) -> None:
        rows = self._rows
        while self._next < len(rows) and rows[self._next].first_offset <= offset:
            row = rows[self._next]
            self.ongoing[row.producer_id] = (row, False)
            self._next += 1

    def skip_to(self, offset: int) -> None:
        """Forget transactions whose marker lies below `offset` (a map build starting
        mid-stream)."""
        self._next = bisect.bisect_left(self._rows, offset, key=lambda a: a.first_offset)
        for row in self._rows[: self._next]:
            if row.last_offset >= offset:
                self.ongoing[row.producer_id] = (row, False)


class _TxnTracker:
    """Kafka's CleanedTransactionMetadata: whether a batch belongs to an aborted transaction,
    and whether a marker may go."""

    def __init__(self, aborted: Iterable[tuple[int, int, int]]) -> None:
        self.aborted = _AbortedIndex(aborted)
        self.committed: set[int] = set()  # producers whose open transaction had a batch seen

    def on_batch(self, info: BatchInfo) -> bool:
        """A data batch is read: True when it belongs to an aborted transaction (it goes)."""
        self.aborted.consume_up_to(info.base_offset + info.last_offset_delta)
        if not info.attributes & _TRANSACTIONAL_BIT or info.record_count == 0:
            return False
        ongoing = self.aborted.ongoing.get(info.producer_id)
        if (
            ongoing is not None
            and ongoing[0].first_offset <= info.base_offset <= ongoing[0].last_offset
        ):
            self.aborted.ongoing[info.producer_id] = (ongoing[0], True)
            return True
        self.committed.add(info.producer_id)
        return False

    def on_marker(self, info: BatchInfo, control_type: int | None) -> bool:
        """A control batch is read: True when no batch of its transaction was seen (the marker
        may go once its delete horizon passed)."""
        self.aborted.consume_up_to(info.base_offset + info.last_offset_delta)
        if control_type == _ABORT:
            ongoing = self.aborted.ongoing.pop(info.producer_id, None)
            return ongoing is None or not ongoing[1]
        if control_type == _COMMIT:
            if info.producer_id in self.committed:
                self.committed.discard(info.producer_id)
                return False
            return True
        return control_type is None  # an already emptied control batch; other types stay


# -- the offset map -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MapResult:
    end: int  # the map covers the dirty section's records below this offset
    records: int
    full: bool  # stopped early: the next key did not fit


def build_offset_map(
    batches: Iterable[Buffer],
    offset_map: OffsetMap,
    start: int,
    end: int,
    aborted: Iterable[tuple[int, int, int]] = (),
) -> MapResult:
    """Put the keys of the dirty section [start, end) of one stream's batches (offset order,
    whole batches) into `offset_map`. Stops at the first batch whose keys do not all fit;
    `MapResult.end` is then that batch's base offset (Kafka's rule)."""
    txns = _TxnTracker(aborted)
    txns.aborted.skip_to(start)
    records = 0
    for view, info in _iter_batches(batches):
        if info.base_offset + info.last_offset_delta < start:
            continue
        if info.base_offset >= end:
            break
        if info.attributes & _CONTROL_BIT:
            txns.on_marker(info, None)
            continue
        if txns.on_batch(info) or info.record_count == 0:
            continue
        base = info.base_offset
        keys, deltas = _keys(_body(view, info), info)
        offsets = [base + d for d in deltas]
        if base < start:  # a batch across the start: only its records from there on
            kept = [i for i, o in enumerate(offsets) if o >= start]
            keys, offsets = [keys[i] for i in kept], [offsets[i] for i in kept]
        stored = offset_map.put_all(keys, offsets)
        records += stored
        if stored < len(keys):
            return MapResult(base, records, True)
    return MapResult(end, records, False)


# -- the rewriting ------------------------------------------------------------------------------


def empty_batch(info: BatchInfo) -> bytes:
    """A batch with no records over the same offsets and timestamps as `info`'s: what stays of
    a batch at the edge of an object range once all its records went."""
    header = bytearray(
        _HEADER.pack(
            info.base_offset,
            BATCH_HEADER_SIZE - LOG_OVERHEAD,
            info.partition_leader_epoch,
            2,
            0,
            info.attributes & DELETE_HORIZON_BIT,
            info.last_offset_delta,
            info.base_timestamp,
            info.max_timestamp,
            -1,
            -1,
            -1,
            0,
        )
    )
    struct.pack_into(">I", header, _CRC_OFFSET, crc32c(memoryview(header)[_ATTRIBUTES_OFFSET:]))
    return bytes(header)


def _recompress(codec: int, records: bytes, original: Buffer) -> bytes:
    """`records` compressed with the batch's codec; snappy keeps the original's framing (a
    Java producer's xerial frames, which some consumers expect, or librdkafka's raw block)."""
    data = compress(codec, records)
    if codec == SNAPPY and bytes(original[:8]) == _XERIAL_MAGIC:
        return _XERIAL_HEADER + len(data).to_bytes(4, "big") + data
    return data


def _rebuild(
    info: BatchInfo,
    body: bytes,
    kept: Sequence[_Record],
    horizon: int | None,
    original: Buffer = b"",
) -> bytes:
    """The batch with only the `kept` records; with `horizon`, a delete horizon is set (bit
    0x40, base timestamp = horizon, the records' timestamp deltas shifted to match)."""
    attributes = info.attributes
    base_ts = info.base_timestamp
    if horizon is None:
        records = b"".join([body[r[0] : r[1]] for r in kept])
    else:
        shift = info.base_timestamp - horizon
        out = bytearray()
        for start, end, *_ in kept:
            _, attributes_at = _varint(body, start)
            ts_delta, ts_end = _varint(body, attributes_at + 1)
            rec = bytearray(body[attributes_at : attributes_at + 1])
            _zigzag(ts_delta + shift, rec)
            rec += body[ts_end:end]
            _zigzag(len(rec), out)
            out += rec
        records = bytes(out)
        attributes |= DELETE_HORIZON_BIT
        base_ts = horizon
    codec = attributes & _COMPRESSION_MASK
    if codec != COMPRESSION_NONE:
        records = _recompress(codec, records, original)
    header = bytearray(
        _HEADER.pack(
            info.base_offset,
            BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records),
            info.partition_leader_epoch,
            2,
            0,
            attributes,
            info.last_offset_delta,
            base_ts,
            info.max_timestamp,
            info.producer_id,
            info.producer_epoch,
            info.base_sequence,
            len(kept),
        )
    )
    crc = crc32c(records, crc32c(memoryview(header)[_ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", header, _CRC_OFFSET, crc)
    return bytes(header) + records


@dataclass(slots=True)
class CleanStats:
    batches_read: int = 0
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    batches_removed: int = 0
    markers_removed: int = 0
    aborted_batches_removed: int = 0
    horizons_set: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def add(self, other: CleanStats) -> None:
        for name in self.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(slots=True)
class StreamCleaner:
    """One cleaning pass over one stream: feed it the batches of each object range below the
    end, in offset order (`clean_range`), and it returns what each range keeps."""

    offset_map: OffsetMap
    end: int  # records at or above it are not touched
    now_ms: int
    delete_retention_ms: int
    aborted: Iterable[tuple[int, int, int]] = ()
    stats: CleanStats = field(default_factory=CleanStats)
    _txns: _TxnTracker = field(init=False)

    def __post_init__(self) -> None:
        self._txns = _TxnTracker(self.aborted)

    def clean_range(self, batches: Iterable[Buffer]) -> tuple[list[Buffer], bool]:
        """The batches of one object range (whole batches, offset order) as the cleaning keeps
        them, and whether anything changed. The first and last offsets stay covered (empty
        batches where the edge batches went)."""
        out: list[Buffer] = []
        changed = False
        first: BatchInfo | None = None
        last: BatchInfo | None = None
        for view, info in _iter_batches(batches):
            if first is None:
                first = info
            last = info
            kept = self._clean_batch(view, info) if info.base_offset < self.end else view
            if kept is not view:
                changed = True
            if kept is not None:
                out.append(kept)
        if first is None or last is None:
            return out, False
        if not out or parse_batch_header(out[0]).base_offset > first.base_offset:
            out.insert(0, empty_batch(first))
        tail = parse_batch_header(out[-1])
        if tail.base_offset + tail.last_offset_delta < last.base_offset + last.last_offset_delta:
            out.append(empty_batch(last))
        return out, changed

    def _clean_batch(self, view: memoryview, info: BatchInfo) -> Buffer | None:
        """What stays of one batch below the end: `view` itself, a rewritten batch, or None."""
        stats = self.stats
        stats.batches_read += 1
        stats.bytes_read += info.size
        stats.records_read += info.record_count
        now = self.now_ms
        has_horizon = bool(info.attributes & DELETE_HORIZON_BIT)
        horizon_passed = has_horizon and info.base_timestamp <= now
        if info.attributes & _CONTROL_BIT:
            body = _body(view, info)
            if not self._txns.on_marker(info, _control_type(body, info)):
                return self._keep(view, info)
            if horizon_passed or info.record_count == 0:
                stats.markers_removed += 1
                stats.records_removed += info.record_count
                return None
            if has_horizon:
                return self._keep(view, info)
            stats.horizons_set += 1
            return self._written(
                _rebuild(
                    info,
                    body,
                    _records(body, info),
                    self._horizon(),
                    view[BATCH_HEADER_SIZE : info.size],
                )
            )
        if info.record_count == 0:
            self._txns.on_batch(info)
            stats.batches_removed += 1
            return None
        if self._txns.on_batch(info):
            stats.aborted_batches_removed += 1
            stats.batches_removed += 1
            stats.records_removed += info.record_count
            return None
        body = _body(view, info)
        records = _records(body, info)
        base = info.base_offset
        latest = self.offset_map.get_all([r[3] for r in records if r[3] is not None])
        kept: list[_Record] = []
        tombstones_kept = False
        i = 0
        for r in records:
            if r[3] is None:
                continue  # keyless: Kafka's cleaner drops it too
            found = latest[i]
            i += 1
            if found > base + r[2]:
                continue  # superseded
            if r[4]:
                if horizon_passed:
                    stats.tombstones_removed += 1
                    continue
                tombstones_kept = True
            kept.append(r)
        removed = len(records) - len(kept)
        stats.records_removed += removed
        set_horizon = tombstones_kept and not has_horizon
        if not kept:
            stats.batches_removed += 1
            return None
        if not removed and not set_horizon:
            return self._keep(view, info)
        if set_horizon:
            stats.horizons_set += 1
        horizon = self._horizon() if set_horizon else None
        original = view[BATCH_HEADER_SIZE : info.size]
        return self._written(_rebuild(info, body, kept, horizon, original))

    def _horizon(self) -> int:
        return min(self.now_ms + self.delete_retention_ms, LONG_MAX)

    def _keep(self, view: memoryview, info: BatchInfo) -> memoryview:
        self.stats.bytes_written += info.size
        return view

    def _written(self, data: bytes) -> bytes:
        self.stats.bytes_written += len(data)
        return data


# -- the checkpoint document --------------------------------------------------------------------

CHECKPOINT_PREFIX = "cleaner/"
CHECKPOINT_FORMAT = 1


def checkpoint_key(node_id: int) -> str:
    """Where a main keeps its cleaner's checkpoints (Kafka's cleaner-offset-checkpoint)."""
    return f"{CHECKPOINT_PREFIX}{node_id}.json"


def encode_checkpoints(node_id: int, checkpoints: Mapping[StreamKey, int]) -> bytes:
    """`{"format":1,"node_id":N,"first_dirty":[[topic id hex, partition, offset],...]}`,
    sorted by stream."""
    rows = [[k.topic_id.hex(), k.partition, off] for k, off in sorted(checkpoints.items())]
    body = {"format": CHECKPOINT_FORMAT, "node_id": node_id, "first_dirty": rows}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_checkpoints(data: bytes) -> dict[StreamKey, int]:
    """The checkpoints of `encode_checkpoints`' bytes; ValueError when they are not that."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"cleaner checkpoints are not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != CHECKPOINT_FORMAT:
        raise ValueError("cleaner checkpoints: not a format 1 document")
    rows = raw.get("first_dirty")
    if not isinstance(rows, list):
        raise ValueError("cleaner checkpoints: first_dirty is not a list")
    out: dict[StreamKey, int] = {}
    for i, row in enumerate(rows):
        if (
            not isinstance(row, list)
            or len(row) != 3
            or not isinstance(row[0], str)
            or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in row[1:])
        ):
            raise ValueError(f"cleaner checkpoints: first_dirty[{i}] is not [hex, int, int]")
        try:
            topic_id = bytes.fromhex(row[0])
        except ValueError:
            topic_id = b""
        if len(topic_id) != 16:
            raise ValueError(f"cleaner checkpoints: first_dirty[{i}] has a bad topic id")
        out[StreamKey(topic_id, row[1])] = row[2]
    return out
