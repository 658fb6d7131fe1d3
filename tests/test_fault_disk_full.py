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
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from shared_wal import RecordType, WalConfig, WalReader, WalWriter, open_wal_fs, storage
from shared_wal.scan import SegmentScan
from tests.fault_helpers import ContinuousProducer, probe_produce, strip, until
from tests.ports import free_port
from tests.wal_helpers import running
from tests.zone_fleet import check_exactly_once_in_order, consume_confluent

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


# -- a lone main, real clients ----------------------------------------------------------------


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(30)


async def test_lone_main_survives_a_full_wal_file_system(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_tmpfs(tmp_path / "wal") as wal_root:
        config = BrokerConfig(
            node_id=1,
            zone="az1",
            wal_url=f"osfs://{wal_root}",
            port=free_port(),
            wal=WalConfig(segment_bytes=4 * 1024 * 1024),
        )
        broker = MainBroker(config)
        filler = wal_root / "filler"
        caplog.set_level(logging.INFO)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(broker.run)
            bootstrap = f"127.0.0.1:{port}"
            await trio.to_thread.run_sync(create_topics, bootstrap, "t", "probe")
            producer = ContinuousProducer(bootstrap, "t", "df").start()
            try:
                await until(lambda: producer.acked >= 500, "acknowledged before the fault")
                await trio.to_thread.run_sync(fill, filler)
                wal = broker.store.wal
                await until(lambda: wal.stalled is not None, "the WAL stalls")
                stalled_at = time.monotonic()
                acked_at_stall = producer.acked
                # New produce: the retriable KAFKA_STORAGE_ERROR, answered at once.
                err = await trio.to_thread.run_sync(probe_produce, bootstrap, "probe")
                # KAFKA_STORAGE_ERROR is retriable in Kafka's protocol (KafkaStorageException
                # is an InvalidMetadataException): a client with retries left retries it.
                assert err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR, err
                assert not broker.storage_failed and wal.failed is None
                # No corrupt segment: every record checks; only an unacknowledged tail (a
                # partial group) may follow the durable end.
                durable = wal.end_offset
                await trio.to_thread.run_sync(
                    check_segments, wal_root, config.wal_writer_id, durable
                )
                assert producer.acked - acked_at_stall <= 1000  # nothing more gets through
                # Space returns: the held group is written, produce resumes by itself.
                filler.unlink()
                recovered_s = await until(lambda: wal.stalled is None, "the WAL writes again")
                await until(lambda: producer.acked >= acked_at_stall + 1000, "produce resumes")
                resumed_s = time.monotonic() - stalled_at
                assert await trio.to_thread.run_sync(probe_produce, bootstrap, "probe") is None
            finally:
                await trio.to_thread.run_sync(producer.stop)
            assert producer.flushed == 0 and producer.errors == []
            assert producer.acked == producer.sent
            records = await trio.to_thread.run_sync(
                consume_confluent, bootstrap, "az1", "t", 1, producer.sent
            )
            check_exactly_once_in_order(strip(records), producer.sent, "df")
            await trio.to_thread.run_sync(
                check_segments, wal_root, config.wal_writer_id, broker.store.wal.end_offset
            )
            nursery.cancel_scope.cancel()
        stalls = [r for r in caplog.records if "holding it and writing it again" in r.getMessage()]
        assert len(stalls) == 1, [r.getMessage() for r in stalls]
        tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("zonefleet")]
        assert not tracebacks, [r.getMessage() for r in tracebacks]
        print(
            f"disk full: stalled with {acked_at_stall} acknowledged; writing again "
            f"{recovered_s:.2f} s after the filler went, produce resumed "
            f"{resumed_s:.1f} s after the stall began; {producer.sent} records read back"
        )
