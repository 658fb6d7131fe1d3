"""DeleteGroups and OffsetDelete over both kinds of group (classic and KIP-848 consumer), with
the errors Apache Kafka 4.x gives. Deletions are durable: the offset table logs them first."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from main_broker.groups.classic import GroupState
from main_broker.groups.consumer_coordinator import ConsumerCoordinator
from main_broker.groups.coordinator import GroupCoordinator

log = logging.getLogger(__name__)

NONE = int(ErrorCode.none)
INVALID_GROUP_ID = int(ErrorCode.invalid_group_id)
NOT_COORDINATOR = int(ErrorCode.not_coordinator)
GROUP_ID_NOT_FOUND = int(ErrorCode.group_id_not_found)
NON_EMPTY_GROUP = int(ErrorCode.non_empty_group)
GROUP_SUBSCRIBED_TO_TOPIC = int(ErrorCode.group_subscribed_to_topic)
COORDINATOR_NOT_AVAILABLE = int(ErrorCode.coordinator_not_available)


def _check_group(
    classic: GroupCoordinator, consumer: ConsumerCoordinator | None, group_id: str
) -> tuple[int, set[str]]:
    """(error, topics the group's members subscribe to) for a group about to lose offsets."""
    if not group_id:
        return INVALID_GROUP_ID, set()
    if not classic.owns(group_id):
        return NOT_COORDINATOR, set()
    cgroup = consumer.groups.get(group_id) if consumer is not None else None
    if cgroup is not None:
        return NONE, cgroup.subscribed_topics() if cgroup.members else set()
    g = classic.group(group_id)
    if g is None or g.state is GroupState.DEAD:
        if classic.offsets.has_offsets(group_id):
            return NONE, set()
        return GROUP_ID_NOT_FOUND, set()
    return NONE, g.subscribed_topics()


def _is_empty(
    classic: GroupCoordinator, consumer: ConsumerCoordinator | None, group_id: str
) -> bool:
    cgroup = consumer.groups.get(group_id) if consumer is not None else None
    if cgroup is not None:
        return not cgroup.members
    g = classic.group(group_id)
    return g is None or g.state in (GroupState.EMPTY, GroupState.DEAD)


async def delete_groups(
    classic: GroupCoordinator, consumer: ConsumerCoordinator | None, group_ids: Sequence[str]
) -> dict[str, Any]:
    """DeleteGroups: each group must exist, be coordinated here and have no members."""
    results = []
    # Kafka checks every named group against the state before the request (its deletions
    # are applied after), so a group named twice gets the same answer twice.
    answered: dict[str, int] = {}
    for group_id in group_ids:
        if group_id in answered:
            results.append({"group_id": group_id, "error_code": answered[group_id]})
            continue
        error, _ = _check_group(classic, consumer, group_id)
        if error == NONE and not _is_empty(classic, consumer, group_id):
            error = NON_EMPTY_GROUP
        if error == NONE:
            # Gone from memory before the await, so nobody joins it meanwhile.
            classic.remove_group(group_id)
            classic.membership.group_gone(group_id)
            if consumer is not None:
                consumer.remove_group(group_id)
            try:
                await classic.offsets.delete(group_id, None)
            except Exception:
                log.exception("group %s: persisting its deletion failed", group_id)
                error = COORDINATOR_NOT_AVAILABLE
        answered[group_id] = error
        results.append({"group_id": group_id, "error_code": error})
    return {"results": results}


async def delete_offsets(
    classic: GroupCoordinator,
    consumer: ConsumerCoordinator | None,
    group_id: str,
    topics: Sequence[tuple[str, Sequence[int]]],
) -> dict[str, Any]:
    """OffsetDelete: the offsets of topics the group does not subscribe to."""
    error, subscribed = _check_group(classic, consumer, group_id)
    if error == NONE and not _is_empty(classic, consumer, group_id):
        g = classic.group(group_id)
        if g is not None and g.protocol_type != "consumer":
            error = NON_EMPTY_GROUP  # only consumer-protocol groups know their topics
    if error != NONE:
        return {"error_code": error, "topics": []}
    out: list[dict[str, Any]] = []
    doomed: list[tuple[str, int]] = []
    stored = classic.offsets.partitions(group_id)
    for topic, partitions in topics:
        code = GROUP_SUBSCRIBED_TO_TOPIC if topic in subscribed else NONE
        if code == NONE:
            doomed.extend(k for k in ((topic, p) for p in partitions) if k in stored)
        out.append(
            {
                "name": topic,
                "partitions": [{"partition_index": p, "error_code": code} for p in partitions],
            }
        )
    if doomed:
        try:
            await classic.offsets.delete(group_id, doomed)
        except Exception:
            log.exception("group %s: persisting an offset deletion failed", group_id)
            return {"error_code": COORDINATOR_NOT_AVAILABLE, "topics": []}
    return {"error_code": NONE, "topics": out}
