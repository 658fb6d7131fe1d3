"""Blocking readers of a writer's WAL: random access by position and tailing by offset.

Callers on the trio loop run these in worker threads; one WalReader may serve many threads.
"""

from __future__ import annotations

import bisect
import io
import logging
import threading
from collections import OrderedDict
from collections.abc import Generator, Iterable
from typing import Any

from shared_wal import storage
from shared_wal.io_hook import count_io
from shared_wal.record import (
    LENGTH,
    MIN_BODY,
    CorruptRecord,
    OffsetOutOfRange,
    SegmentNotFound,
    WalError,
    WalPosition,
    WalRecord,
    decode_body,
)
from shared_wal.scan import SegmentScan
from shared_wal.storage import FS

log = logging.getLogger("zonefleet.wal")

_MAX_HANDLES = 16
_MAX_RELISTS = 8
TAIL_READ_BYTES = 4 * 1024 * 1024


def _close_read_handle(f: Any) -> None:
    """Close a segment opened for reading. Its bytes were read and checked already, so a
    failing close (an NFS client unsure whether its CLOSE went through, say) costs nothing:
    logged, not raised into the read that succeeded."""
    try:
        f.close()
    except OSError as exc:
        log.info("closing a WAL segment opened for reading failed (ignored): %s", exc)


class _SegmentWindow(io.BytesIO):
    """Bytes read from a segment at byte ``base``, addressed by segment position, so that a
    SegmentScan can parse them as if reading the file."""

    def __init__(self, data: bytes, base: int) -> None:
        super().__init__(data)
        self._base = base

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            return super().seek(pos - self._base) + self._base
        return super().seek(pos, whence) + self._base


def list_writers(fs: FS) -> list[str]:
    """Writer ids that have a WAL directory on ``fs``."""
    return storage.list_writer_dirs(fs)


class _Handle:
    __slots__ = ("evicted", "f", "lock", "users")

    def __init__(self, f: Any) -> None:
        self.f = f
        self.lock = threading.Lock()  # only for files without a real fd (seek + read)
        self.users = 0
        self.evicted = False


