"""The audit log's file: lines appended by a thread of its own, so the trio loop never waits
on the disk (the events and their lines: `telemetry/audit.py`; the format: docs/formats.md).

`write(line)` only queues. The thread takes what is queued and appends it as whole lines in
one `write(2)` on an `O_APPEND` descriptor, then `fsync`s: lines go out as they come (no
buffer holds them back), and nodes that share one file (a `{node}`-less path) interleave whole
lines. The file is created on the first line (mode 0600, its directory too), so a node that
has nothing to audit leaves no file. If the last line was torn by a crash, the next append
starts on a new line. A failed write is one warning (at most one a minute) and the lines are
dropped: the audit log never stops a node.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Final

from telemetry.audit import AuditLog

__all__ = ["AuditFile", "audit_log_path", "open_audit_log"]

log = logging.getLogger("zonefleet.audit")

WARN_EVERY_S: Final = 60.0
MAX_BATCH: Final = 1024  # lines in one write
CLOSE_TIMEOUT_S: Final = 5.0


def audit_log_path(template: str | os.PathLike[str], node: str) -> Path:
    """The file of `node` ("main-1", "proxy-101"): `{node}` in the template is replaced."""
    return Path(str(template).replace("{node}", node))


class AuditFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._fd: int | None = None
        self._warned = -WARN_EVERY_S
        self.lines_written = 0
        self.lines_lost = 0
        self._thread = threading.Thread(target=self._run, name=f"audit {path}", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        self._queue.put(line)

    def close(self) -> None:
        """Write what is queued, then stop the thread (waits at most CLOSE_TIMEOUT_S)."""
        self._queue.put(None)
        self._thread.join(CLOSE_TIMEOUT_S)

    def _run(self) -> None:
        try:
            while True:
                first = self._queue.get()
                lines: list[str] = []
                stop = first is None
                if first is not None:
                    lines.append(first)
                while not stop and len(lines) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                    else:
                        lines.append(more)
                if lines:
                    self._append(lines)
                if stop:
                    return
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _append(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("ascii", "backslashreplace")
        try:
            fd = self._open()
            os.write(fd, data)
            os.fsync(fd)
            self.lines_written += len(lines)
        except OSError as exc:
            self.lines_lost += len(lines)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None  # open again next time (the directory may be back)
            now = time.monotonic()
            if now - self._warned >= WARN_EVERY_S:
                self._warned = now
                log.warning(
                    "audit log %s not written (%d lines lost so far): %s",
                    self.path,
                    self.lines_lost,
                    exc,
                )

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.write(fd, b"\n")  # a line torn by a crash stays on its own
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        return fd


def open_audit_log(template: str | None, node: str) -> tuple[AuditLog, AuditFile | None]:
    """The node's audit log, writing to its file (`[security] audit_log`), or off (None)."""
    if template is None:
        return AuditLog.off(node), None
    out = AuditFile(audit_log_path(template, node))
    return AuditLog(node, out.write), out
