"""Topic changes below the APIs: the WAL records of config changes, added partitions and
DeleteRecords (golden bytes, replay, snapshots), the partition log's DeleteRecords floor, the
manifest's log start for DeleteRecords, keyless-record detection in every codec, and the
confirm result's record errors."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import trio
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode

from internal_rpc.messages import PartitionOutcome
from kafka_wire.codec import (
    build_request,
    build_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    parse_request_header,
)
from kafka_wire.compression import (
    GZIP,
    LZ4,
    MAX_DECOMPRESSED_BYTES,
    SNAPPY,
    ZSTD,
    DecompressedTooLarge,
    DecompressionError,
    compress,
    decompress,
)
from kafka_wire.hot_codecs import ProducePartitionResult
from kafka_wire.record_batch import (
    InvalidBatch,
    build_batch,
    decode_records_for_tools,
    null_key_indexes,
    parse_batch_header,
)
from main_broker.objects.retention_policy import apply_log_starts, pending_log_starts
from main_broker.partition_log import PartitionLog
from main_broker.topic_config import EffectiveTopicConfig
from proxy_broker.relay_plan import plan_relay
from s3_commit.manifest import Manifest, ObjectRange, StreamKey, StreamManifest
from shared_wal import WalConfig, WalPosition
from shared_wal import broker_records as wal_records
from tests.test_log_store import _open, _produce

NOW = 1_800_000_000_000
T1 = bytes(range(16))
CODECS = [0, GZIP, SNAPPY, LZ4, ZSTD]


# -- WAL records -------------------------------------------------------------------------------


def test_golden_topic_change_headers() -> None:
    """The exact msgpack bytes of the CONTROL records (docs/formats.md)."""
    configs = wal_records.topic_configs_header("t", {"retention.ms": "1"})
    assert msgpack.packb(configs, use_bin_type=True).hex() == (
        "83a16bad746f7069635f636f6e6669677" + "3a16ea174a16381ac726574656e74696f6e2e6d73a131"
    )
    parts = wal_records.topic_partitions_header("t", 4)
    assert msgpack.packb(parts, use_bin_type=True).hex() == (
        "83a16bb0746f7069635f706172746974696f6e73a16ea174a26e7004"
    )
    start = wal_records.log_start_header("t", 1, 300)
    assert msgpack.packb(start, use_bin_type=True).hex() == (
        "84a16ba96c6f675f7374617274a174a174a17001a16fcd012c"
    )


async def test_configs_partitions_and_log_start_replay(tmp_path: Path) -> None:
    """A lone main's topic changes come back from its WAL, through snapshots too."""
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=4096)  # rolls, each segment starting with a SNAPSHOT
    store, wal = await _open(url, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        await store.create_topic("t", 1, {})
        for i in range(10):
            await _produce(store, "t", 0, [f"v{i}".encode() * 40] * 3)
        await store.alter_topic_configs("t", {"cleanup.policy": "compact", "retention.ms": "9"})
        assert store.topics["t"].partitions[0].config.compacted
        await store.add_partitions("t", 3)
        await _produce(store, "t", 2, [b"new"])
        plog = store.partition("t", 0)
        assert plog is not None
        assert await store.delete_records(plog, 13) == 13
        assert await store.delete_records(plog, 5) == 13  # never backwards
        for i in range(20):  # more segments: the changes live on in snapshots
            await _produce(store, "t", 1, [f"w{i}".encode() * 40] * 3)
        await wal.aclose()
        nursery.cancel_scope.cancel()
    assert len(wal.segments()) >= 3
    store2, wal2 = await _open(url, config)
    topic = store2.topics["t"]
    assert topic.configs == {"cleanup.policy": "compact", "retention.ms": "9"}
    assert all(p.config.compacted and p.config.retention_ms == 9 for p in topic.partitions)
    assert len(topic.partitions) == 3
    assert topic.partitions[2].high_watermark == 1
    p0 = topic.partitions[0]
    assert (p0.log_start_offset, p0.high_watermark) == (13, 30)
    assert p0.fetch_slice(12, 1 << 20, 30, True).error == ErrorCode.offset_out_of_range
    assert p0.fetch_slice(13, 1 << 20, 30, True).error == ErrorCode.none
    await wal2.aclose()


# -- the partition log -------------------------------------------------------------------------


def _plog(batches: int, per_batch: int = 10) -> PartitionLog:
    plog = PartitionLog("t", 0, T1, EffectiveTopicConfig.from_explicit({}, {}))
    for i in range(batches):
        buf = bytearray(build_batch([(b"k", b"x" * 50)] * per_batch, timestamp_ms=1000 + i))
        entry = plog.append(memoryview(buf), parse_batch_header(buf), 0)
        plog.mark_durable(entry, WalPosition("main-1", 0, 1000 * i, 500))
    return plog


def test_delete_records_floor_holds_against_objects_and_segments() -> None:
    plog = _plog(6)  # offsets 0..59
    assert plog.delete_records(25)
    assert not plog.delete_records(25) and not plog.delete_records(3)
    assert plog.log_start_offset == 25
    # Objects that start lower do not bring the deleted offsets back.
    stream = StreamManifest("t", (ObjectRange(0, 40, "k", 100, 1003, 100),))
    plog.adopt_objects(stream)
    assert plog.log_start_offset == 25
    assert plog.fetch_slice(24, 1 << 20, 60, True).error == ErrorCode.offset_out_of_range
    # The batch holding the log start is served whole (the client skips below its offset).
    assert plog.fetch_slice(25, 1 << 20, 60, True).error == ErrorCode.none
    # A timestamp search never answers below the log start.
    entry = plog.first_batch_at_timestamp(0)
    assert entry is not None and entry.last_offset >= 25
    assert plog.max_timestamp_entry() is not None
    # The newest timestamp below the start does not count (ListOffsets max-timestamp).
    early = PartitionLog("t", 0, T1, EffectiveTopicConfig.from_explicit({}, {}))
    for i, ts in enumerate((5000, 1000, 2000)):
        buf = bytearray(build_batch([(b"k", b"x")] * 10, timestamp_ms=ts))
        entry = early.append(memoryview(buf), parse_batch_header(buf), 0)
        early.mark_durable(entry, WalPosition("main-1", 0, 100 * i, 100))
    first = early.max_timestamp_entry()
    assert first is not None and first.base_offset == 0
    early.delete_records(12)
    newest = early.max_timestamp_entry()
    assert newest is not None and newest.base_offset == 20
    # Past the log end: clamped to it.
    assert plog.delete_records(1000) and plog.log_start_offset == 60


def test_manifest_log_start_for_delete_records_never_passes_the_objects() -> None:
    key = StreamKey(T1, 0)
    other = StreamKey(T1, 1)
    manifest = Manifest(
        1,
        streams={
            key: StreamManifest(
                "t", (ObjectRange(0, 10, "a", 100, 5, 50), ObjectRange(10, 20, "b", 100, 6, 50))
            )
        },
    )
    moved = apply_log_starts(manifest, {key: 12, other: 5})
    stream = moved.streams[key]
    assert stream.log_start == 12 and [r.key for r in stream.ranges] == ["b"]
    assert pending_log_starts(moved, {key: 12, other: 5}, {T1}) == {other: 5}
    assert pending_log_starts(moved, {key: 12, other: 5}, set()) == {}  # topic gone
    further = apply_log_starts(moved, {key: 50})
    assert further.streams[key].log_start == 20 and not further.streams[key].ranges
    assert pending_log_starts(further, {key: 50}, {T1}) == {key: 50}  # the rest waits
    assert apply_log_starts(further, {key: 5}) is further


# -- keyless records ---------------------------------------------------------------------------


def _kafka_python_batch(codec: int, keys: list[bytes | None]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, key in enumerate(keys):
        builder.append(i, timestamp=NOW, key=key, value=b"v" * 100, headers=[])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", CODECS, ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_null_keys_found_in_every_codec(codec: int) -> None:
    keys: list[bytes | None] = [b"a", None, b"", None, b"e"]
    # kafka-python frames snappy as Java does (xerial); build_batch writes raw snappy blocks.
    theirs = _kafka_python_batch(codec, keys)
    assert DefaultRecordBatch(bytearray(theirs)).compression_type == codec
    ours = build_batch(
        list(zip(keys, [b"v"] * 5, strict=True)), timestamp_ms=NOW, compression=codec
    )
    for buf in (theirs, ours):
        assert null_key_indexes(buf, parse_batch_header(buf)) == [1, 3]
        assert [k for _, _, k, _ in decode_records_for_tools(buf)] == keys
    keyed = build_batch([(b"k", b"v")] * 3, timestamp_ms=NOW, compression=codec)
    assert null_key_indexes(keyed, parse_batch_header(keyed)) == []


def test_undecompressable_or_overrunning_records_are_corrupt() -> None:
    good = bytearray(build_batch([(None, b"v")], timestamp_ms=NOW, compression=LZ4))
    good[-5:] = b"\x00" * 5
    with pytest.raises(InvalidBatch) as info:
        null_key_indexes(good, parse_batch_header(good))
    assert info.value.error_code == ErrorCode.corrupt_message
    plain = bytearray(build_batch([(None, b"v")], timestamp_ms=NOW))
    plain[61] = 0x7E  # a record length far past the batch
    with pytest.raises(InvalidBatch):
        null_key_indexes(plain, parse_batch_header(plain))


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_compression_round_trip(codec: int) -> None:
    data = b"zonefleet " * 1000
    assert decompress(codec, compress(codec, data)) == data
    # Past the first output buffer (8x the compressed size): grown until it fits.
    zeros = bytes(3 << 20)
    assert decompress(codec, compress(codec, zeros)) == zeros


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_decompression_bomb_is_refused_before_it_inflates(codec: int) -> None:
    bomb = compress(codec, bytes(8 << 20))
    assert decompress(codec, bomb, limit=8 << 20) == bytes(8 << 20)
    with pytest.raises(DecompressedTooLarge):
        decompress(codec, bomb, limit=(8 << 20) - 1)
    with pytest.raises(DecompressionError) as info:
        decompress(codec, bomb[: len(bomb) // 2], limit=8 << 20)
    assert not isinstance(info.value, DecompressedTooLarge)
    # A keyless record whose value inflates past the limit: MESSAGE_TOO_LARGE, not a corrupt
    # batch (a producer retries CORRUPT_MESSAGE).
    huge = build_batch([(None, bytes(MAX_DECOMPRESSED_BYTES))], timestamp_ms=NOW, compression=codec)
    assert len(huge) < MAX_DECOMPRESSED_BYTES // 20
    with pytest.raises(InvalidBatch) as refused:
        null_key_indexes(huge, parse_batch_header(huge))
    assert refused.value.error_code == ErrorCode.message_too_large


# -- the confirm result ------------------------------------------------------------------------


def test_golden_confirm_row_with_record_errors() -> None:
    plain = ProducePartitionResult(index=0, error_code=0, base_offset=5, log_start_offset=0)
    wire = PartitionOutcome.of(plain).to_wire()
    assert msgpack.packb(wire, use_bin_type=True).hex() == "950005ff00c0"
    refused = ProducePartitionResult(
        index=0,
        error_code=ErrorCode.invalid_record,
        error_message="m",
        record_errors=[(1, "k"), (3, "k")],
    )
    row = PartitionOutcome.of(refused).to_wire()
    assert row == [87, -1, -1, -1, "m", [[1, "k"], [3, "k"]]]
    assert msgpack.packb(row, use_bin_type=True).hex() == "9657ffffffa16d929201a16b9203a16b"


# -- a proxy's relay of DeleteRecords ------------------------------------------------------------


def test_delete_records_is_split_by_leader_and_merged() -> None:
    def frame(data: dict[str, object]) -> bytes:
        return encode_request(21, 2, 7, "c", build_request(21, 2, data))

    leaders = {("t", 0): 1, ("t", 1): 2, ("u", 0): 2}
    parts = [{"partition_index": p, "offset": 10 + p} for p in (0, 1)]
    request = frame(
        {
            "topics": [
                {"name": "t", "partitions": parts},
                {"name": "u", "partitions": [{"partition_index": 0, "offset": -1}]},
            ],
            "timeout": 30000,
        }
    )
    header = parse_request_header(request)
    plan = plan_relay(header, request, [1, 2, 3], 3, lambda t, p: leaders.get((t, p)))
    asked = {}
    for main, sub in plan.calls:
        decoded = decode_request(parse_request_header(sub), bytearray(sub))
        asked[main] = {
            (t.name, p.partition_index, p.offset) for t in decoded.topics for p in t.partitions
        }
    assert asked == {1: {("t", 0, 10)}, 2: {("t", 1, 11), ("u", 0, -1)}}
    assert plan.merge is not None
    answers = []
    for main in sorted(asked):
        topics: dict[str, list[dict[str, object]]] = {}
        for name, index, offset in sorted(asked[main]):
            part = {"partition_index": index, "low_watermark": max(offset, 0), "error_code": 0}
            topics.setdefault(name, []).append(part)
        data = {"topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
        answers.append(encode_response(header, build_response(21, 2, data)))
    _, merged = decode_response(21, 2, plan.merge(answers))
    got = {
        (t.name, p.partition_index): p.low_watermark for t in merged.topics for p in t.partitions
    }
    assert got == {("t", 0): 10, ("t", 1): 11, ("u", 0): 0}
