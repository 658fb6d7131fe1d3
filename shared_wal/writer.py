"""The WAL writer: synchronous submits, one group commit (one write + one fsync) at a time."""

from __future__ import annotations

import errno
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import trio

from shared_wal import storage
from shared_wal.fence import WalFenced, fence_path, read_fence
from shared_wal.io_hook import count_io
from shared_wal.reader import WalReader
from shared_wal.record import (
    OVERHEAD,
    Buffer,
    RecordType,
    WalError,
    WalPosition,
    WalRecord,
    byte_view,
    encode_prefix,
    pack_header,
)
from shared_wal.recovery import recover
from shared_wal.retention import prepared_segments_to_delete, segments_to_delete
from shared_wal.storage import FS
from telemetry.pause_points import pause_point

log = logging.getLogger("zonefleet.wal")

SnapshotProvider = Callable[[], tuple[dict[str, Any], bytes]]

#: Write errors after which the group is held and written again (from its start, the partial
#: tail cut off) once the file system lets it: out of space or quota, or a remote file system
#: (nfs://) unreachable past its own reconnect attempts (shared_wal/nfs_fs.py).
RETRIABLE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOTCONN,
        errno.ETIMEDOUT,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.EHOSTUNREACH,
    }
)
RETRY_MIN_S = 0.05  # first wait before writing a held group again (doubling)
RETRY_MAX_S = 1.0  # longest wait between attempts
STALL_REMINDER_S = 60.0  # a held group is logged again at this interval, one line each


class _SyncFailed(Exception):
    """An fsync (of a segment or of the WAL directory) failed: never retried. After a failed
    fsync the kernel may have dropped the dirty pages and marked them clean, so a later fsync
    can succeed without the data ever reaching the disk (PostgreSQL's "fsyncgate", 2018): the
    only safe answer is to stop acknowledging and let recovery re-read the disk at restart."""


def _retriable(exc: BaseException) -> bool:
    """Whether a failed group write may be held and written again: an error of the write
    stage (open, truncate, write; never fsync) with an errno of RETRIABLE_ERRNOS."""
    if isinstance(exc, WalFenced | _SyncFailed):
        return False
    if isinstance(exc, storage.InsufficientStorage | storage.RemoteConnectionError):
        return True  # pyfilesystem's names for these errors (opening or creating a segment)
    cause = getattr(exc, "exc", None)  # the OSError a pyfilesystem error wraps
    if not isinstance(exc, OSError) and isinstance(cause, OSError):
        exc = cause
    return isinstance(exc, OSError) and exc.errno in RETRIABLE_ERRNOS


@dataclass
class WalConfig:
    segment_bytes: int = 64 * 1024 * 1024  # roll when a segment would pass this
    retention_bytes: int | None = None  # delete oldest sealed segments beyond this total
    retention_ms: int | None = 7 * 24 * 3600 * 1000  # delete sealed segments older than this
    max_group_bytes: int = 8 * 1024 * 1024  # cap on one group commit's write
    retention_interval_s: float = 5.0  # how often run() applies retention
    # Cap on the writer's retained bytes (sealed and active segments plus queued records);
    # owners refuse new data with a retriable error while `WalWriter.full` (None: no cap).
    max_bytes: int | None = None


@dataclass(frozen=True)
class PreparedTrim:
    """Retention of a proxy's PREPARED segments (shared_wal.retention.prepared_segments_to_delete):
    what `floor()` (the mains' links floor, and whether every main reported it) frees once
    sealed `min_age_s`, or, while some main has not reported, once sealed `max_age_s`.
    Replaces the byte and time budgets of `WalConfig` and `WalWriter.retention_floor` for the
    writer it is set on."""

    floor: Callable[[], tuple[int, bool]]
    min_age_s: float
    max_age_s: float | None


