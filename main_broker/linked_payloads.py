"""The bytes of linked batches, read back off the produce path.

A confirmed batch is appended from its header alone: its bytes stay in the zone proxy's
PREPARED record, and the main's LINK points there. The main still wants them in memory, for
its own fetches and its uploads; this reads them once the LINK is durable, many per worker
thread call, and puts them in the batch cache. A batch not read yet (or evicted again) is read
on demand, as any evicted batch is (shared_wal.batch_reader).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import trio

from main_broker.partition_log import BatchEntry
from shared_wal.batch_reader import BatchReader, Buffer

log = logging.getLogger("zonefleet.main_broker.linked_payloads")

# Batches per worker call: one thread hop reads this many.
READ_BATCH = 256
# How long a wake-up waits for more linked batches before reading: at 1,000 single-batch
# produces a second, a read per LINK group would be a thread hop per message on the main.
GATHER_S = 0.02
# Past this many waiting, the oldest are left to be read on demand.
MAX_WAITING = 20_000


class LinkedPayloads:
    def __init__(self, batches: BatchReader, cached: Callable[[BatchEntry], None]) -> None:
        self._batches = batches
        self._cached = cached
        self._waiting: deque[BatchEntry] = deque(maxlen=MAX_WAITING)
        self._wakeup = trio.Event()
        self.read = 0
        self.failed = 0

    def want(self, entry: BatchEntry) -> None:
        """A durable linked batch whose bytes are not in memory."""
        self._waiting.append(entry)
        self._wakeup.set()

    async def run(self) -> None:
        while True:
            if not self._waiting:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                if len(self._waiting) < READ_BATCH:
                    await trio.sleep(GATHER_S)
                continue
            take = min(len(self._waiting), READ_BATCH)
            entries = [self._waiting.popleft() for _ in range(take)]
            read = await trio.to_thread.run_sync(
                self._read_all, entries, limiter=self._batches.limiter
            )
            for entry, data in zip(entries, read, strict=True):
                if data is not None and entry.data is None:
                    entry.data = memoryview(data)
                    self._cached(entry)

    def _read_all(self, entries: list[BatchEntry]) -> list[Buffer | None]:
        out: list[Buffer | None] = []
        for entry in entries:
            try:
                out.append(self._batches.read_batch(entry))
                self.read += 1
            except Exception as exc:  # a batch not read now is read on demand
                self.failed += 1
                log.warning("cannot read linked batch at %d: %r", entry.base_offset, exc)
                out.append(None)
        return out
