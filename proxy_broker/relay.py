"""A request a zone proxy does not answer itself, relayed to the main(s) that do.

Decoded and checked in the zone first: `authorize_relay`, when the request is begun, closes
the connection of a principal sending an API only super users may use; `relay_request` asks
the proxy's ACLs what to do with it (proxy_broker/access.py, a `Verdict`): answer it here,
relay it, or relay its allowed part and complete the main's answer (the denied part joined,
filters, `authorized_operations`). Then it is sent over internal RPC with the client's
address and principal (the mains trust them from an authenticated fleet peer only), split and
merged by `relay_plan`; answers that name brokers (Metadata, FindCoordinator,
DescribeCluster, DescribeTopicPartitions) rewritten into the client's zone view.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from internal_rpc import RpcError
from internal_rpc.messages import MalformedMessage, RelayParams, RelayResult
from kafka_wire.codec import (
    MalformedRequest,
    RequestHeader,
    build_request,
    build_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    entity_to_data,
)
from kafka_wire.server_loop import ANONYMOUS_PRINCIPAL, Buffer, CloseConnection
from proxy_broker.access import OPEN_APIS, NotAuthorized
from proxy_broker.access_verdict import Complete, Verdict
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


def authorize_relay(proxy: ProxyBroker, ctx: RequestContext) -> None:
    """Closes the connection of a principal that sends an API only super users may use;
    everything else is decided by `relay_request`."""
    try:
        proxy.access.check_known(ctx.header, ctx.conn)
    except NotAuthorized as exc:
        raise CloseConnection(str(exc)) from None


class _MirrorTopics:
    """The proxy's mirrors as the ACL checks' `TopicIndex`."""

    def __init__(self, proxy: ProxyBroker) -> None:
        self._proxy = proxy

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self._proxy.topic_name(topic_id.bytes)

    def topic_exists(self, name: str) -> bool:
        return any(name in mirror.topics for mirror in self._proxy.mirrors.values())


def _verdict(proxy: ProxyBroker, ctx: RequestContext, frame: bytes) -> Verdict | None:
    header = ctx.header
    if not proxy.access.enabled:
        return None
    request = ctx.request
    if request is None:  # not decoded when it was begun
        try:
            request = decode_request(header, frame)
        except MalformedRequest as exc:
            raise CloseConnection(f"malformed api {header.api_key} request: {exc}") from None
    try:
        return proxy.access.check_relayed(header, request, ctx.conn, _MirrorTopics(proxy))
    except NotAuthorized as exc:
        raise CloseConnection(str(exc)) from None


def _relay_target(proxy: ProxyBroker) -> int:
    for node, mirror in sorted(proxy.mirrors.items()):
        if mirror.connected:
            return node
    return min(proxy.mirrors)


async def relay_request(
    proxy: ProxyBroker, ctx: RequestContext, frame: bytes
) -> Sequence[Buffer] | None:
    """Relays a request to the main(s) that answer it (`relay_plan`) as its ACL verdict
    says (answered here, relayed, or relayed in part), merges the answers, rewrites those
    that name brokers into the client's zone view, and completes them by the verdict."""
    header = ctx.header
    verdict = None if header.api_key in OPEN_APIS else _verdict(proxy, ctx, frame)
    if verdict is not None and verdict.answer is not None:
        return [_encode(header, verdict.answer)]
    if verdict is not None and verdict.request is not None:
        request = build_request(header.api_key, header.api_version, verdict.request)
        frame = encode_request(
            header.api_key, header.api_version, header.correlation_id, header.client_id, request
        )
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
    complete = verdict.complete if verdict is not None else None
    if header.api_key in REWRITTEN or complete is not None:
        response = _rewrite(proxy, ctx, response, complete)
    return [response]


def _rewrite(
    proxy: ProxyBroker, ctx: RequestContext, response: bytes, complete: Complete | None
) -> bytes:
    """The main's answer in the client's zone view, completed by the ACL verdict."""
    header = ctx.header
    key, version = header.api_key, header.api_version
    _, entity = decode_response(key, version, response)
    out = entity_to_data(entity)
    zone = proxy.config.zone  # a client that reached this proxy is in its zone
    topology = proxy.client_topology(ctx.conn, header.client_id)
    if key == API_METADATA:
        out = rewrite_metadata(out, zone, topology).data
    elif key == API_FIND_COORDINATOR:
        out = rewrite_find_coordinator(out, zone, topology).data
    elif key == API_DESCRIBE_TOPIC_PARTITIONS:
        out = rewrite_describe_topic_partitions(out, zone, topology).data
    elif key == API_DESCRIBE_CLUSTER:
        out = rewrite_describe_cluster(out, zone, topology).data
    if complete is not None:
        out = complete(out)
    return _encode(header, out)


def _encode(header: RequestHeader, data: dict[str, Any]) -> bytes:
    return encode_response(header, build_response(header.api_key, header.api_version, data))