class AppendTicket:
    """One submitted record; resolves once the group holding it is durable."""

    __slots__ = (
        "_error",
        "_event",
        "_position",
        "header_bytes",
        "nbytes",
        "on_durable",
        "payload",
        "type",
    )

    def __init__(
        self,
        rtype: RecordType,
        header_bytes: bytes,
        payload: memoryview,
        on_durable: Callable[[], None] | None = None,
    ) -> None:
        self.type = rtype
        self.header_bytes = header_bytes
        self.payload = payload
        self.nbytes = OVERHEAD + len(header_bytes) + payload.nbytes
        # Run by the writer as the record becomes durable, before it takes the next group:
        # so the snapshot opening the next segment already holds the record's effect (a waiter
        # woken by the ticket may run only after that snapshot, and once the segment holding
        # the record is trimmed the effect would be gone).
        self.on_durable = on_durable
        self._event = trio.Event()
        self._position: WalPosition | None = None
        self._error: WalError | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    @property
    def position(self) -> WalPosition | None:
        """Where the record lies, once durable (set before `on_durable` runs)."""
        return self._position

    async def wait(self) -> WalPosition:
        """The record's position once durable; WalError if its group failed."""
        await self._event.wait()
        if self._error is not None:
            # A fence stays recognisable: the broker stops rather than retrying.
            kind = WalFenced if isinstance(self._error, WalFenced) else WalError
            raise kind(str(self._error)) from self._error
        assert self._position is not None
        return self._position

    def _resolve(self, position: WalPosition) -> None:
        self._position = position
        self.payload = memoryview(b"")  # let go of the caller's buffer
        if self.on_durable is not None:
            on_durable, self.on_durable = self.on_durable, None
            try:
                on_durable()
            except Exception:
                log.exception("applying a durable WAL record at %s failed", position)
        self._event.set()

    def _fail(self, error: WalError) -> None:
        self._error = error
        self.payload = memoryview(b"")
        self._event.set()


@dataclass
class _Group:
    tickets: list[AppendTicket]
    segment: int
    start: int  # byte position of the group's first record in `segment`
    new_segment: bool
    records: list[tuple[int, bytes, memoryview]]  # snapshot (if any) + the tickets' records
    nbytes: int


