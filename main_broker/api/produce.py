"""Produce from a Kafka client: answered after the WAL group commit that holds its batches.

`begin_produce` runs in the connection's read loop, so batches from one connection enter the
log in the order the client sent them even when requests are pipelined.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import (
    ProducePartitionResult,
    name_topics,
    produce_response_parts,
)
from kafka_wire.leader_hints import fill_produce_hints
from kafka_wire.server_loop import Buffer, decode_produce_or_close
from kafka_wire.topic_bytes import TopicFinish
from main_broker.api.zone_redirect import misplaced
from main_broker.append import PendingAppends, append_partition

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

log = logging.getLogger("zonefleet.main_broker.produce")


def begin_produce(broker: BrokerServices, ctx: RequestContext, frame: bytearray) -> TopicFinish:
    header = ctx.header
    req = decode_produce_or_close(header, frame)
    throttle_ms = 0
    if broker.direct_client(ctx):  # a proxy's clients are throttled by their proxy
        throttle_ms = broker.quotas.produce_throttle_ms(ctx.conn, header.client_id, len(frame))
        ctx.conn.mute.mute_for(throttle_ms)
    topics_by_id = broker.store.topics_by_id
    name_topics(req, lambda topic_id: t.name if (t := topics_by_id.get(topic_id)) else None)
    metrics = broker.metrics
    appender = broker.appender
    now_ms = int(time.time() * 1000)
    # A client back from a fallback to the mains goes to its zone's proxy again (acks=0 has
    # no answer to say so: served as before).
    elsewhere = (
        misplaced(broker, ctx, [(t.name, p.index) for t in req.topics for p in t.partitions])
        if req.acks != 0
        else frozenset()
    )
    pending = PendingAppends()
    topics_out: list[tuple[str, list[ProducePartitionResult]]] = []
    for topic in req.topics:
        results: list[ProducePartitionResult] = []
        topics_out.append((topic.name, results))
        for part in topic.partitions:
            result = ProducePartitionResult(index=part.index)
            results.append(result)
            if topic.unknown_id:  # v13+
                result.error_code = ErrorCode.unknown_topic_id
                continue
            if (topic.name, part.index) in elsewhere:
                result.error_code = code = ErrorCode.not_leader_or_follower
                result.error_message = "its zone's proxy leads it for this client"
                metrics.request_errors.labels("Produce", code.name).inc()
                continue
            records = part.records
            decision = appender.decide(
                topic.name,
                part.index,
                acks=req.acks,
                records_size=None if records is None else len(records),
                now_ms=now_ms,
                api_version=header.api_version,
                records=records,
            )
            append_partition(broker, decision, result, pending)
            if result.error_code == ErrorCode.none:
                metrics.bytes_in.labels(topic.name).inc(len(records or b""))
            else:
                metrics.request_errors.labels("Produce", ErrorCode(result.error_code).name).inc()
    # The size of each topic's entry, for the traffic accounting's split by topic.
    request_topics = [(topic.name, topic.nbytes) for topic in req.topics]

    if req.acks == 0:

        async def no_response() -> Sequence[bytes] | None:
            return None

        return TopicFinish(no_response, request_topics)

    async def respond() -> Sequence[Buffer]:
        await pending.wait(broker, req.timeout_ms / 1000)
        endpoints = fill_produce_hints(header.api_version, topics_out, broker.leader_hints(ctx))
        # Frame parts that carry each topic's size, for per-topic traffic accounting.
        return produce_response_parts(
            header.api_version,
            header.correlation_id,
            topics_out,
            throttle_time_ms=throttle_ms,
            node_endpoints=endpoints,
            topic_ids=[topic.topic_id for topic in req.topics],
        )

    return TopicFinish(respond, request_topics)
