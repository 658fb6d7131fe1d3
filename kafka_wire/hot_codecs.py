"""Hand-written codecs for the hot APIs: Produce request (v3-13), Produce response (v3-13)
and Fetch response (v4-18; v17 and v18 only add tagged fields to the request).

Produce v13 names each topic by its id instead of its name (KIP-516): the decoder hands out the
id with an empty name, which `name_topics` fills in from the broker's topics; the response
names the topics by the ids the request used.

Each also measures the bytes of every topic entry it reads or writes, for the traffic
accounting's split by topic (`kafka_wire.topic_bytes`): a Produce request's topics carry
``nbytes``, and the responses come back as `TopicParts`.

kio's generic codecs cost ~10 µs per partition and copy record bytes; these use plain struct,
hand out record data as zero-copy memoryviews (requests) and never copy record buffers
(fetch responses). Field lists follow kio's generated schemas (Apache Kafka's JSON).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from kafka_wire.topic_bytes import TopicBytes, TopicParts
from kafka_wire.varint import read_uvarint, skip_tagged_fields_at

Buffer: TypeAlias = bytes | bytearray | memoryview

PRODUCE_VERSIONS = range(3, 14)
PRODUCE_RESPONSE_VERSIONS = range(3, 14)
FETCH_RESPONSE_VERSIONS = range(4, 19)
_PRODUCE_FIRST_FLEXIBLE = 9
_PRODUCE_FIRST_TOPIC_ID = 13
_FETCH_FIRST_FLEXIBLE = 12

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_unpack_i16 = _I16.unpack_from
_unpack_i32 = _I32.unpack_from
_unpack_i32_i32 = struct.Struct(">ii").unpack_from
_unpack_acks_timeout = struct.Struct(">hi").unpack_from
_pack_i16 = _I16.pack
_pack_i32 = _I32.pack
_pack_i64 = _I64.pack
_pack_i32_i32 = struct.Struct(">ii").pack
_pack_i64_i64 = struct.Struct(">qq").pack
_pack_i16_i32 = struct.Struct(">hi").pack
_pack_part_head = struct.Struct(">ihqq").pack  # index, error, base/hw, log append/lso
_pack_fetch_head = struct.Struct(">ihqqq").pack  # index, error, hw, lso, log start

# A flexible LeaderIdAndEpoch as a tagged-field payload: two int32s + empty tag buffer.
_LEADER_PAYLOAD_SIZE = 9


# --- Produce request -------------------------------------------------------------------------


@dataclass(slots=True)
class ProducePartitionData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class ProduceTopicData:
    name: str  # v13+: "" until `name_topics` names it, and still "" for an unknown id
    partitions: list[ProducePartitionData]
    # Bytes of this topic's entry in the frame (name, partitions, records, tags): traffic
    # accounting splits the frame by them (kafka_wire.topic_bytes).
    nbytes: int = 0
    topic_id: bytes | None = None  # v13+: the 16 bytes the request names the topic by

    @property
    def unknown_id(self) -> bool:
        """A v13+ topic whose id names no topic (UNKNOWN_TOPIC_ID for its partitions)."""
        return self.topic_id is not None and not self.name


@dataclass(slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[ProduceTopicData]


def _take(buf: memoryview, pos: int, n: int) -> tuple[memoryview, int]:
    end = pos + n
    if n < 0 or end > len(buf):
        raise ValueError(f"field of {n} bytes at {pos} runs past the end of the frame")
    return buf[pos:end], end


def decode_produce_request(version: int, frame: memoryview, offset: int) -> ProduceRequestData:
    """Decode a Produce request body starting at ``offset`` (just after the request header).

    ``frame`` should be a writable memoryview over a bytearray: the records are zero-copy
    sub-views of it, so offsets can be patched in place. Each topic also says how many bytes
    its entry takes (``nbytes``). Raises ValueError on malformed input.
    """
    if version not in PRODUCE_VERSIONS:
        raise ValueError(f"unsupported Produce request version {version}")
    if not 0 <= offset <= len(frame):
        raise ValueError(f"body offset {offset} outside a frame of {len(frame)} bytes")
    try:
        if version >= _PRODUCE_FIRST_FLEXIBLE:
            return _decode_produce_flexible(frame, offset, version >= _PRODUCE_FIRST_TOPIC_ID)
        return _decode_produce_legacy(frame, offset)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed Produce v{version} request: {exc}") from exc


def _decode_produce_legacy(buf: memoryview, pos: int) -> ProduceRequestData:
    limit = len(buf)
    n = _unpack_i16(buf, pos)[0]
    pos += 2
    transactional_id: str | None = None
    if n >= 0:
        raw, pos = _take(buf, pos, n)
        transactional_id = str(raw, "utf-8")
    elif n != -1:
        raise ValueError(f"invalid transactional_id length {n}")
    acks, timeout_ms = _unpack_acks_timeout(buf, pos)
    pos += 6
    topic_count = _unpack_i32(buf, pos)[0]
    pos += 4
    if topic_count < 0:
        raise ValueError(f"invalid topic array length {topic_count}")
    topics: list[ProduceTopicData] = []
    for _ in range(topic_count):
        start = pos
        n = _unpack_i16(buf, pos)[0]
        raw, pos = _take(buf, pos + 2, n)
        name = str(raw, "utf-8")
        part_count = _unpack_i32(buf, pos)[0]
        pos += 4
        if part_count < 0:
            raise ValueError(f"invalid partition array length {part_count}")
        parts: list[ProducePartitionData] = []
        for _ in range(part_count):
            index, size = _unpack_i32_i32(buf, pos)
            pos += 8
            records: memoryview | None = None
            if size >= 0:
                end = pos + size
                if end > limit:
                    raise ValueError(f"records of {size} bytes at {pos} run past the frame")
                records = buf[pos:end]
                pos = end
            elif size != -1:
                raise ValueError(f"invalid records length {size}")
            parts.append(ProducePartitionData(index, records))
        topics.append(ProduceTopicData(name, parts, pos - start))
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


def _decode_produce_flexible(buf: memoryview, pos: int, by_id: bool) -> ProduceRequestData:
    limit = len(buf)
    n, pos = read_uvarint(buf, pos, limit)
    transactional_id: str | None = None
    if n:
        raw, pos = _take(buf, pos, n - 1)
        transactional_id = str(raw, "utf-8")
    acks, timeout_ms = _unpack_acks_timeout(buf, pos)
    pos += 6
    topic_count, pos = read_uvarint(buf, pos, limit)
    if not topic_count:
        raise ValueError("null topic array")
    topics: list[ProduceTopicData] = []
    for _ in range(topic_count - 1):
        start = pos
        topic_id: bytes | None = None
        if by_id:
            raw, pos = _take(buf, pos, 16)
            topic_id, name = bytes(raw), ""
        else:
            n, pos = read_uvarint(buf, pos, limit)
            if not n:
                raise ValueError("null topic name")
            raw, pos = _take(buf, pos, n - 1)
            name = str(raw, "utf-8")
        part_count, pos = read_uvarint(buf, pos, limit)
        if not part_count:
            raise ValueError("null partition array")
        parts: list[ProducePartitionData] = []
        for _ in range(part_count - 1):
            index = _unpack_i32(buf, pos)[0]
            pos += 4
            # Inline fast paths: one-byte lengths and empty tag buffers are the norm.
            size = buf[pos]
            if size < 0x80:
                pos += 1
            elif buf[pos + 1] < 0x80:
                size = (size & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
            else:
                size, pos = read_uvarint(buf, pos, limit)
            records: memoryview | None = None
            if size:
                end = pos + size - 1
                if end > limit:
                    raise ValueError(f"records of {size - 1} bytes at {pos} run past the frame")
                records = buf[pos:end]
                pos = end
            parts.append(ProducePartitionData(index, records))
            if buf[pos]:
                pos = skip_tagged_fields_at(buf, pos, limit)
            else:
                pos += 1
        pos = skip_tagged_fields_at(buf, pos, limit)
        topics.append(ProduceTopicData(name, parts, pos - start, topic_id))
    skip_tagged_fields_at(buf, pos, limit)
    return ProduceRequestData(transactional_id, acks, timeout_ms, topics)


def name_topics(req: ProduceRequestData, name_of: Callable[[bytes], str | None]) -> None:
    """Names the topics a v13+ request gave by id; an unknown id leaves the name empty."""
    for topic in req.topics:
        if topic.topic_id is not None:
            topic.name = name_of(topic.topic_id) or ""


# --- shared encoders -------------------------------------------------------------------------


def _put_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _put_array_len(out: bytearray, n: int, flexible: bool) -> None:
    if flexible:
        _put_uvarint(out, n + 1)
    else:
        out += _pack_i32(n)


def _put_string(out: bytearray, s: str, flexible: bool) -> None:
    raw = s.encode()
    if flexible:
        _put_uvarint(out, len(raw) + 1)
    else:
        out += _pack_i16(len(raw))
    out += raw


def _put_nullable_string(out: bytearray, s: str | None, flexible: bool) -> None:
    if s is None:
        if flexible:
            out.append(0)
        else:
            out += b"\xff\xff"
    else:
        _put_string(out, s, flexible)


def _put_leader_tag(out: bytearray, tag: int, leader: tuple[int, int]) -> None:
    """One tagged field holding a LeaderIdAndEpoch (preceded by a tag count of 1)."""
    out.append(1)
    out.append(tag)
    out.append(_LEADER_PAYLOAD_SIZE)
    out += _pack_i32_i32(leader[0], leader[1])
    out.append(0)


def _put_node_endpoints_tag(
    out: bytearray, endpoints: list[tuple[int, str, int, str | None]] | None
) -> None:
    """Top-level tag buffer: node_endpoints as tag 0 when non-empty, else no tags."""
    if not endpoints:
        out.append(0)
        return
    payload = bytearray()
    _put_uvarint(payload, len(endpoints) + 1)
    for node_id, host, port, rack in endpoints:
        payload += _pack_i32(node_id)
        _put_string(payload, host, True)
        payload += _pack_i32(port)
        _put_nullable_string(payload, rack, True)
        payload.append(0)
    out.append(1)
    out.append(0)
    _put_uvarint(out, len(payload))
    out += payload


# --- Produce response ------------------------------------------------------------------------


@dataclass(slots=True)
class ProducePartitionResult:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)
    error_message: str | None = None
    # (leader_id, leader_epoch); tagged field, v10+ only.
    current_leader: tuple[int, int] | None = None


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, list[ProducePartitionResult]]],
    throttle_time_ms: int = 0,
    node_endpoints: list[tuple[int, str, int, str | None]] | None = None,
    topic_ids: Sequence[bytes | None] = (),
) -> bytes:
    """Response header + Produce response body (without the 4-byte frame size).

    ``node_endpoints`` (node_id, host, port, rack) and ``current_leader`` are sent on v10+;
    v13+ names each topic by its entry in ``topic_ids`` (16 bytes; one per topic).
    """
    return _encode_produce_response(
        version, correlation_id, topics, throttle_time_ms, node_endpoints, None, topic_ids
    )


def produce_response_parts(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, list[ProducePartitionResult]]],
    throttle_time_ms: int = 0,
    node_endpoints: list[tuple[int, str, int, str | None]] | None = None,
    topic_ids: Sequence[bytes | None] = (),
) -> TopicParts:
    """`encode_produce_response` as frame parts that carry each topic entry's size."""
    entries: TopicBytes = []
    body = _encode_produce_response(
        version, correlation_id, topics, throttle_time_ms, node_endpoints, entries, topic_ids
    )
    return TopicParts((body,), entries)


