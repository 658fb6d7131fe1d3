"""WalReader: tailing across segments up to a published end, random access, deleted segments."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import trio

from shared_wal import (
    CorruptRecord,
    OffsetOutOfRange,
    RecordType,
    SegmentNotFound,
    WalError,
    WalPosition,
    WalReader,
    WalWriter,
    list_writers,
    storage,
)
from shared_wal.storage import FS, segment_path
from tests import wal_helpers
from tests.wal_helpers import no_retention, running

wal_fs = wal_helpers.wal_fs


async def write_log(fs: FS, n: int, writer: str = "w1") -> tuple[WalWriter, list[WalPosition]]:
    config = no_retention(segment_bytes=500)
    return await wal_helpers.write_log(
        fs, n, lambda i: b"%03d" % i * 30, writer=writer, config=config
    )


async def test_tail_across_segments_stops_at_end_offset(wal_fs: FS) -> None:
    wal, positions = await write_log(wal_fs, 20)
    assert len(wal.segments()) >= 5
    with WalReader(wal_fs, "w1") as reader:
        everything = list(reader.iter_records(0, wal.end_offset))
        assert [r.position for r in everything] == positions
        assert all(bytes(r.payload) == b"%03d" % r.header["i"] * 30 for r in everything)

        # from a record boundary inside a segment, to an end in the middle of a later record
        start, stop = positions[3], positions[13]
        got = list(reader.iter_records(start.offset, stop.offset + 5))
        assert [r.position for r in got] == positions[3:13]

        # an end exactly at a segment boundary
        boundary = wal.segments()[2]
        got = list(reader.iter_records(0, boundary))
        assert got[-1].position.end_offset == boundary
        assert [r.position for r in got] == [p for p in positions if p.end_offset <= boundary]

        # starting at a segment start, and at the published end (nothing to read)
        seg = wal.segments()[1]
        assert reader.iter_records(seg, wal.end_offset).__next__().position.offset == seg
        assert list(reader.iter_records(wal.end_offset, wal.end_offset)) == []
        # without an end: to the end of the newest segment
        assert [r.position for r in reader.iter_records(positions[18].offset)] == positions[18:]


async def test_tail_never_passes_the_published_end_while_writing(wal_fs: FS) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention(segment_bytes=400))
    reader = WalReader(wal_fs, "w1")
    seen: list[int] = []
    offset = 0

    def read_range(start: int, end: int) -> list[Any]:
        return list(reader.iter_records(start, end))

    async with running(wal):
        for i in range(30):
            wal.submit(RecordType.DATA, {"i": i}, b"p" * 40)
            if i % 3 == 2:
                await trio.sleep(0)
            published = wal.end_offset
            batch = await trio.to_thread.run_sync(read_range, offset, published)
            for r in batch:
                assert r.position.end_offset <= published
                seen.append(r.header["i"])
                offset = r.position.end_offset
    seen.extend(r.header["i"] for r in reader.iter_records(offset, wal.end_offset))
    assert seen == list(range(30))
    reader.close()


async def test_tail_follows_a_growing_log_across_segments_with_few_listings(
    wal_fs: FS, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention(segment_bytes=400))
    reader = WalReader(wal_fs, "w1")
    listings = 0
    real_segments = reader.segments

    def counted_segments() -> list[int]:
        nonlocal listings
        listings += 1
        return real_segments()

    monkeypatch.setattr(reader, "segments", counted_segments)
    seen: list[int] = []
    offset = 0
    calls = 0
    async with running(wal):
        for i in range(60):
            await wal.append(RecordType.DATA, {"i": i}, b"p" * 40)
            published = wal.end_offset
            batch = await trio.to_thread.run_sync(reader.tail, offset, published)
            calls += 1
            for r in batch:
                assert r.position.end_offset <= published
                seen.append(r.header["i"])
                offset = r.position.end_offset
    assert seen == list(range(60))
    segments = len(wal.segments())
    assert segments >= 6
    # Listing happens when a segment is done, not on every call.
    assert listings <= 3 * segments < calls
    reader.close()


async def test_tail_bounds_a_read_but_returns_at_least_one_record(wal_fs: FS) -> None:
    wal, positions = await write_log(wal_fs, 20)
    with WalReader(wal_fs, "w1") as reader:
        first = reader.tail(0, wal.end_offset, max_bytes=1)
        assert [r.position for r in first] == positions[:1]
        got = list(first)
        while got[-1].position.end_offset < wal.end_offset:
            more = reader.tail(got[-1].position.end_offset, wal.end_offset, max_bytes=250)
            assert more and sum(r.position.length for r in more) <= 250 + more[-1].position.length
            got += more
        assert [r.position for r in got] == positions
        assert reader.tail(wal.end_offset, wal.end_offset) == []


async def test_tail_reports_corruption_and_deleted_segments(wal_fs: FS) -> None:
    wal, positions = await write_log(wal_fs, 20)
    with WalReader(wal_fs, "w1") as reader:
        assert [r.position for r in reader.tail(0, positions[2].end_offset)] == positions[:3]
        target = positions[4]
        path = segment_path("w1", target.segment)
        raw = bytearray(wal_fs.readbytes(path))
        raw[target.position + 9] ^= 0xFF  # inside the record body: its CRC no longer matches
        wal_fs.writebytes(path, bytes(raw))
        reader.forget([target.segment])
        offset = positions[3].offset
        with pytest.raises(CorruptRecord, match="byte"):
            for _ in range(len(positions)):
                got = reader.tail(offset, wal.end_offset)
                assert all(r.position.end_offset <= target.offset for r in got)
                offset = got[-1].position.end_offset
    wal.config.retention_bytes = 600
    assert await wal.enforce_retention()
    with WalReader(wal_fs, "w1") as reader, pytest.raises(OffsetOutOfRange):
        reader.tail(0, wal.end_offset)


async def test_deleted_segments(wal_fs: FS) -> None:
    wal, positions = await write_log(wal_fs, 20)
    segs = wal.segments()
    wal.config.retention_bytes = 1200
    deleted = await wal.enforce_retention()
    assert deleted and deleted == segs[: len(deleted)]
    with WalReader(wal_fs, "w1") as reader:
        with pytest.raises(OffsetOutOfRange, match="below the oldest"):
            list(reader.iter_records(0, wal.end_offset))
        kept = [p for p in positions if p.segment >= wal.start_offset]
        assert [r.position for r in reader.iter_records(wal.start_offset)] == kept
        with pytest.raises(SegmentNotFound):
            reader.read_record(positions[0])


async def test_read_record_checks_crc_and_pointer(wal_fs: FS) -> None:
    _, positions = await write_log(wal_fs, 3)
    target = positions[1]
    path = f"wal/w1/{target.segment:020d}.wal"
    with WalReader(wal_fs, "w1") as reader:
        record = reader.read_record(target)
        assert record.header == {"i": 1}
        assert record.payload.readonly
        with pytest.raises(CorruptRecord, match="length field says"):
            reader.read_record(WalPosition("w1", target.segment, target.position, 30))
        with pytest.raises(WalError, match="writer"):
            reader.read_record(WalPosition("w2", target.segment, target.position, target.length))
        beyond = WalPosition("w1", target.segment, 10_000, target.length)
        with pytest.raises(CorruptRecord, match="segment ends"):
            reader.read_record(beyond)

    data = bytearray(wal_fs.readbytes(path))
    data[target.position + target.length - 1] ^= 0x01
    wal_fs.writebytes(path, bytes(data))
    with WalReader(wal_fs, "w1") as reader:
        with pytest.raises(CorruptRecord, match=r"00000000000000000000\.wal at byte \d+: CRC") as e:
            reader.read_record(target)
        assert e.value.position == target.position
        # a bounded tail read over the bad record raises too
        with pytest.raises(CorruptRecord, match="CRC"):
            list(reader.iter_records(0, positions[-1].end_offset))


async def test_unbounded_tail_of_a_dead_writer_tolerates_bad_bytes(
    wal_fs: FS, caplog: pytest.LogCaptureFixture
) -> None:
    wal, positions = await write_log(wal_fs, 20)
    segs = wal.segments()
    last = f"wal/w1/{segs[-1]:020d}.wal"
    wal_fs.appendbytes(last, b"\x00\x00\x01\x00partial")
    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"), WalReader(wal_fs, "w1") as r:
        assert [rec.position for rec in r.iter_records(0)] == positions
    assert not caplog.records  # an incomplete newest record is just not written yet

    # a corrupt record in a sealed segment: warn, skip the rest of it, go on with the next
    sealed = f"wal/w1/{segs[1]:020d}.wal"
    data = bytearray(wal_fs.readbytes(sealed))
    data[-1] ^= 0x01
    wal_fs.writebytes(sealed, bytes(data))
    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"), WalReader(wal_fs, "w1") as r:
        got = [rec.position for rec in r.iter_records(0)]
    lost = [p for p in positions if p.segment == segs[1]][-1]
    assert got == [p for p in positions if p != lost]
    assert sealed in caplog.text
    assert "skipping to the next segment" in caplog.text


async def test_forget_closes_cached_handles(wal_fs: FS) -> None:
    wal, positions = await write_log(wal_fs, 20)
    with WalReader(wal_fs, "w1") as reader:
        assert reader.read_record(positions[0]).header == {"i": 0}
        wal.config.retention_bytes = 0
        deleted = await wal.enforce_retention()
        assert positions[0].segment in deleted
        reader.forget(deleted)
        with pytest.raises(SegmentNotFound):
            reader.read_record(positions[0])


async def test_concurrent_random_reads_from_threads(wal_fs: FS) -> None:
    _, positions = await write_log(wal_fs, 40)
    with WalReader(wal_fs, "w1") as reader:

        def read(p: WalPosition) -> int:
            record = reader.read_record(p)
            assert bytes(record.payload) == b"%03d" % record.header["i"] * 30
            return int(record.header["i"])

        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(read, positions * 5))
    assert got == list(range(40)) * 5


async def test_list_writers(wal_fs: FS) -> None:
    assert list_writers(wal_fs) == []
    await write_log(wal_fs, 1, "main-a")
    await write_log(wal_fs, 1, "proxy-b")
    assert list_writers(wal_fs) == ["main-a", "proxy-b"]


async def test_a_failing_close_of_a_read_handle_does_not_fail_the_read(
    wal_fs: FS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nfs-rs can report a CLOSE whose outcome it is unsure of; the bytes were read and checked.
    wal, positions = await write_log(wal_fs, 20)
    real_open = storage.open_for_read

    class CloseFails:
        def __init__(self, f: Any) -> None:
            self._f = f

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def close(self) -> None:
            self._f.close()
            raise OSError("NFS I/O failed: Uncertain NFS operation")

    monkeypatch.setattr(
        storage,
        "open_for_read",
        lambda fs, path, buffered: CloseFails(real_open(fs, path, buffered=buffered)),
    )
    with WalReader(wal_fs, "w1") as reader:
        assert [r.position for r in reader.iter_records(0, wal.end_offset)] == positions
        assert reader.read_record(positions[3]).header["i"] == 3
        reader.forget(wal.segments())
