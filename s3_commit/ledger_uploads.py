"""A node's traffic ledgers, uploaded to the object store (docs/formats.md, "Ledger uploads").

In production every node has its own disk, so the ledgers meet in the object store: each
node uploads the new complete lines of its ledger files as byte ranges (keys and planning in
`telemetry.ledger_upload`, which is pure). One pass, for every file of the node under
``<data_dir>/accounting`` (older days too, so a restart catches up):

1. read the bytes past the cursor (at most MAX_OBJECT_BYTES), cut after the last ``\\n``;
2. PUT them create-only (``If-None-Match: *``) under the key of their start offset;
3. only then move the cursor (``accounting/_upload/<node>.json``, written atomically).

A crash between 2 and 3 leaves the cursor where it was, so the next pass puts the same key,
from the same start, with a superset of the bytes. The create-only put then fails; the
uploader reads the object back and replaces it (``If-Match``) only when it holds exactly the
file's bytes from that start, i.e. an earlier upload of this very file. Any other content (a
wiped data directory, two nodes of one name) is never overwritten: the file is logged as an
error and skipped. So no byte lands in two objects that a reader counts, and a lost or
corrupt cursor costs a re-upload, never a duplicate.

`LedgerUploads` is the schedule: a pass at start (whatever the cursor says is missing), then
every `upload_interval_s` right after a flush of the closed minutes, and one bounded pass at
a clean shutdown, after the final flush. A failed pass is logged and retried at the next
tick; it never stops the node.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from s3_commit.object_store import ObjectStore, PreconditionFailed, TrafficHook, open_object_store
from telemetry.ledger_upload import (
    DEFAULT_UPLOAD_INTERVAL_S,
    MAX_OBJECT_BYTES,
    CursorError,
    LedgerRange,
    UploadCursor,
    complete_range,
    cursor_relpath,
    parse_ledger_relpath,
    pending_files,
)
from telemetry.metrics import MetricsRegistry
from telemetry.traffic_sink import ACCOUNTING_DIR

__all__ = ["FINAL_UPLOAD_S", "LedgerUploader", "LedgerUploads", "PassResult"]

log = logging.getLogger("zonefleet.accounting")

# The last pass at shutdown gives up after this long (a supervisor SIGKILLs a node 10 s after
# its SIGTERM); what it leaves, the next start uploads.
FINAL_UPLOAD_S: Final = 5.0


@dataclass
class PassResult:
    objects: int = 0
    bytes: int = 0


def _read(path: Path, start: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(length)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories
    finally:
        os.close(fd)


class LedgerUploader:
    """Uploads of node `node`'s ledger files under `data_dir` to `store`. Blocking: run a
    pass in a worker thread; passes of one uploader never overlap (a lock)."""

    def __init__(
        self,
        store: ObjectStore,
        data_dir: str | os.PathLike[str],
        node: str,
        *,
        max_object_bytes: int = MAX_OBJECT_BYTES,
    ) -> None:
        self.store = store
        self.node = node
        self.root = Path(data_dir) / ACCOUNTING_DIR
        self.cursor_path = self.root / cursor_relpath(node)
        self.max_object_bytes = max_object_bytes
        self.objects_uploaded = 0
        self.bytes_uploaded = 0
        self._lock = threading.Lock()
        # Files this process will not upload again (their keys hold other bytes): logged once.
        self._skipped: set[str] = set()

    def __repr__(self) -> str:
        return f"LedgerUploader({self.node!r}, {self.store!r})"

    # -- the cursor --------------------------------------------------------------------------

    def load_cursor(self) -> UploadCursor:
        """The cursor on disk; an empty one when there is none or it does not parse (the
        create-only puts make re-uploading from 0 safe)."""
        try:
            data = self.cursor_path.read_bytes()
        except FileNotFoundError:
            return UploadCursor(self.node)
        try:
            return UploadCursor.decode(data, self.node)
        except CursorError as exc:
            log.warning(
                "ledger upload cursor %s is unreadable (%s): checking every file from its start",
                self.cursor_path,
                exc,
            )
            return UploadCursor(self.node)

    def _save_cursor(self, cursor: UploadCursor) -> None:
        """Temp file, fsync, rename over the cursor, fsync the directory."""
        directory = self.cursor_path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            _fsync_dir(directory.parent)
        tmp = directory / f".{self.cursor_path.name}.tmp"
        with open(tmp, "wb") as f:
            f.write(cursor.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.cursor_path)
        _fsync_dir(directory)

    # -- a pass ------------------------------------------------------------------------------

    def _sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for path in self.root.glob(f"dt=*/{self.node}.jsonl"):
            try:
                sizes[path.relative_to(self.root).as_posix()] = path.stat().st_size
            except FileNotFoundError:
                continue  # deleted since the glob
        return sizes

    def upload_pending(self) -> PassResult:
        """Upload every complete line not yet in the store, oldest day first. Raises the
        store's error (ObjectStoreError, OSError) after keeping what did go up."""
        with self._lock:
            result = PassResult()
            cursor = self.load_cursor()
            sizes = self._sizes()
            pending, shrunk = pending_files(self.node, cursor.uploaded, sizes)
            for relpath in shrunk:
                self._skip(
                    relpath,
                    f"it is shorter than the {cursor.uploaded[relpath]} bytes "
                    "uploaded from it (replaced or truncated)",
                )
            for relpath, start in pending:
                if relpath not in self._skipped:
                    self._upload_file(relpath, start, sizes[relpath], cursor, result)
            if cursor.prune(sizes):
                self._save_cursor(cursor)
            return result

    def _skip(self, relpath: str, why: str) -> None:
        if relpath not in self._skipped:
            self._skipped.add(relpath)
            log.error("ledger %s/%s is not uploaded: %s", self.root, relpath, why)

    def _upload_file(
        self, relpath: str, start: int, size: int, cursor: UploadCursor, result: PassResult
    ) -> None:
        parsed = parse_ledger_relpath(relpath)
        assert parsed is not None  # pending_files returns only ledger files
        day, node = parsed
        path = self.root / relpath
        while start < size:
            window = _read(path, start, min(size - start, self.max_object_bytes))
            part = complete_range(day, node, start, window)
            if part is None:
                if len(window) >= self.max_object_bytes:
                    self._skip(relpath, f"no line ends in the {len(window)} bytes from {start}")
                return  # only a torn or unfinished last line: it waits for its newline
            end = self._put(part, window[: part.size], path)
            if end is None:
                return
            cursor.uploaded[relpath] = end
            self._save_cursor(cursor)
            result.objects += 1
            result.bytes += end - start
            self.objects_uploaded += 1
            self.bytes_uploaded += end - start
            start = end

    def _put(self, part: LedgerRange, data: bytes, path: Path) -> int | None:
        """Put `data` (bytes `part` of the file at `path`) under the part's key; returns the
        end the store now holds from part.start, or None when the key holds other bytes."""
        try:
            self.store.put(part.key, data, if_none_match=True)
            return part.end
        except PreconditionFailed:
            pass
        # The key exists: an upload from the same start that the cursor never heard of.
        found = self.store.get(part.key)
        if found is None:  # deleted since (by hand?): create it again
            self.store.put(part.key, data, if_none_match=True)
            return part.end
        held, etag = found
        if held != _read(path, part.start, len(held)):
            self._skip(
                part.relpath,
                f"object {part.key} holds {len(held)} bytes that are not this file's bytes "
                f"from {part.start} (a wiped data directory, or two nodes named {part.node}?)",
            )
            return None
        if len(held) >= len(data):
            return part.start + len(held)
        self.store.put(part.key, data, if_match=etag)  # the same bytes, and more
        return part.end


