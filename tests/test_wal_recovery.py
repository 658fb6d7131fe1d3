"""Crash recovery: torn tails, bad CRCs and garbage are truncated and logged, never fatal."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest

from shared_wal import RecordType, WalPosition, WalReader, WalWriter
from shared_wal.storage import FS
from tests import wal_helpers
from tests.wal_helpers import no_retention, running

wal_fs = wal_helpers.wal_fs

SEG0 = "wal/w1/00000000000000000000.wal"


async def write_records(fs: FS, n: int, **kw: Any) -> list[WalPosition]:
    _, positions = await wal_helpers.write_log(
        fs, n, lambda i: bytes([i]) * (50 + i), config=no_retention(**kw)
    )
    return positions


async def reopen_and_check(
    fs: FS, survivors: list[WalPosition], caplog: pytest.LogCaptureFixture, cut: int
) -> None:
    """Reopen after damage: replay = survivors, WARNING logged, appends land at ``cut``."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"):
        wal = await WalWriter.open(fs, "w1", no_retention())
    warnings = [r for r in caplog.records if r.name == "zonefleet.wal"]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    message = warnings[0].getMessage()
    assert SEG0 in message
    assert f"truncating at byte {cut}" in message

    replayed = list(wal.replay())
    assert [r.position for r in replayed] == survivors
    assert [r.header["i"] for r in replayed] == list(range(len(survivors)))
    assert fs.getsize(SEG0) == cut
    assert wal.end_offset == cut

    async with running(wal):
        new = await wal.append(RecordType.CONTROL, {"k": "after"}, b"fresh")
    assert new.offset == cut
    with WalReader(fs, "w1") as reader:
        assert bytes(reader.read_record(new).payload) == b"fresh"
        everything = list(reader.iter_records(0, wal.end_offset))
    assert [r.position for r in everything] == [*survivors, new]


async def test_clean_log_recovers_silently(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    positions = await write_records(wal_fs, 5)
    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"):
        wal = await WalWriter.open(wal_fs, "w1", no_retention())
    assert not caplog.records
    assert [r.position for r in wal.replay()] == positions
    assert wal.end_offset == positions[-1].end_offset
    await wal.aclose()


async def test_torn_tail_is_truncated(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    positions = await write_records(wal_fs, 6)
    last = positions[-1]
    data = wal_fs.readbytes(SEG0)
    wal_fs.writebytes(SEG0, data[: last.position + last.length // 2])
    await reopen_and_check(wal_fs, positions[:-1], caplog, last.position)


async def test_torn_inside_length_field(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    positions = await write_records(wal_fs, 3)
    last = positions[-1]
    wal_fs.writebytes(SEG0, wal_fs.readbytes(SEG0)[: last.position + 2])
    await reopen_and_check(wal_fs, positions[:-1], caplog, last.position)


async def test_bad_crc_in_last_record(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    positions = await write_records(wal_fs, 6)
    last = positions[-1]
    data = bytearray(wal_fs.readbytes(SEG0))
    data[last.end_offset - 3] ^= 0x10  # a payload byte
    wal_fs.writebytes(SEG0, bytes(data))
    await reopen_and_check(wal_fs, positions[:-1], caplog, last.position)
    assert "CRC mismatch" in caplog.text


async def test_garbage_appended(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    positions = await write_records(wal_fs, 4)
    end = positions[-1].end_offset
    wal_fs.appendbytes(SEG0, b"\xde\xad\xbe\xef" * 10)
    await reopen_and_check(wal_fs, positions, caplog, end)


async def test_huge_length_field_does_not_allocate(
    wal_fs: FS, caplog: pytest.LogCaptureFixture
) -> None:
    positions = await write_records(wal_fs, 2)
    end = positions[-1].end_offset
    wal_fs.appendbytes(SEG0, struct.pack(">I", 0xFFFFFFF0) + b"\x00" * 20)
    await reopen_and_check(wal_fs, positions, caplog, end)
    assert "runs past" in caplog.text


async def test_zeroed_tail(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    # What a crash after a size update but before the data reached the disk can leave behind.
    positions = await write_records(wal_fs, 3)
    end = positions[-1].end_offset
    wal_fs.appendbytes(SEG0, b"\x00" * 4096)
    await reopen_and_check(wal_fs, positions, caplog, end)
    assert "impossible record length 0" in caplog.text


async def test_corrupt_sealed_segment_keeps_later_segments(
    wal_fs: FS, caplog: pytest.LogCaptureFixture
) -> None:
    positions = await write_records(wal_fs, 12, segment_bytes=300)
    segs = sorted({p.segment for p in positions})
    assert len(segs) >= 3
    victim = segs[1]
    in_victim = [p for p in positions if p.segment == victim]
    assert len(in_victim) >= 2
    bad = in_victim[1]
    path = f"wal/w1/{victim:020d}.wal"
    data = bytearray(wal_fs.readbytes(path))
    data[bad.position + 9] ^= 0xFF  # the type byte, covered by the CRC
    wal_fs.writebytes(path, bytes(data))

    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"):
        wal = await WalWriter.open(wal_fs, "w1", no_retention(segment_bytes=300))
    assert path in caplog.text
    assert f"truncating at byte {bad.position}" in caplog.text
    expected = [p for p in positions if p.segment != victim or p.position < bad.position]
    assert [r.position for r in wal.replay()] == expected
    assert wal_fs.getsize(path) == bad.position
    assert wal.segments() == segs
    # the log has a hole where the truncated bytes were; new appends go after the last segment
    async with running(wal):
        new = await wal.append(RecordType.DATA, {"i": 99}, b"new")
    assert new.offset == positions[-1].end_offset
    with WalReader(wal_fs, "w1") as reader:
        assert [r.position for r in reader.iter_records(0, wal.end_offset)] == [*expected, new]


async def test_segment_truncated_to_empty_gets_a_snapshot(
    wal_fs: FS, caplog: pytest.LogCaptureFixture
) -> None:
    wal = await WalWriter.open(wal_fs, "w1", no_retention(), lambda: ({"k": "snap"}, b"s"))
    async with running(wal):
        await wal.append(RecordType.DATA, {"i": 0}, b"x")
    data = bytearray(wal_fs.readbytes(SEG0))
    data[10] ^= 1  # inside the first record (the SNAPSHOT)
    wal_fs.writebytes(SEG0, bytes(data))
    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"):
        wal = await WalWriter.open(wal_fs, "w1", no_retention(), lambda: ({"k": "snap2"}, b""))
    assert "truncating at byte 0" in caplog.text
    assert list(wal.replay()) == []
    assert wal.segments() == [0]
    async with running(wal):
        pos = await wal.append(RecordType.DATA, {"i": 1}, b"y")
    with WalReader(wal_fs, "w1") as reader:
        got = list(reader.iter_records(0, wal.end_offset))
    assert [r.header for r in got] == [{"k": "snap2"}, {"i": 1}]
    assert got[1].position == pos


async def test_stray_files_are_ignored(wal_fs: FS, caplog: pytest.LogCaptureFixture) -> None:
    positions = await write_records(wal_fs, 2)
    wal_fs.writebytes("wal/w1/notes.txt", b"not a segment")
    wal_fs.writebytes("wal/w1/123.wal", b"bad name")
    with caplog.at_level(logging.WARNING, logger="zonefleet.wal"):
        wal = await WalWriter.open(wal_fs, "w1", no_retention())
    assert not caplog.records
    assert [r.position for r in wal.replay()] == positions
    await wal.aclose()
