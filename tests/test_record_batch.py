"""RecordBatch v2 parsing, produce validation and in-place patching."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from kafka_wire.record_batch import (
    BATCH_HEADER_SIZE,
    BatchInfo,
    InvalidBatch,
    assign_offsets,
    build_batch,
    decode_records_for_tools,
    iter_batches,
    parse_batch_header,
    stamp_log_append_time,
    validate_produce_records,
)

NOW = 1_700_000_000_000
HOUR = 3_600_000


def validate(buf: bytes | bytearray | memoryview, **overrides: Any) -> BatchInfo:
    kwargs: dict[str, Any] = {
        "now_ms": NOW,
        "log_append_time": False,
        "timestamp_before_max_ms": HOUR,
        "timestamp_after_max_ms": HOUR,
        "max_message_bytes": 1 << 20,
    }
    kwargs.update(overrides)
    return validate_produce_records(buf, **kwargs)


def reject(buf: bytes | bytearray, code: ErrorCode, **overrides: Any) -> InvalidBatch:
    with pytest.raises(InvalidBatch) as info:
        validate(buf, **overrides)
    assert info.value.error_code == code, info.value.message
    assert info.value.message
    return info.value


def recrc(buf: bytearray) -> bytearray:
    """Rewrite the CRC after a deliberate edit, so only the edited field is wrong."""
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return buf


def patched(
    buf: bytes | bytearray, fmt: str, offset: int, value: int, fix_crc: bool = True
) -> bytearray:
    out = bytearray(buf)
    struct.pack_into(fmt, out, offset, value)
    return recrc(out) if fix_crc else out


def sample(n: int = 3, **kwargs: Any) -> bytes:
    records: list[tuple[bytes | None, bytes | None]] = [
        (f"k{i}".encode(), f"value-{i}".encode() * 3) for i in range(n)
    ]
    return build_batch(records, timestamp_ms=kwargs.pop("timestamp_ms", NOW), **kwargs)


# --- build / decode / parse --------------------------------------------------------------


@pytest.mark.parametrize("compression", [0, 1])
def test_build_batch_round_trip(compression: int) -> None:
    records: list[tuple[bytes | None, bytes | None]] = [
        (b"key", b"value"),
        (None, b"no key"),
        (b"no value", None),
        (None, None),
        (b"", b""),
        (b"big", bytes(range(256)) * 40),
    ]
    buf = build_batch(records, base_offset=1000, timestamp_ms=NOW, compression=compression)
    decoded = decode_records_for_tools(buf)
    assert decoded == [(1000 + i, NOW, k, v) for i, (k, v) in enumerate(records)]
    # kafka-python, an independent reader, agrees on CRC and content
    theirs = DefaultRecordBatch(bytearray(buf))
    assert theirs.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value) for r in theirs] == decoded


def test_parse_batch_header_fields_and_properties() -> None:
    buf = build_batch(
        [(b"a", b"1"), (b"b", b"2")],
        base_offset=77,
        timestamp_ms=NOW,
        producer_id=9001,
        producer_epoch=3,
        base_sequence=40,
        transactional=True,
    )
    info = parse_batch_header(b"junk" + buf, 4)
    assert info.position == 4
    assert info.size == len(buf)
    assert (info.base_offset, info.magic, info.record_count, info.last_offset_delta) == (
        77,
        2,
        2,
        1,
    )
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (9001, 3, 40)
    assert (info.base_timestamp, info.max_timestamp) == (NOW, NOW)
    assert info.crc == crc32c(buf[21:])
    assert info.is_transactional and not info.is_control
    assert info.compression == 0 and not info.timestamp_type_log_append
    assert info.last_offset == 78
    assert info.last_sequence == 41
    assert info.has_producer_id


def test_last_sequence_wraps_like_kafka() -> None:
    info = parse_batch_header(sample(5, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2))
    # Kafka: 2147483646 + 4 wraps to 2
    assert info.last_sequence == 2
    assert parse_batch_header(sample(1)).last_sequence == -1
    assert not parse_batch_header(sample(1)).has_producer_id


def test_parse_batch_header_short_buffer() -> None:
    with pytest.raises(InvalidBatch) as info:
        parse_batch_header(sample()[: BATCH_HEADER_SIZE - 1])
    assert info.value.error_code == ErrorCode.corrupt_message


def test_iter_batches_walks_and_stops_at_partial_tail() -> None:
    b1, b2, b3 = sample(1, base_offset=0), sample(2, base_offset=1), sample(3, base_offset=3)
    blob = b1 + b2 + b3
    assert [(b.position, b.base_offset, b.size) for b in iter_batches(blob)] == [
        (0, 0, len(b1)),
        (len(b1), 1, len(b2)),
        (len(b1) + len(b2), 3, len(b3)),
    ]
    for cut in (1, 11, 12, 40, BATCH_HEADER_SIZE, len(b3) - 1):
        assert [b.base_offset for b in iter_batches(blob[: len(b1) + len(b2) + cut])] == [0, 1]
    assert list(iter_batches(b"")) == []
    assert [r[0] for r in decode_records_for_tools(blob + b3[:20])] == list(range(6))


def test_iter_batches_rejects_impossible_length() -> None:
    bad = patched(sample(), ">i", 8, 10, fix_crc=False)
    with pytest.raises(InvalidBatch) as info:
        list(iter_batches(sample() + bad))
    assert info.value.error_code == ErrorCode.corrupt_message


# --- batches from kafka-python's own builder ---------------------------------------------

CODECS: list[tuple[int, Callable[[], bool]]] = [
    (DefaultRecordBatch.CODEC_NONE, lambda: True),
    (DefaultRecordBatch.CODEC_GZIP, kafka_codec.has_gzip),
    (DefaultRecordBatch.CODEC_SNAPPY, kafka_codec.has_snappy),
    (DefaultRecordBatch.CODEC_LZ4, kafka_codec.has_lz4),
    (DefaultRecordBatch.CODEC_ZSTD, kafka_codec.has_zstd),
]


def kafka_python_batch(codec: int, n: int = 50, transactional: bool = False) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=4242,
        producer_epoch=1,
        base_sequence=10,
        batch_size=1 << 20,
    )
    for i in range(n):
        builder.append(i, timestamp=NOW + i, key=b"key-%d" % i, value=b"v" * 200, headers=[])
    return bytearray(builder.build())


@pytest.mark.parametrize("codec, available", CODECS, ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_batches_validate_and_pass_through(
    codec: int, available: Callable[[], bool]
) -> None:
    if not available():
        pytest.skip(f"compression library for codec {codec} not installed")
    original = bytes(kafka_python_batch(codec, transactional=True))
    buf = bytearray(original)
    info = validate(buf, api_version=9)
    assert info.compression == codec
    assert info.record_count == 50 and info.is_transactional and info.has_producer_id
    assert info.max_timestamp == NOW + 49

    assign_offsets(memoryview(buf), info, 5_000_000_000, 17)
    assert (info.base_offset, info.partition_leader_epoch) == (5_000_000_000, 17)
    assert buf[16:] == original[16:]  # only baseOffset and partitionLeaderEpoch changed
    assert buf[8:12] == original[8:12]
    assert struct.unpack_from(">qii", buf) == (5_000_000_000, len(original) - 12, 17)
    assert validate(buf) == info
    theirs = DefaultRecordBatch(buf)
    assert theirs.validate_crc()
    assert [r.offset for r in theirs] == list(range(5_000_000_000, 5_000_000_050))


@pytest.mark.parametrize("codec, available", CODECS, ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_stamp_log_append_time(codec: int, available: Callable[[], bool]) -> None:
    if not available():
        pytest.skip(f"compression library for codec {codec} not installed")
    original = bytes(kafka_python_batch(codec, n=5))
    buf = bytearray(original)
    view = memoryview(buf)
    info = validate(buf, log_append_time=True)
    stamp_log_append_time(view, info, NOW + 123)
    assert info.timestamp_type_log_append
    assert (info.base_timestamp, info.max_timestamp) == (NOW + 123, NOW + 123)
    assert info.crc == crc32c(buf[21:])
    assert parse_batch_header(buf) == info
    assert buf[43:] == original[43:]  # records untouched
    assert validate(buf, log_append_time=True) == info
    theirs = DefaultRecordBatch(buf)
    assert theirs.validate_crc()
    assert theirs.timestamp_type == DefaultRecordBatch.LOG_APPEND_TIME
    assert {r.timestamp for r in theirs} == {NOW + 123}


def test_assign_offsets_and_stamp_at_a_nonzero_position() -> None:
    b1, b2 = sample(2), sample(3)
    buf = bytearray(b1 + b2)
    view = memoryview(buf)
    _first, second = list(iter_batches(view))
    assign_offsets(view, second, 10, 3)
    stamp_log_append_time(view, second, NOW)
    assert buf[: len(b1)] == b1
    assert [r[0] for r in decode_records_for_tools(buf)] == [0, 1, 10, 11, 12]
    assert validate(view[second.position :]).base_offset == 10


# --- rejections --------------------------------------------------------------------------


def test_bad_crc_is_corrupt_message() -> None:
    buf = bytearray(sample())
    buf[-1] ^= 0xFF
    reject(buf, ErrorCode.corrupt_message)
    reject(patched(sample(), ">I", 17, 12345, fix_crc=False), ErrorCode.corrupt_message)


@pytest.mark.parametrize(
    "magic, code",
    [
        (0, ErrorCode.unsupported_for_message_format),
        (1, ErrorCode.unsupported_for_message_format),
        (3, ErrorCode.corrupt_message),
        (-1, ErrorCode.corrupt_message),
    ],
)
def test_bad_magic(magic: int, code: ErrorCode) -> None:
    reject(patched(sample(), ">b", 16, magic, fix_crc=False), code)


def test_truncated_and_too_short() -> None:
    buf = sample()
    for cut in (0, 5, 11, 12, 30, BATCH_HEADER_SIZE, len(buf) - 1):
        reject(buf[:cut], ErrorCode.invalid_record)
    # a length that cannot even hold the v2 header is corruption, not truncation
    reject(patched(buf, ">i", 8, 20, fix_crc=False), ErrorCode.corrupt_message)
    reject(patched(buf, ">i", 8, -5, fix_crc=False), ErrorCode.corrupt_message)


def test_trailing_bytes_are_rejected() -> None:
    buf = sample()
    reject(buf + b"\x00", ErrorCode.invalid_record)
    reject(buf + sample(1), ErrorCode.invalid_record)  # two batches in one partition


def test_count_mismatches() -> None:
    buf = sample(3)
    reject(patched(buf, ">i", 57, 2), ErrorCode.invalid_record)  # count != lastOffsetDelta+1
    reject(patched(buf, ">i", 23, 5), ErrorCode.invalid_record)  # lastOffsetDelta too big
    zero = patched(patched(buf, ">i", 57, 0), ">i", 23, -1)
    reject(zero, ErrorCode.invalid_record)
    reject(build_batch([], timestamp_ms=NOW), ErrorCode.invalid_record)


def test_too_large() -> None:
    buf = sample(10)
    assert validate(buf, max_message_bytes=len(buf)).size == len(buf)
    reject(buf, ErrorCode.message_too_large, max_message_bytes=len(buf) - 1)


def test_timestamps() -> None:
    reject(sample(timestamp_ms=NOW - HOUR - 1), ErrorCode.invalid_timestamp)
    reject(sample(timestamp_ms=NOW + HOUR + 1), ErrorCode.invalid_timestamp)
    assert validate(sample(timestamp_ms=NOW - HOUR)).base_timestamp == NOW - HOUR
    assert validate(sample(timestamp_ms=NOW + HOUR)).max_timestamp == NOW + HOUR
    # maxTimestamp alone out of range
    reject(patched(sample(), ">q", 35, NOW + 2 * HOUR), ErrorCode.invalid_timestamp)
    # -1 means "no timestamp" and is allowed
    assert validate(sample(timestamp_ms=-1)).base_timestamp == -1
    # LogAppendTime topics do not check client timestamps
    assert validate(sample(timestamp_ms=0), log_append_time=True).base_timestamp == 0


def test_control_batch_is_rejected() -> None:
    buf = sample(1)
    attributes = struct.unpack_from(">h", buf, 21)[0]
    reject(patched(buf, ">h", 21, attributes | 0x20), ErrorCode.invalid_record)


def test_compression_checks() -> None:
    buf = sample(1)
    reject(patched(buf, ">h", 21, 5), ErrorCode.invalid_record)
    zstd = patched(buf, ">h", 21, 4)
    reject(zstd, ErrorCode.unsupported_compression_type, api_version=6)
    assert validate(zstd, api_version=7).compression == 4


def test_producer_id_without_sequence() -> None:
    reject(sample(1, producer_id=5, producer_epoch=0, base_sequence=-1), ErrorCode.invalid_record)


def test_large_batch_validates() -> None:
    buf = build_batch([(None, bytes(1 << 20))], timestamp_ms=NOW)
    assert validate(buf, max_message_bytes=2 << 20).size == len(buf)


# --- fuzz --------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_invalid_batch(data: bytes) -> None:
    try:
        validate(data)
    except InvalidBatch:
        pass


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_fuzz_mutated_batches_only_invalid_batch(data: Any) -> None:
    buf = bytearray(sample(data.draw(st.integers(1, 4))))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        recrc(buf)
    try:
        validate(buf)
    except InvalidBatch:
        pass
