"""Which bytes of a node's ledger files go to the object store, and under which keys (pure).

A node's ledger (`telemetry.traffic_sink`) is one append-only file per UTC day,
``accounting/dt=YYYY-MM-DD/<node>.jsonl`` under its data directory. Uploads are byte ranges of
those files (docs/formats.md, "Ledger uploads"): the object
``accounting/dt=YYYY-MM-DD/<node>.<start:012d>.jsonl`` holds bytes [start, end) of the day's
file, where start is the uploaded end the node's cursor records and end lies just past the
last ``\\n`` (a torn last line is never uploaded). The cursor moves only after a put
succeeded, so a crash between the two puts the same key again, from the same start, with a
superset of the bytes: no byte is ever in two objects that a reader would both count.

This module decides; `s3_commit.ledger_uploads` reads the files and talks to the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ACCOUNTING_PREFIX",
    "CURSOR_DIR",
    "CURSOR_FORMAT",
    "DEFAULT_UPLOAD_INTERVAL_S",
    "MAX_OBJECT_BYTES",
    "MAX_UPLOAD_INTERVAL_S",
    "CursorError",
    "LedgerRange",
    "UploadCursor",
    "complete_range",
    "cursor_relpath",
    "ledger_key",
    "ledger_relpath",
    "parse_ledger_key",
    "parse_ledger_relpath",
    "pending_files",
]

# Object keys start with this, inside the object store's own prefix; local files and the
# cursor live under <data_dir>/accounting/ (telemetry.traffic_sink.ACCOUNTING_DIR).
ACCOUNTING_PREFIX: Final = "accounting/"
# "_" so that Spark's partition discovery and the dt=*/*.jsonl glob pass it by.
CURSOR_DIR: Final = "_upload"
CURSOR_FORMAT: Final = 1
DEFAULT_UPLOAD_INTERVAL_S: Final = 600.0
# The bound: a closed minute reaches the store at most an hour late.
MAX_UPLOAD_INTERVAL_S: Final = 3600.0
# One object holds at most this much (a catch-up after a long outage goes up in parts, so
# a pass never holds a whole day of a busy node in memory).
MAX_OBJECT_BYTES: Final = 64 << 20
_START_DIGITS: Final = 12

_DAY = r"\d{4}-\d{2}-\d{2}"
_NODE = r"[A-Za-z0-9_-]+"
_NODE_RE: Final = re.compile(rf"{_NODE}\Z")
_DAY_RE: Final = re.compile(rf"{_DAY}\Z")
_KEY_RE: Final = re.compile(
    rf"accounting/dt=(?P<day>{_DAY})/(?P<node>{_NODE})\.(?P<start>\d{{{_START_DIGITS}}})\.jsonl\Z"
)
_RELPATH_RE: Final = re.compile(rf"dt=(?P<day>{_DAY})/(?P<node>{_NODE})\.jsonl\Z")


def _check(day: str, node: str) -> None:
    if not _DAY_RE.match(day):
        raise ValueError(f"not a day (YYYY-MM-DD): {day!r}")
    if not _NODE_RE.match(node):
        raise ValueError(f"not a node name (letters, digits, '-', '_'; no dots): {node!r}")


def ledger_key(day: str, node: str, start: int) -> str:
    """``accounting/dt=<day>/<node>.<start:012d>.jsonl``, relative to the object store's prefix."""
    _check(day, node)
    if not 0 <= start < 10**_START_DIGITS:
        raise ValueError(f"start offset {start} does not fit {_START_DIGITS} digits")
    return f"{ACCOUNTING_PREFIX}dt={day}/{node}.{start:0{_START_DIGITS}d}.jsonl"


def parse_ledger_key(key: str) -> tuple[str, str, int] | None:
    """(day, node, start) of an upload's key, or None for any other key."""
    m = _KEY_RE.match(key)
    if m is None:
        return None
    return m.group("day"), m.group("node"), int(m.group("start"))


def ledger_relpath(day: str, node: str) -> str:
    """``dt=<day>/<node>.jsonl``: a ledger file relative to <data_dir>/accounting."""
    _check(day, node)
    return f"dt={day}/{node}.jsonl"


