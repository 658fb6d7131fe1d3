"""The transaction APIs: InitProducerId (with a transactional id), AddPartitionsToTxn (v0-v5,
the KIP-890 verify-only path included), AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions and ListTransactions. The coordinator is main_broker/txn/coordinator.py;
TxnOffsetCommit goes to the group's coordinator (main_broker/groups/txn_offsets.py).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kafka_wire.errors import ErrorCode
from main_broker.groups.offsets import OffsetTuple
from main_broker.request import RequestContext
from main_broker.txn.state import TxnState, valid_transactional_id
from shared_wal import WalError

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices

_UNKNOWN = ErrorCode.unknown_topic_or_partition
_NOT_ATTEMPTED = ErrorCode.operation_not_attempted


async def init_producer_id(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    tid = getattr(req, "transactional_id", None)
    if tid is None:
        try:
            pid = broker.cluster.producer_id(await broker.store.allocate_producer_id())
        except WalError:
            # The block of ids is recorded in the WAL first; a failed (or fenced) WAL was
            # logged where it failed. Retriable: the client asks again, or another main.
            return {
                "error_code": ErrorCode.coordinator_not_available,
                "producer_id": -1,
                "producer_epoch": -1,
            }
        return {"error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": 0}
    if not valid_transactional_id(tid):
        return {"error_code": ErrorCode.invalid_request, "producer_id": -1, "producer_epoch": -1}
    timeout_ms = int(req.transaction_timeout.total_seconds() * 1000)
    result = await broker.txn.init_producer_id(
        tid,
        timeout_ms,
        getattr(req, "producer_id", -1),
        getattr(req, "producer_epoch", -1),
    )
    return {
        "error_code": result.error,
        "producer_id": result.producer_id,
        "producer_epoch": result.producer_epoch,
    }


def _partitions_of(broker: BrokerServices, topics: Any) -> tuple[set[tuple[str, int]], set[str]]:
    """(every partition named, the topics of them that do not exist)."""
    wanted: set[tuple[str, int]] = set()
    unknown: set[str] = set()
    for topic in topics:
        for index in topic.partitions:
            wanted.add((topic.name, int(index)))
            if broker.store.partition(topic.name, int(index)) is None:
                unknown.add(topic.name)
    return wanted, unknown


def _topic_results(
    codes: dict[tuple[str, int], ErrorCode],
) -> list[dict[str, Any]]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, index), code in sorted(codes.items()):
        by_topic.setdefault(topic, []).append(
            {"partition_index": index, "partition_error_code": code}
        )
    return [{"name": t, "results_by_partition": parts} for t, parts in by_topic.items()]


async def _add_partitions(
    broker: BrokerServices, tid: str, pid: int, epoch: int, topics: Any, verify_only: bool
) -> dict[tuple[str, int], ErrorCode]:
    wanted, unknown = _partitions_of(broker, topics)
    if not valid_transactional_id(tid):
        return dict.fromkeys(wanted, ErrorCode.invalid_request)
    if verify_only:
        return broker.txn.verify_partitions(tid, pid, epoch, frozenset(wanted))
    if unknown:
        # As Kafka: nothing is added; the unknown partitions say why, the rest were not tried.
        return {tp: _UNKNOWN if tp[0] in unknown else _NOT_ATTEMPTED for tp in wanted}
    code, missed = await broker.txn.add_partitions(tid, pid, epoch, frozenset(wanted))
    codes = dict.fromkeys(wanted, code)
    for tp in missed:
        # Its leader was not told of the transaction (unreachable, or it moved): retriable.
        codes[tp] = ErrorCode.concurrent_transactions
    return codes


async def add_partitions_to_txn(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    if ctx.header.api_version < 4:
        codes = await _add_partitions(
            broker, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch, req.v3_and_below_topics, False,
        )  # fmt: skip
        if ctx.header.api_version < 2:
            codes = {tp: _fenced_as_epoch(code) for tp, code in codes.items()}
        return {"throttle_time": datetime.timedelta(0), "results_by_topic_v3_and_below": (
            _topic_results(codes)
        )}  # fmt: skip
    results = []
    for txn in req.transactions:
        codes = await _add_partitions(
            broker, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics,
            txn.verify_only,
        )  # fmt: skip
        results.append(
            {"transactional_id": txn.transactional_id, "topic_results": _topic_results(codes)}
        )
    return {
        "throttle_time": datetime.timedelta(0),
        "error_code": ErrorCode.none,
        "results_by_transaction": results,
    }


def _fenced_as_epoch(code: ErrorCode) -> ErrorCode:
    """Clients before KIP-588 know PRODUCER_FENCED as INVALID_PRODUCER_EPOCH."""
    return ErrorCode.invalid_producer_epoch if code == ErrorCode.producer_fenced else code


async def add_offsets_to_txn(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    if not valid_transactional_id(req.transactional_id):
        code = ErrorCode.invalid_request
    elif not req.group_id:
        code = ErrorCode.invalid_group_id
    else:
        code, _ = await broker.txn.add_partitions(
            req.transactional_id,
            req.producer_id,
            req.producer_epoch,
            frozenset(),
            frozenset({req.group_id}),
        )
    if ctx.header.api_version < 2:
        code = _fenced_as_epoch(code)
    return {"throttle_time": datetime.timedelta(0), "error_code": code}


async def end_txn(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    if not valid_transactional_id(req.transactional_id):
        code = ErrorCode.invalid_request
    else:
        code = await broker.txn.end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, req.committed
        )
    if ctx.header.api_version < 2:
        code = _fenced_as_epoch(code)
    return {"throttle_time": datetime.timedelta(0), "error_code": code}


async def txn_offset_commit(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    codes: dict[tuple[str, int], ErrorCode] = {}
    offsets: list[OffsetTuple] = []
    for topic in req.topics:
        for p in topic.partitions:
            key = (topic.name, p.partition_index)
            codes[key] = ErrorCode.none
            if broker.store.partition(topic.name, p.partition_index) is None:
                codes[key] = _UNKNOWN
            else:
                epoch = getattr(p, "committed_leader_epoch", -1)
                metadata = p.committed_metadata or ""
                offsets.append((topic.name, p.partition_index, p.committed_offset, epoch, metadata))
    error = _txn_commit_error(broker, req)
    if error is None and not broker.txn_offsets.may_commit(
        req.group_id, req.producer_id, req.producer_epoch
    ):
        # AddOffsetsToTxn first (or the transaction already ended): offsets that would wait
        # for a marker that never comes are refused.
        error = ErrorCode.invalid_txn_state
    if error is not None:
        codes = dict.fromkeys(codes, error)
    elif offsets:
        try:
            await broker.txn_offsets.add(req.group_id, req.producer_id, offsets)
        except Exception:  # the WAL failed: the client retries
            for t, p, *_ in offsets:
                codes[(t, p)] = ErrorCode.coordinator_not_available
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic_name, index), code in codes.items():
        by_topic.setdefault(topic_name, []).append({"partition_index": index, "error_code": code})
    return {
        "throttle_time": datetime.timedelta(0),
        "topics": [{"name": t, "partitions": parts} for t, parts in by_topic.items()],
    }


def _txn_commit_error(broker: BrokerServices, req: Any) -> ErrorCode | None:
    if not valid_transactional_id(req.transactional_id):
        return ErrorCode.invalid_request
    if not req.group_id:
        return ErrorCode.invalid_group_id
    if not broker.cluster.owns_group(req.group_id):
        return ErrorCode.not_coordinator
    generation = getattr(req, "generation_id", -1)
    if generation < 0:
        return None  # v0-v2, or a producer that does not name its consumer's generation
    group = broker.coordinator.group(req.group_id)
    if group is None:
        return ErrorCode.illegal_generation
    code = group.commit_error(
        generation, getattr(req, "member_id", ""), getattr(req, "group_instance_id", None)
    )
    return None if code == 0 else ErrorCode(code)


async def describe_transactions(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    states = []
    for tid in req.transactional_ids:
        found = broker.txn.describe(tid)
        if isinstance(found, ErrorCode):
            states.append(
                {
                    "error_code": found,
                    "transactional_id": tid,
                    "transaction_state": "",
                    "transaction_timeout": datetime.timedelta(0),
                    "transaction_start_time": _utc(-1),
                    "producer_id": -1,
                    "producer_epoch": -1,
                    "topics": [],
                }
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(found.partitions):
            by_topic.setdefault(topic, []).append(index)
        states.append(
            {
                "error_code": ErrorCode.none,
                "transactional_id": tid,
                "transaction_state": found.state.kafka_name,
                "transaction_timeout": datetime.timedelta(milliseconds=found.timeout_ms),
                "transaction_start_time": _utc(found.start_ms),
                "producer_id": found.producer_id,
                "producer_epoch": found.producer_epoch,
                "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            }
        )
    return {"throttle_time": datetime.timedelta(0), "transaction_states": states}


def _utc(ms: int) -> datetime.datetime:
    """Kafka says -1 for a transaction not started; kio (the proxy merges these answers
    through it) reads no negative timestamp, so that is the epoch here."""
    return datetime.datetime.fromtimestamp(max(ms, 0) / 1000, tz=datetime.UTC)


_STATE_NAMES = {s.kafka_name: s for s in TxnState}


async def list_transactions(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    filters = list(getattr(req, "state_filters", ()) or ())
    unknown = [f for f in filters if f not in _STATE_NAMES]
    states = {_STATE_NAMES[f] for f in filters if f in _STATE_NAMES}
    pids = set(getattr(req, "producer_id_filters", ()) or ())
    duration = getattr(req, "duration_filter", -1)
    now = int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
    out = []
    for meta in broker.txn.list():
        if filters and meta.state not in states:
            continue
        if pids and meta.producer_id not in pids:
            continue
        if duration >= 0 and (meta.start_ms < 0 or now - meta.start_ms < duration):
            continue
        out.append(
            {
                "transactional_id": meta.transactional_id,
                "producer_id": meta.producer_id,
                "transaction_state": meta.state.kafka_name,
            }
        )
    return {
        "throttle_time": datetime.timedelta(0),
        "error_code": ErrorCode.none,
        "unknown_state_filters": unknown,
        "transaction_states": out,
    }


TXN_APIS: dict[int, tuple[str, int, int]] = {
    24: ("AddPartitionsToTxn", 0, 5),
    25: ("AddOffsetsToTxn", 0, 3),
    26: ("EndTxn", 0, 4),
    28: ("TxnOffsetCommit", 0, 4),
    65: ("DescribeTransactions", 0, 0),
    66: ("ListTransactions", 0, 1),
}
TXN_HANDLERS = {
    24: add_partitions_to_txn,
    25: add_offsets_to_txn,
    26: end_txn,
    28: txn_offset_commit,
    65: describe_transactions,
    66: list_transactions,
}
