"""S3 object format: golden bytes, round trips, lookups, corruption and block sizing."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_wire.record_batch import build_batch, iter_batches
from s3_commit.object_format import (
    FOOTER_SIZE,
    INDEX_ENTRY_SIZE,
    MAGIC,
    CorruptObject,
    IndexEntry,
    ObjectIndex,
    block_view,
    check_block,
    decode_object,
    encode_object,
    iter_block_batches,
    parse_footer,
    parse_index,
    stream_id_for,
)
from s3_commit.object_plan import (
    DEFAULT_SPLIT_SIZE,
    ObjectKind,
    parse_object_key,
    plan_upload,
    so_key,
    sso_key,
)
from tests.test_wal_record import reference_crc32c

TS = 1_700_000_000_000  # 0x18bcfe56800
TOPIC_ID = bytes(range(16))  # 000102030405060708090a0b0c0d0e0f
STREAM_A = 0x0001020304050000  # stream_id_for(TOPIC_ID, 0)
STREAM_B = 0x0001020304050001  # stream_id_for(TOPIC_ID, 1)

# Stream A: one batch at offset 0, one record (value "a"), idempotent producer 1000, epoch 0,
# sequence 0. 69 bytes, laid out as in docs/formats.md "Kafka RecordBatch v2":
GOLDEN_BATCH_A = (
    "0000000000000000"  # baseOffset 0
    "00000039"  # batchLength 57 (batch = 69 bytes)
    "ffffffff"  # partitionLeaderEpoch -1
    "02"  # magic 2
    "c63634c5"  # crc32c of bytes 21..68
    "0000"  # attributes: no compression, CreateTime
    "00000000"  # lastOffsetDelta 0
    "0000018bcfe56800"  # baseTimestamp 1700000000000
    "0000018bcfe56800"  # maxTimestamp
    "00000000000003e8"  # producerId 1000
    "0000"  # producerEpoch 0
    "00000000"  # baseSequence 0
    "00000001"  # recordsCount 1
    # record: length 7, attributes, ts delta 0, offset delta 0, key null, value "a", no headers
    "0e00000001026100"
)
# Stream B: one batch at offsets 10..11, two records ("b", "c"), no producer id. 77 bytes.
GOLDEN_BATCH_B = (
    "000000000000000a"  # baseOffset 10
    "00000041"  # batchLength 65 (batch = 77 bytes)
    "ffffffff"
    "02"
    "96ed70fb"
    "0000"
    "00000001"  # lastOffsetDelta 1
    "0000018bcfe56800"
    "0000018bcfe56800"
    "ffffffffffffffff"  # producerId -1
    "ffff"
    "ffffffff"
    "00000002"  # recordsCount 2
    "0e00000001026200"
    "0e00000201026300"  # offset delta 1 (zigzag 02)
)
GOLDEN_INDEX = (
    # stream id       start offset      end delta record count position          size
    "0001020304050000"
    "0000000000000000"
    "00000001"
    "00000001"
    "0000000000000000"
    "00000045"
    "0001020304050001"
    "000000000000000a"
    "00000002"
    "00000002"
    "0000000000000045"
    "0000004d"
)
GOLDEN_FOOTER = (
    "0000000000000092"  # index position 146 = 69 + 77
    "00000048"  # index length 72 = 2 entries
    + "00" * 28  # padding
    + "5a464c544f424a31"  # magic "ZFLTOBJ1"
)
GOLDEN_OBJECT = GOLDEN_BATCH_A + GOLDEN_BATCH_B + GOLDEN_INDEX + GOLDEN_FOOTER


def golden_batches() -> tuple[bytes, bytes]:
    a = build_batch(
        [(None, b"a")],
        base_offset=0,
        timestamp_ms=TS,
        producer_id=1000,
        producer_epoch=0,
        base_sequence=0,
    )
    b = build_batch([(None, b"b"), (None, b"c")], base_offset=10, timestamp_ms=TS)
    return a, b


def batch(offset: int, n: int = 1, size: int = 10, ts: int = TS) -> bytes:
    return build_batch(
        [(None, bytes([i % 251]) * size) for i in range(n)], base_offset=offset, timestamp_ms=ts
    )


def test_golden_batches_match_the_hand_layout() -> None:
    a, b = golden_batches()
    assert a == bytes.fromhex(GOLDEN_BATCH_A)
    assert b == bytes.fromhex(GOLDEN_BATCH_B)
    for raw in (a, b):
        assert struct.unpack_from(">I", raw, 17)[0] == reference_crc32c(raw[21:])


def test_golden_object_bytes() -> None:
    a, b = golden_batches()
    assert stream_id_for(TOPIC_ID, 0) == STREAM_A
    assert stream_id_for(TOPIC_ID, 1) == STREAM_B
    # Streams are laid out in id order whatever order the caller gives them in.
    encoded = encode_object({STREAM_B: [b], STREAM_A: [a]})
    golden = bytes.fromhex(GOLDEN_OBJECT)
    assert encoded.to_bytes() == golden
    assert encoded.size == len(golden) == 69 + 77 + 2 * INDEX_ENTRY_SIZE + FOOTER_SIZE == 266
    assert golden[-8:] == MAGIC


def test_golden_object_decodes() -> None:
    golden = bytes.fromhex(GOLDEN_OBJECT)
    index = decode_object(golden)
    assert (index.footer.index_position, index.footer.index_length) == (146, 72)
    assert index.entries == [
        IndexEntry(STREAM_A, 0, 1, 1, 0, 69),
        IndexEntry(STREAM_B, 10, 12, 2, 69, 77),
    ]
    assert index.stream_ids() == [STREAM_A, STREAM_B]
    first, second = (check_block(block_view(golden, e), e) for e in index.entries)
    assert [(x.base_offset, x.record_count, x.producer_id, x.base_sequence) for x in first] == [
        (0, 1, 1000, 0)
    ]
    assert [(x.base_offset, x.record_count, x.producer_id) for x in second] == [(10, 2, -1)]


def test_footer_and_index_parse_from_ranged_reads() -> None:
    """A reader fetches the last 48 bytes, then the index range, never the data."""
    golden = bytes.fromhex(GOLDEN_OBJECT)
    footer = parse_footer(golden[-FOOTER_SIZE:], len(golden))
    raw_index = golden[footer.index_position : footer.index_position + footer.index_length]
    entries = parse_index(raw_index, footer)
    assert ObjectIndex(footer, entries, len(golden)).find(STREAM_B, 11) == entries[1]
    # A guessed tail that covers index and footer works in one read.
    assert ObjectIndex.from_tail(golden[-130:], len(golden)).entries == entries


def test_stream_id_derivation_bounds() -> None:
    assert stream_id_for(b"\xff" * 16, 65535) == 2**64 - 1
    with pytest.raises(ValueError):
        stream_id_for(TOPIC_ID, 65536)
    with pytest.raises(ValueError):
        stream_id_for(b"short", 0)


# --- round trip and lookup ----------------------------------------------------------------


def test_round_trip_many_streams_and_blocks() -> None:
    streams = {
        sid: [batch(o * 3, n=3, size=200) for o in range(sid % 5, 40)] for sid in (7, 3, 2**63, 1)
    }
    encoded = encode_object(streams, block_size=2048)
    data = encoded.to_bytes()
    index = decode_object(data)
    assert index.entries == encoded.entries
    assert index.stream_ids() == sorted(streams)
    for sid, batches in streams.items():
        entries = index.entries_for(sid)
        assert len(entries) > 1
        got = b"".join(bytes(block_view(data, e)) for e in entries)
        assert got == b"".join(batches)
        assert sum(e.record_count for e in entries) == 3 * len(batches)
        assert entries[0].start_offset == (sid % 5) * 3
        assert entries[-1].end_offset == 120
        for e in entries:
            check_block(block_view(data, e), e)


def test_lookup_finds_the_block_holding_an_offset() -> None:
    # Stream 9: offsets 0..29 in 10-record batches, a gap, then 100..109; 1 batch per block.
    batches = [batch(0, 10), batch(10, 10), batch(20, 10), batch(100, 10)]
    data = encode_object({9: batches, 4: [batch(0, 1)], 12: [batch(5, 1)]}, block_size=1).to_bytes()
    index = decode_object(data)
    starts = {o: index.find(9, o) for o in (0, 9, 10, 29, 30, 99, 100, 109, 110)}
    assert {o: e.start_offset if e else None for o, e in starts.items()} == {
        0: 0,
        9: 0,
        10: 10,
        29: 20,
        30: 100,  # in the gap: the next block
        99: 100,
        100: 100,
        109: 100,
        110: None,  # past the stream's end: not the next stream's block
    }
    assert index.find(4, 0) is not None and index.find(4, 0).stream_id == 4  # type: ignore[union-attr]
    assert index.find(4, 1) is None
    assert index.find(5, 0) is None
    assert index.find(12, 0) == index.entries_for(12)[0]  # before the stream's start


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 2**64 - 1),
        st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4), st.integers(0, 300)), max_size=8),
        max_size=5,
    ),
    st.integers(70, 2000),
)
def test_round_trip_property(spec: dict[int, list[tuple[int, int, int]]], block_size: int) -> None:
    streams: dict[int, list[bytes]] = {}
    for sid, parts in spec.items():
        offset = 0
        out = []
        for gap, n, size in parts:
            offset += gap
            out.append(batch(offset, n, size))
            offset += n
        streams[sid] = out
    encoded = encode_object(streams, block_size)
    data = encoded.to_bytes()
    index = decode_object(data)
    assert index.entries == encoded.entries
    for sid, batches in streams.items():
        entries = index.entries_for(sid)
        assert b"".join(bytes(block_view(data, e)) for e in entries) == b"".join(batches)
        for e in entries:
            got = check_block(block_view(data, e), e)
            # Blocks stay within the target unless one batch alone exceeds it.
            assert e.size <= block_size or len(got) == 1
        for raw in batches:
            info = next(iter_batches(raw))
            found = index.find(sid, info.base_offset)
            assert found is not None and found.start_offset <= info.base_offset < found.end_offset


def test_several_batches_in_one_buffer_are_split_into_blocks() -> None:
    blob = batch(0, 2, 400) + batch(2, 2, 400) + batch(4, 2, 400)
    encoded = encode_object({1: [blob]}, block_size=1800)
    assert [(e.start_offset, e.end_offset) for e in encoded.entries] == [(0, 4), (4, 6)]


# --- block sizing -------------------------------------------------------------------------


def test_blocks_fill_to_about_one_mib() -> None:
    batches = [batch(i, 1, 100_000) for i in range(30)]
    size = len(batches[0])
    encoded = encode_object({1: batches})  # default target: 1 MiB
    sizes = [e.size for e in encoded.entries]
    assert all(s <= 1 << 20 for s in sizes)
    assert all(s > (1 << 20) - size for s in sizes[:-1])
    assert sizes == [10 * size, 10 * size, 10 * size]
    assert [e.record_count for e in encoded.entries] == [10, 10, 10]


def test_a_batch_larger_than_the_target_gets_its_own_block() -> None:
    small = [batch(0, 1, 1000), batch(1, 1, 1000)]
    big = batch(2, 1, 3 << 20)
    tail = [batch(3, 1, 1000)]
    encoded = encode_object({1: [*small, big, *tail]})
    assert [(e.start_offset, e.end_offset, e.size) for e in encoded.entries] == [
        (0, 2, len(small[0]) + len(small[1])),
        (2, 3, len(big)),
        (3, 4, len(tail[0])),
    ]
    data = encoded.to_bytes()
    assert check_block(block_view(data, encoded.entries[1]), encoded.entries[1])[0].size == len(big)


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        encode_object({1: [batch(5, 2), batch(6, 1)]})
    with pytest.raises(ValueError, match="claims"):
        encode_object({1: [batch(0)[:-1]]})
    with pytest.raises(ValueError, match="u64"):
        encode_object({2**64: [batch(0)]})
    with pytest.raises(ValueError, match="block size"):
        encode_object({1: [batch(0)]}, block_size=0)


def test_an_empty_object_is_just_a_footer() -> None:
    data = encode_object({}).to_bytes()
    assert len(data) == FOOTER_SIZE
    assert decode_object(data).entries == []


# --- corruption ---------------------------------------------------------------------------


def _golden() -> bytearray:
    return bytearray(bytes.fromhex(GOLDEN_OBJECT))


def _set(pos: int, fmt: str, value: int) -> Callable[[bytearray], bytearray]:
    def mutate(data: bytearray) -> bytearray:
        struct.pack_into(fmt, data, pos, value)
        return data

    return mutate


INDEX_AT = 146
FOOTER_AT = 266 - 48


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d[:-1] + b"2", "bad magic"),
        (lambda d: d[:-1], "bad magic"),  # truncated: the footer is misaligned
        (lambda d: d[1:], "does not end at the footer"),  # truncated at the front
        (lambda d: d[:20], "shorter than a footer"),
        (lambda d: bytearray(), "shorter than a footer"),
        (_set(FOOTER_AT, ">Q", 10_000), "does not end at the footer"),
        (_set(FOOTER_AT + 8, ">I", 71), "not a multiple of 36"),
        (_set(FOOTER_AT + 20, ">B", 1), "padding"),
        (_set(INDEX_AT + 24, ">Q", 1), "expected 0"),  # first block's position
        (_set(INDEX_AT + 32, ">I", 500), "contiguous|runs past"),  # first block's size
        (_set(INDEX_AT + 36 + 32, ">I", 1000), "runs past the index"),
        (_set(INDEX_AT + 36, ">Q", 1), "out of order"),  # second entry's stream id
        (_set(INDEX_AT + 16, ">I", 0), "empty offset range"),
        (_set(INDEX_AT + 8, ">q", -5), "out of range"),
    ],
)
def test_corrupt_footer_or_index_raises_corrupt_object(
    mutate: Callable[[bytearray], bytearray], reason: str
) -> None:
    data = bytes(mutate(_golden()))
    with pytest.raises(CorruptObject, match=reason):
        decode_object(data)


def test_overlapping_blocks_of_one_stream_are_corrupt() -> None:
    data = bytearray(encode_object({1: [batch(0, 5), batch(5, 5)]}, block_size=1).to_bytes())
    index_at = len(data) - FOOTER_SIZE - 2 * INDEX_ENTRY_SIZE
    struct.pack_into(">q", data, index_at + INDEX_ENTRY_SIZE + 8, 3)
    with pytest.raises(CorruptObject, match="overlaps"):
        decode_object(bytes(data))


def test_bad_crc_in_a_block() -> None:
    data = _golden()
    data[69 + 70] ^= 0x01  # a record byte of the second batch, covered by its CRC
    index = decode_object(bytes(data))  # footer and index are intact
    block = block_view(bytes(data), index.entries[1])
    assert [b.crc_ok for b in iter_block_batches(block)] == [False]
    with pytest.raises(CorruptObject, match="CRC"):
        check_block(block, index.entries[1])
    assert check_block(block_view(bytes(data), index.entries[0]), index.entries[0])


@pytest.mark.parametrize(
    ("pos", "fmt", "value", "reason"),
    [
        (8, ">i", 10, "below the v2 minimum"),
        (8, ">i", 500, "claims"),
        (16, ">b", 1, "magic"),
        (0, ">q", 7, "starts at offset 7"),
        (23, ">i", 5, "CRC"),  # lastOffsetDelta is CRC-covered
    ],
)
def test_block_framing_errors(pos: int, fmt: str, value: int, reason: str) -> None:
    data = _golden()
    struct.pack_into(fmt, data, pos, value)
    index = decode_object(bytes(data))
    with pytest.raises(CorruptObject, match=reason):
        check_block(block_view(bytes(data), index.entries[0]), index.entries[0])


def test_index_record_count_mismatch_is_caught_by_the_block_check() -> None:
    data = _golden()
    struct.pack_into(">I", data, INDEX_AT + 36 + 20, 3)
    index = decode_object(bytes(data))
    with pytest.raises(CorruptObject, match="3"):
        check_block(block_view(bytes(data), index.entries[1]), index.entries[1])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_byte_flip_or_cut_raises_only_corrupt_object(data: st.DataObject) -> None:
    obj = bytearray(
        encode_object({1: [batch(0, 2, 30), batch(2, 1, 5)], 9: [batch(4, 3, 7)]}, 120).to_bytes()
    )
    if data.draw(st.booleans()):
        pos = data.draw(st.integers(0, len(obj) - 1))
        obj[pos] ^= data.draw(st.integers(1, 255))
    else:
        cut = data.draw(st.integers(0, len(obj) - 1))
        obj = obj[:cut] if data.draw(st.booleans()) else obj[cut:]
    raw = bytes(obj)
    try:
        index = decode_object(raw)
        for entry in index.entries:
            check_block(block_view(raw, entry), entry)
    except CorruptObject:
        pass


# --- SO / SSO planning --------------------------------------------------------------------


def _ids() -> Callable[[], str]:
    counter = iter(range(1, 1000))
    return lambda: f"{next(counter):032x}"


def batch_of_size(offset: int, total: int) -> bytes:
    """A one-record batch of exactly ``total`` bytes (the record's varints grow with it)."""
    for value_size in range(total - 75, total - 60):
        raw = batch(offset, 1, value_size)
        if len(raw) == total:
            return raw
    raise AssertionError(f"no one-record batch of {total} bytes")


def test_plan_splits_at_the_8_mib_threshold() -> None:
    exact = 8 << 20
    # Stream 1 holds exactly 8 MiB in 16 batches of 512 KiB; stream 2 one byte less.
    at_split = [batch_of_size(i, 512 << 10) for i in range(16)]
    short = [*at_split[:15], batch_of_size(15, (512 << 10) - 1)]
    assert sum(len(b) for b in at_split) == exact
    assert sum(len(b) for b in short) == exact - 1
    streams = {1: at_split, 2: short, 3: [batch(0, 5)], 4: []}
    plan = plan_upload(streams, new_object_id=_ids())
    assert [o.kind for o in plan.stream_objects] == [ObjectKind.STREAM]
    so = plan.stream_objects[0]
    assert so.key == f"data/so/0000000000000001/{0:020d}-{16:020d}-{1:032x}"
    assert list(so.streams) == [1] and so.size == exact
    assert plan.stream_set is not None
    assert plan.stream_set.key == f"data/sso/{2:032x}"
    assert sorted(plan.stream_set.streams) == [2, 3]  # empty stream 4 is skipped
    assert [(r.stream_id, r.start_offset, r.end_offset) for r in plan.stream_set.ranges] == [
        (2, 0, 16),
        (3, 0, 5),
    ]
    assert plan.objects == [so, plan.stream_set]
    # The objects encode to the same bytes the streams hold.
    for obj in plan.objects:
        data = obj.encode().to_bytes()
        index = decode_object(data)
        for sid, batches in obj.streams.items():
            got = b"".join(bytes(block_view(data, e)) for e in index.entries_for(sid))
            assert got == b"".join(batches)
    assert DEFAULT_SPLIT_SIZE == exact


def test_plan_split_size_is_configurable() -> None:
    streams = {5: [batch(0, 2, 100), batch(2, 1, 100)], 6: [batch(0, 1)]}
    total = sum(len(b) for b in streams[5])
    plan = plan_upload(streams, split_size=total, new_object_id=_ids())
    assert [list(o.streams) for o in plan.stream_objects] == [[5]]
    plan = plan_upload(streams, split_size=total + 1, new_object_id=_ids())
    assert plan.stream_objects == []
    assert plan.stream_set is not None and sorted(plan.stream_set.streams) == [5, 6]
    assert plan.stream_set.ranges[0].end_offset == 3
    only_big = plan_upload({5: streams[5]}, split_size=1, new_object_id=_ids())
    assert only_big.stream_set is None and len(only_big.stream_objects) == 1
    assert plan_upload({}).objects == []


def test_object_keys_round_trip_and_reject_foreign_keys() -> None:
    key = so_key(2**64 - 1, 0, 10**19, "ab" * 16)
    assert key == f"data/so/ffffffffffffffff/{0:020d}-10000000000000000000-{'ab' * 16}"
    assert parse_object_key(key) == (ObjectKind.STREAM, 2**64 - 1, 0, 10**19, "ab" * 16)
    assert parse_object_key(sso_key("0" * 32)) == (
        ObjectKind.STREAM_SET,
        None,
        None,
        None,
        "0" * 32,
    )
    for foreign in ("cluster/metadata.json", "data/sso/xyz", "data/so/1/2-3-4"):
        with pytest.raises(ValueError):
            parse_object_key(foreign)
    with pytest.raises(ValueError):
        sso_key("not-hex")
    assert len(plan_upload({1: [batch(0)]}).objects[0].key) == len("data/sso/") + 32


def test_docs_worked_example_is_the_golden_object() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "formats.md").read_text()
    section = docs[docs.index("### Worked example (golden)") :]
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    hex_lines = [
        line.replace(" ", "")
        for line in block.splitlines()
        if line.startswith("  ") and re.fullmatch(r"[0-9a-f ]+", line.strip())
    ]
    assert "".join(hex_lines) == GOLDEN_OBJECT
