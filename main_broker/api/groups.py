"""Protocol glue between kio group/offset requests and the ``GroupCoordinator``.

Each handler takes the decoded kio request of any version and returns a version-agnostic dict
named after the latest kio response schema; the broker builds the versioned response from it.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from main_broker.groups import admin as group_admin
from main_broker.groups.consumer_coordinator import ConsumerCoordinator
from main_broker.groups.coordinator import GroupCoordinator
from main_broker.groups.offsets import commit_response

JOIN_GROUP = 11
SYNC_GROUP = 14
HEARTBEAT = 12
LEAVE_GROUP = 13
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
LIST_GROUPS = 16
DESCRIBE_GROUPS = 15
DELETE_GROUPS = 42
OFFSET_DELETE = 47
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
GROUP_API_KEYS = frozenset({8, 9, 11, 12, 13, 14, 15, 16, 42, 47, 68, 69})

UNKNOWN_TOPIC_ID = int(ErrorCode.unknown_topic_id)
UNSTABLE_OFFSET_COMMIT = int(ErrorCode.unstable_offset_commit)
UNSUPPORTED_VERSION = int(ErrorCode.unsupported_version)
NONE = int(ErrorCode.none)


def _ms(value: Any) -> int:
    """kio gives some ``*_ms`` fields as timedelta; accept either form."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


def _opt(req: Any, *names: str) -> Any:
    for name in names:
        if hasattr(req, name):
            return getattr(req, name)
    return None


async def handle(
    api_key: int,
    api_version: int,
    request: Any,
    coordinator: GroupCoordinator,
    client_id: str,
    client_host: str,
    consumer: ConsumerCoordinator | None = None,
) -> dict[str, Any]:
    """Serve one group-related request; raises ValueError for other API keys.

    ``consumer`` serves KIP-848 consumer groups; without it there are only classic groups."""
    if api_key == JOIN_GROUP:
        resp = await _join_group(api_version, request, coordinator, client_id, client_host)
    elif api_key == SYNC_GROUP:
        resp = await coordinator.sync_group(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=_opt(request, "group_instance_id"),
            protocol_type=_opt(request, "protocol_type"),
            protocol_name=_opt(request, "protocol_name"),
            assignments=[(a.member_id, bytes(a.assignment)) for a in request.assignments],
        )
    elif api_key == HEARTBEAT:
        resp = await coordinator.heartbeat(
            group_id=request.group_id,
            generation_id=request.generation_id,
            member_id=request.member_id,
            group_instance_id=_opt(request, "group_instance_id"),
        )
    elif api_key == LEAVE_GROUP:
        resp = await _leave_group(api_version, request, coordinator)
    elif api_key == OFFSET_COMMIT:
        resp = await _offset_commit(api_version, request, coordinator, consumer)
    elif api_key == OFFSET_FETCH:
        resp = _offset_fetch(api_version, request, coordinator, consumer)
    elif api_key == LIST_GROUPS:
        resp = _list_groups(request, coordinator, consumer)
    elif api_key == DELETE_GROUPS:
        resp = await group_admin.delete_groups(coordinator, consumer, list(request.groups_names))
    elif api_key == OFFSET_DELETE:
        topics = [(t.name, [p.partition_index for p in t.partitions]) for t in request.topics]
        resp = await group_admin.delete_offsets(coordinator, consumer, request.group_id, topics)
    elif api_key == CONSUMER_GROUP_HEARTBEAT:
        if consumer is None:
            raise ValueError("no consumer group coordinator")
        resp = await consumer.heartbeat(request, client_id, client_host, api_version)
    elif api_key == CONSUMER_GROUP_DESCRIBE:
        if consumer is None:
            raise ValueError("no consumer group coordinator")
        resp = consumer.describe(
            list(request.group_ids), bool(request.include_authorized_operations)
        )
    elif api_key == DESCRIBE_GROUPS:
        resp = coordinator.describe_groups(
            list(request.groups),
            include_authorized_operations=bool(_opt(request, "include_authorized_operations")),
            not_found_error=api_version >= 6,
        )
    else:
        raise ValueError(f"not a group API: {api_key}")
    resp["throttle_time_ms"] = 0
    return resp


