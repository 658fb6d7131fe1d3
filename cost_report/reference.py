"""A plain-Python sum of ledger files: the independent check of the Spark job's totals.

It reads every line with `json.loads` and adds up, with none of the job's code but the file
plan and the row contract (`ledger_rows`). Tests compare the report against it, and the
benchmark measures how much faster Spark is.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cost_report.ledger_files import LedgerFile, plan_files
from cost_report.ledger_rows import WAL_CHANNELS, is_cross_zone, row_problem

__all__ = ["ReferenceTotals", "reference_totals", "walk_files"]


@dataclass
class ReferenceTotals:
    rows: int = 0
    total_bytes: int = 0
    cross_zone_bytes: int = 0
    cross_zone_bytes_without_wal: int = 0
    unknown_zone_bytes: int = 0
    rejected_rows: int = 0
    bytes_by_day: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    cross_zone_by_day: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_by_channel: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_by_topic: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    client_bytes_by_api: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rejected_by_reason: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def walk_files(root: str | os.PathLike[str]) -> list[tuple[str, int]]:
    out = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            out.append((str(path), path.stat().st_size))
    return sorted(out)


def reference_totals(
    root: str | os.PathLike[str], date_from: str | None = None, date_to: str | None = None
) -> ReferenceTotals:
    plan = plan_files(walk_files(root), date_from, date_to)
    return sum_files(plan.kept)


def sum_files(files: Iterable[LedgerFile]) -> ReferenceTotals:
    t = ReferenceTotals()
    for f in files:
        with open(f.path, "rb") as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw)
                except ValueError:
                    row = None
                problem = row_problem(row, f.dt, f.node)
                if problem is not None:
                    t.rejected_rows += 1
                    t.rejected_by_reason[problem] += 1
                    continue
                _add(t, row, f.dt)
    return t


def _add(t: ReferenceTotals, row: dict, dt: str) -> None:  # type: ignore[type-arg]
    nbytes = row["bytes"]
    channel = row["channel"]
    cross = row.get("cross_zone")
    if cross is None:
        cross = is_cross_zone(row["from_zone"], row["to_zone"])
    t.rows += 1
    t.total_bytes += nbytes
    t.bytes_by_day[dt] += nbytes
    t.bytes_by_channel[channel] += nbytes
    t.bytes_by_topic[row.get("topic") or ""] += nbytes
    if channel == "kafka-client":
        t.client_bytes_by_api[row["api"]] += nbytes
    if cross:
        t.cross_zone_bytes += nbytes
        t.cross_zone_by_day[dt] += nbytes
        if channel not in WAL_CHANNELS:
            t.cross_zone_bytes_without_wal += nbytes
    if "unknown" in (row["from_zone"], row["to_zone"]):
        t.unknown_zone_bytes += nbytes
