"""Produce through a zone proxy: prepare (payload to the shared WAL), then confirm (~100 bytes
to the owning main), then relay the main's partition results to the client.

`begin_produce` runs in the connection's read loop: PREPARED records are submitted and confirm
requests queued in the order the client sent its batches, so order holds end to end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio
from kio.schema.errors import ErrorCode

from internal_rpc.messages import BatchSummary
from kafka_wire.acl import Operation, ResourceType
from kafka_wire.hot_codecs import (
    ProducePartitionResult,
    name_topics,
    produce_response_parts,
)
from kafka_wire.leader_hints import fill_produce_hints
from kafka_wire.produce_admission import produce_admission
from kafka_wire.record_batch import InvalidBatch, validate_produce_records
from kafka_wire.server_loop import Buffer, decode_produce_or_close
from kafka_wire.topic_bytes import TopicFinish
from proxy_broker.confirm_pipe import ConfirmRequest, PreparedPart
from proxy_broker.sequence_guard import RESENT, BatchRef
from shared_wal import RecordType

if TYPE_CHECKING:
    from proxy_broker.broker import ProxyBroker, RequestContext

log = logging.getLogger("zonefleet.proxy.produce")

# The main validates timestamps and sizes against the topic config; the proxy only refuses
# what is malformed, so a bad batch never reaches the shared WAL.
NO_LIMIT = 2**62
# How often a confirm slower than this looks whether its partitions moved meanwhile.
MOVED_CHECK_S = 0.25


class _Share:
    """One main's share of a Produce request: its confirm, and the client's results for it."""

    def __init__(self, request: ConfirmRequest, results: list[ProducePartitionResult]) -> None:
        self.request = request
        self.results = results


def begin_produce(proxy: ProxyBroker, ctx: RequestContext, frame: bytearray) -> TopicFinish:
    header = ctx.header
    req = decode_produce_or_close(header, frame)
    throttle = proxy.quotas.produce_throttle_ms(ctx.conn, header.client_id, len(frame))
    if throttle > 0:
        ctx.throttle_ms = max(ctx.throttle_ms, throttle)
        ctx.conn.mute.mute_for(throttle)
    name_topics(req, proxy.topic_name)
    now_ms = int(time.time() * 1000)
    topics_out: list[tuple[str, list[ProducePartitionResult]]] = []
    shares: dict[int, _Share] = {}
    access, conn = proxy.access, ctx.conn
    txn_denied = (
        access.enabled
        and req.transactional_id is not None
        and not access.allows(conn, Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                              req.transactional_id)
    )  # fmt: skip
    for topic in req.topics:
        results: list[ProducePartitionResult] = []
        topics_out.append((topic.name, results))
        # As Kafka: the transactional id first, then WRITE on the topic; nothing is written.
        denied = (
            ErrorCode.transactional_id_authorization_failed
            if txn_denied
            else ErrorCode.topic_authorization_failed
            if access.enabled
            and not topic.unknown_id
            and not access.allows(conn, Operation.WRITE, ResourceType.TOPIC, topic.name)
            else None
        )
        for part in topic.partitions:
            result = ProducePartitionResult(index=part.index)
            results.append(result)
            if denied is not None:
                result.error_code = denied
                continue
            if topic.unknown_id:  # v13+
                result.error_code = ErrorCode.unknown_topic_id
                continue
            owner = proxy.owner_of(topic.name, part.index)
            records = part.records
            wal_failed = proxy.wal.failed
            refusal = produce_admission(
                acks=req.acks,
                known=owner is not None,
                leads=True,  # the owner is the main that leads it, as far as this proxy knows
                storage_failure=None if wal_failed is None else "the proxy's WAL write failed",
                wal_full=proxy.wal.full,
                records_size=None if records is None else len(records),
            )
            if refusal is not None:
                result.error_code, result.error_message = refusal.error_code, refusal.message
                continue
            assert owner is not None and records is not None
            try:
                # The framing and CRC, which need the bytes; the main checks the topic's
                # limits, the producer's sequence and its epoch from the header summary.
                batch = validate_produce_records(
                    records,
                    now_ms=now_ms,
                    log_append_time=False,
                    timestamp_before_max_ms=NO_LIMIT,
                    timestamp_after_max_ms=NO_LIMIT,
                    max_message_bytes=NO_LIMIT,
                    api_version=header.api_version,
                )
            except InvalidBatch as exc:
                result.error_code = exc.error_code
                result.error_message = exc.message
                continue
            share = shares.get(owner)
            request = (
                share.request
                if share is not None
                else ConfirmRequest(header.api_version, req.timeout_ms, [])
            )
            ref = BatchRef(
                topic.name,
                part.index,
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
            )
            held = proxy.sequence_guard.admit(ref, owner, trio.current_time(), request.done.is_set)
            if held is not None:
                proxy.held_log.warn(
                    f"{topic.name}-{part.index}",
                    "sequence_held",
                    "held back %s-%d, producer %d epoch %d sequence %d, for main %d: %s",
                    *ref,
                    owner,
                    held,
                )
                # Surely not written (never prepared); the client retries it in order.
                result.error_code = ErrorCode.request_timed_out
                result.error_message = (
                    "an earlier batch of this producer to this partition is in doubt: retry from it"
                )
                continue
            if share is None:
                share = shares[owner] = _Share(request, [])
                # Queued now, in arrival order; the pipe sends it once it is prepared.
                proxy.pipes[owner].submit(request)
            ticket = proxy.wal.submit(
                RecordType.PREPARED, {"t": topic.name, "p": part.index}, records
            )
            share.results.append(result)
            share.request.parts.append(
                PreparedPart(
                    topic.name,
                    part.index,
                    BatchSummary.of(batch),
                    ticket=ticket,
                    payload=records,
                )
            )
            proxy.metrics.bytes_in.labels(topic.name).inc(len(records))

    async def respond() -> Sequence[Buffer] | None:
        with trio.move_on_after(max(req.timeout_ms, 0) / 1000 + proxy.config.confirm_timeout_s):
            for owner, share in shares.items():
                await _wait_confirmed(proxy, owner, share)
        now = trio.current_time()
        for share in shares.values():
            _apply_results(share)
            if not share.request.done.is_set():
                # Answered, so never confirmed afterwards (the pipe skips a request that is
                # done): the client may send it again under a new producer epoch, which the
                # main could not tell from new records.
                share.request.fail(ErrorCode.request_timed_out, "answered before its confirm")
            for part, result in zip(share.request.parts, share.results, strict=True):
                if result.error_code in RESENT:
                    proxy.sequence_guard.in_doubt(part.batch_ref(), now)
        if req.acks == 0:
            return None
        # Failures the main answered, or a main this proxy cannot reach: KIP-951 hints in
        # this zone's view (the zone's main or this proxy), as Metadata through it shows.
        hints = partial(
            proxy.leader_hints, topology=proxy.client_topology(ctx.conn, header.client_id)
        )
        endpoints = fill_produce_hints(header.api_version, topics_out, hints)
        # Frame parts that carry each topic's size, for per-topic traffic accounting.
        return produce_response_parts(
            header.api_version,
            header.correlation_id,
            topics_out,
            throttle_time_ms=ctx.throttle_ms,
            node_endpoints=endpoints,
            topic_ids=[topic.topic_id for topic in req.topics],
        )

    # The size of each topic's entry, for the traffic accounting's split by topic.
    return TopicFinish(respond, [(topic.name, topic.nbytes) for topic in req.topics])


async def _wait_confirmed(proxy: ProxyBroker, owner: int, share: _Share) -> None:
    """Until the owner confirms, or every partition of the share has moved to another main:
    a main that is paused (or cut off) holds its confirms, and the clients' requests, until
    its partitions are taken over (main_broker/cluster/watch.py); then they go elsewhere."""
    done = share.request.done
    while not done.is_set():
        with trio.move_on_after(MOVED_CHECK_S):
            await done.wait()
        if not done.is_set() and _all_moved(proxy, owner, share):
            return


def _all_moved(proxy: ProxyBroker, owner: int, share: _Share) -> bool:
    return all(
        proxy.owner_of(part.topic, part.partition) not in (owner, None)
        for part in share.request.parts
    )


def _apply_results(share: _Share) -> None:
    request = share.request
    if not request.done.is_set():
        # Not answered (or moved while its confirm was under way): possibly written, so the
        # client retries it with its sequence, deduplicated where the partition is led now.
        # NOT_LEADER_OR_FOLLOWER would say "not written": librdkafka would then bump its
        # producer epoch and send it again as new.
        for result in share.results:
            result.error_code = ErrorCode.request_timed_out
        return
    for result, outcome in zip(share.results, request.results, strict=False):
        outcome.apply_to(result)
