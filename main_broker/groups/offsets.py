"""Committed consumer-group offsets: validation, durable commit through an ``OffsetStore``,
replay, and OffsetFetch answers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

log = logging.getLogger(__name__)

NONE = int(ErrorCode.none)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.coordinator_not_available)
UNKNOWN_TOPIC_OR_PARTITION = int(ErrorCode.unknown_topic_or_partition)
OFFSET_METADATA_TOO_LARGE = int(ErrorCode.offset_metadata_too_large)

OffsetTuple = tuple[str, int, int, int, str]  # topic, partition, offset, leader epoch, metadata
# As committed by a client: the metadata may be None.
OffsetCommitTuple = tuple[str, int, int, int, str | None]
PartitionKey = tuple[str, int]


class OffsetStore(Protocol):
    """Durability and topic knowledge the broker provides to the coordinator."""

    async def persist_offsets(
        self, group_id: str, offsets: list[OffsetTuple], applied: Callable[[], None]
    ) -> None:
        """Return once the offsets are durable. ``applied`` runs as they become durable,
        before anything later is logged (a snapshot must see them); not if they fail."""

    async def persist_offsets_delete(
        self,
        group_id: str,
        partitions: list[PartitionKey] | None,
        applied: Callable[[], None],
    ) -> None:
        """Return once the deletion is durable; ``None`` deletes the whole group. ``applied``
        as for ``persist_offsets``."""

    def partition_exists(self, topic: str, partition: int) -> bool: ...


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str


class OffsetTable:
    """Every group's committed offsets, kept in memory and made durable by ``store``."""

    def __init__(self, store: OffsetStore) -> None:
        self.store = store
        self._offsets: dict[str, dict[PartitionKey, CommittedOffset]] = {}
        self._seq: dict[str, dict[PartitionKey, int]] = {}
        self._commit_seq = 0
        self._floor: dict[str, int] = {}  # group id -> seq of its last whole-group deletion

    def has_offsets(self, group_id: str) -> bool:
        return bool(self._offsets.get(group_id))

    def partitions(self, group_id: str) -> set[PartitionKey]:
        return set(self._offsets.get(group_id, {}))

    async def delete(self, group_id: str, partitions: Sequence[PartitionKey] | None) -> None:
        """Durably forget the group's offsets (``partitions=None``: all of them); raises when
        the store fails, and then nothing is forgotten."""
        self._commit_seq += 1
        seq = self._commit_seq
        keys = None if partitions is None else list(partitions)
        await self.store.persist_offsets_delete(
            group_id, keys, lambda: self.forget(group_id, keys, seq)
        )

    def forget(
        self, group_id: str, partitions: Iterable[PartitionKey] | None, seq: int = 0
    ) -> None:
        """Apply a deletion (also on replay, with ``seq=0``)."""
        stored = self._offsets.get(group_id, {})
        seqs = self._seq.setdefault(group_id, {})
        if partitions is None:
            # Commits submitted before the deletion (lower seqs) must not bring offsets back.
            self._floor[group_id] = seq
            keys: list[PartitionKey] = list(stored)
        else:
            keys = [(str(t), int(p)) for t, p in partitions]
        for key in keys:
            if seqs.get(key, -1) <= seq:
                seqs[key] = seq
                stored.pop(key, None)
        if not stored:
            self._offsets.pop(group_id, None)

    async def commit(
        self, group_id: str, offsets: Sequence[OffsetCommitTuple], metadata_max_bytes: int
    ) -> dict[PartitionKey, int]:
        """Validate, persist and apply; returns the error code of each partition.

        The caller has already checked that the committer may commit for the group."""
        errors: dict[PartitionKey, int] = {}
        to_store: list[OffsetTuple] = []
        for topic, partition, offset, epoch, metadata in offsets:
            key = (topic, partition)
            if not self.store.partition_exists(topic, partition):
                errors[key] = UNKNOWN_TOPIC_OR_PARTITION
            elif metadata is not None and len(metadata) > metadata_max_bytes:
                errors[key] = OFFSET_METADATA_TOO_LARGE
            else:
                errors[key] = NONE
                to_store.append((topic, partition, offset, epoch, metadata or ""))
        if to_store:
            self._commit_seq += 1
            seq = self._commit_seq
            try:
                await self.store.persist_offsets(
                    group_id, to_store, lambda: self.apply(group_id, to_store, seq)
                )
            except Exception:
                log.exception("group %s: persisting offsets failed", group_id)
                for topic, partition, *_ in to_store:
                    errors[(topic, partition)] = COORDINATOR_NOT_AVAILABLE
        return errors

    def apply(self, group_id: str, offsets: Iterable[OffsetTuple], seq: int) -> None:
        if seq < self._floor.get(group_id, 0):
            return
        stored = self._offsets.setdefault(group_id, {})
        seqs = self._seq.setdefault(group_id, {})
        for topic, partition, offset, epoch, metadata in offsets:
            key = (topic, partition)
            # Concurrent commits are applied in submission order (the order the store logged).
            if seqs.get(key, -1) <= seq:
                seqs[key] = seq
                stored[key] = CommittedOffset(offset, epoch, metadata)

    def load(self, group_id: str, offsets: Iterable[OffsetTuple]) -> None:
        """Replay durable offsets (broker start-up, before serving)."""
        self.apply(group_id, offsets, 0)

    def committed(self) -> dict[str, dict[PartitionKey, CommittedOffset]]:
        return {gid: dict(offsets) for gid, offsets in self._offsets.items() if offsets}

    def delete_topic(self, topic: str) -> None:
        for group_id, offsets in list(self._offsets.items()):
            seqs = self._seq[group_id]
            for key in [k for k in offsets if k[0] == topic]:
                del offsets[key]
                seqs.pop(key, None)
            if not offsets:
                del self._offsets[group_id]
                del self._seq[group_id]

    def fetch(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]] | None
    ) -> dict[str, Any]:
        """OffsetFetch for one group; ``topics=None`` means every partition it has offsets for."""
        offsets = self._offsets.get(group_id, {})
        if topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
            topics = list(wanted.items())
        result = []
        for topic, partitions in topics:
            parts = []
            for p in partitions:
                c = offsets.get((topic, p))
                error = NONE
                if c is None and not self.store.partition_exists(topic, p):
                    error = UNKNOWN_TOPIC_OR_PARTITION
                parts.append(
                    {
                        "partition_index": p,
                        "committed_offset": c.offset if c else -1,
                        "committed_leader_epoch": c.leader_epoch if c else -1,
                        "metadata": c.metadata if c else "",
                        "error_code": error,
                    }
                )
            result.append({"name": topic, "partitions": parts})
        return {"error_code": NONE, "topics": result}


def commit_response(errors: dict[PartitionKey, int]) -> dict[str, Any]:
    """The OffsetCommit answer for each partition's error code."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in errors.items():
        by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}
