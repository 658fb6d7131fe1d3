"""Crash-safe JSON Lines files for traffic-accounting rows, and their reader.

Layout (docs/formats.md, "Traffic accounting"): ``<data-dir>/accounting/dt=YYYY-MM-DD/<node>.jsonl``
where the date is the UTC date of each row's minute. Each write appends whole lines with one
``write(2)`` on an ``O_APPEND`` descriptor and is fsynced before it returns, so a crash leaves at
most one torn line at the end of a file. The next append first ends that line with a newline, so
a torn line never swallows a good one; readers skip lines that are not JSON objects.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

__all__ = [
    "ACCOUNTING_DIR",
    "DailyJsonlTrafficSink",
    "JsonlTrafficSink",
    "accounting_file",
    "encode_rows",
    "iter_accounting_files",
    "read_traffic_rows",
]

log = logging.getLogger("zonefleet.telemetry")

ACCOUNTING_DIR: Final = "accounting"
_FILE_MODE: Final = 0o644


def encode_rows(rows: Iterable[dict[str, Any]]) -> bytes:
    """Rows as JSON Lines: compact, keys in the rows' own order, ASCII (\\u escapes), `\\n` ends."""
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows).encode()


def _append_durably(path: Path, data: bytes) -> None:
    """One O_APPEND write of whole lines, then fsync (and fsync the directory of a new file)."""
    created = False
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        created = True
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    if not path.exists():
        created = True
    fd = os.open(path, flags, _FILE_MODE)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # close the line a crash tore, so ours starts clean
        view = memoryview(data)
        # A regular file takes the whole buffer in one call; the loop only guards against a
        # signal or a full disk, where a torn line is the documented outcome anyway.
        while view.nbytes:
            n = os.write(fd, view)
            if n <= 0:
                raise OSError(f"short write to {path}")
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_dir(path.parent)
        _fsync_dir(path.parent.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories
    finally:
        os.close(fd)


class JsonlTrafficSink:
    """Appends rows as JSON Lines to one file (created with its directory if missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            _append_durably(self.path, encode_rows(rows))


def accounting_file(data_dir: str | os.PathLike[str], node: str, day: str) -> Path:
    """``<data_dir>/accounting/dt=<day>/<node>.jsonl``; `day` is ``YYYY-MM-DD``."""
    return Path(data_dir) / ACCOUNTING_DIR / f"dt={day}" / f"{node}.jsonl"


class DailyJsonlTrafficSink:
    """Appends each row to its node's file in the ``dt=`` directory of the row's UTC day."""

    def __init__(self, data_dir: str | os.PathLike[str], node: str) -> None:
        self.data_dir = Path(data_dir)
        self.node = node

    def path_for(self, day: str) -> Path:
        return accounting_file(self.data_dir, self.node, day)

    def write(self, rows: list[dict[str, Any]]) -> None:
        by_day: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(str(row["minute"])[:10], []).append(row)
        for day, day_rows in sorted(by_day.items()):
            _append_durably(self.path_for(day), encode_rows(day_rows))


def read_traffic_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of one JSONL file, skipping (with a warning) lines torn by a crash: a last line
    without its newline, and any line that is not a JSON object. A row written before rows had
    a topic gets ``"topic": ""`` after its ``api``."""
    rows: list[dict[str, Any]] = []
    lines = Path(path).read_bytes().split(b"\n")
    if lines[-1]:
        log.warning("%s: skipping a torn last line", path)
    for number, line in enumerate(lines[:-1], 1):
        if not line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            log.warning("%s: skipping torn line %d", path, number)
            continue
        rows.append(row if "topic" in row or "api" not in row else _with_empty_topic(row))
    return rows


def _with_empty_topic(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        out[key] = value
        if key == "api":
            out["topic"] = ""
    return out


def iter_accounting_files(data_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Every ``accounting/dt=*/*.jsonl`` file under `data_dir`, sorted."""
    root = Path(data_dir) / ACCOUNTING_DIR
    yield from sorted(root.glob("dt=*/*.jsonl"))
