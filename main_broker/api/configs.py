"""Config APIs of the main broker: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

Topic configs change durably (the lone main's WAL, or the cluster metadata document every main
follows) and the append and retention paths use them at once. Broker configs are static (the
fleet's TOML): they are described, and a change is refused as Kafka refuses a read-only one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from main_broker.api.config_changes import (
    ConfigChangeError,
    broker_entries,
    incremental_topic_configs,
    replace_topic_configs,
    topic_entries,
)
from main_broker.cluster.doc import UnknownTopic
from main_broker.topic_config import TYPE_BOOLEAN, TYPE_INT, TYPE_SHORT, TYPE_STRING

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

log = logging.getLogger("zonefleet.main_broker.configs")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4

ConfigChange = Callable[[dict[str, str]], dict[str, str]]


def _listener(host: str, port: int) -> str:
    return f"PLAINTEXT://{host}:{port}"


def broker_config_values(broker: BrokerServices, node_id: int) -> dict[str, tuple[str, int]]:
    """The static configs of broker ``node_id`` (this main, a peer main or a zone proxy, whose
    endpoints and WAL directory every main knows), with their DescribeConfigs types."""
    c = broker.config
    wal_root = c.wal_url.rstrip("/")
    peer = next((m for m in c.mains if m.node_id == node_id), None)
    proxy = next((p for p in c.zone_proxies if p.node_id == node_id), None)
    if node_id == c.node_id or (peer is None and proxy is None):
        zone, listeners = c.zone, _listener(c.host, c.port)
        advertised = _listener(*c.advertised)
        log_dirs = f"{wal_root}/{c.wal_writer_id}"
    elif peer is not None:
        zone, listeners = peer.zone, _listener(peer.host, peer.port)
        advertised = listeners
        log_dirs = f"{wal_root}/main-{node_id}"
    else:
        assert proxy is not None
        zone, listeners = proxy.zone, _listener(proxy.host, proxy.port)
        advertised = listeners
        log_dirs = f"{wal_root}/proxy-{node_id}"
    groups = c.groups
    return {
        "broker.id": (str(node_id), TYPE_INT),
        "node.id": (str(node_id), TYPE_INT),
        "broker.rack": (zone, TYPE_STRING),
        "listeners": (listeners, TYPE_STRING),
        "advertised.listeners": (advertised, TYPE_STRING),
        "listener.security.protocol.map": ("PLAINTEXT:PLAINTEXT", TYPE_STRING),
        "inter.broker.listener.name": ("PLAINTEXT", TYPE_STRING),
        "log.dirs": (log_dirs, TYPE_STRING),
        "log.dir": (log_dirs, TYPE_STRING),
        "auto.create.topics.enable": (str(c.auto_create_topics).lower(), TYPE_BOOLEAN),
        "num.partitions": (str(c.num_partitions), TYPE_INT),
        # Each partition has one replica, its main: the shared WAL and S3 are its durability.
        "default.replication.factor": ("1", TYPE_INT),
        "offsets.topic.replication.factor": ("1", TYPE_SHORT),
        "transaction.state.log.replication.factor": ("1", TYPE_SHORT),
        "socket.request.max.bytes": (str(c.max_request_bytes), TYPE_INT),
        "log.segment.bytes": (str(c.wal.segment_bytes), TYPE_INT),
        "group.initial.rebalance.delay.ms": (
            str(groups.group_initial_rebalance_delay_ms),
            TYPE_INT,
        ),
        "group.min.session.timeout.ms": (str(groups.group_min_session_timeout_ms), TYPE_INT),
        "group.max.session.timeout.ms": (str(groups.group_max_session_timeout_ms), TYPE_INT),
        "group.max.size": (str(groups.group_max_size), TYPE_INT),
        "group.consumer.session.timeout.ms": (
            str(groups.consumer_session_timeout_ms),
            TYPE_INT,
        ),
        "group.consumer.heartbeat.interval.ms": (
            str(groups.consumer_heartbeat_interval_ms),
            TYPE_INT,
        ),
        "offset.metadata.max.bytes": (str(groups.offset_metadata_max_bytes), TYPE_INT),
        "transaction.max.timeout.ms": (str(c.transaction_max_timeout_ms), TYPE_INT),
    }


def _broker_id(name: str) -> int | None:
    """The node id a BROKER resource names (an empty name: this broker), None if not one."""
    if name == "":
        return -1
    try:
        node = int(name)
    except ValueError:
        return None
    return node if node >= 0 else None


def _result(res: Any, code: ErrorCode = ErrorCode.none, message: str | None = None) -> dict:
    return {
        "error_code": code,
        "error_message": message,
        "resource_type": res.resource_type,
        "resource_name": res.resource_name,
    }


def _unknown_topic(name: str) -> tuple[ErrorCode, str]:
    return ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."


async def describe_configs(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    include_synonyms = bool(getattr(req, "include_synonyms", False))
    include_docs = bool(getattr(req, "include_documentation", False))
    defaults = broker.config.topic_defaults
    results = []
    for res in req.resources:
        # Null or empty: every key (Kafka's ConfigHelper treats both alike).
        wanted = set(res.configuration_keys) if res.configuration_keys else None
        out = {**_result(res), "configs": []}
        if res.resource_type == RESOURCE_TOPIC:
            state = broker.store.topics.get(res.resource_name)
            if state is None:
                out["error_code"], out["error_message"] = _unknown_topic(res.resource_name)
            else:
                out["configs"] = topic_entries(state.configs, defaults, wanted, include_synonyms)
        elif res.resource_type == RESOURCE_BROKER:
            node = _broker_id(res.resource_name)
            if node is None:
                out["error_code"] = ErrorCode.invalid_request
                out["error_message"] = (
                    f"Broker id must be an integer, but it is: {res.resource_name}"
                )
            else:
                static = broker_config_values(broker, broker.config.node_id if node < 0 else node)
                out["configs"] = broker_entries(static, defaults, wanted, include_synonyms)
        else:
            out["error_code"] = ErrorCode.invalid_request
            out["error_message"] = f"Unsupported resource type {res.resource_type}"
        if not include_docs:
            for entry in out["configs"]:
                entry["documentation"] = None
        results.append(out)
    return {"results": results}


NAMED_TWICE = "Each resource must appear at most once."


def _named_twice(resources: Any) -> set[tuple[int, str]]:
    """Resources a request names more than once: Kafka refuses each occurrence before any
    change (ConfigAdminManager.preprocess), so a long list of one resource costs nothing."""
    seen: set[tuple[int, str]] = set()
    twice: set[tuple[int, str]] = set()
    for res in resources:
        key = (res.resource_type, res.resource_name)
        (twice if key in seen else seen).add(key)
    return twice


async def alter_configs(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    """AlterConfigs: each resource's entries replace its whole explicit set."""
    responses = []
    twice = _named_twice(req.resources)
    for res in req.resources:
        if (res.resource_type, res.resource_name) in twice:
            responses.append(_result(res, ErrorCode.invalid_request, NAMED_TWICE))
            continue
        entries: list[tuple[str, str | None]] = [(c.name, c.value) for c in res.configs]

        def replace(current: dict[str, str], entries: Any = entries) -> dict[str, str]:
            return replace_topic_configs(entries, null_is_invalid_request=True)

        names = [name for name, _ in entries]
        responses.append(await _alter(broker, res, names, replace, bool(req.validate_only)))
    return {"responses": responses}


