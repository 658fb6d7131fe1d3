"""WriteTxnMarkers on the receiving main: append each marker to the partitions it leads and
complete the transactional offsets of the groups it coordinates. And `allow`: the partitions
and groups a transaction now holds, which a producer's batch or TxnOffsetCommit needs before
it may open the transaction there (KIP-890's verification, pushed by the coordinator).

A coordinator main calls `write_markers` directly for its own partitions and groups, and
over the internal RPC (`write_txn_markers`, internal_rpc.messages.WriteTxnMarkers) for
another main's. A marker is answered once durable. Sending one again is harmless: a marker
for a producer with no open transaction changes nothing a reader sees.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

import trio

from internal_rpc.messages import (
    AllowTxn,
    AllowTxnResult,
    TxnMarkerResult,
    WriteTxnMarkers,
    WriteTxnMarkersResult,
)
from kafka_wire.errors import ErrorCode
from main_broker.partition_log import PartitionLog, leader_error
from shared_wal import WalError

if TYPE_CHECKING:
    from main_broker.cluster.view import ClusterView
    from main_broker.groups.txn_offsets import PendingTxnOffsets
    from main_broker.log_store import LogStore
    from shared_wal import AppendTicket

log = logging.getLogger("zonefleet.main_broker.txn")


class TxnHost(Protocol):
    """What transactions use of their broker (`main_broker.broker.MainBroker` is one)."""

    @property
    def store(self) -> LogStore: ...
    @property
    def cluster(self) -> ClusterView: ...
    @property
    def txn_offsets(self) -> PendingTxnOffsets: ...
    @property
    def node_id(self) -> int: ...

    def may_append(self, plog: PartitionLog) -> bool: ...

    def mark_storage_failed(self, exc: BaseException) -> None: ...


async def write_markers(host: TxnHost, request: WriteTxnMarkers) -> WriteTxnMarkersResult:
    results = []
    now_ms = int(time.time() * 1000)
    for marker in request.markers:
        codes: list[tuple[str, int, int]] = []
        waits: list[tuple[int, PartitionLog, AppendTicket]] = []
        for topic, index in marker.partitions:
            plog = host.store.partition(topic, index)
            error = leader_error(plog)
            if error is None and plog is not None and not host.may_append(plog):
                error = ErrorCode.not_leader_or_follower
            if error is None and plog is not None:
                error = plog.check_marker(marker.producer_id, marker.producer_epoch)
            if error is None and plog is not None:
                ticket = host.store.append_marker(
                    plog,
                    marker.producer_id,
                    marker.producer_epoch,
                    marker.commit,
                    marker.coordinator_epoch,
                    now_ms,
                )
                waits.append((len(codes), plog, ticket))
            codes.append((topic, index, int(error or ErrorCode.none)))
        for i, plog, ticket in waits:
            try:
                await ticket.wait()
            except WalError as exc:
                host.mark_storage_failed(exc)
                codes[i] = (codes[i][0], codes[i][1], int(ErrorCode.kafka_storage_error))
                continue
            if not host.cluster.may_acknowledge(plog):
                codes[i] = (codes[i][0], codes[i][1], int(ErrorCode.not_leader_or_follower))
        groups = []
        for group_id in marker.groups:
            code = ErrorCode.none
            if not host.cluster.owns_group(group_id):
                code = ErrorCode.not_coordinator
            else:
                try:
                    await host.txn_offsets.complete(group_id, marker.producer_id, marker.commit)
                except (OSError, WalError) as exc:
                    log.warning(
                        "group %s: completing producer %d's offsets failed: %s",
                        group_id,
                        marker.producer_id,
                        exc,
                    )
                    code = ErrorCode.coordinator_not_available
            groups.append((group_id, int(code)))
        results.append(TxnMarkerResult(tuple(codes), tuple(groups)))
        await trio.lowlevel.checkpoint()
    return WriteTxnMarkersResult(tuple(results))


def allow(host: TxnHost, request: AllowTxn) -> AllowTxnResult:
    """Record that the producer's transaction at this epoch holds these partitions (led
    here) and groups (coordinated here). Synchronous: no record, nothing to wait for."""
    codes = []
    for topic, index in request.partitions:
        plog = host.store.partition(topic, index)
        error = leader_error(plog)
        if error is None and plog is not None:
            plog.txns.allow(request.producer_id, request.producer_epoch)
        codes.append((topic, index, int(error or ErrorCode.none)))
    groups = []
    for group_id in request.groups:
        code = ErrorCode.none
        if host.cluster.owns_group(group_id):
            host.txn_offsets.allow(group_id, request.producer_id, request.producer_epoch)
        else:
            code = ErrorCode.not_coordinator
        groups.append((group_id, int(code)))
    return AllowTxnResult(TxnMarkerResult(tuple(codes), tuple(groups)))
