"""A request a zone proxy does not answer itself, relayed to the main(s) that do.

Decoded and checked in the zone first (`authorize_relay`: ACLs, and Metadata without
auto-creation for a principal that may not create topics); then sent over internal RPC with
the client's address and principal (the mains trust them from an authenticated fleet peer
only), split and merged by `relay_plan`; answers that name brokers (Metadata,
FindCoordinator, DescribeCluster, DescribeTopicPartitions) rewritten into the client's zone
view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from internal_rpc import RpcError
from internal_rpc.messages import MalformedMessage, RelayParams, RelayResult
from kafka_wire.codec import (
    MalformedRequest,
    build_response,
    decode_response,
    encode_request,
    encode_response,
    entity_to_data,
)
from kafka_wire.server_loop import ANONYMOUS_PRINCIPAL, Buffer, CloseConnection
from proxy_broker.access import NotAuthorized
from proxy_broker.relay_plan import plan_relay
from zone_router import (
    rewrite_describe_cluster,
    rewrite_describe_topic_partitions,
    rewrite_find_coordinator,
    rewrite_metadata,
)

if TYPE_CHECKING:
    from proxy_broker.broker import ProxyBroker, RequestContext

__all__ = ["RELAY_TIMEOUT_S", "authorize_relay", "relay_request"]

API_PRODUCE, API_METADATA, API_FIND_COORDINATOR = 0, 3, 10
API_DESCRIBE_CLUSTER, API_DESCRIBE_TOPIC_PARTITIONS = 60, 75
REWRITTEN = {API_METADATA, API_FIND_COORDINATOR, API_DESCRIBE_CLUSTER}
REWRITTEN |= {API_DESCRIBE_TOPIC_PARTITIONS}
RELAY_TIMEOUT_S = 60.0  # JoinGroup may legitimately wait for a whole rebalance


def authorize_relay(
    proxy: ProxyBroker, ctx: RequestContext, request: Any
) -> Sequence[Buffer] | bytearray | None:
    """The answer to a request this principal may not make; a Metadata request's frame
    without auto-creation when it may not create topics; or None: relay it as it came."""
    header, conn = ctx.header, ctx.conn
    try:
        answer = proxy.access.check_relayed(header, request, conn)
    except NotAuthorized as exc:
        raise CloseConnection(str(exc)) from None
    if answer is not None or header.api_key != API_METADATA:
        return answer
    ctx.topics_named = bool(request.topics)
    if not getattr(request, "allow_auto_topic_creation", False):
        return None
    if proxy.access.may_auto_create(conn):
        return None
    plain = dataclasses.replace(request, allow_auto_topic_creation=False)
    return bytearray(
        encode_request(
            header.api_key, header.api_version, header.correlation_id, header.client_id, plain
        )
    )


def _relay_target(proxy: ProxyBroker) -> int:
    for node, mirror in sorted(proxy.mirrors.items()):
        if mirror.connected:
            return node
    return min(proxy.mirrors)


async def relay_request(
    proxy: ProxyBroker, ctx: RequestContext, frame: bytes
) -> Sequence[Buffer] | None:
    """Relays a request to the main(s) that answer it (`relay_plan`), merges the answers,
    and rewrites those that name brokers into the client's zone view."""
    header = ctx.header
    try:
        mains = sorted(proxy.mirrors)
        # The mains this proxy stands for in its zone view: other zones' mains, and its
        # own zone's mains while their state stream is lost (Topology.down_mains), whose
        # groups FindCoordinator then places on this proxy too.
        topo = proxy.client_topology(ctx.conn, header.client_id)
        foreign = [m for m in mains if topo.zone_of(m) != proxy.config.zone or not topo.main_up(m)]
        plan = plan_relay(header, frame, mains, _relay_target(proxy), proxy.owner_of, foreign)
    except MalformedRequest as exc:
        raise CloseConnection(f"malformed api {header.api_key} request: {exc}") from None
    principal = None if ctx.conn.principal == ANONYMOUS_PRINCIPAL else ctx.conn.principal
    responses: list[bytes | None] = [None] * len(plan.calls)
    # Failures are collected, not raised in the nursery: several mains refusing a split
    # request would otherwise end as an exception group, not as the close it means.
    failures: list[str] = []

    async def call(i: int, target: int, sub_frame: bytes) -> None:
        try:
            result = await proxy.rpcs[target].call(
                "relay",
                RelayParams(sub_frame, ctx.conn.peer_host, principal).to_wire(),
                timeout=RELAY_TIMEOUT_S,
                retries=1,
                idempotent=header.api_key != API_PRODUCE,
            )
            responses[i] = RelayResult.from_wire(result).frame
        except (RpcError, MalformedMessage) as exc:
            failures.append(f"relay of api {header.api_key} to main {target} failed: {exc}")

    if len(plan.calls) == 1:
        await call(0, *plan.calls[0])
    else:
        async with trio.open_nursery() as nursery:
            for i, (target, sub_frame) in enumerate(plan.calls):
                nursery.start_soon(call, i, target, sub_frame)
    if failures:
        raise CloseConnection("; ".join(failures))
    if plan.merge is None:
        response = responses[0]
    elif any(r is None for r in responses):
        response = None
    else:
        response = plan.merge([r for r in responses if r is not None])
    if response is None:
        return None
    if header.api_key in REWRITTEN:
        response = _rewrite(proxy, ctx, response)
    return [response]


def _rewrite(proxy: ProxyBroker, ctx: RequestContext, response: bytes) -> bytes:
    header = ctx.header
    key, version = header.api_key, header.api_version
    _, entity = decode_response(key, version, response)
    data = entity_to_data(entity)
    zone = proxy.config.zone  # a client that reached this proxy is in its zone
    topology = proxy.client_topology(ctx.conn, header.client_id)
    if key == API_METADATA:
        out = rewrite_metadata(data, zone, topology).data
        out = proxy.access.filter_metadata(out, ctx.topics_named, ctx.conn)
    elif key == API_FIND_COORDINATOR:
        out = rewrite_find_coordinator(data, zone, topology).data
    elif key == API_DESCRIBE_TOPIC_PARTITIONS:
        out = rewrite_describe_topic_partitions(data, zone, topology).data
    else:
        out = rewrite_describe_cluster(data, zone, topology).data
    return encode_response(header, build_response(key, version, out))
