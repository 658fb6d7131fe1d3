"""A byte-count callback per shared file system, for traffic accounting.

The owner of an FS registers ``hook(op, nbytes)`` with `set_io_hook`; every WAL writer and
reader on that FS object then reports what it moved: ``write`` (one group commit), ``read`` (one
record by position) and ``scan`` (a stretch of a segment read sequentially). The hook runs in
whichever thread did the I/O, usually a trio worker thread, so it must be thread-safe and cheap.
Nodes sharing a process each open their own FS object, so each counts only its own I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["IoHook", "count_io", "io_hook", "set_io_hook"]

IoHook = Callable[[str, int], None]
_ATTR: Final = "_zonefleet_io_hook"


def set_io_hook(fs: Any, hook: IoHook | None) -> None:
    """Report the I/O of every WAL writer and reader on `fs` to `hook` (None: stop)."""
    setattr(fs, _ATTR, hook)


def io_hook(fs: Any) -> IoHook | None:
    hook: IoHook | None = getattr(fs, _ATTR, None)
    return hook


def count_io(fs: Any, op: str, nbytes: int) -> None:
    hook: IoHook | None = getattr(fs, _ATTR, None)
    if hook is not None and nbytes > 0:
        hook(op, nbytes)