def _list_groups(
    req: Any, coordinator: GroupCoordinator, consumer: ConsumerCoordinator | None
) -> dict[str, Any]:
    states = {s.lower() for s in _opt(req, "states_filter") or ()}
    types = {t.lower() for t in _opt(req, "types_filter") or ()}
    resp = coordinator.list_groups()
    listed = consumer.listed() if consumer is not None else []
    # A consumer group supersedes the offsets-only classic shell its id may still have.
    taken = {g["group_id"] for g in listed}
    groups = [g for g in resp["groups"] if g["group_id"] not in taken] + listed
    resp["groups"] = [
        g
        for g in groups
        if (not states or g["group_state"].lower() in states)
        and (not types or g["group_type"] in types)
    ]
    return resp


async def _join_group(
    api_version: int, req: Any, coordinator: GroupCoordinator, client_id: str, client_host: str
) -> dict[str, Any]:
    session_ms = _ms(_opt(req, "session_timeout", "session_timeout_ms"))
    rebalance = _opt(req, "rebalance_timeout", "rebalance_timeout_ms")
    # v0 has no rebalance timeout: Kafka uses the session timeout for both.
    rebalance_ms = session_ms if rebalance is None else _ms(rebalance)
    resp = await coordinator.join_group(
        group_id=req.group_id,
        member_id=req.member_id,
        group_instance_id=_opt(req, "group_instance_id"),
        protocol_type=req.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        client_id=client_id or "",
        client_host=client_host,
        require_known_member_id=api_version >= 4,
        reason=_opt(req, "reason"),
    )
    if api_version < 7 and resp["protocol_name"] is None:
        resp["protocol_name"] = ""  # not nullable before v7
    return resp


async def _leave_group(api_version: int, req: Any, coordinator: GroupCoordinator) -> dict[str, Any]:
    if api_version < 3:
        resp = await coordinator.leave_group(group_id=req.group_id, members=[(req.member_id, None)])
        # v0-2 carry the member's error as the response's error.
        if resp["error_code"] == 0 and resp["members"]:
            resp["error_code"] = resp["members"][0]["error_code"]
        resp["members"] = []
        return resp
    reasons = [m.reason for m in req.members if getattr(m, "reason", None)]
    return await coordinator.leave_group(
        group_id=req.group_id,
        members=[(m.member_id, m.group_instance_id) for m in req.members],
        reason="; ".join(reasons) or None,
    )


def _resolver(coordinator: GroupCoordinator, name: str) -> Callable[[Any], Any] | None:
    """Topic-id lookups (v10 commit/fetch) are optional methods of the offset store."""
    fn = getattr(coordinator.store, name, None)
    return fn if callable(fn) else None


async def _offset_commit(
    api_version: int,
    req: Any,
    coordinator: GroupCoordinator,
    consumer: ConsumerCoordinator | None,
) -> dict[str, Any]:
    name_for_id = _resolver(coordinator, "topic_name_for_id")
    offsets: list[tuple[str, int, int, int, str | None]] = []
    unresolved: list[dict[str, Any]] = []
    ids: dict[str, uuid.UUID | None] = {}
    for topic in req.topics:
        name = getattr(topic, "name", None)
        if name is None:  # v10+: topics by id
            topic_id = topic.topic_id
            name = name_for_id(topic_id) if name_for_id and topic_id is not None else None
            if name is None:
                parts = [
                    {"partition_index": p.partition_index, "error_code": UNKNOWN_TOPIC_ID}
                    for p in topic.partitions
                ]
                unresolved.append({"name": "", "topic_id": topic_id, "partitions": parts})
                continue
            ids[name] = topic_id
        for p in topic.partitions:
            epoch = getattr(p, "committed_leader_epoch", -1)
            offsets.append(
                (name, p.partition_index, p.committed_offset, epoch, p.committed_metadata)
            )
    generation = _opt(req, "generation_id_or_member_epoch", "generation_id")
    group = consumer.groups.get(req.group_id) if consumer is not None else None
    if group is not None and coordinator.owns(req.group_id):
        # KIP-848: the member epoch is the generation (STALE_MEMBER_EPOCH when it is not).
        error = group.validate_commit(req.member_id, generation, api_version)
        if error != NONE:
            errors = {(topic, partition): error for topic, partition, *_ in offsets}
        else:
            limit = coordinator.config.offset_metadata_max_bytes
            errors = await coordinator.offsets.commit(req.group_id, offsets, limit)
        resp = commit_response(errors)
    else:
        resp = await coordinator.commit_offsets(
            group_id=req.group_id,
            generation_id=generation,
            member_id=req.member_id,
            group_instance_id=_opt(req, "group_instance_id"),
            offsets=offsets,
        )
    for t in resp["topics"]:
        t["topic_id"] = ids.get(t["name"])
    resp["topics"].extend(unresolved)
    return resp


