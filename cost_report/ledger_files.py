"""Which ledger files a report reads: names, the period, and duplicates (pure, no I/O).

A node's day of traffic is one append-only file, ``dt=YYYY-MM-DD/<node>.jsonl`` on the node's
disk. In the object store it arrives as byte ranges of that file,
``dt=YYYY-MM-DD/<node>.<start:012d>.jsonl`` (docs/formats.md, "Ledger uploads"). Every file
is therefore a range [start, start + size) of one node-day, and two files of the same
node-day hold the same bytes where their ranges meet. The plan keeps non-overlapping ranges:
a range inside another is a duplicate (an upload retried, or the local file next to its
uploads) and is not read; a range that overlaps another only in part cannot be split by line
here and is rejected whole, with the reason. Nothing is dropped without a line in the plan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["FilePlan", "LedgerFile", "parse_ledger_path", "plan_files"]

_LEDGER_PATH: Final = re.compile(
    r"(?:^|/)dt=(?P<dt>\d{4}-\d{2}-\d{2})/(?P<node>[A-Za-z0-9_-]+)(?:\.(?P<start>\d{12}))?\.jsonl$"
)


@dataclass(frozen=True, order=True)
class LedgerFile:
    dt: str
    node: str
    start: int
    size: int
    path: str

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass
class FilePlan:
    kept: list[LedgerFile] = field(default_factory=list)
    # (file, why it is not read): contained in a kept range, so its bytes are counted once.
    duplicates: list[tuple[LedgerFile, str]] = field(default_factory=list)
    # (file, why it is rejected): overlaps a kept range in part.
    rejected: list[tuple[LedgerFile, str]] = field(default_factory=list)
    # (path, why): not named as a ledger file, or outside the period.
    ignored: list[tuple[str, str]] = field(default_factory=list)

    @property
    def days(self) -> list[str]:
        return sorted({f.dt for f in self.kept})


def parse_ledger_path(path: str, size: int) -> LedgerFile | None:
    m = _LEDGER_PATH.search(path)
    if m is None:
        return None
    start = int(m.group("start")) if m.group("start") else 0
    return LedgerFile(m.group("dt"), m.group("node"), start, size, path)


def _hidden(path: str) -> bool:
    # Spark's own convention: names starting with "_" or "." are metadata, not data.
    return any(part.startswith(("_", ".")) for part in path.split("/")[-2:])


def plan_files(
    entries: Iterable[tuple[str, int]], date_from: str | None = None, date_to: str | None = None
) -> FilePlan:
    """The files to read among `entries` (path, size), for days in [date_from, date_to]."""
    plan = FilePlan()
    by_node_day: dict[tuple[str, str], list[LedgerFile]] = {}
    for path, size in entries:
        if _hidden(path):
            continue
        ledger = parse_ledger_path(path, size)
        if ledger is None:
            plan.ignored.append((path, "not a ledger file name (dt=YYYY-MM-DD/<node>.jsonl)"))
            continue
        if (date_from and ledger.dt < date_from) or (date_to and ledger.dt > date_to):
            continue  # partition pruning: outside the period, not read
        by_node_day.setdefault((ledger.dt, ledger.node), []).append(ledger)
    for key in sorted(by_node_day):
        # By start, the longest first: a later range either starts at or after the end of what
        # is kept (kept), lies inside a kept range (duplicate) or straddles its end (rejected).
        files = sorted(by_node_day[key], key=lambda f: (f.start, -f.size, f.path))
        covering: LedgerFile | None = None
        for f in files:
            if covering is None or f.start >= covering.end:
                plan.kept.append(f)
                covering = f
            elif f.end <= covering.end:
                plan.duplicates.append(
                    (f, f"bytes {f.start}-{f.end} of {f.node} on {f.dt} are in {covering.path}")
                )
            else:
                plan.rejected.append(
                    (
                        f,
                        f"bytes {f.start}-{f.end} of {f.node} on {f.dt} overlap {covering.path} "
                        f"({covering.start}-{covering.end}) in part; file not counted",
                    )
                )
    return plan
