"""The S3 object format: DataBlocks, an IndexBlock and a Footer (docs/formats.md, "S3 objects").

A design core like h11: pure functions over bytes/memoryview, no I/O and no trio, so the
uploader, the read path, compaction and `zonefleet inspect-object` share one codec. Kafka
batches are framed by their headers only; records are never decoded.

Layout of an object of N DataBlocks (all integers big-endian):

    DataBlock 0 | ... | DataBlock N-1 | IndexBlock (N * 36 bytes) | Footer (48 bytes)
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from crc32c import crc32c

from kafka_wire.record_batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchInfo,
    Buffer,
    InvalidBatch,
    parse_batch_header,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "FOOTER_SIZE",
    "INDEX_ENTRY_SIZE",
    "MAGIC",
    "BlockBatch",
    "CorruptObject",
    "EncodedObject",
    "Footer",
    "IndexEntry",
    "ObjectIndex",
    "block_view",
    "check_block",
    "decode_object",
    "encode_object",
    "iter_block_batches",
    "parse_footer",
    "parse_index",
    "stream_id_for",
]

MAGIC = b"ZFLTOBJ1"
FOOTER_SIZE = 48
INDEX_ENTRY_SIZE = 36
DEFAULT_BLOCK_SIZE = 1 << 20

_FOOTER = struct.Struct(">QI28x8s")
_ENTRY = struct.Struct(">QqIIQI")
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_I64_MAX = 2**63 - 1
_CRC_START = 21  # the batch CRC covers attributes (byte 21) to the end of the batch
_MAGIC_OFFSET = 16
_PARTITION_BITS = 16

assert _FOOTER.size == FOOTER_SIZE and _ENTRY.size == INDEX_ENTRY_SIZE


class CorruptObject(Exception):
    """The bytes are not a well-formed object (or block); the message says why."""


def stream_id_for(topic_id: bytes, partition: int) -> int:
    """The default stream id of a topic-partition: the first 48 bits of the 16-byte topic id,
    then the partition in the low 16 bits.

    A topic's partitions stay adjacent in an index and an operator can read the topic and
    partition off the hex id. Topic ids are random UUIDs, so two topics share a prefix with
    probability about T**2 / 2**49 for T topics; whoever creates topics may re-roll an id that
    collides. The format itself treats a stream id as an opaque u64.
    """
    if len(topic_id) != 16:
        raise ValueError(f"topic id must be 16 bytes, got {len(topic_id)}")
    if not 0 <= partition < 1 << _PARTITION_BITS:
        raise ValueError(f"partition {partition} does not fit the stream id's 16 bits")
    return int.from_bytes(topic_id[:6], "big") << _PARTITION_BITS | partition


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One DataBlock: offsets [start_offset, end_offset) of one stream."""

    stream_id: int
    start_offset: int
    end_offset: int
    record_count: int
    position: int
    size: int

    @property
    def end_delta(self) -> int:
        return self.end_offset - self.start_offset

    def pack(self) -> bytes:
        return _ENTRY.pack(
            self.stream_id,
            self.start_offset,
            self.end_delta,
            self.record_count,
            self.position,
            self.size,
        )


@dataclass(frozen=True, slots=True)
class Footer:
    index_position: int
    index_length: int

    @property
    def entry_count(self) -> int:
        return self.index_length // INDEX_ENTRY_SIZE

    def pack(self) -> bytes:
        return _FOOTER.pack(self.index_position, self.index_length, MAGIC)


@dataclass(slots=True)
class EncodedObject:
    """An object as a list of parts (the callers' batch buffers, uncopied, then the index and
    the footer): an uploader can stream them into a multipart upload without joining."""

    parts: list[Buffer]
    size: int
    entries: list[IndexEntry]
    footer: Footer

    def to_bytes(self) -> bytes:
        return b"".join(self.parts)


# --- encoding -----------------------------------------------------------------------------


@dataclass(slots=True)
class _OpenBlock:
    start_offset: int
    end_offset: int
    record_count: int
    size: int


