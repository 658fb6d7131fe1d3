"""ACL checks of the APIs that act on the cluster resource as a whole, as Kafka 4.x's
AclApis, ControllerApis and KafkaApis make them: one operation on the cluster, else the
request's error answer (its getErrorResponse with CLUSTER_AUTHORIZATION_FAILED), built in the
proxy; nothing is relayed.

CreateAcls, DeleteAcls: ALTER. DescribeAcls: DESCRIBE. DescribeUserScramCredentials:
DESCRIBE; AlterUserScramCredentials: ALTER. DescribeClientQuotas: DESCRIBE_CONFIGS;
AlterClientQuotas: ALTER_CONFIGS. ElectLeaders, AlterPartitionReassignments,
AlterReplicaLogDirs: ALTER. ListPartitionReassignments, DescribeLogDirs: DESCRIBE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from kafka_wire.acl import Operation
from kafka_wire.codec import entity_to_data
from proxy_broker.access_verdict import CAF, MESSAGES, Caller, Check, Data, Verdict, answer

__all__ = ["CHECKS", "CLUSTER_OPERATIONS"]

MESSAGE: Final = MESSAGES[CAF]
_ERROR: Final = {"error_code": CAF, "error_message": MESSAGE}


def _describe_acls(_: Data) -> Data:
    return {**_ERROR, "resources": []}


def _create_acls(request: Data) -> Data:
    return {"results": [_ERROR for _ in request["creations"]]}


def _delete_acls(request: Data) -> Data:
    return {"filter_results": [{**_ERROR, "matching_acls": []} for _ in request["filters"]]}


def _describe_client_quotas(_: Data) -> Data:
    return {**_ERROR, "entries": None}


def _alter_client_quotas(request: Data) -> Data:
    return {"entries": [{**_ERROR, "entity": e["entity"]} for e in request["entries"]]}


def _describe_scram(request: Data) -> Data:
    users = request["users"] or ()
    return {**_ERROR, "results": [{**_ERROR, "user": u["name"]} for u in users]}


def _alter_scram(request: Data) -> Data:
    users = {d["name"] for d in request["deletions"]} | {u["name"] for u in request["upsertions"]}
    return {"results": [{**_ERROR, "user": u} for u in sorted(users)]}


def _elect_leaders(request: Data) -> Data:
    results = [
        {
            "topic": t["topic"],
            "partition_result": [
                {"partition_id": p, "error_code": CAF, "error_message": MESSAGE}
                for p in t["partitions"]
            ],
        }
        for t in request["topic_partitions"] or ()
    ]
    return {"error_code": CAF, "replica_election_results": results}


def _alter_reassignments(request: Data) -> Data:
    responses = [
        {
            "name": t["name"],
            "partitions": [{**_ERROR, "partition_index": i} for i in _indexes(t)],
        }
        for t in request["topics"]
    ]
    return {**_ERROR, "responses": responses}


def _indexes(topic: Data) -> list[int]:
    return [p["partition_index"] for p in topic["partitions"]]


def _list_reassignments(request: Data) -> Data:
    topics = [
        {"name": t["name"], "partitions": [{"partition_index": i} for i in t["partition_indexes"]]}
        for t in request["topics"] or ()
    ]
    return {**_ERROR, "topics": topics}


def _describe_log_dirs(_: Data) -> Data:
    return {"error_code": CAF, "results": []}


def _alter_replica_log_dirs(request: Data) -> Data:
    results = [
        {
            "topic_name": t["name"],
            "partitions": [{"partition_index": p, "error_code": CAF} for p in t["partitions"]],
        }
        for move in request["dirs"]
        for t in move["topics"]
    ]
    return {"results": results}


O = Operation  # noqa: E741 - reads as a table
#: api key -> (the operation on the cluster, the answer to a request without it)
CLUSTER_OPERATIONS: Final[Mapping[int, tuple[Operation, Callable[[Data], Data]]]] = {
    29: (O.DESCRIBE, _describe_acls),
    30: (O.ALTER, _create_acls),
    31: (O.ALTER, _delete_acls),
    34: (O.ALTER, _alter_replica_log_dirs),
    35: (O.DESCRIBE, _describe_log_dirs),
    43: (O.ALTER, _elect_leaders),
    45: (O.ALTER, _alter_reassignments),
    46: (O.DESCRIBE, _list_reassignments),
    48: (O.DESCRIBE_CONFIGS, _describe_client_quotas),
    49: (O.ALTER_CONFIGS, _alter_client_quotas),
    50: (O.DESCRIBE, _describe_scram),
    51: (O.ALTER, _alter_scram),
}


def _cluster_check(operation: Operation, refused: Callable[[Data], Data]) -> Check:
    def check(caller: Caller, request: Any) -> Verdict | None:
        if caller.may_cluster(operation):
            return None
        return answer(refused(entity_to_data(request)))

    return check


CHECKS: Final[Mapping[int, Check]] = {
    key: _cluster_check(operation, refused)
    for key, (operation, refused) in CLUSTER_OPERATIONS.items()
}
