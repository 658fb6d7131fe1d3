"""The log cleaner's pure core (s3_commit/cleaner.py, s3_commit/offset_map.py): the offset
map, the choice of the cleanable section, and the rewriting of batches (issue 13)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_wire.compression import GZIP, SNAPPY, ZSTD
from kafka_wire.control_batch import build_marker
from kafka_wire.record_batch import (
    COMPRESSION_NONE,
    Buffer,
    assign_offsets,
    build_batch,
    decode_records_for_tools,
    iter_batches,
    parse_batch_header,
)
from s3_commit.cleaner import (
    DELETE_HORIZON_BIT,
    CleaningPolicy,
    StreamCleaner,
    build_offset_map,
    checkpoint_key,
    cleanable_section,
    decode_checkpoints,
    encode_checkpoints,
)
from s3_commit.manifest import ObjectRange, StreamKey, StreamManifest
from s3_commit.object_format import check_block, decode_object, encode_object
from s3_commit.offset_map import BYTES_PER_ENTRY, OffsetMap

NOW = 1_700_000_000_000
DAY = 86_400_000

Rec = tuple[bytes | None, bytes | None]


def batch(
    records: Sequence[Rec],
    base: int,
    ts: int = NOW - DAY,
    *,
    compression: int = COMPRESSION_NONE,
    pid: int = -1,
    transactional: bool = False,
) -> bytes:
    return build_batch(
        list(records),
        base_offset=base,
        timestamp_ms=ts,
        compression=compression,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
        transactional=transactional,
    )


def marker(commit: bool, pid: int, offset: int, ts: int = NOW - DAY) -> bytes:
    buf = bytearray(build_marker(commit, pid, 0, 0, ts))
    assign_offsets(memoryview(buf), parse_batch_header(buf), offset, 0)
    return bytes(buf)


def stream_of(updates: Sequence[Rec], per_batch: int, **kw: object) -> list[bytes]:
    out = []
    for i in range(0, len(updates), per_batch):
        out.append(batch(updates[i : i + per_batch], i, **kw))  # type: ignore[arg-type]
    return out


def records(buffers: Sequence[Buffer]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [r for b in buffers for r in decode_records_for_tools(b)]


def clean(
    buffers: list[bytes],
    *,
    budget: int = 1 << 16,
    now: int = NOW,
    retention: int = DAY,
    aborted: Sequence[tuple[int, int, int]] = (),
    first_dirty: int = 0,
) -> tuple[list[Buffer], StreamCleaner]:
    end = max(parse_batch_header(b).last_offset for b in buffers) + 1
    offset_map = OffsetMap(budget)
    result = build_offset_map(buffers, offset_map, first_dirty, end, aborted)
    cleaner = StreamCleaner(offset_map, result.end, now, retention, aborted)
    out, _ = cleaner.clean_range(buffers)
    return out, cleaner


# -- the offset map -----------------------------------------------------------------------------


def test_offset_map_keeps_the_latest_offset_within_its_capacity() -> None:
    m = OffsetMap(100 * BYTES_PER_ENTRY)
    assert m.capacity == 89 and m.nbytes == 99 * BYTES_PER_ENTRY
    for i in range(89):
        assert m.put(b"k%d" % i, i)
    assert m.full and not m.put(b"new", 1000)
    assert m.put(b"k3", 500)  # a known key still updates when full
    assert m.get(b"k3") == 500 and m.get(b"k4") == 4 and m.get(b"new") == -1
    assert len(m) == 89
    m.clear()
    assert len(m) == 0 and m.get(b"k3") == -1
    with pytest.raises(ValueError):
        OffsetMap(BYTES_PER_ENTRY)


# -- choosing the section -----------------------------------------------------------------------


def _ranges(*spec: tuple[int, int, int, int]) -> StreamManifest:
    return StreamManifest(
        "t",
        tuple(
            ObjectRange(a, b, f"data/sso/{i:032x}", 1000, ts, n)
            for i, (a, b, ts, n) in enumerate(spec)
        ),
    )


def test_section_ratio_lags_and_lso() -> None:
    stream = _ranges((0, 100, NOW - DAY, 1000), (100, 200, NOW - 1000, 1000))
    policy = CleaningPolicy()
    never = cleanable_section(stream, 0, 200, NOW, policy)
    assert never.dirty_ratio == 1.0 and never.end == 200 and never.due(policy)
    half = cleanable_section(stream, 100, 200, NOW, policy)
    assert half.clean_bytes == 1000 and half.dirty_bytes == 1000 and half.due(policy)
    assert not cleanable_section(stream, 150, 200, NOW, policy).due(policy)  # 500 / 2000
    # The last stable offset bounds the end, pro rata bytes.
    lso = cleanable_section(stream, 100, 150, NOW, policy)
    assert lso.end == 150 and lso.dirty_bytes == 500
    # min.compaction.lag.ms: the second range holds a record younger than 10 s.
    lag = CleaningPolicy(min_compaction_lag_ms=10_000)
    young = cleanable_section(stream, 100, 200, NOW, lag)
    assert young.end == 100 and not young.due(lag)
    assert [r.start for r in young.ranges] == [0]
    # max.compaction.lag.ms forces a cleaning whatever the ratio.
    strict = CleaningPolicy(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=60_000)
    forced = cleanable_section(stream, 0, 200, NOW, strict)
    assert forced.forced and forced.due(strict)
    late = cleanable_section(stream, 100, 200, NOW, strict)
    assert not late.forced and not late.due(strict)  # the first dirty range is 1 s old


# -- cleaning -----------------------------------------------------------------------------------


def test_latest_value_per_key_survives_with_original_offsets() -> None:
    updates: list[Rec] = [(b"k%d" % (i % 10), b"v%d" % i) for i in range(200)]
    buffers = stream_of(updates, 7)
    out, cleaner = clean(buffers)
    got = records(out)
    assert [(o, k, v) for o, _, k, v in got] == [
        (i, b"k%d" % (i % 10), b"v%d" % i) for i in range(190, 200)
    ]
    # The range's first and last offsets stay (an empty batch at the start).
    infos = [i for b in out for i in iter_batches(b)]
    assert infos[0].base_offset == 0 and infos[0].record_count == 0
    assert infos[-1].last_offset == 199
    assert cleaner.stats.records_removed == 190
    # What the cleaning wrote is a valid object (index, CRCs, counts).
    obj = encode_object({7: out}).to_bytes()
    index = decode_object(obj)
    for entry in index.entries:
        check_block(memoryview(obj)[entry.position : entry.position + entry.size], entry)


def test_partially_cleaned_batches_keep_base_and_last_offsets() -> None:
    buffers = [
        batch([(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], 0),
        batch([(b"a", b"2"), (b"x", b"2")], 3),
    ]
    out, _ = clean(buffers)
    first = parse_batch_header(out[0])
    assert (first.base_offset, first.last_offset_delta, first.record_count) == (0, 2, 2)
    assert [(o, k) for o, _, k, _ in records(out)] == [(1, b"b"), (2, b"c"), (3, b"a"), (4, b"x")]


@pytest.mark.parametrize("codec", [GZIP, ZSTD])
def test_compressed_batches_are_rewritten_with_their_codec(codec: int) -> None:
    updates: list[Rec] = [(b"k%d" % (i % 3), b"v%d" % i) for i in range(30)]
    out, _ = clean(stream_of(updates, 4, compression=codec))
    rewritten = [i for b in out for i in iter_batches(b) if i.record_count]
    assert all(i.compression == codec for i in rewritten)
    assert [v for _, _, _, v in records(out)] == [b"v27", b"v28", b"v29"]


def test_tombstones_get_a_delete_horizon_then_go() -> None:
    buffers = [
        batch([(b"a", b"1"), (b"b", b"1")], 0, ts=NOW - 5000),
        batch([(b"a", None), (b"c", b"1")], 2, ts=NOW - 4000),
    ]
    out, cleaner = clean(buffers, now=NOW, retention=60_000)
    got = records(out)
    assert [(o, k, v) for o, _, k, v in got] == [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1")]
    # The batch keeping the tombstone carries the horizon; its records keep their timestamps.
    info = parse_batch_header(out[-1])
    assert info.attributes & DELETE_HORIZON_BIT and info.base_timestamp == NOW + 60_000
    assert [t for _, t, _, _ in got[1:]] == [NOW - 4000, NOW - 4000]
    assert cleaner.stats.horizons_set == 1
    as_bytes = [bytes(b) for b in out]
    # Before the horizon the tombstone stays, the batch is not rewritten again.
    again, c2 = clean(as_bytes, now=NOW + 59_000, retention=60_000)
    assert (2, b"a", None) in [(o, k, v) for o, _, k, v in records(again)]
    assert c2.stats.horizons_set == 0
    # After it, the tombstone goes; the offsets still end where they did.
    later, c3 = clean(as_bytes, now=NOW + 60_000, retention=60_000)
    assert [(o, k) for o, _, k, _ in records(later)] == [(1, b"b"), (3, b"c")]
    assert c3.stats.tombstones_removed == 1
    assert parse_batch_header(later[-1]).last_offset == 3


def test_aborted_records_go_and_markers_follow_kafkas_rule() -> None:
    pid = 7
    buffers = [
        batch([(b"a", b"committed")], 0),
        batch([(b"a", b"aborted"), (b"b", b"aborted")], 1, pid=pid, transactional=True),
        marker(False, pid, 3),
        batch([(b"c", b"txn")], 4, pid=8, transactional=True),
        marker(True, 8, 5),
        batch([(b"z", b"1")], 6),
    ]
    aborted = [(pid, 1, 3)]
    out, cleaner = clean(buffers, aborted=aborted)
    kept = [(o, k, v) for o, _, k, v in records(out)]
    # The aborted records go; the committed value of "a" is the latest that counts.
    assert (0, b"a", b"committed") in kept and all(v != b"aborted" for _, _, v in kept)
    assert cleaner.stats.aborted_batches_removed == 1
    # Both markers stay this time: the ABORT one saw its batches, the COMMIT one has "c".
    infos = [i for b in out for i in iter_batches(b)]
    assert [i.base_offset for i in infos if i.is_control] == [3, 5]
    # Next pass: the ABORT marker's transaction is empty: it gets a horizon, then goes.
    second, _ = clean([bytes(b) for b in out], aborted=aborted, retention=1000)
    markers = [i for b in second for i in iter_batches(b) if i.is_control]
    abort = next(i for i in markers if i.base_offset == 3)
    assert abort.attributes & DELETE_HORIZON_BIT
    third, _ = clean([bytes(b) for b in second], aborted=aborted, now=NOW + 1000)
    assert [i.base_offset for b in third for i in iter_batches(b) if i.is_control] == [5]


def test_map_overflow_stops_the_section_and_leaves_the_rest_untouched() -> None:
    updates: list[Rec] = [(b"k%d" % i, b"v") for i in range(100)]
    buffers = stream_of(updates * 2, 10)
    offset_map = OffsetMap(41 * BYTES_PER_ENTRY)  # room for 36 keys
    result = build_offset_map(buffers, offset_map, 0, 200)
    assert result.full and result.end == 30
    cleaner = StreamCleaner(offset_map, result.end, NOW, DAY)
    out, changed = cleaner.clean_range(buffers)
    assert not changed  # every key below 30 is still the latest the map knows
    assert [bytes(b) for b in out] == buffers
    # A later dirty section shadows earlier records; above the end nothing changes.
    offset_map.clear()
    result = build_offset_map(buffers, offset_map, 100, 200)
    assert result.end == 130
    cleaner = StreamCleaner(offset_map, result.end, NOW, DAY)
    out, changed = cleaner.clean_range(buffers)
    got = records(out)
    # Keys 30..35 went into the map from the batch that filled it: their records below are
    # superseded by ones that stay.
    assert changed and [o for o, *_ in got if o < 100] == list(range(36, 100))
    assert [bytes(b) for b in out if parse_batch_header(b).base_offset >= 130] == buffers[13:]


# -- properties ---------------------------------------------------------------------------------

_updates = st.lists(
    st.tuples(st.integers(0, 12), st.one_of(st.none(), st.binary(min_size=0, max_size=6))),
    min_size=1,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    updates=_updates,
    per_batch=st.integers(1, 9),
    slots=st.integers(3, 30),
    first_dirty=st.integers(0, 60),
    expired=st.booleans(),
)
def test_cleaning_properties(
    updates: list[tuple[int, bytes | None]],
    per_batch: int,
    slots: int,
    first_dirty: int,
    expired: bool,
) -> None:
    recs: list[Rec] = [(b"key-%d" % k, v) for k, v in updates]
    buffers = stream_of(recs, per_batch)
    n = len(recs)
    first_dirty = min(first_dirty, n - 1)
    # Clean once (tombstones get their horizon), then maybe once more after it passed.
    offset_map = OffsetMap(slots * BYTES_PER_ENTRY)
    result = build_offset_map(buffers, offset_map, first_dirty, n)
    end = result.end
    cleaner = StreamCleaner(offset_map, end, NOW, 1000)
    out, _ = cleaner.clean_range(buffers)
    if expired:
        cleaner = StreamCleaner(offset_map, end, NOW + 1000, 1000)
        out, _ = cleaner.clean_range([bytes(b) for b in out])
    before = {o: (k, v) for o, _, k, v in records(buffers)}
    after = records(out)
    offsets = [o for o, *_ in after]
    # Offsets strictly increase and each record is the one that had that offset.
    assert offsets == sorted(set(offsets))
    assert all(before[o] == (k, v) for o, _, k, v in after)
    # Nothing at or above the end is touched.
    assert [o for o in offsets if o >= end] == list(range(max(end, 0), n))
    # The range still starts and ends where it did.
    infos = [i for b in out for i in iter_batches(b)]
    assert infos[0].base_offset == 0 and infos[-1].last_offset == n - 1
    # For each key the latest record survives (a tombstone: unless its horizon passed), and
    # in the dirty section each key has at most one record.
    latest: dict[bytes, int] = {}
    for o, (k, _) in before.items():
        assert k is not None
        latest[k] = o
    kept = set(offsets)
    for k, o in latest.items():
        tombstone = before[o][1] is None
        if o >= end or not (tombstone and expired):
            assert o in kept, (k, o)
    if not result.full:
        dirty_keys = [before[o][0] for o in offsets if first_dirty <= o < end]
        assert len(dirty_keys) == len(set(dirty_keys))
        # ... and below the end too: the map saw every key of the dirty section.
        for o in offsets:
            if o < end:
                k = before[o][0]
                assert k is not None and (
                    latest[k] == o or latest[k] < first_dirty or o < first_dirty
                )


# -- golden: what a cleaning writes (docs/formats.md, "Log compaction") ----------------------------

GOLDEN_EMPTY_EDGE = bytes.fromhex(
    "000000000000006400000031ffffffff02525a8db70000000000010000018bcfe568000000018bcfe568"
    "00ffffffffffffffffffffffffffff00000000"
)
GOLDEN_HORIZON = bytes.fromhex(
    "000000000000006600000046ffffffff02af8d6a160040000000010000018bcfe656480000018bcfe568"
    "05ffffffffffffffffffffffffffff00000002120085b9070002610100140085b907020262023300"
)


def test_golden_cleaned_batches() -> None:
    first = build_batch([(b"a", b"1"), (b"b", b"2")], base_offset=100, timestamp_ms=NOW)
    second = build_batch([(b"a", None), (b"b", b"3")], base_offset=102, timestamp_ms=NOW + 5)
    offset_map = OffsetMap(1 << 12)
    assert offset_map.put_all([b"a", b"b"], [102, 103]) == 2
    cleaner = StreamCleaner(offset_map, 104, NOW + 1000, 60_000)
    out, changed = cleaner.clean_range([first, second])
    assert changed and [bytes(b) for b in out] == [GOLDEN_EMPTY_EDGE, GOLDEN_HORIZON]
    horizon = parse_batch_header(GOLDEN_HORIZON)
    assert horizon.attributes == DELETE_HORIZON_BIT and horizon.base_timestamp == NOW + 61_000
    assert decode_records_for_tools(GOLDEN_HORIZON) == [
        (102, NOW + 5, b"a", None),
        (103, NOW + 5, b"b", b"3"),
    ]
    edge = parse_batch_header(GOLDEN_EMPTY_EDGE)
    assert (edge.base_offset, edge.last_offset, edge.record_count) == (100, 101, 0)


GOLDEN_CHECKPOINTS = (
    b'{"format":1,"node_id":3,"first_dirty":['
    b'["000102030405060708090a0b0c0d0e0f",0,1200],["000102030405060708090a0b0c0d0e0f",1,0]]}'
)


def test_golden_checkpoints() -> None:
    topic_id = bytes(range(16))
    checkpoints = {StreamKey(topic_id, 1): 0, StreamKey(topic_id, 0): 1200}
    assert encode_checkpoints(3, checkpoints) == GOLDEN_CHECKPOINTS
    assert decode_checkpoints(GOLDEN_CHECKPOINTS) == checkpoints
    assert checkpoint_key(3) == "cleaner/3.json"
    for bad in (
        b"[]",
        b'{"format":2,"first_dirty":[]}',
        b'{"format":1,"first_dirty":[["00",0,1]]}',
        b'{"format":1,"first_dirty":[["000102030405060708090a0b0c0d0e0f",0,-1]]}',
        b"not json",
    ):
        with pytest.raises(ValueError):
            decode_checkpoints(bad)


def test_snappy_batches_keep_their_framing() -> None:
    """A Java producer's xerial-framed snappy stays xerial-framed, librdkafka's raw stays raw."""
    raw = batch([(b"a", b"1"), (b"b", b"2"), (b"a", b"3")], 0, compression=SNAPPY)
    block = raw[61:]
    framed_body = (
        b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") * 2 + len(block).to_bytes(4, "big") + block
    )
    header = bytearray(raw[:61])
    header[8:12] = (49 + len(framed_body)).to_bytes(4, "big")
    header[17:21] = crc32c(framed_body, crc32c(bytes(header[21:]))).to_bytes(4, "big")
    framed = bytes(header) + framed_body
    assert decode_records_for_tools(framed) == decode_records_for_tools(raw)
    for source, xerial in ((raw, False), (framed, True)):
        out, _ = clean([source])
        body = bytes(out[0])[61:]
        assert body.startswith(b"\x82SNAPPY\x00") == xerial
        assert [(o, k, v) for o, _, k, v in records(out)] == [(1, b"b", b"2"), (2, b"a", b"3")]