def parse_ledger_relpath(relpath: str) -> tuple[str, str] | None:
    """(day, node) of ``dt=<day>/<node>.jsonl``, or None."""
    m = _RELPATH_RE.match(relpath)
    return None if m is None else (m.group("day"), m.group("node"))


def cursor_relpath(node: str) -> str:
    """``_upload/<node>.json``: the node's cursor relative to <data_dir>/accounting."""
    _check("2000-01-01", node)
    return f"{CURSOR_DIR}/{node}.json"


@dataclass(frozen=True, slots=True, order=True)
class LedgerRange:
    """Bytes [start, end) of one node-day file, and the object that holds them."""

    day: str
    node: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def key(self) -> str:
        return ledger_key(self.day, self.node, self.start)

    @property
    def relpath(self) -> str:
        return ledger_relpath(self.day, self.node)


def complete_range(day: str, node: str, start: int, window: bytes) -> LedgerRange | None:
    """The range to upload from `start`, given `window`, the file's bytes from `start` on (all
    of them, or the first MAX_OBJECT_BYTES): up to just past its last ``\\n``. None when the
    window holds no complete line (only a torn or still-unfinished tail)."""
    last = window.rfind(b"\n")
    if last < 0:
        return None
    return LedgerRange(day, node, start, start + last + 1)


def pending_files(
    node: str, uploaded: Mapping[str, int], sizes: Mapping[str, int]
) -> tuple[list[tuple[str, int]], list[str]]:
    """Node `node`'s files with bytes past the cursor, as (relpath, uploaded end), oldest day
    first; and the files now shorter than what was uploaded (replaced or truncated: not
    appended to, so nothing of them can be uploaded under the same keys). `sizes` maps
    relpaths under <data_dir>/accounting to file sizes; other nodes' files are left out."""
    pending: list[tuple[str, int]] = []
    shrunk: list[str] = []
    for relpath in sorted(sizes):
        parsed = parse_ledger_relpath(relpath)
        if parsed is None or parsed[1] != node:
            continue
        done = uploaded.get(relpath, 0)
        if sizes[relpath] > done:
            pending.append((relpath, done))
        elif sizes[relpath] < done:
            shrunk.append(relpath)
    return pending, shrunk


class CursorError(ValueError):
    """A cursor file that does not parse, or belongs to another node."""


@dataclass
class UploadCursor:
    """What node `node` has uploaded: relpath -> end offset (every byte before it is in the
    store). Encoded as one line of compact JSON, keys in this order, files sorted:
    ``{"format":1,"node":"main-1","uploaded":{"dt=2026-11-22/main-1.jsonl":1300}}``."""

    node: str
    uploaded: dict[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc = {
            "format": CURSOR_FORMAT,
            "node": self.node,
            "uploaded": dict(sorted(self.uploaded.items())),
        }
        return (json.dumps(doc, separators=(",", ":")) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes, node: str) -> UploadCursor:
        try:
            doc: Any = json.loads(data)
        except ValueError as exc:
            raise CursorError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != CURSOR_FORMAT:
            raise CursorError(f"not a format-{CURSOR_FORMAT} upload cursor")
        if doc.get("node") != node:
            raise CursorError(f"the cursor of node {doc.get('node')!r}, not of {node!r}")
        uploaded = doc.get("uploaded")
        if not isinstance(uploaded, dict):
            raise CursorError("uploaded is not an object")
        out: dict[str, int] = {}
        for relpath, end in uploaded.items():
            parsed = parse_ledger_relpath(relpath)
            if parsed is None or parsed[1] != node:
                raise CursorError(f"{relpath!r} is not a ledger file of {node}")
            if not isinstance(end, int) or isinstance(end, bool) or end < 0:
                raise CursorError(f"{relpath}: end {end!r} is not an offset")
            out[relpath] = end
        return cls(node, out)

    def prune(self, existing: Iterable[str]) -> bool:
        """Forget files that are gone (deleted locally after their upload); True if any was."""
        keep = set(existing)
        gone = [relpath for relpath in self.uploaded if relpath not in keep]
        for relpath in gone:
            del self.uploaded[relpath]
        return bool(gone)
