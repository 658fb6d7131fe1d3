"""ACL checks of the group and transaction coordinators' APIs a zone proxy relays, as Kafka
4.x's KafkaApis makes them:

- JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group. ConsumerGroupHeartbeat
  too, and DESCRIBE on each subscribed topic name (TOPIC_AUTHORIZATION_FAILED).
- OffsetCommit: READ on the group, then READ per topic (TOPIC_AUTHORIZATION_FAILED per
  partition, the rest committed). OffsetFetch: DESCRIBE per group, and per topic: a named
  topic's partitions TOPIC_AUTHORIZATION_FAILED, and a group's all-offsets answer without
  the topics it may not describe. OffsetDelete: DELETE on the group, READ per topic.
- DescribeGroups, ConsumerGroupDescribe: DESCRIBE per group (GROUP_AUTHORIZATION_FAILED per
  group), `authorized_operations` when asked for; a described consumer group whose
  assignments name a topic the principal may not describe fails TOPIC_AUTHORIZATION_FAILED.
  ListGroups: every group with DESCRIBE on the cluster, else those it may DESCRIBE (not
  audited). DeleteGroups: DELETE per group.
- FindCoordinator: DESCRIBE on each group or transactional id.
- InitProducerId: WRITE on the transactional id; without one IDEMPOTENT_WRITE on the cluster
  or WRITE on some topic (KIP-679). AddPartitionsToTxn (v0-3, from producers): WRITE on the
  transactional id, then WRITE per topic, all or nothing (the others OPERATION_NOT_ATTEMPTED);
  v4+ (from brokers) CLUSTER_ACTION. AddOffsetsToTxn: WRITE on the transactional id, READ on
  the group. EndTxn: WRITE on the transactional id. TxnOffsetCommit: WRITE on the
  transactional id, READ on the group, READ per topic. DescribeTransactions: DESCRIBE per
  transactional id, and only the topics it may describe; ListTransactions: only the
  transactional ids it may describe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kafka_wire.acl import Operation, ResourceType
from kafka_wire.codec import entity_to_data
from kafka_wire.errors import ErrorCode
from proxy_broker.access_verdict import (
    CAF,
    GAF,
    MESSAGES,
    TAF,
    TIAF,
    Caller,
    Check,
    Complete,
    Data,
    Verdict,
    answer,
    partition_errors,
    relay,
    relay_part,
    split_topics,
)

__all__ = ["CHECKS"]

O = Operation  # noqa: E741 - reads as a table
TOPIC, GROUP, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
DESCRIBED_TOPICS_HIDDEN: Final = (
    "The group has described topic(s) that the client is not authorized to describe."
)


def _group_read(caller: Caller, request: Any) -> Verdict | None:
    if caller.may(O.READ, GROUP, request.group_id):
        return None
    return answer({"error_code": GAF})


def offset_commit(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    if not caller.may(O.READ, GROUP, data["group_id"]):
        return answer({"topics": [partition_errors(t, GAF) for t in data["topics"]]})
    allowed, refused = split_topics(caller, data["topics"], O.READ)
    return relay_part(data, allowed, [partition_errors(t, code) for t, code in refused])


def _offsets_refused(topic: Data, code: ErrorCode) -> Data:
    return partition_errors(topic, code, "partition_indexes", committed_offset=-1, metadata="")


def _fetch_group(caller: Caller, group: Data) -> tuple[Data | None, Complete | None]:
    """One group of an OffsetFetch the principal may describe: (what to relay of it, or
    None when nothing; what joins the main's answer for it, or None: nothing to join)."""
    topics = group.get("topics")
    if topics is None:  # all its offsets: those of topics it may not describe left out

        def described(out: Data) -> Data:
            if out.get("error_code"):
                return out
            kept = [t for t in out["topics"] if _described(caller, t)]
            return {**out, "topics": kept}

        return group, described
    allowed, refused = split_topics(caller, topics, O.DESCRIBE)
    if not refused:
        return group, None
    denied = [_offsets_refused(t, code) for t, code in refused]

    def join(out: Data) -> Data:
        if out.get("error_code"):
            return out
        return {**out, "topics": [*out["topics"], *denied]}

    return ({**group, "topics": allowed} if allowed else None), join


def _described(caller: Caller, topic: Data) -> bool:
    name = caller.topic(topic)
    return name is not None and caller.may(O.DESCRIBE, TOPIC, name)


def offset_fetch(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    if caller.version >= 8:
        return _offset_fetch_groups(caller, data)
    if not caller.may(O.DESCRIBE, GROUP, data["group_id"]):
        # v1 has no error_code of its own: each partition asked for carries it.
        topics = [_offsets_refused(t, GAF) for t in data["topics"] or ()]
        return answer({"error_code": GAF, "topics": topics if caller.version < 2 else []})
    relayed, join = _fetch_group(caller, data)
    if relayed is None:
        assert join is not None
        return answer(join({"error_code": ErrorCode.none, "topics": []}))
    return relay(relayed if relayed is not data else None, join)


def _offset_fetch_groups(caller: Caller, data: Data) -> Verdict | None:
    relayed: list[Data] = []
    local: list[Data] = []
    # By group id, every join of its entries: a group named twice gets both (a filter and
    # a join of denied topics never show more than either alone).
    joins: dict[str, list[Complete]] = {}
    for group in data["groups"]:
        group_id = group["group_id"]
        if not caller.may(O.DESCRIBE, GROUP, group_id):
            local.append({"group_id": group_id, "error_code": GAF})
            continue
        entry, join = _fetch_group(caller, group)
        if entry is None:
            assert join is not None
            local.append(join({"group_id": group_id, "error_code": ErrorCode.none, "topics": []}))
            continue
        relayed.append(entry)
        if join is not None:
            joins.setdefault(group_id, []).append(join)
    if not local and not joins:
        return None
    if not relayed:
        return answer({"groups": local})

    def complete(out: Data) -> Data:
        groups = []
        for group in out["groups"]:
            for join in joins.get(group["group_id"], ()):
                group = join(group)
            groups.append(group)
        return {**out, "groups": [*groups, *local]}

    return relay({**data, "groups": relayed}, complete)


def _groups_by_id(
    caller: Caller,
    request: Any,
    ids_field: str,
    refused_entry: Data,
    with_ops: bool,
    described: Complete | None = None,
) -> Verdict | None:
    """DescribeGroups and ConsumerGroupDescribe: DESCRIBE per group, the denied ones answered
    here; the described ones get `authorized_operations` and `described`."""
    data = entity_to_data(request)
    ids = list(data[ids_field])
    allowed = [g for g in ids if caller.may(O.DESCRIBE, GROUP, g)]
    local = [{**refused_entry, "group_id": g} for g in ids if g not in set(allowed)]
    if local and not allowed:
        return answer({"groups": local})
    if not local and not with_ops and described is None:
        return None

    def complete(out: Data) -> Data:
        groups = []
        for group in out["groups"]:
            if group["error_code"] == ErrorCode.none and described is not None:
                group = described(group)
            if group["error_code"] == ErrorCode.none and with_ops:
                ops = caller.operations(GROUP, group["group_id"])
                group = {**group, "authorized_operations": ops}
            groups.append(group)
        return {**out, "groups": [*groups, *local]}

    return relay({**data, ids_field: allowed} if local else None, complete)


def describe_groups(caller: Caller, request: Any) -> Verdict | None:
    with_ops = caller.version >= 3 and bool(getattr(request, "include_authorized_operations", 0))
    return _groups_by_id(caller, request, "groups", {"error_code": GAF}, with_ops)


def consumer_group_describe(caller: Caller, request: Any) -> Verdict | None:
    def described(group: Data) -> Data:
        names = {
            tp["topic_name"]
            for member in group["members"]
            for assignment in (member.get("assignment"), member.get("target_assignment"))
            for tp in (assignment or {}).get("topic_partitions") or ()
        }
        if all(caller.may(O.DESCRIBE, TOPIC, n) for n in sorted(names)):
            return group
        return {**group, "error_code": TAF, "error_message": DESCRIBED_TOPICS_HIDDEN, "members": []}

    with_ops = bool(request.include_authorized_operations)
    return _groups_by_id(caller, request, "group_ids", {"error_code": GAF}, with_ops, described)


def list_groups(caller: Caller, request: Any) -> Verdict | None:
    if caller.may_cluster(O.DESCRIBE, audit=False):
        return None

    def complete(out: Data) -> Data:
        kept = [
            g for g in out["groups"] if caller.may(O.DESCRIBE, GROUP, g["group_id"], audit=False)
        ]
        return {**out, "groups": kept}

    return relay(complete=complete)


def delete_groups(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    names = list(dict.fromkeys(data["groups_names"]))  # Kafka asks each group once
    allowed = [g for g in names if caller.may(O.DELETE, GROUP, g)]
    refused = [{"group_id": g, "error_code": GAF} for g in names if g not in set(allowed)]
    return relay_part(data, allowed, refused, field="groups_names", results="results")


def offset_delete(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    if not caller.may(O.DELETE, GROUP, data["group_id"]):
        return answer({"error_code": GAF})
    allowed, refused = split_topics(caller, data["topics"], O.READ)
    answers = [partition_errors(t, code) for t, code in refused]
    return relay_part(data, allowed, answers, base={"error_code": ErrorCode.none})


def consumer_group_heartbeat(caller: Caller, request: Any) -> Verdict | None:
    if not caller.may(O.READ, GROUP, request.group_id):
        return answer({"error_code": GAF})
    names = dict.fromkeys(request.subscribed_topic_names or ())
    hidden = [n for n in names if not caller.may(O.DESCRIBE, TOPIC, n)]
    if not hidden:
        return None
    message = f"The client is not authorized to describe topics: {', '.join(sorted(hidden))}"
    return answer({"error_code": TAF, "error_message": message})


def find_coordinator(caller: Caller, request: Any) -> Verdict | None:
    rtype, code = (TXN, TIAF) if getattr(request, "key_type", 0) == 1 else (GROUP, GAF)
    if caller.version < 4:
        if caller.may(O.DESCRIBE, rtype, request.key):
            return None
        return answer({"error_code": code, "node_id": -1, "host": "", "port": -1})
    data = entity_to_data(request)
    keys = data["coordinator_keys"]
    allowed = [k for k in keys if caller.may(O.DESCRIBE, rtype, k)]
    failed = {"node_id": -1, "host": "", "port": -1, "error_code": code}
    refused = [
        {**failed, "key": k, "error_message": MESSAGES[code]} for k in keys if k not in set(allowed)
    ]
    return relay_part(data, allowed, refused, field="coordinator_keys", results="coordinators")


def init_producer_id(caller: Caller, request: Any) -> Verdict | None:
    txn = request.transactional_id
    if txn is not None:
        if caller.may(O.WRITE, TXN, txn):
            return None
        code = TIAF
    else:
        if caller.may_cluster(O.IDEMPOTENT_WRITE, audit=False) or caller.access.allows_any(
            caller.conn, O.WRITE, TOPIC
        ):
            return None
        code = CAF
        caller.may_cluster(O.IDEMPOTENT_WRITE)  # the audit line of the denial
    return answer({"error_code": code, "producer_id": -1, "producer_epoch": -1})


def add_partitions_to_txn(caller: Caller, request: Any) -> Verdict | None:
    if caller.version >= 4:  # from brokers verifying a transaction
        if caller.may_cluster(O.CLUSTER_ACTION):
            return None
        return answer({"error_code": CAF})
    data = entity_to_data(request)
    topics = data["v3_and_below_topics"]

    def results(code: dict[str, ErrorCode]) -> Data:
        return {
            "results_by_topic_v3_and_below": [
                {
                    "name": t["name"],
                    "results_by_partition": [
                        {"partition_index": p, "partition_error_code": code[t["name"]]}
                        for p in t["partitions"]
                    ],
                }
                for t in topics
            ]
        }

    if not caller.may(O.WRITE, TXN, data["v3_and_below_transactional_id"]):
        return answer(results({t["name"]: TIAF for t in topics}))
    codes = {
        t["name"]: ErrorCode.operation_not_attempted
        if caller.may(O.WRITE, TOPIC, t["name"])
        else TAF
        for t in topics
    }
    if TAF not in codes.values():
        return None
    return answer(results(codes))  # all or nothing: no partition is added


def add_offsets_to_txn(caller: Caller, request: Any) -> Verdict | None:
    if not caller.may(O.WRITE, TXN, request.transactional_id):
        return answer({"error_code": TIAF})
    if not caller.may(O.READ, GROUP, request.group_id):
        return answer({"error_code": GAF})
    return None


def end_txn(caller: Caller, request: Any) -> Verdict | None:
    if caller.may(O.WRITE, TXN, request.transactional_id):
        return None
    return answer({"error_code": TIAF})


def txn_offset_commit(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    for operation, rtype, name, code in (
        (O.WRITE, TXN, data["transactional_id"], TIAF),
        (O.READ, GROUP, data["group_id"], GAF),
    ):
        if not caller.may(operation, rtype, name):
            return answer({"topics": [partition_errors(t, code) for t in data["topics"]]})
    allowed, refused = split_topics(caller, data["topics"], O.READ)
    return relay_part(data, allowed, [partition_errors(t, code) for t, code in refused])


def describe_transactions(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    ids = data["transactional_ids"]
    allowed = [t for t in ids if caller.may(O.DESCRIBE, TXN, t)]
    local = [{"transactional_id": t, "error_code": TIAF} for t in ids if t not in set(allowed)]
    if local and not allowed:
        return answer({"transaction_states": local})

    def complete(out: Data) -> Data:
        states = [
            {**s, "topics": [t for t in s["topics"] if caller.may(O.DESCRIBE, TOPIC, t["topic"])]}
            for s in out["transaction_states"]
        ]
        return {**out, "transaction_states": [*states, *local]}

    return relay({**data, "transactional_ids": allowed} if local else None, complete)


def list_transactions(caller: Caller, request: Any) -> Verdict | None:
    def complete(out: Data) -> Data:
        states = out["transaction_states"]
        kept = [s for s in states if caller.may(O.DESCRIBE, TXN, s["transactional_id"])]
        return {**out, "transaction_states": kept}

    return relay(complete=complete)


CHECKS: Final[Mapping[int, Check]] = {
    8: offset_commit,
    9: offset_fetch,
    10: find_coordinator,
    11: _group_read,
    12: _group_read,
    13: _group_read,
    14: _group_read,
    15: describe_groups,
    16: list_groups,
    22: init_producer_id,
    24: add_partitions_to_txn,
    25: add_offsets_to_txn,
    26: end_txn,
    28: txn_offset_commit,
    42: delete_groups,
    47: offset_delete,
    65: describe_transactions,
    66: list_transactions,
    68: consumer_group_heartbeat,
    69: consumer_group_describe,
}
