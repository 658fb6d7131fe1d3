"""Read-only describe APIs of the main broker: DescribeTopicPartitions (KIP-966),
DescribeLogDirs, DescribeProducers, and GetTelemetrySubscriptions (KIP-714); and
AlterReplicaLogDirs, which finds nothing to move.

A main reports the partitions it leads: their WAL bytes under its WAL directory and their
committed object bytes under the object store. Proxies ask every main and merge.
"""

from __future__ import annotations

import shutil
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio
from kio.schema.errors import ErrorCode

from kafka_wire.acl.rules import ResourceType, authorized_operations
from main_broker.api.cluster import topic_metadata
from main_broker.partition_log import PartitionLog, leader_error
from s3_commit.manifest import manifest_key

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

# Kafka's max.request.partition.size.limit default: partitions per DescribeTopicPartitions answer.
MAX_PARTITIONS_PER_RESPONSE = 2000
# KIP-714: with no metrics requested a client does not push and asks again after this long.
TELEMETRY_RETRY_MS = 300_000
TELEMETRY_MAX_BYTES = 1024 * 1024
_disk_usage_limiter = trio.CapacityLimiter(1)


# -- DescribeTopicPartitions -------------------------------------------------------------------


async def describe_topic_partitions(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    store = broker.store
    await broker.cluster.refresh()  # a topic another main created moments ago
    names = sorted({t.name for t in req.topics}) if req.topics else sorted(store.topics)
    cursor = req.cursor
    if cursor is not None:
        if cursor.topic_name not in names:  # Kafka fails the whole request
            return {
                "topics": [
                    {"error_code": ErrorCode.invalid_request, "name": n, "partitions": []}
                    for n in names
                ],
                "next_cursor": None,
            }
        names = names[names.index(cursor.topic_name) :]
    limit = min(max(int(req.response_partition_limit), 1), MAX_PARTITIONS_PER_RESPONSE)
    ops = authorized_operations(ResourceType.TOPIC)
    topics_out: list[dict[str, Any]] = []
    next_cursor: dict[str, Any] | None = None
    for name in names:
        if name not in store.topics:
            topics_out.append(
                {
                    "error_code": ErrorCode.unknown_topic_or_partition,
                    "name": name,
                    "topic_id": uuid.UUID(int=0),
                    "partitions": [],
                    "topic_authorized_operations": ops,
                }
            )
            continue
        entry = topic_metadata(broker, name)
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        partitions = entry["partitions"][max(first, 0) :]
        if len(partitions) > limit:
            next_cursor = {
                "topic_name": name,
                "partition_index": partitions[limit]["partition_index"],
            }
            partitions = partitions[:limit]
        limit -= len(partitions)
        for part in partitions:
            part["eligible_leader_replicas"] = []
            part["last_known_elr"] = []
        topics_out.append({**entry, "partitions": partitions, "topic_authorized_operations": ops})
        if next_cursor is not None:
            break
        if limit == 0:
            later = names[names.index(name) + 1 :]
            if later:
                next_cursor = {"topic_name": later[0], "partition_index": 0}
            break
    return {"topics": topics_out, "next_cursor": next_cursor}


# -- DescribeLogDirs ----------------------------------------------------------------------------


def _wanted(broker: BrokerServices, req: Any) -> list[tuple[str, list[PartitionLog]]]:
    """The led partitions the request names (every led partition when topics is null)."""
    store = broker.store
    out: list[tuple[str, list[PartitionLog]]] = []
    requested: list[tuple[str, set[int] | None]]
    if req.topics is None:
        requested = [(name, None) for name in sorted(store.topics)]
    else:
        requested = [(t.topic, set(t.partitions)) for t in req.topics]
    for name, indexes in requested:
        state = store.topics.get(name)
        if state is None:
            continue
        logs = [
            p for p in state.partitions if p.owned and (indexes is None or p.partition in indexes)
        ]
        if logs:
            out.append((name, logs))
    return out


def _wal_bytes(plog: PartitionLog) -> int:
    return sum(e.size for e in plog.entries)


def _object_bytes(plog: PartitionLog) -> int:
    stream = plog.objects
    if stream is None:
        return 0
    return sum(max(r.nbytes, 0) for r in stream.ranges if r.end > stream.log_start)


def _local_path(url: str) -> str | None:
    parts = urlsplit(url)
    return parts.path if parts.scheme in ("osfs", "file") and parts.path else None


async def _disk_usage(url: str) -> tuple[int, int]:
    """(total, usable) bytes of a local directory's file system; -1 where it is not local."""
    path = _local_path(url)
    if path is None:
        return -1, -1
    try:
        usage = await trio.to_thread.run_sync(shutil.disk_usage, path, limiter=_disk_usage_limiter)
    except OSError:
        return -1, -1
    return usage.total, usage.free


def _log_dir_names(broker: BrokerServices) -> tuple[str, str | None]:
    """This main's "log directories": its WAL directory and, with an object store, its
    objects (named after its manifest, which lists the objects counted)."""
    cfg = broker.config
    wal_dir = f"{cfg.wal_url.rstrip('/')}/{cfg.wal_writer_id}"
    if cfg.object_store_url is None:
        return wal_dir, None
    return wal_dir, f"{cfg.object_store_url.rstrip('/')}/{manifest_key(cfg.node_id)}"


async def describe_log_dirs(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    wanted = _wanted(broker, req)
    wal_dir, objects_dir = _log_dir_names(broker)
    total, usable = await _disk_usage(broker.config.wal_url)
    results = [_log_dir(wal_dir, wanted, _wal_bytes, total, usable)]
    if objects_dir is not None:
        results.append(_log_dir(objects_dir, wanted, _object_bytes, -1, -1))
    return {"error_code": ErrorCode.none, "results": results}


# Kafka names a moving replica's directory "<topic>-<partition>.<32 hex>-future" and refuses a
# move whose name would pass the file system's 255 bytes (KAFKA-4893).
_FUTURE_DIR_SUFFIX = len(".") + 32 + len("-future")


async def alter_replica_log_dirs(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    """Kafka's answer for a broker with the log directories DescribeLogDirs lists: a path
    that is not one of them is LOG_DIR_NOT_FOUND; every partition a main leads already lives
    in all of them (its recent batches in the WAL, older ones in objects), so a move to one
    of them has nothing to do. A partition led by another main has no replica here
    (REPLICA_NOT_AVAILABLE), and one that does not exist is UNKNOWN_TOPIC_OR_PARTITION."""
    dirs = {d for d in _log_dir_names(broker) if d is not None}
    results: dict[str, dict[int, int]] = {}
    for move in req.dirs:
        for topic in move.topics:
            state = broker.store.topics.get(topic.name)
            for index in topic.partitions:
                if len(f"{topic.name}-{index}") + _FUTURE_DIR_SUFFIX > 255:
                    error = ErrorCode.invalid_topic_exception
                elif move.path not in dirs:
                    error = ErrorCode.log_dir_not_found
                elif state is None or not 0 <= index < len(state.partitions):
                    error = ErrorCode.unknown_topic_or_partition
                elif not state.partitions[index].owned:
                    error = ErrorCode.replica_not_available
                else:
                    error = ErrorCode.none
                results.setdefault(topic.name, {})[index] = error
    return {
        "throttle_time": 0,
        "results": [
            {
                "topic_name": name,
                "partitions": [
                    {"partition_index": i, "error_code": e} for i, e in sorted(parts.items())
                ],
            }
            for name, parts in results.items()
        ],
    }


def _log_dir(
    name: str,
    wanted: list[tuple[str, list[PartitionLog]]],
    size: Any,
    total: int,
    usable: int,
) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "log_dir": name,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": p.partition,
                        "partition_size": size(p),
                        "offset_lag": 0,  # the leader is the only replica
                        "is_future_key": False,
                    }
                    for p in logs
                ],
            }
            for topic, logs in wanted
        ],
        "total_bytes": total,
        "usable_bytes": usable,
    }