class WalWriter:
    """Appends to ``wal/<writer_id>/`` on ``fs``. Create with ``await WalWriter.open(...)``."""

    on_segments_deleted: Callable[[list[int]], None] | None
    #: Retention never deletes a segment with bytes at or beyond this offset (None: no floor).
    retention_floor: int | None
    #: Called after each durable group with (bytes, seconds spent writing and syncing).
    on_group_commit: Callable[[int, float], None] | None
    #: Set before run(): the writer holds a proxy's PREPARED records (see PreparedTrim).
    prepared_trim: PreparedTrim | None
    #: Look for a fence (shared_wal/fence.py) after every fsync: set where another node may
    #: take this writer's data over (a main of several).
    fence_check: bool

    def __init__(
        self,
        fs: FS,
        writer_id: str,
        config: WalConfig,
        snapshot_provider: SnapshotProvider | None,
        sizes: dict[int, int],
        mtimes: dict[int, float],
        limiter: trio.CapacityLimiter,
    ) -> None:
        self.fs = fs
        self.writer_id = writer_id
        self.config = config
        self.on_segments_deleted = None
        self.retention_floor = None
        self.on_group_commit = None
        self.prepared_trim = None
        self.fence_check = False
        self._fence_path = fence_path(writer_id)
        self._queued_bytes = 0
        self._was_full = False
        self._snapshot_provider = snapshot_provider
        self._dir = storage.wal_dir(writer_id)
        self._sizes = dict(sizes)
        self._last_write = dict(mtimes)
        self._active: int | None = next(reversed(self._sizes)) if self._sizes else None
        self._end = self._active + self._sizes[self._active] if self._active is not None else 0
        self._recovered_start = next(iter(self._sizes)) if self._sizes else 0
        self._recovered_end = self._end
        self._file: IO[bytes] | None = None
        self._limiter = limiter
        self._retention_limiter = trio.CapacityLimiter(1)
        self._retention_lock = trio.Lock()
        self._commit_lock = trio.Lock()
        self._queue: deque[AppendTicket] = deque()
        self._wakeup = trio.Event()
        self._failed: WalError | None = None
        # A group whose write failed with a retriable error, held until it is written; and why.
        self._held: _Group | None = None
        self._roll_requested = False
        self._stalled: WalError | None = None
        self._stalled_since = 0.0
        self._stall_logged = 0.0
        self._close_requested = trio.Event()
        self._closing = False
        self._closed = False
        self._running = False
        self._stopped = trio.Event()

    @classmethod
    async def open(
        cls,
        fs: FS,
        writer_id: str,
        config: WalConfig,
        snapshot_provider: SnapshotProvider | None = None,
    ) -> WalWriter:
        """Recover the writer's directory (truncating bad tails) and return a writer for it."""
        storage.check_writer_id(writer_id)
        limiter = trio.CapacityLimiter(1)
        recovered = await trio.to_thread.run_sync(recover, fs, writer_id, limiter=limiter)
        return cls(
            fs, writer_id, config, snapshot_provider, recovered.sizes, recovered.mtimes, limiter
        )

    # -- state -----------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """Logical offset just past the last durable record."""
        return self._end

    @property
    def start_offset(self) -> int:
        """Logical offset of the oldest retained segment."""
        return next(iter(self._sizes)) if self._sizes else self._end

    @property
    def failed(self) -> WalError | None:
        return self._failed

    @property
    def stalled(self) -> WalError | None:
        """Why the current group's write is being retried (the file system is full, or remote
        and unreachable); None while writes go through. Nothing is acknowledged meanwhile:
        the held group's tickets resolve once it is written (see `_commit_once`)."""
        return self._stalled

    @property
    def total_bytes(self) -> int:
        """Retained segment bytes plus records queued for the next group commits."""
        return sum(self._sizes.values()) + self._queued_bytes

    @property
    def full(self) -> bool:
        """At or over `WalConfig.max_bytes`: owners refuse new data until retention frees
        space (the cap is soft: submit itself never refuses, so one request may pass it).
        Also True while a group write is being retried (`stalled`): owners then refuse new
        data with the same retriable error. Logs when the writer fills up and when it has
        room again."""
        if self._stalled is not None:
            return True
        cap = self.config.max_bytes
        full = cap is not None and self.total_bytes >= cap
        if full != self._was_full:
            self._was_full = full
            if full:
                log.warning(
                    "WAL %s is full (%d bytes, cap %d): refusing new data until retention "
                    "frees segments",
                    self.writer_id,
                    self.total_bytes,
                    cap,
                )
            else:
                log.info("WAL %s has room again (%d bytes)", self.writer_id, self.total_bytes)
        return full

    def segments(self) -> list[int]:
        """Retained segment ids, oldest first (the last one is the active segment)."""
        return list(self._sizes)

    def replay(self) -> Iterator[WalRecord]:
        """The records that survived recovery, oldest first, read lazily (blocking reads)."""
        reader = WalReader(self.fs, self.writer_id)
        return reader.iter_records(self._recovered_start, self._recovered_end)

    # -- appending -------------------------------------------------------------------------

    def submit(
        self,
        type: RecordType,
        header: dict[str, Any],
        payload: Buffer = b"",
        on_durable: Callable[[], None] | None = None,
    ) -> AppendTicket:
        """Queue a record now (no checkpoint: submit order is log order) and return its ticket.

        The payload buffer is referenced, not copied: do not mutate it until the ticket is done.
        `on_durable` applies the record's effect to the state a snapshot reads (see
        AppendTicket), not run if the record fails.
        """
        if self._failed is not None:
            kind = WalFenced if isinstance(self._failed, WalFenced) else WalError
            raise kind(f"WAL writer {self.writer_id} has failed: {self._failed}")
        if self._closing:
            raise WalError(f"WAL writer {self.writer_id} is closed")
        ticket = AppendTicket(RecordType(type), pack_header(header), byte_view(payload), on_durable)
        if ticket.nbytes - 4 > 0xFFFFFFFF:
            raise WalError(f"WAL record of {ticket.nbytes} bytes is too large")
        self._queue.append(ticket)
        self._queued_bytes += ticket.nbytes
        self._wakeup.set()
        return ticket

    def roll_soon(self) -> None:
        """Start a new segment with the next group (when the active one holds records): its
        head SNAPSHOT holds the owner's state as of then, a point a reader of this WAL may
        start at (a takeover scans from the newest one below what it needs)."""
        self._roll_requested = True

    async def append(
        self,
        type: RecordType,
        header: dict[str, Any],
        payload: Buffer = b"",
        on_durable: Callable[[], None] | None = None,
    ) -> WalPosition:
        return await self.submit(type, header, payload, on_durable).wait()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The group-commit loop (and periodic retention); returns after ``aclose()``."""
        if self._running or self._closed:
            raise RuntimeError("WalWriter.run() is already running or the writer is closed")
        self._running = True
        self._stopped = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                cfg = self.config
                if (
                    cfg.retention_bytes is not None
                    or cfg.retention_ms is not None
                    or self.prepared_trim is not None
                ):
                    nursery.start_soon(self._retention_loop)
                task_status.started()
                await self._commit_loop()
                nursery.cancel_scope.cancel()
        finally:
            self._running = False
            self._stopped.set()

    async def _commit_loop(self) -> None:
        while True:
            if (self._queue or self._held is not None) and self._failed is None:
                async with self._commit_lock:
                    await self._commit_once()
                continue
            if self._closing:
                return
            self._wakeup = trio.Event()
            await self._wakeup.wait()

    async def aclose(self) -> None:
        """Stop accepting submits, make what is queued durable, close the active segment."""
        if self._closed:
            return
        self._closing = True
        self._close_requested.set()
        self._wakeup.set()
        if self._running:
            await self._stopped.wait()
        async with self._commit_lock:
            # run() was never started or was cancelled: flush here.
            while (self._queue or self._held is not None) and self._failed is None:
                await self._commit_once()
            self._fail_queued(WalError(f"WAL writer {self.writer_id} closed"))
            self._closed = True
            if self._file is not None:
                f, self._file = self._file, None
                await trio.to_thread.run_sync(f.close, limiter=self._limiter)

    # -- group commit ----------------------------------------------------------------------

    def _take_group(self) -> _Group | None:
        tickets: list[AppendTicket] = []
        nbytes = 0
        while self._queue:
            ticket = self._queue[0]
            if tickets and nbytes + ticket.nbytes > self.config.max_group_bytes:
                break
            tickets.append(self._queue.popleft())
            nbytes += ticket.nbytes
        self._queued_bytes -= nbytes
        segment = self._active
        size = self._sizes[segment] if segment is not None else 0
        new_segment = segment is None or (
            size > 0 and (self._roll_requested or size + nbytes > self.config.segment_bytes)
        )
        if new_segment:
            segment, size = self._end, 0
            self._roll_requested = False
        assert segment is not None
        records: list[tuple[int, bytes, memoryview]] = []
        start = size
        if size == 0 and self._snapshot_provider is not None:
            # Every segment starts with the owner's state so it can be replayed on its own.
            try:
                snap_header, snap_payload = self._snapshot_provider()
                snap = (RecordType.SNAPSHOT, pack_header(snap_header), byte_view(snap_payload))
            except Exception as exc:
                log.exception("WAL %s: snapshot provider failed", self.writer_id)
                error = WalError(f"WAL snapshot provider failed: {exc!r}")
                for ticket in tickets:
                    ticket._fail(error)
                return None
            records.append(snap)
            size += OVERHEAD + len(snap[1]) + snap[2].nbytes
        records.extend((t.type, t.header_bytes, t.payload) for t in tickets)
        return _Group(tickets, segment, start, new_segment, records, size - start + nbytes)

    async def _commit_once(self) -> None:
        """Write one group: the held one if a write of it failed retriably, else the next.

        A retriable failure (RETRIABLE_ERRNOS: the disk or quota is full, an NFS server is
        unreachable) holds the group and writes it again after a backoff, from its start:
        the segment is first truncated back to where the group begins, so no partial group
        is left behind, and the rewrite is byte for byte the same records (their offsets and
        producer sequences were already assigned by the owner, so the group cannot simply be
        dropped: the partition would have a hole). Its tickets wait; owners refuse new data
        meanwhile (`full`, `stalled`) with a retriable error. Anything else (an fsync error, a
        fence, another write error) fails the writer for good.
        """
        group = self._held
        retry = group is not None
        if group is None:
            group = self._take_group()
            if group is None:
                return
        delay = RETRY_MIN_S
        while True:
            started = time.perf_counter()
            try:
                await trio.to_thread.run_sync(
                    self._write_group, group, retry, limiter=self._limiter
                )
            except Exception as exc:
                if not _retriable(exc):
                    self._held = None
                    self._stalled = None
                    self._enter_failed(group, exc)
                    return
                self._held = group
                self._note_stall(group, exc)
                if self._closing:
                    self._give_up(group)
                    return
                with trio.move_on_after(delay):
                    await self._close_requested.wait()
                delay = min(delay * 2, RETRY_MAX_S)
                retry = True
                continue
            break
        self._held = None
        if self._stalled is not None:
            log.warning(
                "WAL %s: the held group of %d records is written after %.1f s; taking writes again",
                self.writer_id,
                len(group.tickets),
                time.monotonic() - self._stalled_since,
            )
            self._stalled = None
        if self.on_group_commit is not None:
            self.on_group_commit(group.nbytes, time.perf_counter() - started)
        if group.new_segment:
            if self._active is not None:
                self._last_write[self._active] = time.time()  # sealed now
            self._active = group.segment
            self._sizes[group.segment] = 0
        self._sizes[group.segment] += group.nbytes
        self._last_write[group.segment] = time.time()
        self._end = group.segment + self._sizes[group.segment]
        position = self._sizes[group.segment] - sum(t.nbytes for t in group.tickets)
        for ticket in group.tickets:
            ticket._resolve(WalPosition(self.writer_id, group.segment, position, ticket.nbytes))
            position += ticket.nbytes

    def _note_stall(self, group: _Group, exc: BaseException) -> None:
        """One log line when a stall starts, then one each STALL_REMINDER_S: no storm."""
        now = time.monotonic()
        if self._stalled is None:
            error = WalError(f"WAL write to {self._dir} is being retried: {exc}")
            error.__cause__ = exc
            self._stalled = error
            self._stalled_since = self._stall_logged = now
            log.warning(
                "WAL %s: writing a group of %d records failed (%s); holding it and writing it "
                "again from byte %d of segment %d until it goes through, refusing new data "
                "meanwhile",
                self.writer_id,
                len(group.tickets),
                exc,
                group.start,
                group.segment,
            )
        elif now - self._stall_logged >= STALL_REMINDER_S:
            self._stall_logged = now
            log.warning(
                "WAL %s: still retrying the held group after %.0f s (%s)",
                self.writer_id,
                now - self._stalled_since,
                exc,
            )

    def _give_up(self, group: _Group) -> None:
        """Closing while a group is held: its tickets (and the queued ones) fail unwritten."""
        error = WalError(
            f"WAL writer {self.writer_id} closed while retrying a write: {self._stalled}"
        )
        self._held = None
        for ticket in group.tickets:
            ticket._fail(error)
        self._fail_queued(error)

    def _write_group(self, group: _Group, retry: bool = False) -> None:
        """Worker thread: (roll,) encode prefixes, one write, one fsync. A `retry` first cuts
        the segment back to the group's start: the failed attempt may have left part of it."""
        path = storage.segment_path(self.writer_id, group.segment)
        if retry:
            self._reopen_at(group, path)
        elif group.new_segment:
            if self._file is not None:
                self._file.close()  # already fsynced by its last group
                self._file = None
            self._file = storage.open_for_append(self.fs, path, create=True)
            self._sync_dir()
        elif self._file is None:
            self._file = storage.open_for_append(self.fs, path, create=False)
        buffers: list[bytes | memoryview] = []
        for rtype, header_bytes, payload in group.records:
            buffers.append(encode_prefix(rtype, header_bytes, payload))
            if payload.nbytes:
                buffers.append(payload)
        written = storage.write_buffers(self._file, buffers)
        count_io(self.fs, "write", written)
        if written != group.nbytes:
            raise WalError(f"group of {group.nbytes} bytes wrote {written}")
        try:
            storage.sync_file(self._file)
        except OSError as exc:
            raise _SyncFailed(f"fsync of {path} failed: {exc!r}") from exc
        # After the fsync: a fence made before this check is seen here; one made after it
        # was made by a taker that reads this group (shared_wal/fence.py).
        if self.fence_check and self.fs.exists(self._fence_path):
            fence = read_fence(self.fs, self.writer_id)
            raise WalFenced(f"WAL {self.writer_id} was fenced: {fence}")

    def _reopen_at(self, group: _Group, path: str) -> None:
        """Worker thread: a fresh handle on the group's segment, cut back to the group's start
        (the segment is created if the failed attempt never made it)."""
        if self._file is not None:
            f, self._file = self._file, None
            try:
                f.close()
            except Exception as exc:  # its last write failed; its state is of no further use
                log.debug("WAL %s: closing after a failed write: %r", self.writer_id, exc)
        f = storage.open_for_append(self.fs, path, create=False)
        try:
            f.truncate(group.start)
            f.seek(group.start)  # NFS files write at their own position (O_APPEND ones at the end)
        except BaseException:
            f.close()
            raise
        self._file = f
        if group.new_segment:
            self._sync_dir()

    def _sync_dir(self) -> None:
        try:
            storage.sync_dir(self.fs, self._dir)
        except OSError as exc:
            raise _SyncFailed(f"fsync of {self._dir} failed: {exc!r}") from exc

    def _enter_failed(self, group: _Group, exc: BaseException) -> None:
        if isinstance(exc, WalFenced):
            error: WalError = exc
            log.critical("%s: acknowledging nothing more", exc)
        else:
            error = WalError(f"WAL write to {self._dir} failed: {exc!r}")
            error.__cause__ = exc
            log.error(
                "WAL %s: write or fsync failed, writer is now failed: %r", self.writer_id, exc
            )
        self._failed = error
        for ticket in group.tickets:
            ticket._fail(error)
        self._fail_queued(error)

    def _fail_queued(self, error: WalError) -> None:
        while self._queue:
            self._queue.popleft()._fail(error)
        self._queued_bytes = 0

    # -- retention -------------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        while True:
            await trio.sleep(self.config.retention_interval_s)
            try:
                await self.enforce_retention()
            except Exception:
                log.exception("WAL %s: retention failed", self.writer_id)

    async def enforce_retention(self, now_ms: float | None = None) -> list[int]:
        """Delete sealed segments beyond the retention limits now; returns their ids."""
        async with self._retention_lock:
            now = time.time() * 1000 if now_ms is None else now_ms
            last_write = {s: t * 1000 for s, t in self._last_write.items()}
            trim = self.prepared_trim
            if trim is not None:
                floor, complete = trim.floor()
                victims = prepared_segments_to_delete(
                    self._sizes,
                    last_write,
                    active=self._active,
                    now_ms=now,
                    floor=floor,
                    complete=complete,
                    min_age_ms=trim.min_age_s * 1000,
                    max_age_ms=None if trim.max_age_s is None else trim.max_age_s * 1000,
                )
            else:
                victims = segments_to_delete(
                    self._sizes,
                    last_write,
                    active=self._active,
                    now_ms=now,
                    retention_bytes=self.config.retention_bytes,
                    retention_ms=self.config.retention_ms,
                    floor=self.retention_floor,
                )
            if not victims:
                return []
            deleted = await trio.to_thread.run_sync(
                self._delete_segments, victims, limiter=self._retention_limiter
            )
            for segment in deleted:
                self._sizes.pop(segment, None)
                self._last_write.pop(segment, None)
        if deleted and self.on_segments_deleted is not None:
            self.on_segments_deleted(deleted)
        return deleted

    def _delete_segments(self, victims: list[int]) -> list[int]:
        """Worker thread: delete oldest first, stopping at the first failure."""
        deleted: list[int] = []
        for segment in victims:
            path = storage.segment_path(self.writer_id, segment)
            try:
                self.fs.remove(path)
            except storage.ResourceNotFound:
                pass
            except Exception as exc:
                log.warning("WAL %s: could not delete %s: %r", self.writer_id, path, exc)
                break
            deleted.append(segment)
            if len(deleted) < len(victims):
                pause_point("during_trim")  # crash tests: some segments gone, the rest not
        if deleted:
            storage.sync_dir(self.fs, self._dir)
        return deleted
