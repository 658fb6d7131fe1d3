"""Topic admin APIs of the main broker: CreateTopics, DeleteTopics, CreatePartitions and
DeleteRecords, validated and answered as Apache Kafka 4.x does.

Topic changes go to the lone main's WAL or, with several mains, to the cluster metadata
document (every main, and through their state streams every proxy, follows it). DeleteRecords
is the partition leader's: a WAL record, and the object manifest's log start when there is an
object tier.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from main_broker.api.config_changes import ConfigChangeError, replace_topic_configs, topic_entries
from main_broker.cluster.doc import PartitionCountChanged, TopicExists, UnknownTopic
from main_broker.cluster.zone_view import NotAMain, fleet_topology, main_for_replica
from main_broker.partition_log import leader_error

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

log = logging.getLogger("zonefleet.main_broker.admin")

MAX_PARTITIONS_PER_TOPIC = 10_000
# Storage is shared: any factor up to this is accepted and means the same durability.
MAX_REPLICATION_FACTOR = 3
HIGH_WATERMARK = -1
LEGAL_TOPIC_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def topic_name_error(name: str) -> str | None:
    if not name or name in (".", ".."):
        return "topic name is empty or . or .."
    if len(name) > 249:
        return "topic name is longer than 249 characters"
    if not set(name) <= LEGAL_TOPIC_CHARS:
        return "topic name may contain only ASCII alphanumerics, '.', '_' and '-'"
    return None


def partitions_error(num_partitions: int, assigned: int | None) -> str | None:
    """Why a CreateTopics partition count (or replica assignment count) is refused."""
    count = assigned if assigned is not None else num_partitions
    if count == -1 and assigned is None:
        return None  # the broker's num.partitions
    if count <= 0:
        return "Number of partitions was set to an invalid non-positive value."
    if count > MAX_PARTITIONS_PER_TOPIC:
        return f"Number of partitions {count} is above the limit {MAX_PARTITIONS_PER_TOPIC}."
    return None


def replication_error(factor: int) -> str | None:
    if factor == -1 or 1 <= factor <= MAX_REPLICATION_FACTOR:
        return None
    if factor <= 0:
        return "Replication factor must be larger than 0, or -1 to use the default value."
    return (
        f"Unable to replicate the partition {factor} time(s): the replication factor is at most "
        f"{MAX_REPLICATION_FACTOR} (storage is shared)."
    )


def assignment_error(assignments: list[list[int]], known: set[int]) -> str | None:
    """Why manual replica assignments are refused (INVALID_REPLICA_ASSIGNMENT)."""
    for replicas in assignments:
        if not replicas:
            return "The manual partition assignment includes an empty replica list."
        twice = sorted(b for b, n in Counter(replicas).items() if n > 1)
        if twice:
            return f"The manual partition assignment includes the broker {twice[0]} more than once."
        unknown = sorted(set(replicas) - known)
        if unknown:
            return (
                "The manual partition assignment includes the following broker(s) that are not "
                f"registered: {unknown}"
            )
    return None


def _known_nodes(broker: BrokerServices) -> set[int]:
    """The node ids a client may name: the mains and, as clients see them, the zone proxies."""
    return set(broker.cluster.main_ids) | {p.node_id for p in broker.config.zone_proxies}


def _preferred_mains(
    broker: BrokerServices, name: str, current: int, replicas: list[list[int]]
) -> list[int] | None:
    """The main that each new partition's first assigned broker stands for (None: no
    assignment, the placement decides)."""
    if not replicas:
        return None
    topology = fleet_topology(broker.config)
    mains = broker.cluster.main_ids
    return [
        main_for_replica(topology, r[0], mains, name, current + i) for i, r in enumerate(replicas)
    ]


def _uuid(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


async def create_topics(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    results = []
    validate_only = bool(getattr(req, "validate_only", False))
    # Counted once: a request may name a great many topics (names.count per topic is O(n^2)).
    names = Counter(t.name for t in req.topics)
    for topic in req.topics:
        name = topic.name
        result: dict[str, Any] = {"name": name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        error = _create_error(broker, topic, names[name] > 1)
        if error is not None:
            result.update(error_code=error[0], error_message=error[1])
            continue
        try:
            configs = replace_topic_configs([(c.name, c.value) for c in topic.configs])
        except ConfigChangeError as exc:
            result.update(error_code=exc.code, error_message=exc.message)
            continue
        partitions = len(topic.assignments) if topic.assignments else topic.num_partitions
        if partitions == -1:
            partitions = broker.config.num_partitions
        result.update(num_partitions=partitions, replication_factor=1)
        result["configs"] = topic_entries(configs, broker.config.topic_defaults, None, False)
        if validate_only:
            continue
        try:
            state = await broker.create_topic(name, partitions, configs)
        except TopicExists:
            result.update(
                error_code=ErrorCode.topic_already_exists,
                error_message=f"Topic '{name}' already exists.",
            )
            continue
        result["topic_id"] = _uuid(state.topic_id)
        log.info(
            "created topic %s with %d partitions",
            name,
            partitions,
            extra={"topic": name, "partitions": partitions},
        )
    return {"topics": results}


def _create_error(
    broker: BrokerServices, topic: Any, duplicate: bool
) -> tuple[ErrorCode, str] | None:
    """What Kafka answers a CreateTopics entry before looking at its configs, in its order."""
    name = topic.name
    if duplicate:
        return ErrorCode.invalid_request, "Duplicate topic name."
    if (err := topic_name_error(name)) is not None:
        return ErrorCode.invalid_topic_exception, err
    if broker.topic_exists(name):
        return ErrorCode.topic_already_exists, f"Topic '{name}' already exists."
    if topic.assignments and (topic.num_partitions != -1 or topic.replication_factor != -1):
        return ErrorCode.invalid_request, (
            "Both numPartitions or replicationFactor and replicasAssignments were set. "
            "Both cannot be used at the same time."
        )
    assigned = len(topic.assignments) if topic.assignments else None
    if (err := partitions_error(topic.num_partitions, assigned)) is not None:
        return ErrorCode.invalid_partitions, err
    if topic.assignments:
        replicas = [list(a.broker_ids) for a in topic.assignments]
        if (err := assignment_error(replicas, _known_nodes(broker))) is not None:
            return ErrorCode.invalid_replica_assignment, err
    if not topic.assignments and (err := replication_error(topic.replication_factor)) is not None:
        return ErrorCode.invalid_replication_factor, err
    return None


def plan_delete_topics(
    names: Sequence[str],
    rows: Sequence[tuple[str | None, uuid.UUID | None]],
    topic_ids: Mapping[str, bytes],
) -> tuple[dict[uuid.UUID, str], list[dict[str, Any]]]:
    """Which topics a DeleteTopics deletes (id -> name) and the error rows, by Kafka's rules
    (ControllerApis.deleteTopics): `names` are v0-v5 topic names, `rows` v6 (name, id) rows
    (kio reads the zero id as None), `topic_ids` the existing topics. A row with neither or
    both, a name or id given twice, or a name whose id was given too is INVALID_REQUEST."""
    errors: list[dict[str, Any]] = []

    def error(name: str | None, topic_id: uuid.UUID | None, code: ErrorCode, why: str) -> None:
        errors.append(
            {"name": name, "topic_id": topic_id, "error_code": code, "error_message": why}
        )

    # Ordered sets (dicts), so that the answer follows the request.
    provided_names: dict[str, None] = {}
    duplicate_names: dict[str, None] = {}
    provided_ids: dict[uuid.UUID, None] = {}
    duplicate_ids: dict[uuid.UUID, None] = {}

    def add_name(name: str) -> None:
        if name in duplicate_names or name in provided_names:
            duplicate_names[name] = None
            provided_names.pop(name, None)
        else:
            provided_names[name] = None

    for given in names:
        add_name(given)
    for row_name, topic_id in rows:
        if row_name is None and topic_id is None:
            error(None, None, ErrorCode.invalid_request, NEITHER_NAME_NOR_ID)
        elif row_name is None and topic_id is not None:
            if topic_id in duplicate_ids or topic_id in provided_ids:
                duplicate_ids[topic_id] = None
                provided_ids.pop(topic_id, None)
            else:
                provided_ids[topic_id] = None
        elif row_name is not None and topic_id is None:
            add_name(row_name)
        else:
            error(row_name, topic_id, ErrorCode.invalid_request, NAME_AND_ID)
    for name in duplicate_names:
        error(name, None, ErrorCode.invalid_request, "Duplicate topic name.")
    for topic_id in duplicate_ids:
        error(None, topic_id, ErrorCode.invalid_request, "Duplicate topic id.")
    names_by_id = {uuid.UUID(bytes=bytes(raw)): name for name, raw in topic_ids.items()}
    delete: dict[uuid.UUID, str] = {}
    for topic_id in provided_ids:
        found = names_by_id.get(topic_id)
        if found is None:
            error(None, topic_id, ErrorCode.unknown_topic_id, UNKNOWN_TOPIC_ID_MESSAGE)
        else:
            delete[topic_id] = found
    for name in provided_names:
        raw = topic_ids.get(name)
        if raw is None:
            error(name, None, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE)
            continue
        topic_id = uuid.UUID(bytes=bytes(raw))
        if topic_id in duplicate_ids or topic_id in delete:
            # Kafka then deletes neither, and answers only for the name.
            duplicate_ids[topic_id] = None
            delete.pop(topic_id, None)
            error(name, topic_id, ErrorCode.invalid_request, NAME_OF_GIVEN_ID)
        else:
            delete[topic_id] = name
    return delete, errors


NEITHER_NAME_NOR_ID = "Neither topic name nor id were specified."
NAME_AND_ID = "You may not specify both topic name and topic id."
NAME_OF_GIVEN_ID = "The provided topic name maps to an ID that was already supplied."
UNKNOWN_TOPIC_ID_MESSAGE = "This server does not host this topic ID."
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."


async def delete_topics(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    names = list(getattr(req, "topic_names", ()))
    rows = [(t.name, t.topic_id) for t in getattr(req, "topics", ())]
    existing = {name: state.topic_id for name, state in broker.store.topics.items()}
    delete, results = plan_delete_topics(names, rows, existing)
    for topic_id, name in delete.items():
        await broker.delete_topic(name)
        results.append({"name": name, "topic_id": topic_id, "error_code": ErrorCode.none})
    return {"responses": results}


def create_partitions_error(
    name: str, current: int | None, count: int, assignments: int | None
) -> tuple[ErrorCode, str] | None:
    """What Kafka answers a CreatePartitions entry (`current`: None when no such topic)."""
    if current is None:
        return ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
    if count == current:
        return ErrorCode.invalid_partitions, f"Topic already has {current} partition(s)."
    if count < current:
        return ErrorCode.invalid_partitions, (
            f"The topic {name} currently has {current} partition(s); {count} would not be an "
            "increase."
        )
    if count > MAX_PARTITIONS_PER_TOPIC:
        return ErrorCode.invalid_partitions, (
            f"Number of partitions {count} is above the limit {MAX_PARTITIONS_PER_TOPIC}."
        )
    if assignments is not None and assignments != count - current:
        return ErrorCode.invalid_replica_assignment, (
            f"Attempted to add {count - current} additional partition(s), but only "
            f"{assignments} assignment(s) were specified."
        )
    return None


async def create_partitions(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    results = []
    names = Counter(t.name for t in req.topics)
    await broker.cluster.refresh()  # the count another main may just have raised
    for topic in req.topics:
        name = topic.name
        result: dict[str, Any] = {"name": name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        if names[name] > 1:
            result.update(error_code=ErrorCode.invalid_request, error_message="Duplicate topic.")
            continue
        state = broker.store.topics.get(name) if broker.topic_exists(name) else None
        current = len(state.partitions) if state is not None else None
        assignments = len(topic.assignments) if topic.assignments is not None else None
        error = create_partitions_error(name, current, topic.count, assignments)
        replicas = [list(a.broker_ids) for a in topic.assignments or ()]
        if error is None and (err := assignment_error(replicas, _known_nodes(broker))):
            error = ErrorCode.invalid_replica_assignment, err
        if error is not None:
            result.update(error_code=error[0], error_message=error[1])
            continue
        if req.validate_only:
            continue
        # An assignment's first broker leads the new partition (storage is shared: the other
        # replicas mean nothing): a main, or the main a zone proxy's id stands for.
        try:
            preferred = _preferred_mains(broker, name, current or 0, replicas)
        except NotAMain as exc:
            result.update(error_code=ErrorCode.invalid_replica_assignment, error_message=str(exc))
            continue
        try:
            await broker.create_partitions(name, topic.count, preferred)
        except UnknownTopic:
            result.update(
                error_code=ErrorCode.unknown_topic_or_partition,
                error_message=f"The topic '{name}' does not exist.",
            )
        except PartitionCountChanged as exc:  # another client grew it meanwhile
            error = create_partitions_error(name, exc.current, topic.count, assignments)
            error = error or (ErrorCode.invalid_partitions, str(exc))
            result.update(error_code=error[0], error_message=error[1])
        else:
            log.info(
                "topic %s grew to %d partitions",
                name,
                topic.count,
                extra={"topic": name, "partitions": topic.count},
            )
    return {"results": results}


async def delete_records(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    topics_out = []
    for topic in req.topics:
        parts_out = []
        for p in topic.partitions:
            out: dict[str, Any] = {
                "partition_index": p.partition_index,
                "low_watermark": -1,
                "error_code": ErrorCode.none,
            }
            parts_out.append(out)
            plog = broker.store.partition(topic.name, p.partition_index)
            if (error := leader_error(plog)) is not None:
                out["error_code"] = error
                continue
            assert plog is not None
            if not broker.may_append(plog):
                # A move is sealing the partition: its log start goes over as it stands now.
                out["error_code"] = ErrorCode.not_leader_or_follower
                continue
            offset = plog.high_watermark if p.offset == HIGH_WATERMARK else p.offset
            if not 0 <= offset <= plog.high_watermark:
                out["error_code"] = ErrorCode.offset_out_of_range
                continue
            before = plog.log_start_offset
            out["low_watermark"] = await broker.store.delete_records(plog, offset)
            if broker.retention is not None and plog.log_start_offset > before:
                broker.retention.records_deleted(plog)
            log.info(
                "records of %s-%d deleted below %d",
                topic.name,
                p.partition_index,
                out["low_watermark"],
                extra={"topic": topic.name, "partition": p.partition_index},
            )
        topics_out.append({"name": topic.name, "partitions": parts_out})
    return {"topics": topics_out}
