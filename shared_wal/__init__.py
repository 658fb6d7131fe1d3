"""The shared write-ahead log: per-writer segment files on a pyfilesystem2 FS,
group-committed appends, crash recovery with torn-tail truncation, and tailing readers.
"""

from shared_wal.io_hook import IoHook, set_io_hook
from shared_wal.reader import WalReader, list_writers
from shared_wal.record import (
    CorruptRecord,
    OffsetOutOfRange,
    RecordType,
    SegmentNotFound,
    WalError,
    WalPosition,
    WalRecord,
    encode_record,
)
from shared_wal.storage import open_wal_fs, sync_file
from shared_wal.writer import AppendTicket, PreparedTrim, WalConfig, WalWriter

__all__ = [
    "AppendTicket",
    "CorruptRecord",
    "IoHook",
    "OffsetOutOfRange",
    "PreparedTrim",
    "RecordType",
    "SegmentNotFound",
    "WalConfig",
    "WalError",
    "WalPosition",
    "WalReader",
    "WalRecord",
    "WalWriter",
    "encode_record",
    "list_writers",
    "open_wal_fs",
    "set_io_hook",
    "sync_file",
]
