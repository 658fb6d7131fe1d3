"""The object manifest (golden bytes, merge, lookup, validation, CAS), orphan selection, the
uploader's planning over real partition logs, and the read path's pure block selection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kafka_wire.record_batch import build_batch, parse_batch_header
from main_broker.objects.upload import UploadTracker, retention_floor, stream_key
from main_broker.partition_log import ObjectSpan, PartitionLog
from main_broker.topic_config import EffectiveTopicConfig
from s3_commit import AsyncObjectStore, ConditionalPutUnknown, FileObjectStore
from s3_commit.manifest import (
    Manifest,
    ManifestConflict,
    ManifestFormatError,
    StreamKey,
    StreamShare,
    UploadedObject,
    new_object_id,
    object_id_time_ms,
    orphan_keys,
)
from s3_commit.manifest_store import ManifestStore, sweep_orphans
from s3_commit.object_plan import so_key, sso_key
from s3_commit.object_reader import select_block_batches
from shared_wal import WalPosition

TOPIC_ID = bytes(range(16))
A = StreamKey(TOPIC_ID, 0)
B = StreamKey(TOPIC_ID, 1)
SSO_1 = sso_key("0" * 31 + "1")
SSO_2 = sso_key("0" * 31 + "2")
SO_3 = so_key(0x0001020304050000, 100, 250, "0" * 31 + "3")

GOLDEN = (
    b'{"format":1,"node_id":1,"version":2,"streams":['
    b'{"topic":"orders","topic_id":"000102030405060708090a0b0c0d0e0f","partition":0,"ranges":['
    b'[0,100,"data/sso/00000000000000000000000000000001",5000,1700000000000,4000],'
    b'[100,250,"data/so/0001020304050000/00000000000000000100-00000000000000000250-'
    b'00000000000000000000000000000003",9000,1700000000500,8800]]},'
    b'{"topic":"orders","topic_id":"000102030405060708090a0b0c0d0e0f","partition":1,"ranges":['
    b'[10,12,"data/sso/00000000000000000000000000000001",5000,1700000000000,700]]}]}'
)
# What retention leaves of GOLDEN once partition 0's log start passed the SSO's range: the
# stream keeps its log start, the SSO stays for partition 1.
GOLDEN_RETAINED = (
    b'{"format":1,"node_id":1,"version":3,"streams":['
    b'{"topic":"orders","topic_id":"000102030405060708090a0b0c0d0e0f","partition":0,'
    b'"log_start":100,"ranges":['
    b'[100,250,"data/so/0001020304050000/00000000000000000100-00000000000000000250-'
    b'00000000000000000000000000000003",9000,1700000000500,8800]]},'
    b'{"topic":"orders","topic_id":"000102030405060708090a0b0c0d0e0f","partition":1,"ranges":['
    b'[10,12,"data/sso/00000000000000000000000000000001",5000,1700000000000,700]]}]}'
)


def _golden() -> Manifest:
    first = UploadedObject(
        SSO_1,
        5000,
        (
            StreamShare(A, "orders", 0, 100, 1_700_000_000_000, 4000),
            StreamShare(B, "orders", 10, 12, 1_700_000_000_000, 700),
        ),
    )
    second = UploadedObject(
        SO_3, 9000, (StreamShare(A, "orders", 100, 250, 1_700_000_000_500, 8800),)
    )
    return Manifest(1).with_upload([first]).with_upload([second])


def test_golden_bytes_round_trip_and_lookups() -> None:
    manifest = _golden()
    assert manifest.to_bytes() == GOLDEN
    assert Manifest.from_bytes(GOLDEN) == manifest
    assert manifest.end_offset(TOPIC_ID, 0) == 250 and manifest.end_offset(TOPIC_ID, 1) == 12
    assert manifest.end_offset(TOPIC_ID, 7) == 0
    found = manifest.find(TOPIC_ID, 0, 100)
    assert found is not None and found.key == SO_3
    assert manifest.find(TOPIC_ID, 0, 99).key == SSO_1  # type: ignore[union-attr]
    assert manifest.find(TOPIC_ID, 0, 250) is None
    assert manifest.find(TOPIC_ID, 1, 3).start == 10  # type: ignore[union-attr]  # gap: next
    stream = manifest.stream(TOPIC_ID, 0)
    assert stream is not None and stream.first_at_timestamp(1_700_000_000_001).key == SO_3  # type: ignore[union-attr]
    assert manifest.keys() == {SSO_1, SO_3}


def test_retention_golden_bytes_log_start_and_the_five_element_form() -> None:
    retained = _golden().with_log_start(A, 100)
    assert retained.to_bytes() == GOLDEN_RETAINED
    assert Manifest.from_bytes(GOLDEN_RETAINED) == retained
    stream = retained.stream(TOPIC_ID, 0)
    assert stream is not None and (stream.start_offset, stream.end_offset) == (100, 250)
    assert retained.keys() == {SSO_1, SO_3}  # partition 1 still holds the SSO
    assert retained.with_log_start(A, 100) is retained and retained.with_log_start(A, 5) is retained
    # Every range expired: the stream stays, empty, its end where the log start is.
    empty = retained.with_log_start(A, 250)
    gone = empty.stream(TOPIC_ID, 0)
    assert gone is not None and gone.ranges == () and gone.start_offset == gone.end_offset == 250
    assert Manifest.from_bytes(empty.to_bytes()) == empty
    assert empty.without_objects([SSO_1]).stream(TOPIC_ID, 0) == gone  # the log start stays
    assert empty.without_streams([A, B]).streams == {}
    # Manifests written before ranges carried the stream's bytes still read.
    old = GOLDEN.replace(b",4000]", b"]").replace(b",8800]", b"]").replace(b",700]", b"]")
    legacy = Manifest.from_bytes(old)
    assert [r.nbytes for s in legacy.streams.values() for r in s.ranges] == [-1, -1, -1]
    assert legacy.find(TOPIC_ID, 0, 120).key == SO_3  # type: ignore[union-attr]


def test_upload_merge_is_idempotent_allows_gaps_and_refuses_overlaps() -> None:
    manifest = _golden()
    again = UploadedObject(SO_3, 9000, (StreamShare(A, "orders", 100, 250),))
    assert manifest.with_upload([again]) is manifest  # a commit whose answer was lost
    gap = UploadedObject(SSO_2, 100, (StreamShare(A, "orders", 300, 310),))
    assert manifest.with_upload([gap]).find(TOPIC_ID, 0, 260).start == 300  # type: ignore[union-attr]
    overlap = UploadedObject(SSO_2, 100, (StreamShare(A, "orders", 249, 260),))
    with pytest.raises(ManifestConflict):
        manifest.with_upload([overlap])
    trimmed = manifest.without_objects([SSO_1])
    assert trimmed.version == manifest.version + 1 and trimmed.keys() == {SO_3}
    assert trimmed.stream(TOPIC_ID, 1) is None and trimmed.end_offset(TOPIC_ID, 0) == 250
    assert manifest.without_objects(["data/sso/" + "9" * 32]) is manifest


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"{", "not JSON"),
        (b'{"format":2}', "unknown manifest format"),
        (b'{"format":1,"node_id":"1","version":0,"streams":[]}', "node_id"),
        (GOLDEN.replace(b'"partition":1', b'"partition":0'), "listed twice"),
        (GOLDEN.replace(b"[10,12,", b"[12,10,"), "bad offsets"),
        (GOLDEN.replace(b"[100,250,", b"[99,250,"), "overlaps"),
        (GOLDEN.replace(b'"data/sso/', b'"junk/sso/', 1), "not a data object key"),
        (GOLDEN.replace(b",5000,", b",47,", 1), "cannot hold a footer"),
        (GOLDEN.replace(b"0e0f", b"0e", 1), "topic_id"),
        (GOLDEN.replace(b",4000]", b",6000]"), "do not fit"),
        (GOLDEN_RETAINED.replace(b'"log_start":100', b'"log_start":250'), "below the log start"),
        (GOLDEN_RETAINED.replace(b'"log_start":100', b'"log_start":-1'), "negative log_start"),
        (GOLDEN.replace(b'"ranges":[[10', b'"ranges":[[10,12]],"x":[[10'), "expected"),
    ],
)
def test_validation_names_the_problem(bad: bytes, message: str) -> None:
    with pytest.raises(ManifestFormatError, match=message):
        Manifest.from_bytes(bad)


def test_orphans_are_old_unreferenced_data_keys_only() -> None:
    now = 1_800_000_000_000
    old = sso_key(new_object_id(now - 700_000))
    young = sso_key(new_object_id(now - 1_000))
    listed_old = so_key(5, 0, 10, new_object_id(now - 900_000))
    assert object_id_time_ms(old.split("/")[-1]) == now - 700_000
    listed = [old, young, listed_old, SSO_1, "manifests/1.json", "data/sso/zz"]
    assert orphan_keys(listed, {listed_old}, now, grace_ms=600_000) == [old]


# -- the manifest in an object store ---------------------------------------------------------


async def test_cas_update_survives_races_and_unknown_outcomes(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    ours = ManifestStore(AsyncObjectStore(store), 1)
    await ours.load()
    first = UploadedObject(SSO_1, 5000, (StreamShare(A, "orders", 0, 100),))
    await ours.update(lambda m: m.with_upload([first]))
    # Someone else replaces the document behind our cached ETag: the next CAS fails, re-reads
    # and applies on top of theirs.
    theirs = Manifest.from_bytes(store.get("manifests/1.json")[0])  # type: ignore[index]
    extra = UploadedObject(SSO_2, 100, (StreamShare(B, "orders", 0, 5),))
    store.put("manifests/1.json", theirs.with_upload([extra]).to_bytes())
    second = UploadedObject(SO_3, 9000, (StreamShare(A, "orders", 100, 250),))
    result = await ours.update(lambda m: m.with_upload([second]))
    assert result.keys() == {SSO_1, SSO_2, SO_3}
    assert Manifest.from_bytes(store.get("manifests/1.json")[0]) == result  # type: ignore[index]

    # A put that lands but whose answer is lost: the re-read finds the change, no second write.
    class LosesAnswer:
        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def put(self, key: str, data: bytes, **kw: Any) -> str:
            self.calls += 1
            store.put(key, data, **kw)
            raise ConditionalPutUnknown("connection dropped")

    flaky = LosesAnswer()
    blind = ManifestStore(AsyncObjectStore(flaky), 1)  # type: ignore[arg-type]
    await blind.load()
    third = UploadedObject(SSO_2.replace("2", "4"), 100, (StreamShare(B, "orders", 5, 9),))
    after = await blind.update(lambda m: m.with_upload([third]))
    assert flaky.calls == 1 and third.key in after.keys()


async def test_sweep_deletes_only_unlisted_old_objects(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    now = 1_800_000_000_000
    kept = sso_key(new_object_id(now - 3_600_000))
    orphan = sso_key(new_object_id(now - 3_600_000))
    in_flight = sso_key(new_object_id(now - 5_000))
    for key in (kept, orphan, in_flight):
        store.put(key, b"x" * 64)
    listed = UploadedObject(kept, 64, (StreamShare(A, "orders", 0, 1),))
    store.put("manifests/2.json", Manifest(2).with_upload([listed]).to_bytes())
    gone = await sweep_orphans(AsyncObjectStore(store), grace_ms=600_000, now_ms=now)
    assert gone == [orphan]
    assert {i.key for i in store.list("data/")} == {kept, in_flight}


# -- the uploader's planning over real partition logs ----------------------------------------


def _plog(batches: int, per_batch: int = 3) -> PartitionLog:
    plog = PartitionLog("orders", 0, TOPIC_ID, EffectiveTopicConfig.from_explicit({}, {}))
    for i in range(batches):
        buf = bytearray(build_batch([(None, b"x" * 100)] * per_batch, timestamp_ms=1000 + i))
        entry = plog.append(memoryview(buf), parse_batch_header(buf), 0)
        plog.mark_durable(entry, WalPosition("main-1", 0, 1000 * i, 500))
    return plog


def test_tracker_counts_committed_bytes_selects_whole_batches_and_advances() -> None:
    plog = _plog(10)
    plog.high_watermark = 24  # batches 0..7 committed (offsets 0..23)
    size = plog.entries[0].size
    tracker = UploadTracker()
    assert tracker.observe([plog]) == 8 * size
    assert tracker.observe([plog]) == 8 * size  # counted once
    parts = tracker.select([plog], max_bytes=3 * size + 1)
    assert [(p.start, p.end) for p in parts] == [(0, 9)] and parts[0].nbytes == 3 * size
    assert parts[0].share().max_timestamp == 1002
    floor_before = retention_floor([plog], tracker.uploaded_end, 10**9)
    assert floor_before == 0
    tracker.committed(parts)
    assert tracker.uploaded_end[stream_key(plog)] == 9
    assert tracker.pending_bytes == 5 * size
    assert retention_floor([plog], tracker.uploaded_end, 10**9) == 3000  # batch 3's record
    rest = tracker.select([plog], max_bytes=1)
    assert [(p.start, p.end) for p in rest] == [(9, 12)]  # at least one batch
    plog.high_watermark = 30
    assert tracker.observe([plog]) == 7 * size
    assert tracker.observe([]) == 0  # the topic went away


def test_partition_reads_below_the_wal_from_objects() -> None:
    plog = _plog(10)  # offsets 0..29
    partial = Manifest(1).with_upload(
        [UploadedObject(SSO_1, 5000, (StreamShare(stream_key(plog), "orders", 0, 15, 1004),))]
    )
    plog.adopt_objects(partial.stream(TOPIC_ID, 0))
    plog.drop_segments({0})  # every batch's WAL segment is gone (retention before PR 3)...
    assert plog.entries == [] and plog.log_start_offset == 30  # ...so 15..29 are lost
    full = Manifest(1).with_upload(
        [UploadedObject(SSO_1, 5000, (StreamShare(stream_key(plog), "orders", 0, 30, 1009),))]
    )
    assert plog.adopt_objects(full.stream(TOPIC_ID, 0))
    assert plog.log_start_offset == 0  # objects reach the WAL's end: no gap
    error, entries = plog.fetch_slice(3, 1000, plog.high_watermark, True)
    assert error == 0 and isinstance(entries[0], ObjectSpan)
    assert (entries[0].base_offset, entries[0].end, entries[0].size) == (3, 30, 1000)
    assert plog.fetch_slice(3, 0, plog.high_watermark, False) == (0, [])
    # An empty WAL after a restart: the log continues after the objects.
    fresh = PartitionLog("orders", 0, TOPIC_ID, EffectiveTopicConfig.from_explicit({}, {}))
    assert fresh.adopt_objects(partial.stream(TOPIC_ID, 0))
    assert (fresh.log_start_offset, fresh.next_offset, fresh.high_watermark) == (0, 15, 15)
    span = fresh.first_batch_at_timestamp(1003)
    assert isinstance(span, ObjectSpan) and span.timestamp == 1003


def test_block_selection_keeps_whole_batches_within_budget() -> None:
    batches = [
        build_batch([(None, b"x" * 50)] * 2, base_offset=10 + 2 * i, timestamp_ms=1)
        for i in range(4)
    ]
    block = b"".join(batches)
    size = len(batches[0])
    chosen = select_block_batches(block, 13, 100, 2 * size, True)
    assert [bytes(v) for v in chosen.batches] == batches[1:3] and chosen.done
    assert select_block_batches(block, 10, 100, 1, True).nbytes == size  # KIP-74: one anyway
    assert select_block_batches(block, 10, 100, 1, False).batches == []
    ending = select_block_batches(block, 10, 15, 10 * size, True)
    assert len(ending.batches) == 2 and ending.done  # offsets 14..15 reach the end
    whole = select_block_batches(block, 0, 100, 10 * size, True)
    assert len(whole.batches) == 4 and not whole.done
