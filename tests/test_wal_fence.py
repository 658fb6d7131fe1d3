"""The WAL fence (shared_wal/fence.py): a writer with fence checks on acknowledges nothing
written after another node fenced it, and the fence file's bytes are pinned."""

from __future__ import annotations

import json

import pytest

from shared_wal import RecordType, WalReader, WalWriter
from shared_wal.fence import (
    WalFence,
    WalFenced,
    fence_path,
    fence_writer,
    is_fenced,
    lift_fence,
    read_fence,
)
from shared_wal.storage import FS
from tests import wal_helpers
from tests.wal_helpers import no_retention, running

wal_fs = wal_helpers.wal_fs


def test_fence_golden_bytes() -> None:
    fence = WalFence("main-2", 1, 1_700_000_000_000, "main 2 is dead: taking its partitions")
    golden = (
        b'{"format":1,"writer":"main-2","by":1,"at_ms":1700000000000,'
        b'"reason":"main 2 is dead: taking its partitions"}'
    )
    assert fence.to_bytes() == golden
    assert WalFence.from_bytes(golden) == fence
    for bad in (b"[]", b"{", b'{"format":2}', json.dumps({"format": 1, "writer": 3}).encode()):
        with pytest.raises(ValueError):
            WalFence.from_bytes(bad)


async def test_a_fenced_writer_acknowledges_nothing_more(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "main-7", no_retention())
    wal.fence_check = True
    async with running(wal):
        before = await wal.append(RecordType.DATA, {"n": 1}, b"acknowledged")
        assert not is_fenced(wal_fs, "main-7")
        fence, made = fence_writer(wal_fs, "main-7", 3, "test")
        assert made
        assert fence_writer(wal_fs, "main-7", 4, "again") == (fence, False)  # the first stays
        assert read_fence(wal_fs, "main-7") == fence
        with pytest.raises(WalFenced):
            await wal.append(RecordType.DATA, {"n": 2}, b"written, never acknowledged")
        assert isinstance(wal.failed, WalFenced)
        with pytest.raises(WalFenced):
            await wal.append(RecordType.DATA, {"n": 3}, b"refused")
    # What was acknowledged is there for the taker; the file beside the segments is no
    # segment (recovery and readers skip it).
    with WalReader(wal_fs, "main-7") as reader:
        got = list(reader.iter_records(reader.segments()[0], None))
    assert got[0].payload == b"acknowledged" and got[0].position == before
    reopened = await WalWriter.open(wal_fs, "main-7", no_retention())
    assert reopened.end_offset >= before.segment + before.position + before.length
    lift_fence(wal_fs, "main-7")
    lift_fence(wal_fs, "main-7")  # idempotent
    assert not wal_fs.exists(fence_path("main-7"))


async def test_without_fence_checks_the_file_changes_nothing(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "proxy-1", no_retention())
    async with running(wal):
        fence_writer(wal_fs, "proxy-1", 1, "test")
        await wal.append(RecordType.DATA, {"n": 1}, b"a proxy's WAL is never taken over")
        assert wal.failed is None


def test_an_unreadable_fence_still_fences(wal_fs: FS) -> None:
    wal_fs.makedirs("wal/main-9", recreate=True)
    wal_fs.writebytes(fence_path("main-9"), b"garbage")
    found = read_fence(wal_fs, "main-9")
    assert found is not None and found.by == -1 and "unreadable" in found.reason
