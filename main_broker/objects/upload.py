"""What the main's uploader moves into objects next: pure bookkeeping, no I/O.

Per partition it knows the uploaded end (everything below is in committed objects; from the
manifest on start) and the committed bytes not yet uploaded (whole batches below the high
watermark). `UploadTracker.select` picks an upload's batches; `retention_floor` tells the WAL
which bytes it must keep because no committed object holds them yet (invariant 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from main_broker.partition_log import BatchEntry, PartitionLog
from s3_commit.manifest import StreamKey, StreamShare
from s3_commit.object_format import stream_id_for

__all__ = ["PartitionUpload", "UploadTracker", "retention_floor", "stream_key"]


def stream_key(plog: PartitionLog) -> StreamKey:
    return StreamKey(plog.topic_id, plog.partition)


@dataclass(slots=True)
class PartitionUpload:
    """One partition's share of an upload: committed batches [start, end)."""

    plog: PartitionLog
    key: StreamKey
    stream_id: int
    entries: list[BatchEntry]

    @property
    def start(self) -> int:
        return self.entries[0].base_offset

    @property
    def end(self) -> int:
        return self.entries[-1].last_offset + 1

    @property
    def nbytes(self) -> int:
        return sum(e.size for e in self.entries)

    def share(self) -> StreamShare:
        max_ts = max(e.max_timestamp for e in self.entries)
        return StreamShare(self.key, self.plog.topic, self.start, self.end, max_ts, self.nbytes)


class UploadTracker:
    def __init__(self) -> None:
        self.uploaded_end: dict[StreamKey, int] = {}
        self.pending: dict[StreamKey, int] = {}
        self._counted_to: dict[StreamKey, int] = {}

    @property
    def pending_bytes(self) -> int:
        return sum(self.pending.values())

    def observe(self, plogs: Iterable[PartitionLog]) -> int:
        """Count the batches committed since the last call; returns the bytes pending."""
        seen: set[StreamKey] = set()
        for plog in plogs:
            key = stream_key(plog)
            seen.add(key)
            uploaded = self.uploaded_end.get(key, 0)
            counted = max(self._counted_to.get(key, uploaded), uploaded)
            hw = plog.high_watermark
            if counted < hw:
                entries = plog.entries
                added = 0
                for i in range(plog.index.first_index_at(counted), len(entries)):
                    entry = entries[i]
                    if entry.last_offset >= hw:
                        break
                    added += entry.size
                    counted = entry.last_offset + 1
                self.pending[key] = self.pending.get(key, 0) + added
            self._counted_to[key] = counted
        for gone in [k for k in self.pending if k not in seen]:
            # A deleted topic (or a partition another main now leads): nothing to upload.
            del self.pending[gone]
            self._counted_to.pop(gone, None)
        return self.pending_bytes

    def select(self, plogs: Iterable[PartitionLog], max_bytes: int) -> list[PartitionUpload]:
        """The committed batches not yet uploaded, in partition order, up to about `max_bytes`
        (at least one batch, and whole batches only)."""
        out: list[PartitionUpload] = []
        total = 0
        for plog in sorted(plogs, key=lambda p: (p.topic, p.partition)):
            if total >= max_bytes:
                break
            key = stream_key(plog)
            hw = plog.high_watermark
            chosen: list[BatchEntry] = []
            entries = plog.entries
            for i in range(plog.index.first_index_at(self.uploaded_end.get(key, 0)), len(entries)):
                entry = entries[i]
                if entry.last_offset >= hw or (total + entry.size > max_bytes and (out or chosen)):
                    break
                chosen.append(entry)
                total += entry.size
            if chosen:
                out.append(PartitionUpload(plog, key, stream_id_for(*key), chosen))
        return out

    def committed(self, uploads: Iterable[PartitionUpload]) -> None:
        """The manifest commit of these uploads succeeded."""
        for up in uploads:
            self.uploaded_end[up.key] = max(self.uploaded_end.get(up.key, 0), up.end)
            left = self.pending.get(up.key, 0) - up.nbytes
            self.pending[up.key] = max(left, 0)

    def load(self, ends: dict[StreamKey, int]) -> None:
        """Uploaded ends from the manifest (on start)."""
        for key, end in ends.items():
            self.uploaded_end[key] = max(self.uploaded_end.get(key, 0), end)


def retention_floor(
    plogs: Iterable[PartitionLog], uploaded_end: dict[StreamKey, int], wal_end: int
) -> int:
    """The lowest WAL byte that still carries a batch no committed object holds: retention
    must keep every segment with bytes at or past it. Batches not yet durable have no
    position; their records come after every durable one, so `wal_end` covers them."""
    floor = wal_end
    for plog in plogs:
        entries = plog.entries
        i = plog.index.first_index_at(uploaded_end.get(stream_key(plog), 0))
        if i < len(entries):
            position = entries[i].position
            if position is not None:
                floor = min(floor, position.offset)
    return floor