class WalReader:
    """Reads one writer's segments. Thread-safe; keeps a few segment files open."""

    def __init__(self, fs: FS, writer_id: str) -> None:
        self.fs = fs
        self.writer_id = storage.check_writer_id(writer_id)
        self._handles: OrderedDict[int, _Handle] = OrderedDict()
        self._lock = threading.Lock()
        self._tail_segment: int | None = None  # where the last `tail` call ended

    # -- random access ---------------------------------------------------------------------

    def read_record(self, position: WalPosition) -> WalRecord:
        """Read and verify the record at ``position`` (blocking)."""
        if position.writer != self.writer_id:
            raise WalError(f"position for writer {position.writer!r} given to {self.writer_id!r}")
        where = f"WAL {self.writer_id}/{position.segment:020d}.wal at byte {position.position}"
        if position.length < LENGTH.size + MIN_BODY or position.position < 0:
            raise CorruptRecord(
                f"{where}: impossible record length {position.length}",
                segment=position.segment,
                position=position.position,
            )
        data = self._pread(position.segment, position.position, position.length)
        count_io(self.fs, "read", len(data))
        if len(data) < position.length:
            raise CorruptRecord(
                f"{where}: segment ends {position.length - len(data)} bytes before the record ends",
                segment=position.segment,
                position=position.position,
                torn=True,
            )
        (n,) = LENGTH.unpack_from(data, 0)
        if n + LENGTH.size != position.length:
            raise CorruptRecord(
                f"{where}: length field says {n + LENGTH.size} bytes, pointer says "
                f"{position.length}",
                segment=position.segment,
                position=position.position,
            )
        return decode_body(memoryview(data)[LENGTH.size :], position)

    def _pread(self, segment: int, position: int, n: int) -> bytes:
        for attempt in (0, 1):
            handle = self._acquire(segment)
            try:
                if storage.real_fileno(handle.f) is not None:
                    return storage.read_exact_at(handle.f, position, n)
                with handle.lock:
                    return storage.read_exact_at(handle.f, position, n)
            except OSError:
                # A stale cached handle (e.g. NFS after a delete): reopen once.
                self._evict(segment, handle)
                if attempt:
                    raise
            finally:
                self._release(handle)
        raise AssertionError("unreachable")

    def _acquire(self, segment: int) -> _Handle:
        with self._lock:
            handle = self._handles.get(segment)
            if handle is not None:
                self._handles.move_to_end(segment)
                handle.users += 1
                return handle
        path = storage.segment_path(self.writer_id, segment)
        try:
            f = storage.open_for_read(self.fs, path, buffered=False)
        except storage.ResourceNotFound:
            raise SegmentNotFound(f"WAL segment {path} does not exist") from None
        with self._lock:
            existing = self._handles.get(segment)
            if existing is not None:  # another thread opened it meanwhile
                existing.users += 1
                _close_read_handle(f)
                return existing
            handle = _Handle(f)
            handle.users = 1
            self._handles[segment] = handle
            while len(self._handles) > _MAX_HANDLES:
                _, old = self._handles.popitem(last=False)
                old.evicted = True
                if old.users == 0:
                    _close_read_handle(old.f)
            return handle

    def _release(self, handle: _Handle) -> None:
        with self._lock:
            handle.users -= 1
            if handle.evicted and handle.users == 0:
                _close_read_handle(handle.f)

    def _evict(self, segment: int, handle: _Handle) -> None:
        with self._lock:
            if self._handles.get(segment) is handle:
                del self._handles[segment]
                handle.evicted = True

    def forget(self, segments: Iterable[int]) -> None:
        """Close cached handles of deleted segments (so their disk space is released)."""
        with self._lock:
            for segment in segments:
                handle = self._handles.pop(segment, None)
                if handle is not None:
                    handle.evicted = True
                    if handle.users == 0:
                        _close_read_handle(handle.f)

    def close(self) -> None:
        """Close cached segment files (handles in use close when their read finishes)."""
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
            for handle in handles:
                handle.evicted = True
                if handle.users == 0:
                    _close_read_handle(handle.f)

    def __enter__(self) -> WalReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tailing ---------------------------------------------------------------------------

    def tail(
        self, from_offset: int, end_offset: int, max_bytes: int = TAIL_READ_BYTES
    ) -> list[WalRecord]:
        """Records from ``from_offset`` up to the published ``end_offset``: about ``max_bytes``
        of them, and at least one when any is published. Blocking.

        A follower calls this on every published end. Within the segment the previous call
        ended in, it costs one read on a cached handle; `iter_records` lists the directory and
        opens the segment every time, which on NFS is four more round trips per call.
        """
        segment = self._tail_segment
        if segment is not None and segment <= from_offset < end_offset:
            start = from_offset - segment
            want = min(end_offset - from_offset, max_bytes)
            try:
                data = self._pread(segment, start, want)
            except SegmentNotFound:
                data = b""  # deleted by retention: iter_records below says what to do
            scan = SegmentScan(
                _SegmentWindow(data, start), self.writer_id, segment, start, start + len(data)
            )
            records = list(scan)
            count_io(self.fs, "scan", scan.stop - start)
            if scan.problem is not None and not scan.incomplete:
                raise scan.error()
            if records:
                # A short read means the segment is complete: the next call goes on in the
                # next one. An incomplete record at the end was cut by max_bytes.
                return records
        out: list[WalRecord] = []
        size = 0
        for record in self.iter_records(from_offset, end_offset):
            out.append(record)
            self._tail_segment = record.position.segment
            size += record.position.length
            if size >= max_bytes:
                break
        return out

    def segments(self) -> list[int]:
        return storage.list_segment_ids(self.fs, self.writer_id)

    def iter_records(
        self, from_offset: int = 0, end_offset: int | None = None
    ) -> Generator[WalRecord, None, None]:
        """Records from logical ``from_offset`` (a record boundary or a segment start) on.

        With ``end_offset`` (the end the writer published) no record extending past it is
        returned and any bad byte before it raises CorruptRecord. Without it (replaying a dead
        writer) the reader goes to the end of the newest segment, stops quietly at an incomplete
        record there, and treats other bad bytes like recovery does: it logs a WARNING and
        continues with the next segment. Raises OffsetOutOfRange if ``from_offset`` lies below
        the oldest retained segment.
        """
        offset = from_offset
        relists = 0
        while end_offset is None or offset < end_offset:
            segs = self.segments()
            i = bisect.bisect_right(segs, offset) - 1
            if i < 0:
                if segs or offset > 0:
                    first = segs[0] if segs else "none"
                    raise OffsetOutOfRange(
                        f"WAL {self.writer_id}: offset {offset} is below the oldest retained "
                        f"segment ({first})"
                    )
                return
            segment = segs[i]
            path = storage.segment_path(self.writer_id, segment)
            try:
                f = storage.open_for_read(self.fs, path, buffered=True)
            except storage.ResourceNotFound:
                relists += 1  # deleted between listing and opening
                if relists > _MAX_RELISTS:
                    raise SegmentNotFound(f"WAL segment {path} keeps disappearing") from None
                continue
            try:
                size = storage.file_size(f)
                limit = size if end_offset is None else min(size, end_offset - segment)
                scan = SegmentScan(f, self.writer_id, segment, offset - segment, limit)
                start = scan.stop
                try:
                    for record in scan:
                        offset = record.position.end_offset
                        yield record
                finally:
                    count_io(self.fs, "scan", scan.stop - start)
            finally:
                _close_read_handle(f)
            if scan.problem is not None:
                cut_by_end = end_offset is not None and limit < size
                if scan.incomplete and cut_by_end:
                    return  # the next record is not published yet
                if end_offset is not None:
                    raise scan.error()
                later = segs[i + 1 :]
                if scan.incomplete and not later:
                    return  # the newest segment's tail may still be being written
                log.warning(
                    "WAL %s: %s at byte %d: %s; %s",
                    self.writer_id,
                    path,
                    scan.stop,
                    scan.problem,
                    "skipping to the next segment" if later else "stopping",
                )
                if not later:
                    return
                offset = later[0]
                continue
            offset = segment + scan.stop
            if end_offset is not None and offset >= end_offset:
                return
            later = [s for s in self.segments() if s > segment]
            if not later:
                return
            if later[0] < offset:
                raise CorruptRecord(
                    f"WAL {self.writer_id}: segment {later[0]} starts inside segment {segment}",
                    segment=segment,
                    position=scan.stop,
                )
            offset = later[0]