async def incremental_alter_configs(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    """IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT on the current set."""
    responses = []
    twice = _named_twice(req.resources)
    for res in req.resources:
        if (res.resource_type, res.resource_name) in twice:
            responses.append(_result(res, ErrorCode.invalid_request, NAMED_TWICE))
            continue
        ops: list[tuple[str, int, str | None]] = [
            (c.name, int(c.config_operation), c.value) for c in res.configs
        ]

        def apply(current: dict[str, str], ops: Any = ops) -> dict[str, str]:
            return incremental_topic_configs(current, ops)

        names = [name for name, _, _ in ops]
        responses.append(await _alter(broker, res, names, apply, bool(req.validate_only)))
    return {"responses": responses}


async def _alter(
    broker: BrokerServices, res: Any, names: list[str], change: ConfigChange, validate_only: bool
) -> dict[str, Any]:
    if res.resource_type == RESOURCE_BROKER:
        if _broker_id(res.resource_name) is None:
            message = f"Broker id must be an integer, but it is: {res.resource_name}"
            return _result(res, ErrorCode.invalid_request, message)
        if not names:
            return _result(res)
        # Kafka answers a change of a read-only broker config like this; ours all are.
        message = (
            f"Invalid config value for resource ConfigResource(type=BROKER, "
            f"name='{res.resource_name}'): Cannot update these configs dynamically: "
            f"{sorted(set(names))}"
        )
        return _result(res, ErrorCode.invalid_request, message)
    if res.resource_type != RESOURCE_TOPIC:
        return _result(
            res, ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
        )
    name = res.resource_name
    if not broker.topic_exists(name):
        return _result(res, *_unknown_topic(name))
    try:
        if validate_only:
            state = broker.store.topics.get(name)
            change(dict(state.configs) if state is not None else {})
        else:
            configs = await broker.alter_topic_configs(name, change)
            log.info(
                "topic %s configs now %s", name, configs, extra={"topic": name, "configs": configs}
            )
    except ConfigChangeError as exc:
        return _result(res, exc.code, exc.message)
    except UnknownTopic:
        return _result(res, *_unknown_topic(name))
    return _result(res)
