"""WalWriter: group commit, ordering, segment roll with SNAPSHOT records, retention, failures."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import pytest
import trio

from shared_wal import (
    RecordType,
    WalConfig,
    WalError,
    WalPosition,
    WalReader,
    WalWriter,
    open_wal_fs,
    storage,
)
from shared_wal.storage import FS
from tests import wal_helpers
from tests.wal_helpers import no_retention, running

wal_fs = wal_helpers.wal_fs


@pytest.fixture
def count_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = storage.sync_file

    def counting(f: Any) -> None:
        calls.append(1)
        real(f)

    monkeypatch.setattr(storage, "sync_file", counting)
    return calls


def records(fs: FS, writer: WalWriter) -> list[Any]:
    with WalReader(fs, writer.writer_id) as reader:
        return list(reader.iter_records(writer.start_offset, writer.end_offset))


async def test_group_commit_joins_concurrent_appends(wal_fs: FS, count_syncs: list[int]) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention())
    submit_order: list[int] = []
    results: dict[int, WalPosition] = {}
    rng = random.Random(7)

    async def producer(i: int) -> None:
        for _ in range(rng.randrange(3)):
            await trio.sleep(0)
        ticket = wal.submit(RecordType.DATA, {"i": i}, bytes([i]) * (100 + i))
        submit_order.append(i)
        results[i] = await ticket.wait()
        assert ticket.done

    async with running(wal):
        async with trio.open_nursery() as producers:
            for i in range(50):
                producers.start_soon(producer, i)

    assert len(results) == 50
    assert 1 <= len(count_syncs) <= 10, f"{len(count_syncs)} fsyncs for 50 appends"
    positions = sorted(results.values(), key=lambda p: p.offset)
    assert len({p.offset for p in positions}) == 50
    for before, after in itertools.pairwise(positions):
        assert before.end_offset == after.offset  # contiguous, no overlap
    assert positions[-1].end_offset == wal.end_offset
    got = records(wal_fs, wal)
    assert [r.header["i"] for r in got] == submit_order
    for r in got:
        i = r.header["i"]
        assert r.position == results[i]
        assert bytes(r.payload) == bytes([i]) * (100 + i)


async def test_submit_is_synchronous_and_keeps_call_order(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention())
    tickets = [wal.submit(RecordType.CONTROL, {"n": n}) for n in range(5)]
    assert not any(t.done for t in tickets)
    async with running(wal):
        positions = [await t.wait() for t in tickets]
    assert [p.offset for p in positions] == sorted(p.offset for p in positions)
    assert positions[0].offset == 0
    assert wal.end_offset == positions[-1].end_offset


async def test_groups_respect_max_group_bytes(wal_fs: FS, count_syncs: list[int]) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention(max_group_bytes=1000))
    tickets = [wal.submit(RecordType.DATA, {}, b"z" * 300) for _ in range(10)]
    async with running(wal):
        for t in tickets:
            await t.wait()
    # 310-byte records, at most 3 per 1000-byte group
    assert len(count_syncs) == 4


async def test_aclose_without_run_flushes_queue(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention())
    ticket = wal.submit(RecordType.DATA, {"k": 1}, b"payload")
    await wal.aclose()
    pos = await ticket.wait()
    with pytest.raises(WalError, match="closed"):
        wal.submit(RecordType.DATA, {}, b"")
    with WalReader(wal_fs, "w1") as reader:
        assert bytes(reader.read_record(pos).payload) == b"payload"


async def test_roll_writes_snapshot_first_in_every_segment(wal_fs: FS) -> None:
    calls: list[int] = []

    def provider() -> tuple[dict[str, Any], bytes]:
        calls.append(1)
        return {"k": "snapshot", "n": len(calls)}, b"state-%d" % len(calls)

    wal = await WalWriter.open(wal_fs, "w1", no_retention(segment_bytes=400), provider)
    async with running(wal):
        positions = [await wal.append(RecordType.DATA, {"i": i}, b"d" * 100) for i in range(12)]

    segs = wal.segments()
    assert len(segs) >= 4
    assert segs[0] == 0
    assert len(calls) == len(segs)
    names = sorted(wal_fs.listdir("wal/w1"))
    assert names == [f"{s:020d}.wal" for s in segs]
    with WalReader(wal_fs, "w1") as reader:
        all_records = list(reader.iter_records(0, wal.end_offset))
    by_segment: dict[int, list[Any]] = {}
    for r in all_records:
        by_segment.setdefault(r.position.segment, []).append(r)
    assert sorted(by_segment) == segs
    for n, seg in enumerate(segs, start=1):
        first = by_segment[seg][0]
        assert first.type is RecordType.SNAPSHOT
        assert first.position.position == 0
        assert first.header == {"k": "snapshot", "n": n}
        assert bytes(first.payload) == b"state-%d" % n
        assert all(r.type is RecordType.DATA for r in by_segment[seg][1:])
    for seg, nxt in itertools.pairwise(segs):
        size = wal_fs.getsize(f"wal/w1/{seg:020d}.wal")
        assert seg + size == nxt  # a segment's name is the logical offset of its first byte
        assert size <= 400
    assert [r.header["i"] for r in all_records if r.type is RecordType.DATA] == list(range(12))
    assert [r.position for r in all_records if r.type is RecordType.DATA] == positions


async def test_roll_soon_starts_the_next_group_in_a_new_segment(wal_fs: FS) -> None:
    def provider() -> tuple[dict[str, Any], bytes]:
        return {"k": "snapshot"}, b""

    wal = await WalWriter.open(wal_fs, "w1", no_retention(), provider)
    async with running(wal):
        first = await wal.append(RecordType.DATA, {"i": 0}, b"d")
        wal.roll_soon()
        second = await wal.append(RecordType.DATA, {"i": 1}, b"d")
        third = await wal.append(RecordType.DATA, {"i": 2}, b"d")
    assert first.segment == 0 and second.segment == third.segment > 0
    assert wal.segments() == [0, second.segment]
    with WalReader(wal_fs, "w1") as reader:
        head = next(reader.iter_records(second.segment, None))
    assert head.type is RecordType.SNAPSHOT and head.position.position == 0


async def test_new_wal_without_provider_has_no_snapshot(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention())
    async with running(wal):
        pos = await wal.append(RecordType.CONTROL, {"k": "x"})
    assert pos.offset == 0


async def _fill_and_close(wal: WalWriter, n: int) -> None:
    async with running(wal):
        await _fill_segments(wal, n)


async def _fill_segments(wal: WalWriter, n: int) -> None:
    # sequential appends: one group per record, so a record past 1000 bytes rolls a segment
    for i in range(n):
        await wal.append(RecordType.DATA, {"i": i}, b"r" * 200)


async def test_retention_by_bytes_deletes_oldest_sealed_only(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention(segment_bytes=1000))
    async with running(wal):
        await _fill_segments(wal, 20)
        await _check_retention_by_bytes(wal_fs, wal)


async def _check_retention_by_bytes(wal_fs: FS, wal: WalWriter) -> None:
    deleted_cb: list[list[int]] = []
    wal.on_segments_deleted = deleted_cb.append
    before = wal.segments()
    assert len(before) == 5
    wal.config.retention_bytes = 2500
    deleted = await wal.enforce_retention()
    assert deleted == before[:3]
    assert deleted_cb == [deleted]
    assert wal.segments() == before[3:]
    assert wal.start_offset == before[3]
    assert sorted(wal_fs.listdir("wal/w1")) == [f"{s:020d}.wal" for s in before[3:]]
    # the active segment survives even a zero budget
    wal.config.retention_bytes = 0
    assert await wal.enforce_retention() == [before[3]]
    assert wal.segments() == [before[4]]
    assert await wal.enforce_retention() == []


async def test_retention_by_time_and_floor(wal_fs: FS) -> None:
    config = WalConfig(segment_bytes=1000, retention_ms=60_000)
    wal = await WalWriter.open(wal_fs, "w1", config)
    await _fill_and_close(wal, 20)
    segs = wal.segments()
    now_ms = time.time() * 1000
    assert await wal.enforce_retention(now_ms) == []
    wal.retention_floor = segs[2] + 1  # segment 2 still holds bytes the owner needs
    assert await wal.enforce_retention(now_ms + 61_000) == segs[:2]
    wal.retention_floor = None
    assert await wal.enforce_retention(now_ms + 61_000) == segs[2:4]
    assert wal.segments() == [segs[4]]
    await wal.aclose()


async def test_run_applies_retention_periodically(wal_fs: FS) -> None:
    config = WalConfig(
        segment_bytes=1000, retention_ms=None, retention_bytes=1500, retention_interval_s=0.01
    )
    wal = await WalWriter.open(wal_fs, "w1", config)
    got = trio.Event()
    deleted: list[int] = []

    def on_deleted(ids: list[int]) -> None:
        deleted.extend(ids)
        got.set()

    wal.on_segments_deleted = on_deleted
    async with running(wal):
        for i in range(12):
            await wal.append(RecordType.DATA, {"i": i}, b"r" * 200)
        with trio.fail_after(5):
            await got.wait()
    assert deleted and deleted[0] == 0
    assert wal.segments()[0] > 0
    assert not set(deleted) & set(wal.segments())


async def test_fsync_failure_fails_group_and_later_submits(
    wal_fs: FS, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention())
    async with running(wal):
        good = await wal.append(RecordType.DATA, {}, b"ok")

        def broken(f: Any) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(storage, "sync_file", broken)
        tickets = [wal.submit(RecordType.DATA, {"i": i}, b"x") for i in range(3)]
        for ticket in tickets:
            with pytest.raises(WalError, match="Input/output error"):
                await ticket.wait()
        assert wal.failed is not None
        with pytest.raises(WalError, match="failed"):
            wal.submit(RecordType.DATA, {}, b"late")
        assert wal.end_offset == good.end_offset  # nothing past the last durable record


async def test_snapshot_provider_failure_fails_only_that_group(wal_fs: FS) -> None:
    fail = [True]

    def provider() -> tuple[dict[str, Any], bytes]:
        if fail[0]:
            raise RuntimeError("no state yet")
        return {"k": "s"}, b""

    wal = await WalWriter.open(wal_fs, "w1", no_retention(), provider)
    async with running(wal):
        with pytest.raises(WalError, match="snapshot provider"):
            await wal.append(RecordType.DATA, {}, b"a")
        fail[0] = False
        pos = await wal.append(RecordType.DATA, {}, b"b")
    assert wal.failed is None
    assert pos.position > 0  # after the snapshot
    assert [r.type for r in records(wal_fs, wal)] == [RecordType.SNAPSHOT, RecordType.DATA]


async def test_invalid_submits_raise_synchronously(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention())
    with pytest.raises(ValueError):
        wal.submit(99, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        wal.submit(RecordType.DATA, "not a map")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        wal.submit(RecordType.DATA, {"x": object()})
    await wal.aclose()
    assert wal.end_offset == 0
    with pytest.raises(ValueError):
        await WalWriter.open(wal_fs, "../escape", no_retention())


def test_open_wal_fs_when_another_main_creates_the_directory_meanwhile(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mains of `zonefleet up` start together on one WAL directory; OSFS checks for it and
    # then creates it, and a fleet start failed once with FileExistsError in between.
    import fs.osfs

    root = tmp_path / "wal"
    real_isdir = fs.osfs.os.path.isdir
    raced = []

    def isdir_then_created_by_another(path: str) -> bool:
        if path == str(root) and not raced:
            raced.append(path)
            root.mkdir()  # the other main wins the race
            return False
        return real_isdir(path)

    monkeypatch.setattr(fs.osfs.os.path, "isdir", isdir_then_created_by_another)
    opened = open_wal_fs(f"osfs://{root}")
    assert raced and opened.isdir("/")
    opened.close()