def _fetch_topics(topics: Any, coordinator: GroupCoordinator) -> tuple[Any, list[Any]]:
    """(topics for the coordinator or None, topics that could not be resolved)."""
    if topics is None:
        return None, []
    name_for_id = _resolver(coordinator, "topic_name_for_id")
    out, unresolved = [], []
    for t in topics:
        name = getattr(t, "name", None)
        if name is None:
            name = name_for_id(t.topic_id) if name_for_id and t.topic_id is not None else None
            if name is None:
                unresolved.append(t)
                continue
        out.append((name, list(t.partition_indexes)))
    return out, unresolved


def _fetch_group(
    group_id: str, topics: Any, coordinator: GroupCoordinator, require_stable: bool = False
) -> dict[str, Any]:
    wanted, unresolved = _fetch_topics(topics, coordinator)
    resp = coordinator.fetch_offsets(group_id, wanted)
    unstable = coordinator.unstable_offsets(group_id) if require_stable else set()
    if unstable:
        # KIP-447: offsets an open transaction will commit are not given out yet (the
        # consumer retries), so a new member does not start from offsets about to change.
        for t in resp["topics"]:
            for p in t["partitions"]:
                if (t["name"], p["partition_index"]) in unstable:
                    p["error_code"] = UNSTABLE_OFFSET_COMMIT
                    p["committed_offset"] = -1
    id_for_name = _resolver(coordinator, "topic_id_for_name")
    for t in resp["topics"]:
        t["topic_id"] = id_for_name(t["name"]) if id_for_name else None
    for t in unresolved:
        parts = [
            {
                "partition_index": p,
                "committed_offset": -1,
                "committed_leader_epoch": -1,
                "metadata": "",
                "error_code": UNKNOWN_TOPIC_ID,
            }
            for p in t.partition_indexes
        ]
        resp["topics"].append({"name": "", "topic_id": t.topic_id, "partitions": parts})
    return resp


def _offset_fetch(
    api_version: int, req: Any, coordinator: GroupCoordinator, consumer: ConsumerCoordinator | None
) -> dict[str, Any]:
    if api_version < 8:
        stable = bool(getattr(req, "require_stable", False))
        return _fetch_group(req.group_id, req.topics, coordinator, stable)
    groups = []
    for g in req.groups:
        member_id = getattr(g, "member_id", None)
        group = consumer.groups.get(g.group_id) if consumer is not None else None
        if member_id and group is not None:
            # v9: a KIP-848 member fetching for itself must hold the current epoch.
            error = group.validate_commit(member_id, g.member_epoch)
            if error != NONE:
                groups.append({"group_id": g.group_id, "topics": [], "error_code": error})
                continue
        resp = _fetch_group(g.group_id, g.topics, coordinator, req.require_stable)
        groups.append(
            {"group_id": g.group_id, "topics": resp["topics"], "error_code": resp["error_code"]}
        )
    return {"groups": groups}