def _split_batches(stream_id: int, buf: Buffer) -> Iterator[tuple[memoryview, BatchInfo]]:
    """Each whole batch of one input buffer (a buffer holds one or more whole batches)."""
    view = memoryview(buf)
    position = 0
    while position < len(view):
        try:
            info = parse_batch_header(view, position)
        except InvalidBatch as exc:
            raise ValueError(f"stream {stream_id:#x}: {exc.message}") from None
        if info.size < BATCH_HEADER_SIZE or position + info.size > len(view):
            raise ValueError(
                f"stream {stream_id:#x}: batch at {position} claims {info.size} bytes, "
                f"{len(view) - position} available"
            )
        if info.magic != MAGIC_V2:
            raise ValueError(f"stream {stream_id:#x}: batch magic {info.magic}, expected 2")
        if info.record_count < 0 or info.last_offset_delta < 0:
            raise ValueError(f"stream {stream_id:#x}: batch at {info.base_offset} has bad counts")
        yield view[position : position + info.size], info
        position += info.size


def encode_object(
    streams: Mapping[int, Iterable[Buffer]] | Iterable[tuple[int, Iterable[Buffer]]],
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> EncodedObject:
    """Lay out the streams' batches as an object.

    ``streams`` maps a stream id (u64) to its batches in offset order, offsets assigned; each
    buffer holds one or more whole RecordBatches. Streams are written in stream-id order. A
    DataBlock closes before a batch that would take it past ``block_size`` bytes, so a block
    never splits a batch and a batch larger than ``block_size`` gets a block of its own.
    Raises ValueError for input that cannot form a valid object (overlapping offsets, a stream
    id out of range, malformed batches).
    """
    if not 0 < block_size <= _U32_MAX:
        raise ValueError(f"block size {block_size} must be in 1..{_U32_MAX}")
    items = list(streams.items()) if isinstance(streams, Mapping) else list(streams)
    items.sort(key=lambda item: item[0])
    parts: list[Buffer] = []
    entries: list[IndexEntry] = []
    position = 0
    previous_id: int | None = None
    for stream_id, batches in items:
        if not 0 <= stream_id <= _U64_MAX:
            raise ValueError(f"stream id {stream_id} is not a u64")
        if stream_id == previous_id:
            raise ValueError(f"stream {stream_id:#x} given twice")
        previous_id = stream_id
        block: _OpenBlock | None = None
        next_offset: int | None = None
        for buf in batches:
            for view, info in _split_batches(stream_id, buf):
                end = info.last_offset + 1
                if info.base_offset < 0 or end > _I64_MAX:
                    raise ValueError(f"stream {stream_id:#x}: offset {info.base_offset} invalid")
                if next_offset is not None and info.base_offset < next_offset:
                    raise ValueError(
                        f"stream {stream_id:#x}: batch at offset {info.base_offset} overlaps "
                        f"or precedes offset {next_offset - 1}"
                    )
                next_offset = end
                if block is not None and (
                    block.size + info.size > block_size
                    or end - block.start_offset > _U32_MAX
                    or block.record_count + info.record_count > _U32_MAX
                ):
                    entries.append(_close(stream_id, block, position))
                    position += block.size
                    block = None
                if block is None:
                    block = _OpenBlock(info.base_offset, end, 0, 0)
                block.end_offset = end
                block.record_count += info.record_count
                block.size += info.size
                parts.append(view)
        if block is not None:
            entries.append(_close(stream_id, block, position))
            position += block.size
    index = b"".join(entry.pack() for entry in entries)
    footer = Footer(position, len(index))
    parts.append(index)
    parts.append(footer.pack())
    return EncodedObject(parts, position + len(index) + FOOTER_SIZE, entries, footer)


def _close(stream_id: int, block: _OpenBlock, position: int) -> IndexEntry:
    return IndexEntry(
        stream_id, block.start_offset, block.end_offset, block.record_count, position, block.size
    )


# --- decoding -----------------------------------------------------------------------------


def parse_footer(tail: Buffer, object_size: int) -> Footer:
    """Parse the footer from ``tail``, the object's last bytes (at least 48, or all of it)."""
    if object_size < FOOTER_SIZE:
        raise CorruptObject(f"object of {object_size} bytes is shorter than a footer (48)")
    if len(tail) < FOOTER_SIZE:
        raise CorruptObject(f"need the last 48 bytes for the footer, got {len(tail)}")
    start = len(tail) - FOOTER_SIZE
    index_position, index_length, magic = _FOOTER.unpack_from(tail, start)
    if magic != MAGIC:
        raise CorruptObject(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if any(memoryview(tail)[start + 12 : start + 40]):
        raise CorruptObject("footer padding is not zero")
    if index_length % INDEX_ENTRY_SIZE:
        raise CorruptObject(f"index length {index_length} is not a multiple of 36")
    if index_position + index_length != object_size - FOOTER_SIZE:
        raise CorruptObject(
            f"index [{index_position}, +{index_length}) does not end at the footer "
            f"(object is {object_size} bytes, footer at {object_size - FOOTER_SIZE})"
        )
    return Footer(index_position, index_length)


def parse_index(index: Buffer, footer: Footer) -> list[IndexEntry]:
    """Parse and validate the IndexBlock bytes.

    Entries must be sorted by (stream id, start offset) with no overlapping offsets within a
    stream, and the DataBlocks must tile bytes [0, index position) in index order.
    """
    if len(index) != footer.index_length:
        raise CorruptObject(f"index is {len(index)} bytes, footer says {footer.index_length}")
    entries: list[IndexEntry] = []
    position = 0
    previous: IndexEntry | None = None
    for i in range(footer.entry_count):
        stream_id, start, delta, count, block_position, size = _ENTRY.unpack_from(
            index, i * INDEX_ENTRY_SIZE
        )
        entry = IndexEntry(stream_id, start, start + delta, count, block_position, size)
        where = f"index entry {i}"
        if start < 0 or start + delta > _I64_MAX:
            raise CorruptObject(f"{where}: offsets [{start}, {start + delta}) out of range")
        if delta == 0:
            raise CorruptObject(f"{where}: empty offset range at {start}")
        if size < BATCH_HEADER_SIZE:
            raise CorruptObject(f"{where}: block size {size} cannot hold a batch")
        if block_position != position:
            raise CorruptObject(
                f"{where}: block at {block_position}, expected {position} (blocks are contiguous)"
            )
        if block_position + size > footer.index_position:
            raise CorruptObject(
                f"{where}: block [{block_position}, +{size}) runs past the index at "
                f"{footer.index_position}"
            )
        if previous is not None:
            if stream_id < previous.stream_id:
                raise CorruptObject(f"{where}: stream {stream_id:#x} out of order")
            if stream_id == previous.stream_id and start < previous.end_offset:
                raise CorruptObject(
                    f"{where}: offset {start} overlaps the previous block, which ends at "
                    f"{previous.end_offset}"
                )
        entries.append(entry)
        previous = entry
        position += size
    if position != footer.index_position:
        raise CorruptObject(
            f"blocks end at {position}, but the index starts at {footer.index_position}"
        )
    return entries


class ObjectIndex:
    """An object's footer and index, with lookups. Cache this per object on the read path."""

    __slots__ = ("_keys", "entries", "footer", "size")

    def __init__(self, footer: Footer, entries: list[IndexEntry], size: int) -> None:
        self.footer = footer
        self.entries = entries
        self.size = size
        self._keys = [(e.stream_id, e.start_offset) for e in entries]

    @classmethod
    def from_tail(cls, tail: Buffer, object_size: int) -> ObjectIndex:
        """From the object's last bytes, when they cover the index and the footer (a reader
        that guesses a tail size makes one ranged GET for both)."""
        footer = parse_footer(tail, object_size)
        needed = footer.index_length + FOOTER_SIZE
        if len(tail) < needed:
            raise ValueError(f"tail of {len(tail)} bytes does not cover index+footer ({needed})")
        start = len(tail) - needed
        index = memoryview(tail)[start : start + footer.index_length]
        return cls(footer, parse_index(index, footer), object_size)

    def stream_ids(self) -> list[int]:
        return sorted({e.stream_id for e in self.entries})

    def entries_for(self, stream_id: int) -> list[IndexEntry]:
        lo = bisect.bisect_left(self._keys, (stream_id, -1))
        hi = bisect.bisect_left(self._keys, (stream_id + 1, -1))
        return self.entries[lo:hi]

    def find(self, stream_id: int, offset: int) -> IndexEntry | None:
        """The block holding ``offset`` of the stream; if the offset falls in a gap between
        blocks, the next block (a reader continues from there); None past the stream's end."""
        i = bisect.bisect_right(self._keys, (stream_id, offset))
        if i > 0:
            entry = self.entries[i - 1]
            if entry.stream_id == stream_id and offset < entry.end_offset:
                return entry
        if i < len(self.entries) and self.entries[i].stream_id == stream_id:
            return self.entries[i]
        return None


def decode_object(data: Buffer) -> ObjectIndex:
    """Footer and index of a whole object held in memory."""
    return ObjectIndex.from_tail(data, len(data))


def block_view(data: Buffer, entry: IndexEntry) -> memoryview:
    """The DataBlock's bytes inside a whole object."""
    if entry.position + entry.size > len(data):
        raise CorruptObject(f"block at {entry.position} runs past the object ({len(data)})")
    return memoryview(data)[entry.position : entry.position + entry.size]


@dataclass(frozen=True, slots=True)
class BlockBatch:
    info: BatchInfo  # info.position is relative to the block
    crc_ok: bool


def iter_block_batches(block: Buffer) -> Iterator[BlockBatch]:
    """Every batch of a DataBlock, framed by its length field, with its CRC-32C checked.

    Framing errors (a partial batch, a length too small for a header, magic other than 2)
    raise CorruptObject; a CRC mismatch is reported in ``crc_ok`` so a tool can show it.
    """
    view = memoryview(block)
    position = 0
    end = len(view)
    while position < end:
        if end - position < BATCH_HEADER_SIZE:
            raise CorruptObject(f"{end - position} trailing bytes at {position} are not a batch")
        info = parse_batch_header(view, position)
        if info.size < BATCH_HEADER_SIZE:
            raise CorruptObject(
                f"batch at {position} has batchLength {info.size - LOG_OVERHEAD}, "
                "below the v2 minimum"
            )
        if position + info.size > end:
            raise CorruptObject(
                f"batch at {position} claims {info.size} bytes, the block has {end - position} left"
            )
        if view[position + _MAGIC_OFFSET] != MAGIC_V2:
            raise CorruptObject(f"batch at {position} has magic {info.magic}, expected 2")
        crc_ok = crc32c(view[position + _CRC_START : position + info.size]) == info.crc
        yield BlockBatch(info, crc_ok)
        position += info.size


def check_block(block: Buffer, entry: IndexEntry) -> list[BatchInfo]:
    """The batches of a DataBlock, verified against its index entry: sizes, CRCs, offsets in
    order within [start, end), and the record count. Raises CorruptObject on any mismatch."""
    if len(block) != entry.size:
        raise CorruptObject(f"block is {len(block)} bytes, index says {entry.size}")
    batches: list[BatchInfo] = []
    count = 0
    next_offset = entry.start_offset
    for item in iter_block_batches(block):
        info = item.info
        if not item.crc_ok:
            raise CorruptObject(f"batch at offset {info.base_offset} fails its CRC-32C check")
        if not batches and info.base_offset != entry.start_offset:
            raise CorruptObject(
                f"block starts at offset {info.base_offset}, index says {entry.start_offset}"
            )
        if info.base_offset < next_offset:
            raise CorruptObject(f"batch at offset {info.base_offset} is out of order")
        next_offset = info.last_offset + 1
        count += info.record_count
        batches.append(info)
    if next_offset != entry.end_offset:
        raise CorruptObject(f"block ends at offset {next_offset}, index says {entry.end_offset}")
    if count != entry.record_count:
        raise CorruptObject(f"block holds {count} records, index says {entry.record_count}")
    return batches