def _encode_produce_response(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, list[ProducePartitionResult]]],
    throttle_time_ms: int,
    node_endpoints: list[tuple[int, str, int, str | None]] | None,
    entries: TopicBytes | None,
    topic_ids: Sequence[bytes | None] = (),
) -> bytes:
    if version not in PRODUCE_RESPONSE_VERSIONS:
        raise ValueError(f"unsupported Produce response version {version}")
    flexible = version >= _PRODUCE_FIRST_FLEXIBLE
    hints = version >= 10
    by_id = version >= _PRODUCE_FIRST_TOPIC_ID
    if by_id and len(topic_ids) != len(topics):
        raise ValueError(f"Produce v{version} names {len(topics)} topics by id")
    out = bytearray(_pack_i32(correlation_id))
    if flexible:
        out.append(0)  # response header v1 tag buffer
    _put_array_len(out, len(topics), flexible)
    for i, (name, parts) in enumerate(topics):
        start = len(out)
        if by_id:
            topic_id = topic_ids[i]
            if topic_id is None or len(topic_id) != 16:
                raise ValueError("a topic id is 16 bytes")
            out += topic_id
        else:
            _put_string(out, name, flexible)
        _put_array_len(out, len(parts), flexible)
        for p in parts:
            out += _pack_part_head(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                out += _pack_i64(p.log_start_offset)
            if version >= 8:
                _put_array_len(out, len(p.record_errors), flexible)
                for batch_index, message in p.record_errors:
                    out += _pack_i32(batch_index)
                    _put_nullable_string(out, message, flexible)
                    if flexible:
                        out.append(0)
                _put_nullable_string(out, p.error_message, flexible)
            if flexible:
                if hints and p.current_leader is not None:
                    _put_leader_tag(out, 0, p.current_leader)
                else:
                    out.append(0)
        if flexible:
            out.append(0)
        if entries is not None:
            entries.append((name, len(out) - start))
    out += _pack_i32(throttle_time_ms)
    if flexible:
        _put_node_endpoints_tag(out, node_endpoints if hints else None)
    return bytes(out)


# --- Fetch response --------------------------------------------------------------------------


@dataclass(slots=True)
class FetchPartitionResult:
    index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # (producer_id, first_offset); None = null array.
    aborted_transactions: list[tuple[int, int]] | None = None
    preferred_read_replica: int = -1
    # Byte-format buffers sent as-is, back to back, as this partition's records.
    records: list[Buffer] = field(default_factory=list)
    # (leader_id, leader_epoch); tagged field, v12+ only.
    current_leader: tuple[int, int] | None = None


def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, bytes, list[FetchPartitionResult]]],
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
    node_endpoints: list[tuple[int, str, int, str | None]] | None = None,
) -> TopicParts:
    """Response header + Fetch response body as a list of buffers to send as one frame.

    Topics are (name, 16-byte topic id, partitions); v4-12 send the name, v13+ the id. Record
    buffers appear in the list uncopied; the frame size is the sum of the pieces' lengths.
    The list carries the size of each topic's entry, booked under its name (`TopicParts`).
    """
    if version not in FETCH_RESPONSE_VERSIONS:
        raise ValueError(f"unsupported Fetch response version {version}")
    flexible = version >= _FETCH_FIRST_FLEXIBLE
    has_log_start = version >= 5
    has_replica = version >= 11
    null_array = b"\x00" if flexible else b"\xff\xff\xff\xff"
    empty_array = b"\x01" if flexible else b"\x00\x00\x00\x00"
    entries: TopicBytes = []
    pieces = TopicParts((), entries)
    sent = 0  # bytes in `pieces`, so sent + len(out) is the position in the frame
    out = bytearray(_pack_i32(correlation_id))
    if flexible:
        out.append(0)  # response header v1 tag buffer
    out += _pack_i32(throttle_time_ms)
    if version >= 7:
        out += _pack_i16_i32(error_code, session_id)
    _put_array_len(out, len(topics), flexible)
    for name, topic_id, parts in topics:
        start = sent + len(out)
        if version >= 13:
            if len(topic_id) != 16:
                raise ValueError(f"topic id must be 16 bytes, got {len(topic_id)}")
            out += topic_id
        else:
            _put_string(out, name, flexible)
        _put_array_len(out, len(parts), flexible)
        for p in parts:
            if has_log_start:
                out += _pack_fetch_head(
                    p.index,
                    p.error_code,
                    p.high_watermark,
                    p.last_stable_offset,
                    p.log_start_offset,
                )
            else:
                out += _pack_part_head(
                    p.index, p.error_code, p.high_watermark, p.last_stable_offset
                )
            aborted = p.aborted_transactions
            if aborted is None:
                out += null_array
            elif not aborted:
                out += empty_array
            else:
                _put_array_len(out, len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    out += _pack_i64_i64(producer_id, first_offset)
                    if flexible:
                        out.append(0)
            records = p.records
            size = 0
            for buf in records:
                size += len(buf)
            if flexible:
                out += _pack_i32(p.preferred_read_replica)
                _put_uvarint(out, size + 1)
            elif has_replica:
                out += _pack_i32_i32(p.preferred_read_replica, size)
            else:
                out += _pack_i32(size)
            if size:
                pieces.append(bytes(out))
                pieces.extend(records)
                sent += len(out) + size
                out = bytearray()
            if flexible:
                if p.current_leader is not None:
                    _put_leader_tag(out, 1, p.current_leader)
                else:
                    out.append(0)
        if flexible:
            out.append(0)
        entries.append((name, sent + len(out) - start))
    if flexible:
        _put_node_endpoints_tag(out, node_endpoints if version >= 16 else None)
    pieces.append(bytes(out))
    return pieces
