"""Compaction's pure core (s3_commit/compaction.py): which objects a job takes, the batches the
new objects carry, and the manifest swap that keeps every offset and retires the sources."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from kafka_wire.record_batch import build_batch
from s3_commit.compaction import (
    CompactionAbandoned,
    CompactionJob,
    CompactionSettings,
    CorruptSource,
    JobKind,
    apply_compaction,
    collect_stream_batches,
    compacted_objects,
    due_retired,
    plan_compaction,
    without_retired,
)
from s3_commit.manifest import (
    Manifest,
    ManifestFormatError,
    StreamKey,
    StreamShare,
    UploadedObject,
    orphan_keys,
)
from s3_commit.object_format import block_view, decode_object, stream_id_for
from s3_commit.object_plan import ObjectKind, parse_object_key, plan_upload, sso_key

TOPIC_ID = bytes(range(16))
OTHER_ID = bytes(range(100, 116))
STREAMS = [StreamKey(TOPIC_ID, 0), StreamKey(TOPIC_ID, 1), StreamKey(OTHER_ID, 0)]
BIG = 1 << 40
RETIRE_AT = 1_800_000_000_000


GOLDEN_COMPACTED = (
    b'{"format":1,"node_id":1,"version":3,"streams":['
    b'{"topic":"orders","topic_id":"000102030405060708090a0b0c0d0e0f","partition":0,"ranges":['
    b'[0,250,"data/sso/00000000000000000000000000000003",12000,1700000000500,11000]]},'
    b'{"topic":"orders","topic_id":"000102030405060708090a0b0c0d0e0f","partition":1,"ranges":['
    b'[10,12,"data/sso/00000000000000000000000000000003",12000,1700000000000,700]]}],'
    b'"retired":[["data/sso/00000000000000000000000000000001",1700000030000],'
    b'["data/sso/00000000000000000000000000000002",1700000030000]]}'
)


def test_golden_compacted_manifest() -> None:
    a, b = STREAMS[0], STREAMS[1]
    sso = [sso_key(f"{i:032x}") for i in (1, 2, 3)]
    manifest = (
        Manifest(1)
        .with_upload(
            [
                UploadedObject(
                    sso[0],
                    5000,
                    (
                        StreamShare(a, "orders", 0, 100, 1_700_000_000_000, 4000),
                        StreamShare(b, "orders", 10, 12, 1_700_000_000_000, 700),
                    ),
                )
            ]
        )
        .with_upload(
            [
                UploadedObject(
                    sso[1], 8000, (StreamShare(a, "orders", 100, 250, 1_700_000_000_500, 7000),)
                )
            ]
        )
    )
    job = plan_compaction(manifest, CompactionSettings(small_object_bytes=10_000))
    assert job is not None and job.sources == (sso[0], sso[1]) and job.kind is JobKind.MERGE
    merged = UploadedObject(
        sso[2],
        12000,
        (
            StreamShare(a, "orders", 0, 250, 1_700_000_000_500, 11000),
            StreamShare(b, "orders", 10, 12, 1_700_000_000_000, 700),
        ),
    )
    compacted = apply_compaction(manifest, job, [merged], 1_700_000_030_000)
    assert compacted.to_bytes() == GOLDEN_COMPACTED
    assert Manifest.from_bytes(GOLDEN_COMPACTED) == compacted


def _ids() -> Iterator[str]:
    for i in itertools.count(1):
        yield f"{i:032x}"


@dataclass
class Store:
    """Objects by key, and the manifest listing them, as uploads built them."""

    manifest: Manifest = field(default_factory=lambda: Manifest(1))
    objects: dict[str, bytes] = field(default_factory=dict)
    next_offset: dict[StreamKey, int] = field(default_factory=dict)
    batches: dict[StreamKey, list[bytes]] = field(default_factory=dict)
    ids: Iterator[str] = field(default_factory=_ids)

    def upload(
        self, counts: dict[StreamKey, int], split_size: int = BIG, value: int = 50
    ) -> list[str]:
        """One upload of `counts[stream]` one-record batches per stream; returns its keys."""
        streams: dict[int, list[bytes]] = {}
        for stream, count in counts.items():
            out = []
            for _ in range(count):
                offset = self.next_offset.get(stream, 0)
                out.append(
                    build_batch(
                        [(None, b"%d" % offset + b"x" * value)],
                        base_offset=offset,
                        timestamp_ms=1000 + offset,
                    )
                )
                self.next_offset[stream] = offset + 1
            self.batches.setdefault(stream, []).extend(out)
            streams[stream_id_for(*stream)] = out
        by_id = {stream_id_for(*s): s for s in counts}
        plan = plan_upload(streams, split_size, lambda: next(self.ids))
        uploaded = []
        for obj in plan.objects:
            data = obj.encode().to_bytes()
            self.objects[obj.key] = data
            shares = tuple(
                StreamShare(
                    by_id[r.stream_id],
                    "t",
                    r.start_offset,
                    r.end_offset,
                    1000 + r.end_offset,
                    r.size,
                )
                for r in obj.ranges
            )
            uploaded.append(UploadedObject(obj.key, len(data), shares))
        self.manifest = self.manifest.with_upload(uploaded)
        return [o.key for o in uploaded]

    def compact(self, job: CompactionJob, split_size: int = BIG) -> list[UploadedObject]:
        """Run the job as the compactor does; returns the new objects (added to `objects`)."""
        streams = collect_stream_batches(job, self.objects)
        plan = plan_upload(streams, split_size, lambda: next(self.ids))
        sizes = {}
        for obj in plan.objects:
            data = obj.encode().to_bytes()
            self.objects[obj.key] = data
            sizes[obj.key] = len(data)
        return compacted_objects(job, plan, sizes)

    def read_back(self, manifest: Manifest, stream: StreamKey) -> list[bytes]:
        """Every batch of the stream, from the objects its manifest ranges name."""
        listed = manifest.streams[stream]
        out: list[bytes] = []
        stream_id = stream_id_for(*stream)
        for rng in listed.ranges:
            data = self.objects[rng.key]
            for entry in decode_object(data).entries_for(stream_id):
                block = bytes(block_view(data, entry))
                position = 0
                while position < len(block):
                    size = int.from_bytes(block[position + 8 : position + 12], "big") + 12
                    base = int.from_bytes(block[position : position + 8], "big")
                    if rng.start <= base < rng.end:
                        out.append(block[position : position + size])
                    position += size
        return out


def _ssos(manifest: Manifest) -> set[str]:
    return {k for k in manifest.keys() if parse_object_key(k)[0] is ObjectKind.STREAM_SET}


def _spans(manifest: Manifest) -> dict[StreamKey, list[tuple[int, int]]]:
    """Per stream the offsets covered, adjacent ranges joined."""
    out: dict[StreamKey, list[tuple[int, int]]] = {}
    for key, stream in manifest.streams.items():
        spans: list[tuple[int, int]] = []
        for r in stream.ranges:
            if spans and spans[-1][1] == r.start:
                spans[-1] = (spans[-1][0], r.end)
            else:
                spans.append((r.start, r.end))
        out[key] = spans
    return out


def _one_range_per_object(manifest: Manifest) -> None:
    for stream in manifest.streams.values():
        keys = [r.key for r in stream.ranges]
        assert len(keys) == len(set(keys)), keys


def test_merge_of_small_ssos_keeps_every_offset_and_batch() -> None:
    store = Store()
    for i in range(4):
        store.upload({STREAMS[0]: 3, STREAMS[1]: 2 + i, STREAMS[2]: 1})
    before = store.manifest
    sources = _ssos(before)
    assert len(sources) == 4
    job = plan_compaction(before, CompactionSettings(small_object_bytes=BIG, split_size=BIG))
    assert job is not None and job.kind is JobKind.MERGE and set(job.sources) == sources
    outputs = store.compact(job)
    after = apply_compaction(before, job, outputs, RETIRE_AT)

    assert _ssos(after) == {outputs[0].key} and len(outputs) == 1
    assert after.version == before.version + 1
    assert _spans(after) == _spans(before)
    for stream in STREAMS:
        (rng,) = after.streams[stream].ranges  # adjacent ranges became one
        assert rng.max_timestamp == before.streams[stream].ranges[-1].max_timestamp
        assert rng.nbytes == sum(len(b) for b in store.batches[stream])
        assert store.read_back(after, stream) == store.batches[stream]
    assert after.retired == dict.fromkeys(sources, RETIRE_AT)
    # Retired objects are no longer read from, but an orphan sweep keeps them.
    assert after.keys() == {outputs[0].key}
    assert after.referenced_keys() == after.keys() | sources
    assert orphan_keys(sources, after.referenced_keys(), 0, -1) == []
    # Applying the swap again (a CAS whose answer was lost) changes nothing.
    assert apply_compaction(after, job, outputs, RETIRE_AT) is after
    # Nothing small is left to merge.
    assert plan_compaction(after, CompactionSettings(small_object_bytes=BIG)) is None


def test_retired_objects_round_trip_and_are_deleted_after_their_time() -> None:
    store = Store()
    for _ in range(2):
        store.upload({STREAMS[0]: 2})
    job = plan_compaction(store.manifest, CompactionSettings(small_object_bytes=BIG))
    assert job is not None
    after = apply_compaction(store.manifest, job, store.compact(job), RETIRE_AT)
    data = after.to_bytes()
    assert data.endswith(
        b',"retired":[["%s",%d],["%s",%d]]}'
        % (job.sources[0].encode(), RETIRE_AT, job.sources[1].encode(), RETIRE_AT)
    )
    assert Manifest.from_bytes(data) == after
    # No retired entry: no field (manifests without compaction keep their bytes).
    assert b"retired" not in store.manifest.to_bytes()
    assert due_retired(after, RETIRE_AT - 1) == []
    assert due_retired(after, RETIRE_AT) == sorted(job.sources)
    done = without_retired(after, job.sources)
    assert done.retired == {} and done.version == after.version + 1
    assert without_retired(done, job.sources) is done
    with pytest.raises(ManifestFormatError, match="retired"):
        Manifest.from_bytes(data.replace(b'"retired":[["data/sso/', b'"retired":[["junk/sso/'))
    with pytest.raises(ManifestFormatError, match="retired"):
        Manifest.from_bytes(data.replace(b"%d]" % RETIRE_AT, b'"x"]', 1))


def test_merge_is_bounded_by_the_max_size_and_leaves_large_objects_alone() -> None:
    store = Store()
    for _ in range(5):
        store.upload({STREAMS[0]: 2, STREAMS[1]: 2})
    size = next(iter(store.objects.values()))
    one = len(size)
    settings = CompactionSettings(small_object_bytes=BIG, max_object_bytes=2 * one + one // 2)
    job = plan_compaction(store.manifest, settings)
    assert job is not None and len(job.sources) == 2 and job.source_bytes <= 2.5 * one
    # Objects at or above the small size take part in no merge.
    assert plan_compaction(store.manifest, CompactionSettings(small_object_bytes=one)) is None
    # Repeated jobs converge: fewer SSOs each time, the same offsets throughout.
    manifest = store.manifest
    while (job := plan_compaction(manifest, settings)) is not None:
        count = len(_ssos(manifest))
        manifest = apply_compaction(manifest, job, store.compact(job), RETIRE_AT)
        assert len(_ssos(manifest)) < count
        assert _spans(manifest) == _spans(store.manifest)
        _one_range_per_object(manifest)
    for stream in STREAMS[:2]:
        assert store.read_back(manifest, stream) == store.batches[stream]


def test_merge_reaching_the_split_size_gives_the_stream_its_own_object() -> None:
    store = Store()
    for _ in range(3):
        store.upload({STREAMS[0]: 4, STREAMS[1]: 1}, value=200)
    per_upload = 4 * len(store.batches[STREAMS[0]][0])
    split = 2 * per_upload  # more than one upload's share, less than three
    job = plan_compaction(
        store.manifest, CompactionSettings(small_object_bytes=BIG, split_size=split)
    )
    assert job is not None and job.kind is JobKind.MERGE and len(job.sources) == 3
    outputs = store.compact(job, split_size=split)
    after = apply_compaction(store.manifest, job, outputs, RETIRE_AT)
    kinds = {parse_object_key(o.key)[0]: o for o in outputs}
    so, sso = kinds[ObjectKind.STREAM], kinds[ObjectKind.STREAM_SET]
    assert [s.stream for s in so.shares] == [STREAMS[0]]
    assert [s.stream for s in sso.shares] == [STREAMS[1]]
    assert parse_object_key(so.key)[1:4] == (stream_id_for(*STREAMS[0]), 0, 12)
    assert _spans(after) == _spans(store.manifest)
    for stream in STREAMS[:2]:
        assert store.read_back(after, stream) == store.batches[stream]


def test_split_of_a_large_share_in_one_sso() -> None:
    store = Store()
    store.upload({STREAMS[0]: 10, STREAMS[1]: 1}, value=200)  # one SSO: the split was larger
    share = next(r for r in store.manifest.streams[STREAMS[0]].ranges)
    settings = CompactionSettings(small_object_bytes=1, split_size=share.nbytes)
    job = plan_compaction(store.manifest, settings)
    assert job is not None and job.kind is JobKind.SPLIT and job.sources == (share.key,)
    outputs = store.compact(job, split_size=share.nbytes)
    after = apply_compaction(store.manifest, job, outputs, RETIRE_AT)
    assert [parse_object_key(o.key)[0] for o in outputs] == [
        ObjectKind.STREAM,
        ObjectKind.STREAM_SET,
    ]
    assert _spans(after) == _spans(store.manifest)
    assert plan_compaction(after, settings) is None  # what is left is below the split size
    # A share of unknown size (a manifest written before sizes existed) is never split.
    unknown = Manifest.from_bytes(store.manifest.to_bytes().replace(b",%d]" % share.nbytes, b"]"))
    assert plan_compaction(unknown, settings) is None


def test_ranges_that_are_not_adjacent_never_share_an_object() -> None:
    store = Store()
    first = store.upload({STREAMS[0]: 2, STREAMS[1]: 1})
    store.upload({STREAMS[0]: 20}, split_size=1)  # an SO sits between the two SSOs
    third = store.upload({STREAMS[0]: 2, STREAMS[1]: 1})
    settings = CompactionSettings(small_object_bytes=BIG, max_object_bytes=BIG)
    # Stream 0's ranges in the SSOs have the SO between them: no merge.
    assert plan_compaction(store.manifest, settings) is None
    fourth = store.upload({STREAMS[0]: 1, STREAMS[2]: 1})
    job = plan_compaction(store.manifest, settings)
    assert job is not None and set(job.sources) == {third[0], fourth[0]}
    after = apply_compaction(store.manifest, job, store.compact(job), RETIRE_AT)
    _one_range_per_object(after)
    assert _spans(after) == _spans(store.manifest)
    assert first[0] in after.keys()
    # A gap in a stream (records the WAL lost before their upload) keeps objects apart too.
    gap = Store()
    gap.upload({STREAMS[0]: 2})
    gap.next_offset[STREAMS[0]] = 10
    gap.upload({STREAMS[0]: 2})
    assert plan_compaction(gap.manifest, settings) is None


def test_a_swap_is_abandoned_when_a_source_changed_meanwhile() -> None:
    store = Store()
    for _ in range(3):
        store.upload({STREAMS[0]: 2, STREAMS[1]: 2})
    job = plan_compaction(store.manifest, CompactionSettings(small_object_bytes=BIG))
    assert job is not None
    outputs = store.compact(job)
    # DeleteTopics removed a stream, retention removed a source, or moved a log start past
    # one of its ranges: the job is dropped, the manifest stays as it is.
    changed = [
        store.manifest.without_streams([STREAMS[1]]),
        store.manifest.without_objects([job.sources[0]]),
        store.manifest.with_log_start(STREAMS[0], 2),
    ]
    for manifest in changed:
        with pytest.raises(CompactionAbandoned):
            apply_compaction(manifest, job, outputs, RETIRE_AT)
    # A later upload to the same streams does not get in the way.
    store.upload({STREAMS[0]: 1})
    after = apply_compaction(store.manifest, job, outputs, RETIRE_AT)
    assert _spans(after) == _spans(store.manifest)
    # Outputs that do not cover the sources' offsets are refused (a bug, not a race).
    short = [
        UploadedObject(
            o.key,
            o.size,
            tuple(StreamShare(s.stream, s.topic, s.start, s.end - 1) for s in o.shares),
        )
        for o in outputs
    ]
    with pytest.raises(ValueError, match="do not cover"):
        apply_compaction(store.manifest, job, short, RETIRE_AT)


def test_a_corrupt_source_names_its_key() -> None:
    store = Store()
    keys = [store.upload({STREAMS[0]: 2})[0] for _ in range(2)]
    job = plan_compaction(store.manifest, CompactionSettings(small_object_bytes=BIG))
    assert job is not None
    damaged = bytearray(store.objects[keys[1]])
    damaged[40] ^= 0xFF  # in the first batch: its CRC no longer matches
    store.objects[keys[1]] = bytes(damaged)
    with pytest.raises(CorruptSource) as info:
        collect_stream_batches(job, store.objects)
    assert info.value.key == keys[1]
    # An object that holds fewer offsets than its range says is refused too.
    store.objects[keys[1]] = store.objects[keys[0]]
    with pytest.raises(CorruptSource, match="do not cover"):
        collect_stream_batches(job, store.objects)
