"""Cluster APIs of the main broker: Metadata, DescribeCluster, FindCoordinator."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from main_broker.api.topics_admin import topic_name_error
from main_broker.txn.state import valid_transactional_id

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

log = logging.getLogger("zonefleet.main_broker.admin")

INT32_MIN = -(2**31)


def _uuid(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw)


def _broker_entries(broker: BrokerServices) -> list[dict[str, Any]]:
    return [
        {
            "node_id": m.node_id,
            "broker_id": m.node_id,
            "host": m.host,
            "port": m.port,
            "rack": m.zone,
        }
        for m in broker.cluster.mains
    ]


def _controller_id(broker: BrokerServices) -> int:
    return broker.cluster.main_ids[0]


# Kafka's own topics. zonefleet keeps group offsets in its WAL and has no transactions or
# share groups, so a client asking for one of these (a UI looking for __consumer_offsets) is
# told it does not exist, not given an ordinary topic of that name.
KAFKA_INTERNAL_TOPICS = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state"}
)


def _topic_ids_refused(version: int, requested: Any) -> dict[str, Any] | None:
    """Kafka's answer to a v10/v11 request naming a topic by id or without a name: v10 and
    v11 carry the fields but Kafka refuses them (InvalidRequestException in the handler), and
    its error response gives every requested topic INVALID_REQUEST ("" for a null name)."""
    if not 10 <= version < 12 or not requested:
        return None
    if all(t.name is not None and t.topic_id is None for t in requested):
        return None
    return {
        "brokers": [],
        "cluster_id": None,
        "controller_id": -1,
        "topics": [
            {
                "error_code": ErrorCode.invalid_request,
                "name": t.name or "",
                "topic_id": t.topic_id,
                "is_internal": False,
                "partitions": [],
            }
            for t in requested
        ],
    }


async def metadata(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    store = broker.store
    version = ctx.header.api_version
    requested = getattr(req, "topics", None)
    if version == 0 and requested is not None and len(requested) == 0:
        requested = None  # v0: an empty list means every topic
    if (refused := _topic_ids_refused(version, requested)) is not None:
        return refused
    allow_auto = (
        getattr(req, "allow_auto_topic_creation", True) and broker.config.auto_create_topics
    )
    topics_out: list[dict[str, Any]] = []
    if requested is None or any(getattr(t, "name", None) not in store.topics for t in requested):
        await broker.cluster.refresh()  # a topic another main created moments ago
    if requested is None:
        names = sorted(store.topics)
        for topic_name in names:
            topics_out.append(topic_metadata(broker, topic_name))
    else:
        answered: set[str] = set()
        unknown_ids: set[uuid.UUID] = set()
        for item in requested:
            name = getattr(item, "name", None)
            topic_id = getattr(item, "topic_id", None)
            if name is None and topic_id is not None:
                state = store.topics_by_id.get(topic_id.bytes)
                if state is None:
                    if topic_id not in unknown_ids:
                        unknown_ids.add(topic_id)
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
            if name is None or name in answered:
                continue  # Kafka answers each topic once however often it is named
            answered.add(name)
            creatable = topic_name_error(name) is None and name not in KAFKA_INTERNAL_TOPICS
            if name not in store.topics and allow_auto and creatable:
                await broker.auto_create_topic(name)
            if name in store.topics:
                topics_out.append(topic_metadata(broker, name))
            else:
                code = (
                    ErrorCode.invalid_topic_exception
                    if topic_name_error(name)
                    else ErrorCode.unknown_topic_or_partition
                )
                topics_out.append(
                    {
                        "error_code": code,
                        "name": name,
                        "is_internal": name in KAFKA_INTERNAL_TOPICS,
                        "partitions": [],
                    }
                )
    return {
        "brokers": _broker_entries(broker),
        "cluster_id": broker.config.cluster_id,
        "controller_id": _controller_id(broker),
        "topics": topics_out,
    }


def topic_metadata(broker: BrokerServices, name: str) -> dict[str, Any]:
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


async def describe_cluster(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
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


COORDINATOR_GROUP, COORDINATOR_TRANSACTION = 0, 1


def _coordinator_error(key_type: int, key: str) -> tuple[ErrorCode, str] | None:
    if key_type not in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION):
        # A coordinator this fleet does not offer (2: share groups): fail fast, as Kafka
        # does for a key type it does not know, rather than COORDINATOR_NOT_AVAILABLE,
        # which clients retry for ever.
        return ErrorCode.invalid_request, f"coordinator key type {key_type} is not supported"
    if key_type == COORDINATOR_TRANSACTION and not valid_transactional_id(key):
        return ErrorCode.invalid_request, "the transactional id is empty or too long"
    return None


async def find_coordinator(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    key_type = getattr(req, "key_type", 0)
    keys = list(req.coordinator_keys) if hasattr(req, "coordinator_keys") else [req.key]
    coordinators = []
    for key in keys:
        error = _coordinator_error(key_type, key)
        if error is not None:
            coordinators.append(
                {
                    "key": key,
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                    "error_code": error[0],
                    "error_message": error[1],
                }
            )
        else:
            # Transactional ids are placed as group ids are (zone_router.placement).
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
