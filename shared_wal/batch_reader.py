"""Reading a batch back from the shared WAL, wherever it lives: a DATA record of a main's WAL,
or a proxy's PREPARED record that a main's LINK points to (patched as the main served it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import trio

from shared_wal.broker_records import PreparedLink, read_prepared, rebuild_linked_batch
from shared_wal.reader import WalReader
from shared_wal.record import WalPosition
from shared_wal.storage import FS

Buffer = bytes | bytearray | memoryview


class StoredBatch(Protocol):
    # Read-only members, so that entries with a narrower `data` type qualify.
    @property
    def base_offset(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def data(self) -> Buffer | None: ...
    @property
    def position(self) -> WalPosition | None: ...
    @property
    def link(self) -> PreparedLink | None: ...


class BatchReader:
    """Readers for every writer directory on one shared FS, with a bounded thread limiter."""

    def __init__(self, fs: FS, max_threads: int = 4, own: WalReader | None = None) -> None:
        self.fs = fs
        self.limiter = trio.CapacityLimiter(max_threads)
        self._readers: dict[str, WalReader] = {own.writer_id: own} if own is not None else {}

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

    async def batches_bytes(self, entries: Sequence[StoredBatch]) -> list[Buffer]:
        """The bytes of every entry, those no longer in memory read in one worker call: a
        consumer that fell behind the cache pays one thread hop per fetch, not per batch."""
        out: list[Buffer | None] = [e.data for e in entries]
        missing = [i for i, data in enumerate(out) if data is None]
        if missing:

            def read_missing() -> list[Buffer]:
                return [self.read_batch(entries[i]) for i in missing]

            read = await trio.to_thread.run_sync(read_missing, limiter=self.limiter)
            for i, data in zip(missing, read, strict=True):
                out[i] = data
        return cast(list[Buffer], out)

    def forget(self, writer: str, segments: list[int]) -> None:
        reader = self._readers.get(writer)
        if reader is not None:
            reader.forget(segments)
