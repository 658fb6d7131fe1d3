"""The unchanged WAL on nfs:// (real NFS-Ganesha) and osfs://: group commit, segment roll,
crash-style reopen with a torn tail, recovery, tailing; plus an append throughput figure.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from shared_wal import RecordType, WalConfig, WalReader, WalWriter, open_wal_fs, storage
from shared_wal.storage import FS
from tests.nfs_server import GaneshaServer, GaneshaUnavailable


@pytest.fixture(scope="module")
def ganesha() -> Iterator[GaneshaServer]:
    try:
        server = GaneshaServer().start()
    except GaneshaUnavailable as exc:
        pytest.skip(f"NFS-Ganesha cannot start here: {exc}")
    yield server
    server.stop()


class Target:
    """One WAL root: its URL and the same directory on the local disk."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        name = uuid.uuid4().hex
        if kind == "nfs":
            server: GaneshaServer = request.getfixturevalue("ganesha")
            self.url = f"{server.url}/{name}"
            self.disk = server.local_subdir / name
        else:
            self.disk = tmp_path / name
            self.url = f"osfs://{self.disk}"
        self.kind = kind


@pytest.fixture(params=["osfs", "nfs"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    return Target(request.param, tmp_path, request)


def config(**kw: Any) -> WalConfig:
    return WalConfig(retention_ms=None, **kw)


async def submit_concurrently(
    wal: WalWriter, submitters: int, per_submitter: int, size: int
) -> list[Any]:
    positions: list[Any] = []

    async def submitter(s: int) -> None:
        for i in range(per_submitter):
            payload = bytes([s]) * size
            positions.append(await wal.append(RecordType.DATA, {"s": s, "i": i}, payload))

    async with trio.open_nursery() as nursery:
        for s in range(submitters):
            nursery.start_soon(submitter, s)
    return positions


def read_all(filesystem: FS, writer_id: str, start: int, end: int | None) -> list[Any]:
    with WalReader(filesystem, writer_id) as reader:
        return list(reader.iter_records(start, end))


async def test_group_commit_roll_crash_reopen_recover_and_tail(target: Target) -> None:
    fs1 = open_wal_fs(target.url)
    groups: list[int] = []
    wal = await WalWriter.open(fs1, "w1", config(segment_bytes=256 * 1024))
    wal.on_group_commit = lambda nbytes, _seconds: groups.append(nbytes)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        positions = await submit_concurrently(wal, 8, 12, 20_000)
        nursery.cancel_scope.cancel()  # the "kill -9": no aclose, the segment stays open
    assert len(positions) == 96
    assert len(groups) < 96, "concurrent submits were not grouped"
    assert len(wal.segments()) >= 7  # ~1.9 MB over 256 KiB segments
    end = wal.end_offset
    # A torn write: half a record's worth of bytes after the last durable one.
    active = target.disk / storage.segment_path("w1", wal.segments()[-1])
    with active.open("ab") as raw:
        raw.write(b"\x00\x01\x00\x00" + b"torn" * 50)

    fs2 = open_wal_fs(target.url)  # a new client, as after a restart
    reopened = await WalWriter.open(fs2, "w1", config(segment_bytes=256 * 1024))
    assert reopened.end_offset == end
    assert reopened.segments() == wal.segments()
    replayed = list(reopened.replay())
    assert [(r.header["s"], r.header["i"]) for r in replayed] == [
        (r.header["s"], r.header["i"]) for r in read_all(fs1, "w1", 0, end)
    ]
    assert sorted(p.offset for p in positions) == [r.position.offset for r in replayed]
    assert all(r.payload == bytes([r.header["s"]]) * 20_000 for r in replayed)

    # Appends resume after the cut tail while a reader on the other client tails them.
    tailed: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(reopened.run)

        async def tail() -> None:
            offset = end
            while len(tailed) < 40:
                published = reopened.end_offset
                got = await trio.to_thread.run_sync(read_all, fs1, "w1", offset, published)
                tailed.extend(got)
                offset = got[-1].position.end_offset if got else offset
                await trio.sleep(0.01)

        nursery.start_soon(tail)
        more = await submit_concurrently(reopened, 4, 10, 5_000)
        with trio.fail_after(20):
            while len(tailed) < 40:
                await trio.sleep(0.01)
        await reopened.aclose()
    assert sorted(p.offset for p in more) == [r.position.offset for r in tailed]
    assert read_all(fs2, "w1", 0, reopened.end_offset)[-1].position == tailed[-1].position
    for filesystem in (fs1, fs2):
        filesystem.close()


async def test_retention_deletes_segments_over_nfs(target: Target) -> None:
    filesystem = open_wal_fs(target.url)
    wal = await WalWriter.open(filesystem, "w2", config(segment_bytes=64 * 1024))
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        for i in range(20):
            await wal.append(RecordType.DATA, {"i": i}, b"r" * 30_000)
        before = wal.segments()
        wal.config.retention_bytes = 100_000
        deleted = await wal.enforce_retention()
        await wal.aclose()
    assert deleted and deleted == before[: len(deleted)]
    assert storage.list_segment_ids(filesystem, "w2") == wal.segments()
    assert not any((target.disk / storage.segment_path("w2", s)).exists() for s in deleted)
    filesystem.close()


async def append_throughput(url: str, total: int) -> float:
    """MB/s of 64 KiB records from 8 concurrent submitters, group-committed."""
    filesystem = open_wal_fs(url)
    wal = await WalWriter.open(filesystem, "bench", config(segment_bytes=64 * 1024 * 1024))
    payload = b"p" * 65536
    per = total // (8 * len(payload))
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        started = time.perf_counter()

        async def submitter() -> None:
            for _ in range(per):
                await wal.append(RecordType.DATA, {}, payload)

        async with trio.open_nursery() as submitters:
            for _ in range(8):
                submitters.start_soon(submitter)
        elapsed = time.perf_counter() - started
        await wal.aclose()
    filesystem.close()
    return 8 * per * len(payload) / elapsed / 1e6


async def test_append_throughput_nfs_vs_osfs(
    ganesha: GaneshaServer, tmp_path: Path, record_property: Any
) -> None:
    total = 48 * 1024 * 1024
    osfs = await append_throughput(f"osfs://{tmp_path / 'os'}", total)
    nfs = await append_throughput(f"{ganesha.url}/{uuid.uuid4().hex}", total)
    record_property("wal_append_mb_s_osfs", round(osfs, 1))
    record_property("wal_append_mb_s_nfs", round(nfs, 1))
    print(f"\nWAL append, 8 submitters x 64 KiB: osfs {osfs:.0f} MB/s, nfs {nfs:.0f} MB/s")
    # Loopback NFS does a WRITE per MiB plus one COMMIT per group; it should not crawl.
    assert nfs > 10, f"nfs:// WAL appends at {nfs:.1f} MB/s"
