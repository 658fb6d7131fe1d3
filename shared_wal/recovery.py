"""Crash recovery of a writer's directory: verify every record, truncate bad tails."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from shared_wal import storage
from shared_wal.io_hook import count_io
from shared_wal.scan import SegmentScan
from shared_wal.storage import FS

log = logging.getLogger("zonefleet.wal")


@dataclass
class RecoveredLog:
    sizes: dict[int, int] = field(default_factory=dict)  # segment id -> bytes, oldest first
    mtimes: dict[int, float] = field(default_factory=dict)  # segment id -> epoch seconds
    truncated: list[tuple[int, int, str]] = field(default_factory=list)  # (segment, at, reason)

    @property
    def end_offset(self) -> int:
        if not self.sizes:
            return 0
        last = next(reversed(self.sizes))
        return last + self.sizes[last]


def recover(fs: FS, writer_id: str) -> RecoveredLog:
    """Scan every segment oldest first (blocking); cut each one at its first bad record.

    A bad record anywhere means the bytes after it in that segment cannot be trusted (lengths
    chain records), so the segment is truncated there and the scan goes on with the next one.
    """
    fs.makedirs(storage.wal_dir(writer_id), recreate=True)
    result = RecoveredLog()
    for segment in storage.list_segment_ids(fs, writer_id):
        path = storage.segment_path(writer_id, segment)
        with storage.open_for_recovery(fs, path) as f:
            size = storage.file_size(f)
            scan = SegmentScan(f, writer_id, segment, 0, size)
            for _ in scan:
                pass
            count_io(fs, "scan", scan.stop)
            if scan.problem is not None:
                log.warning(
                    "WAL recovery: %s: truncating at byte %d of %d (%s bytes dropped): %s",
                    path,
                    scan.stop,
                    size,
                    size - scan.stop,
                    scan.problem,
                )
                f.truncate(scan.stop)
                storage.sync_file(f)
                result.truncated.append((segment, scan.stop, scan.problem))
                size = scan.stop
        result.sizes[segment] = size
        result.mtimes[segment] = storage.segment_mtime(fs, path) or time.time()
    return result
