"""Connects the two group coordinators (classic and KIP-848 consumer groups) to each other and
to the broker's log store: one group id namespace, one offset table, topic ids for KIP-848,
the offsets and both kinds of groups on the WAL (each a `StoreParticipant` of the store,
registered before it replays, in any order)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from main_broker.group_config import GroupConfig
from main_broker.groups.consumer_coordinator import ConsumerCoordinator
from main_broker.groups.consumer_persistence import WalConsumerGroups
from main_broker.groups.coordinator import GroupCoordinator
from main_broker.groups.persistence import WalMembership
from main_broker.log_store import LogStore, StoreParticipant


class StoreTopics:
    """The log store's topics as the consumer coordinator sees them (every main holds every
    topic's metadata, so the coordinator's main knows them all)."""

    def __init__(self, store: LogStore) -> None:
        self._store = store

    def topic_partition_counts(self) -> Mapping[str, int]:
        return {name: len(t.partitions) for name, t in self._store.topics.items()}

    def topic_id(self, name: str) -> uuid.UUID | None:
        t = self._store.topics.get(name)
        return uuid.UUID(bytes=bytes(t.topic_id)) if t is not None else None

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        t = self._store.topics_by_id.get(topic_id.bytes)
        return t.name if t is not None else None


def consumer_groups(
    config: GroupConfig, classic: GroupCoordinator, store: LogStore
) -> ConsumerCoordinator:
    """The KIP-848 coordinator beside ``classic``, sharing its offsets and group ids."""
    consumer = ConsumerCoordinator(config, StoreTopics(store))
    consumer.classic_in_use = classic.in_use
    consumer.drop_classic = lambda group_id: _drop_classic(classic, group_id)
    consumer.has_offsets = classic.offsets.has_offsets
    classic.consumer_in_use = consumer.in_use
    classic.drop_consumer = consumer.remove_group
    return consumer


class GroupOffsetsOnWal:
    """The coordinator's committed offsets as a store participant: the SNAPSHOT's ``offsets``
    section, the ``offsets``, ``group_delete`` and ``offsets_delete`` records, and the offsets
    of a deleted topic's partitions dropped."""

    snapshot_section: ClassVar[str] = "offsets"
    record_kinds: ClassVar[frozenset[str]] = frozenset(
        {"offsets", "group_delete", "offsets_delete"}
    )

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for group_id, offsets in self._coordinator.committed_offsets().items():
            out[group_id] = [
                [topic, partition, c.offset, c.leader_epoch, c.metadata]
                for (topic, partition), c in offsets.items()
            ]
        return out

    def restore(self, section: dict[str, Any]) -> None:
        for group_id, rows in section.items():
            self._coordinator.load_offsets(group_id, [tuple(r) for r in rows])  # type: ignore[misc]

    def replay(self, header: dict[str, Any]) -> None:
        kind, group_id = header["k"], header["g"]
        if kind == "offsets":
            self._coordinator.load_offsets(group_id, [tuple(o) for o in header["o"]])  # type: ignore[misc]
        elif kind == "group_delete":
            self._coordinator.forget_offsets(group_id, None)
        else:  # offsets_delete (OffsetDelete)
            partitions = [(str(t), int(p)) for t, p in header["o"]]
            self._coordinator.forget_offsets(group_id, partitions)

    def topic_deleted(self, name: str, topic_id: bytes | None) -> None:
        self._coordinator.delete_topic_offsets(name)


class GroupRecordsOnWal:
    """One kind of group records (classic or KIP-848) as a store participant: its SNAPSHOT
    section and its records, all loaded into ``records``."""

    def __init__(self, records: WalMembership | WalConsumerGroups, section: str) -> None:
        self._records = records
        self.snapshot_section = section
        self.record_kinds = frozenset({records.kind})

    def snapshot(self) -> dict[str, Any]:
        return self._records.snapshot()

    def restore(self, section: dict[str, Any]) -> None:
        for header in section.values():
            self._records.load(header)

    def replay(self, header: dict[str, Any]) -> None:
        self._records.load(header)


def persist_offsets(classic: GroupCoordinator, store: LogStore) -> None:
    """The group offsets (of both kinds of groups: one table) on the store's WAL: replay and
    snapshots keep them, a deleted topic's go with it."""
    participant = GroupOffsetsOnWal(classic)
    store.register(participant)
    store.listen_topic_deletions(participant)


def _drop_classic(classic: GroupCoordinator, group_id: str) -> None:
    if classic.group(group_id) is not None:
        classic.remove_group(group_id)
        classic.membership.group_gone(group_id)


def persist_membership(classic: GroupCoordinator, store: LogStore) -> WalMembership:
    """Classic group membership on the store's WAL: replay and snapshots keep it, and
    ``restore`` (after replay) rebuilds the groups; run its ``run`` in the broker's nursery."""
    membership = WalMembership(store.wal)
    classic.membership = membership
    participant: StoreParticipant = GroupRecordsOnWal(membership, "groups")
    store.register(participant)
    return membership


def persist_consumer_groups(consumer: ConsumerCoordinator, store: LogStore) -> WalConsumerGroups:
    """KIP-848 groups on the store's WAL beside the classic ones: replay and snapshots keep
    them, ``restore`` (after replay) rebuilds them; run its ``run`` in the broker's nursery."""
    records = WalConsumerGroups(store.wal)
    consumer.records = records
    participant: StoreParticipant = GroupRecordsOnWal(records, "consumer_groups")
    store.register(participant)
    return records
