"""Reading a batch back from the shared WAL, wherever it lives: a DATA record of a main's WAL,
or a proxy's PREPARED record that a main's LINK points to (patched as the main served it)."""

from __future__ import annotations

from typing import Protocol

import trio

from shared_wal.broker_records import PreparedLink, read_prepared, rebuild_linked_batch
from shared_wal.reader import WalReader
from shared_wal.record import WalPosition
from shared_wal.storage import FS

Buffer = bytes | bytearray | memoryview


class StoredBatch(Protocol):
    base_offset: int
    max_timestamp: int
    data: Buffer | None
    position: WalPosition | None
    link: PreparedLink | None


class BatchReader:
    """Readers for every writer directory on one shared FS, with a bounded thread limiter."""

    def __init__(self, fs: FS, max_threads: int = 4) -> None:
        self.fs = fs
        self.limiter = trio.CapacityLimiter(max_threads)
        self._readers: dict[str, WalReader] = {}

    def reader_for(self, writer: str) -> WalReader:
        reader = self._readers.get(writer)
        if reader is None:
            reader = self._readers[writer] = WalReader(self.fs, writer)
        return reader

    def read_prepared(self, position: WalPosition) -> bytearray:
        """Blocking: a PREPARED payload as a writable copy."""
        return read_prepared(self.reader_for(position.writer), position)

    def read_batch(self, entry: StoredBatch) -> Buffer:
        """Blocking: the batch bytes of an entry whose in-memory copy is gone."""
        if entry.link is not None:
            reader = self.reader_for(entry.link.target.writer)
            return rebuild_linked_batch(reader, entry.link, entry.base_offset, entry.max_timestamp)
        position = entry.position
        if position is None:
            raise ValueError(f"batch at {entry.base_offset} has neither bytes nor a WAL position")
        return self.reader_for(position.writer).read_record(position).payload

    async def batch_bytes(self, entry: StoredBatch) -> Buffer:
        data = entry.data
        if data is not None:
            return data
        return await trio.to_thread.run_sync(self.read_batch, entry, limiter=self.limiter)

    def forget(self, writer: str, segments: list[int]) -> None:
        reader = self._readers.get(writer)
        if reader is not None:
            reader.forget(segments)
