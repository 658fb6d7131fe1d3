"""Sequential scan of one segment file, shared by recovery, replay and tailing readers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shared_wal import storage
from shared_wal.record import LENGTH, MIN_BODY, CorruptRecord, WalPosition, WalRecord, decode_body


class SegmentScan:
    """Iterate the records of ``segment`` from byte ``start`` while they end at or before ``limit``.

    Iteration never raises on bad bytes; it stops, and then:
    - ``stop`` is the byte position just past the last good record;
    - ``problem`` is None when the scan reached ``limit`` exactly, else a reason;
    - ``incomplete`` is True when the next record merely does not fit before ``limit`` (a torn
      tail, or a record not yet published), False for corruption (CRC, framing, header).
    """

    def __init__(self, f: Any, writer: str, segment: int, start: int, limit: int) -> None:
        self._f = f
        self._writer = writer
        self._segment = segment
        self._start = start
        self._limit = limit
        self.stop = start
        self.problem: str | None = None
        self.incomplete = False

    def __iter__(self) -> Iterator[WalRecord]:
        f = self._f
        pos = self._start
        limit = self._limit
        f.seek(pos)
        while pos < limit:
            self.stop = pos
            if limit - pos < LENGTH.size:
                self._fail(f"{limit - pos} stray bytes, too few for a length field", True)
                return
            raw = storage.read_exact(f, LENGTH.size)
            if len(raw) < LENGTH.size:
                self._fail("file ends inside a length field", True)
                return
            (n,) = LENGTH.unpack(raw)
            if n < MIN_BODY:
                self._fail(f"impossible record length {n}", False)
                return
            if pos + LENGTH.size + n > limit:
                self._fail(f"record of {LENGTH.size + n} bytes runs past byte {limit}", True)
                return
            body = storage.read_exact(f, n)
            if len(body) < n:
                self._fail(f"file ends {n - len(body)} bytes short of the record's end", True)
                return
            position = WalPosition(self._writer, self._segment, pos, LENGTH.size + n)
            try:
                record = decode_body(memoryview(body), position)
            except CorruptRecord as exc:
                self._fail(exc.reason, False)
                return
            pos += LENGTH.size + n
            self.stop = pos
            yield record
        self.stop = pos

    def _fail(self, reason: str, incomplete: bool) -> None:
        self.problem = reason
        self.incomplete = incomplete

    def error(self) -> CorruptRecord:
        assert self.problem is not None
        return CorruptRecord(
            f"WAL {self._writer}/{self._segment:020d}.wal at byte {self.stop}: {self.problem}",
            reason=self.problem,
            segment=self._segment,
            position=self.stop,
            torn=self.incomplete,
        )
