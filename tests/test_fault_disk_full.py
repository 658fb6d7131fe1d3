"""The WAL's file system fills up (issue 14): a clean retriable error, no corrupt segment, and
recovery once space returns, without restarting anything.

The WAL lives on a small tmpfs mounted for the test (root only; skipped, saying why,
elsewhere). A filler file takes the free space; the writer's group write fails with ENOSPC,
the writer holds the group (truncating any partial write back to the group's start) and
writes it again once the filler is gone; meanwhile the main answers new produce with the
retriable KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from shared_wal import RecordType, WalConfig, WalReader, WalWriter, open_wal_fs, storage
from shared_wal.scan import SegmentScan
from tests.wal_helpers import running

TMPFS_BYTES = 32 * 1024 * 1024


@contextlib.contextmanager
def small_tmpfs(path: Path, size: int = TMPFS_BYTES) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for the WAL needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (no CAP_SYS_ADMIN?): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> int:
    """Write a filler file until the file system is full; returns its size."""
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        with contextlib.suppress(OSError):
            while True:  # the last few KB
                written += f.write(b"\0" * 512)
    return written


def check_segments(wal_root: Path, writer_id: str, durable_end: int) -> int:
    """Every record of every segment has a good CRC; whatever is not a whole record lies at
    or after `durable_end` (never acknowledged). Returns the number of records."""
    fs = open_wal_fs(f"osfs://{wal_root}")
    count = 0
    try:
        for segment in storage.list_segment_ids(fs, writer_id):
            with storage.open_for_read(
                fs, storage.segment_path(writer_id, segment), buffered=True
            ) as f:
                size = storage.file_size(f)
                scan = SegmentScan(f, writer_id, segment, 0, size)
                count += sum(1 for _ in scan)
                if scan.problem is not None:
                    assert scan.incomplete, f"corrupt segment {segment}: {scan.problem}"
                    assert segment + scan.stop >= durable_end, (segment, scan.stop, durable_end)
    finally:
        fs.close()
    return count


# -- the writer alone ---------------------------------------------------------------------


async def test_writer_holds_a_group_on_enospc_and_writes_it_once_space_returns(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "mnt", 4 * 1024 * 1024) as mnt:
        fs = open_wal_fs(f"osfs://{mnt}")
        wal = await WalWriter.open(fs, "w1", WalConfig(retention_ms=None))
        async with running(wal):
            first = [await wal.append(RecordType.DATA, {"i": i}, b"x" * 1000) for i in range(10)]
            filler = mnt / "filler"
            await trio.to_thread.run_sync(fill, filler)
            # Larger than what is left, so a partial group may be written before ENOSPC.
            tickets = [
                wal.submit(RecordType.DATA, {"i": 10 + i}, bytes([i]) * 64 * 1024) for i in range(8)
            ]
            with trio.fail_after(10):
                while wal.stalled is None:
                    await trio.sleep(0.01)
            assert wal.failed is None and wal.full
            assert not any(t.done for t in tickets)
            assert isinstance(wal.stalled.__cause__, OSError)
            assert wal.stalled.__cause__.errno == errno.ENOSPC
            end = wal.end_offset
            assert check_segments(mnt, "w1", end) >= 10
            filler.unlink()
            with trio.fail_after(10):
                positions = [await t.wait() for t in tickets]
            assert wal.stalled is None and not wal.full and wal.failed is None
            more = await wal.append(RecordType.DATA, {"i": 18}, b"y")
        assert positions[0].segment + positions[0].position == end
        with WalReader(fs, "w1") as reader:
            got = list(reader.iter_records(0, wal.end_offset))
        assert [r.header["i"] for r in got] == list(range(19))
        assert [r.position for r in got] == [*first, *positions, more]
        assert check_segments(mnt, "w1", wal.end_offset) == 19
        fs.close()


async def test_fsync_errors_stay_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fs = open_wal_fs(f"osfs://{tmp_path}")
    wal = await WalWriter.open(fs, "w1", WalConfig(retention_ms=None))

    def failing_sync(f: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # ext4 delayed allocation

    async with running(wal):
        await wal.append(RecordType.DATA, {"i": 0}, b"x")
        monkeypatch.setattr(storage, "sync_file", failing_sync)
        ticket = wal.submit(RecordType.DATA, {"i": 1}, b"y")
        with pytest.raises(Exception, match="fsync"):
            await ticket.wait()
        assert wal.failed is not None and wal.stalled is None
    fs.close()


async def test_closing_while_a_group_is_held_fails_its_tickets(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", 1024 * 1024) as mnt:
        fs = open_wal_fs(f"osfs://{mnt}")
        wal = await WalWriter.open(fs, "w1", WalConfig(retention_ms=None))
        async with trio.open_nursery() as nursery:
            await nursery.start(wal.run)
            await wal.append(RecordType.DATA, {"i": 0}, b"x")
            await trio.to_thread.run_sync(fill, mnt / "filler")
            ticket = wal.submit(RecordType.DATA, {"i": 1}, b"y" * 100_000)
            with trio.fail_after(10):
                while wal.stalled is None:
                    await trio.sleep(0.01)
                await wal.aclose()
            assert ticket.done
            with pytest.raises(Exception, match="closed while retrying"):
                await ticket.wait()
        fs.close()
