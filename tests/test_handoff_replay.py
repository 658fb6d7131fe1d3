"""A reassignment's takeover on the target's log store, without a fleet: the source's WAL
records of the partition (TailCollector) become the target's `takeover` record and DATA
records (LogStore.take_over), and a restart of the target replays them to the same log:
offsets, payloads, producer state (a retried batch is a duplicate), epoch and log start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from kafka_wire.record_batch import build_batch
from main_broker.cluster.handoff import _scan_start, _TailRequest
from main_broker.cluster.reassignment import Move, TailCollector, takeover_header
from main_broker.partition_log import PartitionLog
from main_broker.producer_state import Verdict
from main_broker.topic_config import EffectiveTopicConfig
from s3_commit.manifest import ObjectRange, StreamManifest
from shared_wal import WalConfig, WalPosition, WalReader, open_wal_fs, storage
from shared_wal.batch_index import ObjectSpan
from tests.test_log_store import _open, _produce, _values

TOPIC_ID = bytes(range(16))


async def test_takeover_rebuilds_the_partition_and_survives_a_restart(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=2048)  # several segments, the oldest with a SNAPSHOT
    src, src_wal = await _open(url, config, writer="main-1")
    async with trio.open_nursery() as nursery:
        await nursery.start(src_wal.run)
        await src.create_topic("t", 2, {}, TOPIC_ID)
        for i in range(12):
            await _produce(src, "t", 0, [f"v{i}-{j}".encode() * 8 for j in range(3)], 7, i * 3)
            await _produce(src, "t", 1, [b"other"])
        await src_wal.aclose()
        nursery.cancel_scope.cancel()
    source_values = await _values(src, "t", 0)

    # The objects would hold offsets [0, 6): the target takes the rest from the WAL.
    collector = TailCollector("t", 0, TOPIC_ID, 6)
    reader = WalReader(open_wal_fs(url), "main-1")
    for record in reader.iter_records(reader.segments()[0]):
        collector.add(int(record.type), record.header, record.payload)
    tail = collector.result()
    assert (tail.start, tail.end, tail.gap) == (6, 36, None)
    header = takeover_header(Move("t", 0, 1, 2, 1), tail)
    batches = [(b.data_header(), bytes(b.payload or b"")) for b in tail.batches]

    dst, dst_wal = await _open(url, config, writer="main-2")
    async with trio.open_nursery() as nursery:
        await nursery.start(dst_wal.run)
        await dst.create_topic("t", 2, {}, TOPIC_ID, [1, 1])  # led by main 1 so far
        plog = await dst.take_over(header, batches)
        await dst_wal.aclose()
        nursery.cancel_scope.cancel()

    reopened, reopened_wal = await _open(url, config, writer="main-2")
    try:
        for store in (dst, reopened):
            plog = store.partition("t", 0)
            assert plog is not None
            assert (plog.log_start_offset, plog.next_offset, plog.high_watermark) == (6, 36, 36)
            assert plog.leader_epoch == 1
            # Offsets 6.. hold exactly the source's batches.
            assert await _values(store, "t", 0) == source_values[6:]
            # The producer's last batch is remembered: its retry is a duplicate.
            assert plog.producers.check(7, 0, 33, 35).verdict is Verdict.DUPLICATE
            assert plog.producers.check(7, 0, 36, 38).verdict is Verdict.APPEND
            assert plog.producers.check(7, 0, 40, 42).verdict is Verdict.REJECT
            other = store.partition("t", 1)
            assert other is not None and other.next_offset == 0  # only partition 0 moved
    finally:
        await reopened_wal.aclose()


async def test_a_takeover_split_over_segments_survives_their_trim(tmp_path: Path) -> None:
    """The takeover record and the batches after it span segment rolls: each SNAPSHOT opening
    a segment holds what is durable before it, so trimming every older segment (as uploads
    let the WAL do) loses neither the epoch, the producer state nor the offsets."""
    url = f"osfs://{tmp_path}"
    src, src_wal = await _open(url, WalConfig(segment_bytes=1 << 20), writer="main-1")
    async with trio.open_nursery() as nursery:
        await nursery.start(src_wal.run)
        await src.create_topic("t", 1, {}, TOPIC_ID)
        for i in range(12):
            await _produce(src, "t", 0, [f"v{i}-{j}".encode() * 20 for j in range(3)], 7, i * 3)
        await src_wal.aclose()
        nursery.cancel_scope.cancel()
    collector = TailCollector("t", 0, TOPIC_ID, 0)
    reader = WalReader(open_wal_fs(url), "main-1")
    for record in reader.iter_records(reader.segments()[0]):
        collector.add(int(record.type), record.header, record.payload)
    tail = collector.result()
    header = takeover_header(Move("t", 0, 1, 2, 1), tail)
    batches = [(b.data_header(), bytes(b.payload or b"")) for b in tail.batches]

    config = WalConfig(segment_bytes=1024, max_group_bytes=512)  # a roll every few batches
    dst, dst_wal = await _open(url, config, writer="main-2")
    async with trio.open_nursery() as nursery:
        await nursery.start(dst_wal.run)
        await dst.create_topic("t", 1, {}, TOPIC_ID, [1])
        await dst.take_over(header, batches)
        await dst_wal.aclose()
        nursery.cancel_scope.cancel()
    fs = open_wal_fs(url)
    segments = storage.list_segment_ids(fs, "main-2")
    assert len(segments) > 3, "the takeover must span several segments"
    for segment in segments[:-1]:
        fs.remove(storage.segment_path("main-2", segment))

    reopened, reopened_wal = await _open(url, config, writer="main-2")
    try:
        plog = reopened.partition("t", 0)
        assert plog is not None
        assert (plog.next_offset, plog.high_watermark, plog.leader_epoch) == (36, 36, 1)
        assert plog.producers.check(7, 0, 33, 35).verdict is Verdict.DUPLICATE
        assert plog.producers.check(7, 0, 36, 38).verdict is Verdict.APPEND
    finally:
        await reopened_wal.aclose()


async def test_a_takeover_scan_starts_at_the_newest_snapshot_below_its_start(
    tmp_path: Path,
) -> None:
    """A dead main's WAL may hold minutes of data: the scan starts at the newest segment whose
    head SNAPSHOT is below every start (reassignment.snapshot_starts_tails), and collects the
    same tail, producer state included, as a scan of the whole WAL."""
    url = f"osfs://{tmp_path}"
    src, src_wal = await _open(url, WalConfig(segment_bytes=2048), writer="main-1")
    async with trio.open_nursery() as nursery:
        await nursery.start(src_wal.run)
        await src.create_topic("t", 2, {}, TOPIC_ID)
        for i in range(30):
            await _produce(src, "t", 0, [f"v{i}-{j}".encode() * 8 for j in range(3)], 7, i * 3)
            await _produce(src, "t", 1, [b"other"])
        await src_wal.aclose()
        nursery.cancel_scope.cancel()
    reader = WalReader(open_wal_fs(url), "main-1")
    segments = reader.segments()
    assert len(segments) > 4

    def tail_from(first: int, start: int) -> Any:
        collector = TailCollector("t", 0, TOPIC_ID, start)
        for record in reader.iter_records(first):
            collector.add(int(record.type), record.header, record.payload)
        return collector.result()

    move = Move("t", 0, 1, 2, 1)
    for start in (0, 45, 81):
        first = _scan_start(reader, segments, [_TailRequest(move, TOPIC_ID, start, None)])
        assert (first == segments[0]) == (start == 0), (start, first)
        whole, tail = tail_from(segments[0], start), tail_from(first, start)
        assert [b.base_offset for b in tail.batches] == [b.base_offset for b in whole.batches]
        assert (tail.start, tail.end, tail.producers) == (whole.start, whole.end, whole.producers)
    # Another partition's start holds the scan back too.
    late = _TailRequest(move, TOPIC_ID, 81, None)
    early = _TailRequest(Move("t", 1, 1, 2, 1), TOPIC_ID, 2, None)
    assert _scan_start(reader, segments, [late, early]) < _scan_start(reader, segments, [late])


def test_a_takeover_below_adopted_objects_keeps_their_log_start(tmp_path: Path) -> None:
    """The adopted objects hold [0, 6) and the taken-over tail starts at 6: the log starts at
    0 from the takeover on, and a fetch from 0 reads the objects. (The first replayed batch
    used to move the log start to 6 until the next upload adopted the objects again: a
    consumer starting in between from the earliest offset skipped 0..5.)"""
    objects = StreamManifest("t", (ObjectRange(0, 6, "data/sso/" + "0" * 32, 500),))
    plog = PartitionLog("t", 0, TOPIC_ID, EffectiveTopicConfig.from_explicit({}, {}))
    plog.reset_for_takeover(6, 1, [])
    plog.adopt_objects(objects)  # LogStore.apply_takeover: reset, then adopt
    assert plog.log_start_offset == 0
    for n, base in enumerate((6, 9)):
        payload = build_batch([(None, b"v")] * 3, base_offset=base, timestamp_ms=1000)
        header = {"b": base, "l": base + 2, "ts": 1000, "pid": -1}
        plog.replay_batch(header, memoryview(payload), WalPosition("main-2", 0, n * 100, 100))
        assert plog.log_start_offset == 0
    assert (plog.next_offset, plog.high_watermark) == (12, 12)
    error, entries = plog.fetch_slice(0, 1 << 20, plog.high_watermark, True)
    assert error == 0 and isinstance(entries[0], ObjectSpan)
    assert (entries[0].base_offset, entries[0].end) == (0, 6)
    # Without objects below (a gap), the log does start at the tail.
    bare = PartitionLog("t", 0, TOPIC_ID, EffectiveTopicConfig.from_explicit({}, {}))
    bare.reset_for_takeover(6, 1, [])
    bare.adopt_objects(StreamManifest("t", (ObjectRange(0, 4, "data/sso/" + "1" * 32, 500),)))
    payload = build_batch([(None, b"v")] * 3, base_offset=6, timestamp_ms=1000)
    header = {"b": 6, "l": 8, "ts": 1000, "pid": -1}
    bare.replay_batch(header, memoryview(payload), WalPosition("main-2", 0, 0, 100))
    assert bare.log_start_offset == 6
