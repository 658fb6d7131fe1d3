"""Stage the ledgers of a fleet's object store to a local directory the report reads.

The nodes upload their ledgers to the fleet's object store as byte ranges,
``accounting/dt=YYYY-MM-DD/<node>.<start:012d>.jsonl`` (docs/formats.md, "Ledger uploads").
`stage_accounting` lists those keys through the project's own object store (the URL form of
the fleet TOML: ``s3://bucket/prefix?endpoint=...``, ``file:///path``) and copies each to
``dest/dt=YYYY-MM-DD/<name>`` under its own name, so `cost_report.ledger_files` sees exactly
what the store holds. s3_commit is imported only here, so that the report runs without it on
clusters that read local or s3a:// paths.

Staging again into the same directory downloads only what changed: a key names its start
offset, so a local copy of the same size holds the same bytes (a retried upload that grew
the object changes its size). Files are written under a temporary name and renamed.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

__all__ = ["ACCOUNTING_PREFIX", "stage_accounting"]

ACCOUNTING_PREFIX: Final = "accounting/"
DEFAULT_THREADS: Final = 16
# dt=<day>/<file name>: one plain name, no dot or underscore first (Spark's hidden files,
# such as the nodes' _upload/ cursors, are not ledgers).
_STAGED: Final = re.compile(
    r"dt=(?P<day>\d{4}-\d{2}-\d{2})/(?P<name>[A-Za-z0-9-][A-Za-z0-9_.-]*)\Z"
)


def stage_accounting(
    url: str,
    dest: Path,
    *,
    date_from: str | None = None,
    date_to: str | None = None,
    threads: int = DEFAULT_THREADS,
) -> list[Path]:
    """Download the store's ``accounting/dt=*/`` objects (days in [date_from, date_to] when
    given, YYYY-MM-DD) to ``dest/dt=YYYY-MM-DD/<name>``; returns their local paths, sorted."""
    from s3_commit import open_object_store  # lazily: see the module docstring

    store = open_object_store(url)
    wanted: list[tuple[str, Path, int]] = []
    for info in store.list(ACCOUNTING_PREFIX):
        m = _STAGED.match(info.key[len(ACCOUNTING_PREFIX) :])
        if m is None:
            continue
        day = m.group("day")
        if (date_from and day < date_from) or (date_to and day > date_to):
            continue
        wanted.append((info.key, dest / f"dt={day}" / m.group("name"), info.size))

    def fetch(item: tuple[str, Path, int]) -> Path | None:
        key, path, size = item
        if path.is_file() and path.stat().st_size == size:
            return path  # staged before: same key, same size, same bytes
        found = store.get(key)
        if found is None:
            return None  # deleted since the listing
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.staging")
        tmp.write_bytes(found[0])
        os.replace(tmp, path)
        return path

    if not wanted:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(wanted)))) as pool:
        staged = [path for path in pool.map(fetch, wanted) if path is not None]
    return sorted(staged)