class LedgerUploads:
    """The upload schedule of one node (see the module docstring)."""

    def __init__(
        self,
        uploader: LedgerUploader,
        flush: Callable[[], Awaitable[object]],
        interval_s: float = DEFAULT_UPLOAD_INTERVAL_S,
        registry: MetricsRegistry | None = None,
    ) -> None:
        self.uploader = uploader
        self.flush = flush
        self.interval_s = interval_s
        self.passes = 0
        self.failures = 0
        self.last_error: str | None = None
        self.last_success: float | None = None
        self.pass_done = trio.Event()  # replaced after each pass, failed or not (tests wait)
        self._limiter = trio.CapacityLimiter(1)
        self._bytes_counted = 0
        if registry is None:
            registry = MetricsRegistry()
        self._bytes = registry.counter(
            "zonefleet_ledger_upload_bytes_total", "traffic-ledger bytes uploaded to the store"
        )
        self._failures = registry.counter(
            "zonefleet_ledger_upload_failures_total", "traffic-ledger upload passes that failed"
        )
        registry.gauge(
            "zonefleet_ledger_upload_last_success_timestamp_seconds",
            "Unix time of the last ledger upload pass that completed (0: none yet)",
        ).set_function(lambda: self.last_success or 0.0)

    @classmethod
    async def open(
        cls,
        url: str,
        data_dir: str | os.PathLike[str],
        node: str,
        flush: Callable[[], Awaitable[object]],
        *,
        interval_s: float = DEFAULT_UPLOAD_INTERVAL_S,
        traffic_hook: TrafficHook | None = None,
        registry: MetricsRegistry | None = None,
    ) -> LedgerUploads:
        """Uploads to the object store at `url` (a store of their own, its requests booked
        through `traffic_hook`)."""
        store = await trio.to_thread.run_sync(open_object_store, url)
        store.traffic_hook = traffic_hook
        return cls(LedgerUploader(store, data_dir, node), flush, interval_s, registry)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.upload()
            await trio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception:
                log.exception("traffic accounting: flush before the ledger upload failed")

    async def upload(self) -> bool:
        """One pass in a worker thread; False (logged) when it failed. A cancelled pass is
        abandoned to its thread: a put cut short only means the next pass puts it again."""
        try:
            result = await trio.to_thread.run_sync(
                self.uploader.upload_pending, limiter=self._limiter, abandon_on_cancel=True
            )
        except Exception as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._failures.inc()
            log.warning(
                "ledger upload of %s failed (retrying in %.0f s): %s",
                self.uploader.node,
                self.interval_s,
                self.last_error,
            )
            return False
        finally:
            # What went up before a failure counts too (the uploader keeps the total).
            uploaded = self.uploader.bytes_uploaded
            self._bytes.inc(uploaded - self._bytes_counted)
            self._bytes_counted = uploaded
            self.passes += 1
            self.pass_done.set()
            self.pass_done = trio.Event()
        self.last_success = time.time()
        self.last_error = None
        if result.objects:
            log.info(
                "uploaded %d ledger objects (%d bytes) of %s",
                result.objects,
                result.bytes,
                self.uploader.node,
            )
        return True

    async def final_upload(self, timeout_s: float = FINAL_UPLOAD_S) -> None:
        """The last pass of a clean shutdown, after the final flush (shielded, bounded)."""
        with trio.CancelScope(shield=True), trio.move_on_after(timeout_s) as scope:
            await self.upload()
        if scope.cancelled_caught:
            log.warning(
                "ledger upload of %s: gave up at shutdown after %.0f s; the next start "
                "uploads the rest",
                self.uploader.node,
                timeout_s,
            )
