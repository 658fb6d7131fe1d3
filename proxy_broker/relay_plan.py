"""Where a proxy relays a Kafka request, and how answers from several mains become one.

Group requests go to the group's coordinator (zone_router.placement, computed the same way
the mains do), and so do transaction requests to their transactional id's coordinator
(TxnOffsetCommit to the group's: it holds the offsets). ListOffsets and DeleteRecords are
split by partition leader and the answers merged, so one request can span partitions led by
mains in different zones (AlterReplicaLogDirs too). ListTransactions asks every main;
ListGroups asks the mains this proxy stands for in its zone view (`foreign_mains`): a client
sends ListGroups to every broker its Metadata lists, and its zone's own mains list their
groups themselves.
Anything else goes to any live main: every main holds the whole cluster metadata, and reads
the ACL, SCRAM and quota documents from the metadata store on each request (CreateAcls,
DescribeAcls, DeleteAcls, Describe/AlterUserScramCredentials, Describe/AlterClientQuotas), so
any main answers them alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka_wire.codec import (
    RequestHeader,
    build_request,
    build_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    entity_to_data,
)
from zone_router import group_coordinator

API_LIST_OFFSETS = 2
API_DELETE_RECORDS = 21  # only the partition's leader may move its log start
API_OFFSET_COMMIT, API_OFFSET_FETCH = 8, 9
API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP = 11, 12, 13, 14
API_DESCRIBE_GROUPS, API_LIST_GROUPS = 15, 16
API_DESCRIBE_LOG_DIRS, API_DESCRIBE_PRODUCERS = 35, 61
API_ALTER_REPLICA_LOG_DIRS = 34  # each partition's leader answers for it
SINGLE_GROUP_APIS = {API_OFFSET_COMMIT, API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP}
SINGLE_GROUP_APIS |= {API_SYNC_GROUP}
API_DELETE_GROUPS, API_OFFSET_DELETE = 42, 47
API_CONSUMER_GROUP_HEARTBEAT, API_CONSUMER_GROUP_DESCRIBE = 68, 69
SINGLE_GROUP_APIS |= {API_OFFSET_DELETE, API_CONSUMER_GROUP_HEARTBEAT}
# Requests naming several groups are split by coordinator and their answers joined:
# api key -> (request field listing group ids, response field listing one result per group)
MULTI_GROUP_APIS = {
    API_DESCRIBE_GROUPS: ("groups", "groups"),
    API_DELETE_GROUPS: ("groups_names", "results"),
    API_CONSUMER_GROUP_DESCRIBE: ("group_ids", "groups"),
}
# Transactions: a transactional id is placed on a main as a group id is.
API_INIT_PRODUCER_ID, API_ADD_PARTITIONS_TO_TXN, API_ADD_OFFSETS_TO_TXN = 22, 24, 25
API_END_TXN, API_TXN_OFFSET_COMMIT = 26, 28
API_DESCRIBE_TRANSACTIONS, API_LIST_TRANSACTIONS = 65, 66
SINGLE_TXN_APIS = {API_INIT_PRODUCER_ID, API_ADD_OFFSETS_TO_TXN, API_END_TXN}

Merge = Callable[[Sequence[bytes]], bytes]


@dataclass
class RelayPlan:
    """One (main node id, request frame) per main to ask; `merge` joins their responses."""

    calls: list[tuple[int, bytes]]
    merge: Merge | None = None


def plan_relay(
    header: RequestHeader,
    frame: bytes,
    mains: Sequence[int],
    default: int,
    leader_of: Callable[[str, int], int | None],
    foreign_mains: Sequence[int] | None = None,
) -> RelayPlan:
    """`foreign_mains`: the mains in other zones, whose partitions and groups this proxy poses
    as the leader and coordinator of (a main in the proxy's zone shows its own partitions and
    groups to the zone's clients); None: not known, every main."""
    key = header.api_key
    if key in SINGLE_GROUP_APIS:
        group = getattr(decode_request(header, frame), "group_id", "")
        return RelayPlan([(_coordinator(group, mains, default), frame)])
    if key == API_OFFSET_FETCH:
        request = decode_request(header, frame)
        if getattr(request, "groups", None):
            # v8+ may ask for several groups: each goes to its own coordinator.
            entries: dict[int, list[dict[str, Any]]] = {}
            for g in entity_to_data(request)["groups"]:
                entries.setdefault(_coordinator(g["group_id"], mains, default), []).append(g)
            return _split(header, request, entries, "groups", _merge_lists(header, "groups"))
        group = getattr(request, "group_id", "")
        return RelayPlan([(_coordinator(group, mains, default), frame)])
    if key in MULTI_GROUP_APIS:
        ids_field, results_field = MULTI_GROUP_APIS[key]
        request = decode_request(header, frame)
        by_main: dict[int, list[str]] = {}
        for group in getattr(request, ids_field):
            by_main.setdefault(_coordinator(group, mains, default), []).append(group)
        if not by_main:
            by_main[default] = []  # an empty list still gets its (empty) answer
        merge = _merge_lists(header, results_field)
        return _split(header, request, by_main, ids_field, merge)
    if key in SINGLE_TXN_APIS:
        tid = getattr(decode_request(header, frame), "transactional_id", None)
        return RelayPlan([(_coordinator(tid or "", mains, default), frame)])
    if key == API_TXN_OFFSET_COMMIT:  # to the group's coordinator, which holds the offsets
        group = getattr(decode_request(header, frame), "group_id", "")
        return RelayPlan([(_coordinator(group, mains, default), frame)])
    if key == API_ADD_PARTITIONS_TO_TXN:
        request = decode_request(header, frame)
        if header.api_version < 4:
            tid = request.v3_and_below_transactional_id
            return RelayPlan([(_coordinator(tid, mains, default), frame)])
        by_txn: dict[int, list[dict[str, Any]]] = {}
        for txn in entity_to_data(request)["transactions"]:
            by_txn.setdefault(_coordinator(txn["transactional_id"], mains, default), []).append(txn)
        if not by_txn:
            by_txn[default] = []
        merge = _merge_lists(header, "results_by_transaction")
        return _split(header, request, by_txn, "transactions", merge)
    if key == API_DESCRIBE_TRANSACTIONS:
        request = decode_request(header, frame)
        by_id: dict[int, list[str]] = {}
        for tid in request.transactional_ids:
            by_id.setdefault(_coordinator(tid, mains, default), []).append(tid)
        if not by_id:
            by_id[default] = []
        merge = _merge_lists(header, "transaction_states")
        return _split(header, request, by_id, "transactional_ids", merge)
    if key == API_LIST_TRANSACTIONS:
        # Every main's transactions; the unknown state filters are the first main's (the
        # same on each).
        return RelayPlan([(m, frame) for m in mains], _merge_lists(header, "transaction_states"))
    if key == API_LIST_GROUPS:
        listed = mains if foreign_mains is None else foreign_mains
        if not listed:  # every main is in this zone and lists its own groups
            return RelayPlan([], lambda _: _encode(header, {"error_code": 0, "groups": []}))
        return RelayPlan([(m, frame) for m in listed], _merge_lists(header, "groups"))
    if key in (API_LIST_OFFSETS, API_DELETE_RECORDS):
        return _split_by_leader(header, decode_request(header, frame), default, leader_of)
    if key == API_DESCRIBE_PRODUCERS:
        request = decode_request(header, frame)
        return _split_by_leader(header, request, default, leader_of, "partition_indexes")
    if key == API_ALTER_REPLICA_LOG_DIRS:
        return _split_log_dirs_by_leader(header, decode_request(header, frame), default, leader_of)
    if key == API_DESCRIBE_LOG_DIRS:  # each main reports the partitions it leads
        asked = foreign_mains or mains
        return RelayPlan([(m, frame) for m in asked], _merge_lists(header, "results"))
    return RelayPlan([(default, frame)])


def _coordinator(group: str, mains: Sequence[int], default: int) -> int:
    return group_coordinator(group, mains) if group and mains else default


def _split(
    header: RequestHeader, request: Any, by_main: dict[int, list[Any]], field: str, merge: Merge
) -> RelayPlan:
    data = entity_to_data(request)
    calls = []
    for main, items in by_main.items():
        sub = build_request(header.api_key, header.api_version, {**data, field: items})
        calls.append((main, _frame(header, sub)))
    if len(calls) == 1:
        return RelayPlan(calls)
    return RelayPlan(calls, merge)


def _split_by_leader(
    header: RequestHeader,
    request: Any,
    default: int,
    leader_of: Callable[[str, int], int | None],
    partitions_field: str = "partitions",
) -> RelayPlan:
    """Partitions are dicts with a partition_index, or bare indexes (DescribeProducers)."""
    data = entity_to_data(request)
    by_main: dict[int, list[dict[str, Any]]] = {}
    for topic in data["topics"]:
        per_main: dict[int, list[Any]] = {}
        for part in topic[partitions_field]:
            index = part if isinstance(part, int) else part["partition_index"]
            leader = leader_of(topic["name"], index)
            per_main.setdefault(default if leader is None else leader, []).append(part)
        for main, parts in per_main.items():
            by_main.setdefault(main, []).append({**topic, partitions_field: parts})
    if len(by_main) <= 1:
        target = next(iter(by_main), default)
        return RelayPlan([(target, _frame(header, request))])
    return _split(header, request, by_main, "topics", _merge_topics(header))


def _split_log_dirs_by_leader(
    header: RequestHeader, request: Any, default: int, leader_of: Callable[[str, int], int | None]
) -> RelayPlan:
    """AlterReplicaLogDirs: each main gets the (dir, topic, partition) moves of the partitions
    it leads, and the answers' topics are joined by name."""
    by_main: dict[int, dict[str, dict[str, list[int]]]] = {}  # main -> path -> topic -> parts
    for move in entity_to_data(request)["dirs"]:
        for topic in move["topics"]:
            for index in topic["partitions"]:
                leader = leader_of(topic["name"], index)
                main = default if leader is None else leader
                in_dir = by_main.setdefault(main, {}).setdefault(move["path"], {})
                in_dir.setdefault(topic["name"], []).append(index)
    if len(by_main) <= 1:
        return RelayPlan([(next(iter(by_main), default), _frame(header, request))])
    calls = []
    for main, paths in by_main.items():
        dirs = [
            {"path": path, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
            for path, topics in paths.items()
        ]
        sub = build_request(header.api_key, header.api_version, {"dirs": dirs})
        calls.append((main, _frame(header, sub)))

    def merge(responses: Sequence[bytes]) -> bytes:
        parts = _decoded(header, responses)
        topics: dict[str, list[Any]] = {}
        for p in parts:
            for result in p["results"]:
                topics.setdefault(result["topic_name"], []).extend(result["partitions"])
        results = [{"topic_name": n, "partitions": ps} for n, ps in topics.items()]
        throttle = max(p["throttle_time"] for p in parts)
        return _encode(header, {"throttle_time": throttle, "results": results})

    return RelayPlan(calls, merge)


def _frame(header: RequestHeader, request: Any) -> bytes:
    return encode_request(
        header.api_key, header.api_version, header.correlation_id, header.client_id, request
    )


def _decoded(header: RequestHeader, responses: Sequence[bytes]) -> list[dict[str, Any]]:
    return [
        entity_to_data(decode_response(header.api_key, header.api_version, r)[1]) for r in responses
    ]


def _encode(header: RequestHeader, data: dict[str, Any]) -> bytes:
    return encode_response(header, build_response(header.api_key, header.api_version, data))


def _merge_lists(header: RequestHeader, field: str) -> Merge:
    def merge(responses: Sequence[bytes]) -> bytes:
        parts = _decoded(header, responses)
        out = dict(parts[0])
        out[field] = [item for p in parts for item in p[field]]
        if "error_code" in out:
            out["error_code"] = next((p["error_code"] for p in parts if p["error_code"]), 0)
        if "throttle_time_ms" in out:
            out["throttle_time_ms"] = max(p["throttle_time_ms"] for p in parts)
        return _encode(header, out)

    return merge


def _merge_topics(header: RequestHeader) -> Merge:
    def merge(responses: Sequence[bytes]) -> bytes:
        parts = _decoded(header, responses)
        out = dict(parts[0])
        topics: dict[str, dict[str, Any]] = {}
        for p in parts:
            for topic in p["topics"]:
                seen = topics.get(topic["name"])
                if seen is None:
                    topics[topic["name"]] = {**topic, "partitions": list(topic["partitions"])}
                else:
                    seen["partitions"].extend(topic["partitions"])
        out["topics"] = list(topics.values())
        if "throttle_time_ms" in out:
            out["throttle_time_ms"] = max(p["throttle_time_ms"] for p in parts)
        return _encode(header, out)

    return merge