# -- DescribeProducers ----------------------------------------------------------------------


async def describe_producers(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    topics_out = []
    for topic in req.topics:
        parts_out = []
        for index in topic.partition_indexes:
            out: dict[str, Any] = {
                "partition_index": index,
                "error_code": ErrorCode.none,
                "error_message": None,
                "active_producers": [],
            }
            parts_out.append(out)
            plog = broker.store.partition(topic.name, index)
            if (error := leader_error(plog)) is not None:
                out["error_code"] = error
            else:
                assert plog is not None
                # An open transaction's first offset: what an operator looks for when the
                # last stable offset does not move (kafka-transactions.sh find-hanging).
                open_txns = plog.txns.open_producers()
                out["active_producers"] = [
                    {
                        "producer_id": producer_id,
                        "producer_epoch": entry.epoch,
                        "last_sequence": entry.last_seq,
                        "last_timestamp": entry.batches[-1].timestamp if entry.batches else -1,
                        "coordinator_epoch": 0 if producer_id in open_txns else -1,
                        "current_txn_start_offset": open_txns.get(producer_id, -1),
                    }
                    for producer_id, entry in plog.producers.items()
                ]
        topics_out.append({"name": topic.name, "partitions": parts_out})
    return {"topics": topics_out}


# -- GetTelemetrySubscriptions --------------------------------------------------------------


async def get_telemetry_subscriptions(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    """No metrics are requested, so KIP-714 clients do not push (and PushTelemetry is not
    offered); a client without an instance id gets one, as the protocol requires."""
    instance = req.client_instance_id
    if instance is None or instance.int == 0:
        instance = uuid.uuid4()
    return {
        "error_code": ErrorCode.none,
        "client_instance_id": instance,
        "subscription_id": 0,
        "accepted_compression_types": [],
        "push_interval": TELEMETRY_RETRY_MS,
        "telemetry_max_bytes": TELEMETRY_MAX_BYTES,
        "delta_temporality": True,
        "requested_metrics": [],
    }
