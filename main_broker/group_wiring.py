"""Connects the two group coordinators (classic and KIP-848 consumer groups) to each other and
to the broker's log store: one group id namespace, one offset table, topic ids for KIP-848,
both kinds of groups on the WAL."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from main_broker.consumer_coordinator import ConsumerCoordinator
from main_broker.consumer_persistence import WalConsumerGroups
from main_broker.group_config import GroupConfig
from main_broker.group_coordinator import GroupCoordinator
from main_broker.group_persistence import WalMembership
from main_broker.log_store import LogStore


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
    store.forget_offsets = classic.forget_offsets
    return consumer


def _drop_classic(classic: GroupCoordinator, group_id: str) -> None:
    if classic.group(group_id) is not None:
        classic.remove_group(group_id)
        classic.membership.group_gone(group_id)


def persist_membership(classic: GroupCoordinator, store: LogStore) -> WalMembership:
    """Classic group membership on the store's WAL: replay and snapshots keep it, and
    ``restore`` (after replay) rebuilds the groups; run its ``run`` in the broker's nursery."""
    membership = WalMembership(store.wal)
    classic.membership = membership
    store.load_group = membership.load
    store.snapshot_groups = membership.snapshot
    return membership


def persist_consumer_groups(
    consumer: ConsumerCoordinator, classic: WalMembership, store: LogStore
) -> WalConsumerGroups:
    """KIP-848 groups on the store's WAL beside the classic ones (``persist_membership``
    first): replay and snapshots keep them, ``restore`` (after replay) rebuilds them; run its
    ``run`` in the broker's nursery."""
    records = WalConsumerGroups(store.wal)
    consumer.records = records

    def load(header: dict[str, Any]) -> None:
        (records if header.get("k") == records.kind else classic).load(header)

    store.load_group = load
    store.snapshot_consumer_groups = records.snapshot
    return records
