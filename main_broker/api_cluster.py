"""Cluster and admin APIs of the main broker: Metadata, topic admin, configs, coordinators."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from main_broker.cluster_doc import TopicExists
from main_broker.topic_config import TOPIC_CONFIG_KEYS, InvalidConfig, validate_topic_configs

if TYPE_CHECKING:
    from main_broker.broker import MainBroker, RequestContext

log = logging.getLogger("zonefleet.main_broker.admin")

INT32_MIN = -(2**31)
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
MAX_PARTITIONS_PER_TOPIC = 10_000
LEGAL_TOPIC_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def topic_name_error(name: str) -> str | None:
    if not name or name in (".", ".."):
        return "topic name is empty or . or .."
    if len(name) > 249:
        return "topic name is longer than 249 characters"
    if not set(name) <= LEGAL_TOPIC_CHARS:
        return "topic name may contain only ASCII alphanumerics, '.', '_' and '-'"
    return None


def _uuid(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


def _broker_entries(broker: MainBroker) -> list[dict[str, Any]]:
    if broker.cluster is not None:
        endpoints = [(m.node_id, m.host, m.port, m.zone) for m in broker.cluster.mains]
    else:
        host, port = broker.config.advertised
        endpoints = [(broker.config.node_id, host, port, broker.config.zone)]
    return [
        {"node_id": node, "broker_id": node, "host": host, "port": port, "rack": zone}
        for node, host, port, zone in endpoints
    ]


def _controller_id(broker: MainBroker) -> int:
    if broker.cluster is not None:
        return broker.cluster.main_ids[0]
    return broker.config.node_id


async def metadata(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    store = broker.store
    version = ctx.header.api_version
    requested = getattr(req, "topics", None)
    if version == 0 and requested is not None and len(requested) == 0:
        requested = None  # v0: an empty list means every topic
    allow_auto = (
        getattr(req, "allow_auto_topic_creation", True) and broker.config.auto_create_topics
    )
    topics_out: list[dict[str, Any]] = []
    if broker.cluster is not None and (
        requested is None or any(getattr(t, "name", None) not in store.topics for t in requested)
    ):
        await broker.cluster.refresh()  # a topic another main created moments ago
    if requested is None:
        names = sorted(store.topics)
        for topic_name in names:
            topics_out.append(topic_metadata(broker, topic_name))
    else:
        for item in requested:
            name = getattr(item, "name", None)
            topic_id = getattr(item, "topic_id", None)
            if name is None and topic_id is not None:
                state = store.topics_by_id.get(topic_id.bytes)
                if state is None:
                    topics_out.append(
                        {
                            "error_code": ErrorCode.unknown_topic_id,
                            "name": None,
                            "topic_id": topic_id,
                            "partitions": [],
                        }
                    )
                    continue
                name = state.name
            if name is None:
                continue
            if name not in store.topics and allow_auto and topic_name_error(name) is None:
                await broker.auto_create_topic(name)
            if name in store.topics:
                topics_out.append(topic_metadata(broker, name))
            else:
                code = (
                    ErrorCode.invalid_topic_exception
                    if topic_name_error(name)
                    else ErrorCode.unknown_topic_or_partition
                )
                topics_out.append({"error_code": code, "name": name, "partitions": []})
    return {
        "brokers": _broker_entries(broker),
        "cluster_id": broker.config.cluster_id,
        "controller_id": _controller_id(broker),
        "topics": topics_out,
    }


def topic_metadata(broker: MainBroker, name: str) -> dict[str, Any]:
    state = broker.store.topics[name]
    node = broker.config.node_id
    return {
        "error_code": ErrorCode.none,
        "name": name,
        "topic_id": _uuid(state.topic_id),
        "is_internal": False,
        "topic_authorized_operations": INT32_MIN,
        "partitions": [
            {
                "error_code": ErrorCode.none,
                "partition_index": p.partition,
                "leader_id": node if p.leader_id is None else p.leader_id,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": [node if p.leader_id is None else p.leader_id],
                "isr_nodes": [node if p.leader_id is None else p.leader_id],
                "offline_replicas": [],
            }
            for p in state.partitions
        ],
    }


async def create_topics(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    results = []
    validate_only = bool(getattr(req, "validate_only", False))
    seen: set[str] = set()
    for topic in req.topics:
        name = topic.name
        result: dict[str, Any] = {"name": name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        if name in seen:
            result.update(error_code=ErrorCode.invalid_request, error_message="duplicate topic")
            continue
        seen.add(name)
        if (err := topic_name_error(name)) is not None:
            result.update(error_code=ErrorCode.invalid_topic_exception, error_message=err)
            continue
        if broker.topic_exists(name):
            result.update(
                error_code=ErrorCode.topic_already_exists,
                error_message=f"Topic '{name}' already exists.",
            )
            continue
        partitions = topic.num_partitions
        if topic.assignments:
            partitions = len(topic.assignments)
        if partitions == -1:
            partitions = broker.config.num_partitions
        if not 0 < partitions <= MAX_PARTITIONS_PER_TOPIC:
            result.update(
                error_code=ErrorCode.invalid_partitions,
                error_message=f"Number of partitions must be in 1..{MAX_PARTITIONS_PER_TOPIC}.",
            )
            continue
        if topic.replication_factor not in (-1, 1, 2, 3):
            result.update(
                error_code=ErrorCode.invalid_replication_factor,
                error_message="Replication factor must be -1 or 1..3 (storage is shared).",
            )
            continue
        try:
            configs = validate_topic_configs({c.name: c.value for c in topic.configs})
        except InvalidConfig as exc:
            result.update(error_code=ErrorCode.invalid_config, error_message=str(exc))
            continue
        result.update(num_partitions=partitions, replication_factor=1)
        result["configs"] = [
            _describe_entry(broker, key, configs, include_synonyms=False, version=5)
            for key in sorted(TOPIC_CONFIG_KEYS)
        ]
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


async def delete_topics(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    results = []
    names: list[tuple[str | None, Any]] = []
    if hasattr(req, "topic_names"):
        names = [(n, None) for n in req.topic_names]
    else:
        for t in req.topics:
            names.append((t.name, t.topic_id))
    for name, topic_id in names:
        state = None
        if name is None and topic_id is not None:
            state = broker.store.topics_by_id.get(topic_id.bytes)
        elif name is not None:
            state = broker.store.topics.get(name)
        if state is None:
            code = (
                ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
            )
            results.append(
                {
                    "name": name,
                    "topic_id": topic_id,
                    "error_code": code,
                    "error_message": "This server does not host this topic.",
                }
            )
            continue
        await broker.delete_topic(state.name)
        results.append(
            {"name": state.name, "topic_id": _uuid(state.topic_id), "error_code": ErrorCode.none}
        )
    return {"responses": results}


def _describe_entry(
    broker: MainBroker, key: str, explicit: dict[str, str], include_synonyms: bool, version: int
) -> dict[str, Any]:
    synonyms = []
    if key in explicit:
        value, source = explicit[key], SOURCE_TOPIC
        synonyms.append({"name": key, "value": value, "source": SOURCE_TOPIC})
    elif key in broker.config.topic_defaults:
        value, source = broker.config.topic_defaults[key], SOURCE_STATIC_BROKER
    else:
        value, source = TOPIC_CONFIG_KEYS[key].default, SOURCE_DEFAULT
    if key in broker.config.topic_defaults:
        synonyms.append(
            {
                "name": key,
                "value": broker.config.topic_defaults[key],
                "source": SOURCE_STATIC_BROKER,
            }
        )
    synonyms.append(
        {"name": key, "value": TOPIC_CONFIG_KEYS[key].default, "source": SOURCE_DEFAULT}
    )
    return {
        "name": key,
        "value": value,
        "read_only": False,
        "config_source": source,
        "config_type": 0,
        "is_sensitive": False,
        "is_default": source == SOURCE_DEFAULT,
        "synonyms": synonyms if include_synonyms else [],
        "documentation": TOPIC_CONFIG_KEYS[key].doc,
    }


def broker_config_values(broker: MainBroker) -> dict[str, str]:
    c = broker.config
    return {
        "broker.id": str(c.node_id),
        "broker.rack": c.zone,
        "auto.create.topics.enable": str(c.auto_create_topics).lower(),
        "num.partitions": str(c.num_partitions),
        "socket.request.max.bytes": str(c.max_request_bytes),
        "log.segment.bytes": str(c.wal.segment_bytes),
        "group.initial.rebalance.delay.ms": str(c.groups.group_initial_rebalance_delay_ms),
    }


async def describe_configs(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    include_synonyms = bool(getattr(req, "include_synonyms", False))
    results = []
    for res in req.resources:
        wanted = set(res.configuration_keys) if res.configuration_keys else None
        out: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": res.resource_type,
            "resource_name": res.resource_name,
            "configs": [],
        }
        if res.resource_type == RESOURCE_TOPIC:
            state = broker.store.topics.get(res.resource_name)
            if state is None:
                out.update(
                    error_code=ErrorCode.unknown_topic_or_partition,
                    error_message=f"Topic {res.resource_name} does not exist",
                )
            else:
                out["configs"] = [
                    _describe_entry(
                        broker, key, state.configs, include_synonyms, ctx.header.api_version
                    )
                    for key in sorted(TOPIC_CONFIG_KEYS)
                    if wanted is None or key in wanted
                ]
        elif res.resource_type == RESOURCE_BROKER:
            if res.resource_name not in ("", str(broker.config.node_id)):
                out.update(
                    error_code=ErrorCode.invalid_request,
                    error_message=f"Unknown broker {res.resource_name}",
                )
            else:
                out["configs"] = [
                    {
                        "name": k,
                        "value": v,
                        "read_only": True,
                        "config_source": SOURCE_STATIC_BROKER,
                        "is_default": False,
                        "is_sensitive": False,
                        "synonyms": [],
                        "config_type": 0,
                        "documentation": None,
                    }
                    for k, v in sorted(broker_config_values(broker).items())
                    if wanted is None or k in wanted
                ]
        else:
            out.update(
                error_code=ErrorCode.invalid_request,
                error_message=f"Unsupported resource type {res.resource_type}",
            )
        results.append(out)
    return {"results": results}


async def describe_cluster(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    if getattr(req, "endpoint_type", 1) not in (1,):
        return {
            "error_code": ErrorCode.unsupported_endpoint_type,
            "error_message": "only broker endpoints are served",
            "cluster_id": "",
            "brokers": [],
        }
    return {
        "error_code": ErrorCode.none,
        "endpoint_type": 1,
        "cluster_id": broker.config.cluster_id,
        "controller_id": _controller_id(broker),
        "brokers": _broker_entries(broker),
        "cluster_authorized_operations": INT32_MIN,
    }


async def find_coordinator(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    key_type = getattr(req, "key_type", 0)
    keys = list(req.coordinator_keys) if hasattr(req, "coordinator_keys") else [req.key]
    coordinators = []
    for key in keys:
        if key_type != 0:
            coordinators.append(
                {
                    "key": key,
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                    "error_code": ErrorCode.coordinator_not_available,
                    "error_message": "transactions are not supported yet",
                }
            )
        else:
            node_id, (host, port) = broker.config.node_id, broker.config.advertised
            if broker.cluster is not None:
                peer = broker.cluster.coordinator_for(key)
                node_id, host, port = peer.node_id, peer.host, peer.port
            coordinators.append(
                {
                    "key": key,
                    "node_id": node_id,
                    "host": host,
                    "port": port,
                    "error_code": ErrorCode.none,
                    "error_message": None,
                }
            )
    if ctx.header.api_version < 4:
        first = coordinators[0]
        return {**first, "error_message": first["error_message"]}
    return {"coordinators": coordinators}


async def init_producer_id(broker: MainBroker, ctx: RequestContext, req: Any) -> dict[str, Any]:
    if getattr(req, "transactional_id", None):
        return {
            "error_code": ErrorCode.transactional_id_authorization_failed,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    pid = await broker.store.allocate_producer_id()
    if broker.cluster is not None:
        pid = broker.cluster.producer_id(pid)
    return {"error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": 0}
