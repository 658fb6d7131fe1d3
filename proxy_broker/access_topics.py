"""ACL checks of the topic and config APIs a zone proxy relays, as Kafka 4.x makes them
(KafkaApis, ControllerApis, ConfigHelper, DescribeTopicPartitionsRequestHandler):

- Metadata: DESCRIBE on each topic. An all-topics answer leaves out the others (not
  audited); a named one is answered TOPIC_AUTHORIZATION_FAILED without being relayed (by id:
  without its name). A missing topic is auto-created only with CREATE on the cluster or on
  it (else TOPIC_AUTHORIZATION_FAILED, and a v4+ request loses allow_auto_topic_creation).
  `topic_authorized_operations` and `cluster_authorized_operations` (v8-10; 0 without
  DESCRIBE on the cluster) when asked for.
- DescribeTopicPartitions: the same filter; `topic_authorized_operations` always.
- DescribeCluster: open; `cluster_authorized_operations` when asked for (0 without
  DESCRIBE on the cluster).
- ListOffsets: DESCRIBE per topic. CreateTopics: CREATE on the cluster or on each topic;
  a created topic's configs only with DESCRIBE_CONFIGS on it (else topic_config_error_code).
  DeleteTopics: DESCRIBE and DELETE per topic (or DELETE on the cluster). CreatePartitions:
  ALTER per topic. DeleteRecords: DELETE per topic. DescribeProducers: READ per topic.
- DescribeConfigs (DESCRIBE_CONFIGS), AlterConfigs and IncrementalAlterConfigs
  (ALTER_CONFIGS): per resource, on the topic, the group, or the cluster for a broker, a
  broker logger or client metrics (and, failing closed, a type Kafka does not know).

A denied topic is answered per topic or partition in the proxy and the rest relayed
(access_verdict.py); duplicated names go to the main as they came, which refuses them.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

from kafka_wire.acl import CLUSTER_NAME, Operation, ResourceType
from kafka_wire.codec import entity_to_data
from kafka_wire.errors import ErrorCode
from proxy_broker.access_verdict import (
    CAF,
    GAF,
    MESSAGES,
    TAF,
    Caller,
    Check,
    Data,
    NotAuthorized,
    Verdict,
    answer,
    partition_errors,
    relay,
    relay_part,
    split_topics,
)

__all__ = ["CHECKS"]

O = Operation  # noqa: E741 - reads as a table
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
NOT_CREATED: Final = "Authorization failed."  # ControllerApis.createTopics' message


def _named_by_id(topic: Data) -> bool:
    topic_id = topic.get("topic_id")
    return not topic.get("name") and isinstance(topic_id, uuid.UUID) and topic_id.int != 0


def _topic_refused(name: str | None, topic_id: uuid.UUID | None = None) -> Data:
    # Kafka answers a topic named by id with its id and no name, by name with no id.
    return {
        "name": name,
        "topic_id": topic_id,
        "error_code": TAF,
        "is_internal": False,
        "partitions": [],
    }


def _refused_as_named(topic: Data, name: str) -> Data:
    return _topic_refused(None, topic["topic_id"]) if _named_by_id(topic) else _topic_refused(name)


def metadata(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    version = caller.version
    named = bool(data.get("topics"))
    topic_ops = version >= 8 and bool(data.get("include_topic_authorized_operations"))
    cluster_ops = 8 <= version <= 10 and bool(data.get("include_cluster_authorized_operations"))
    auto = bool(data.get("allow_auto_topic_creation", True))  # v0-3 always auto-create
    relayed: list[Data] = []
    refused: list[Data] = []
    creates_all = True
    for topic in data["topics"] if named else ():
        name = caller.topic(topic)
        if name is None:  # an id no mirror knows: the main answers it (never auto-created)
            relayed.append(topic)
        elif not caller.may(O.DESCRIBE, TOPIC, name):
            refused.append(_refused_as_named(topic, name))
        elif not auto or _named_by_id(topic) or caller.may_cluster(O.CREATE, audit=False):
            relayed.append(topic)
        elif not caller.topics.topic_exists(name) and not caller.may(O.CREATE, TOPIC, name):
            refused.append(_topic_refused(name))
        else:
            relayed.append(topic)
            creates_all = creates_all and caller.may(O.CREATE, TOPIC, name, audit=False)
    narrowed: Data | None = None
    if refused:
        if not relayed and version == 0:
            # An empty v0 list asks for every topic: nothing to relay.
            who = caller.conn.principal
            raise NotAuthorized(f"Metadata v0 naming only topics {who} may not see")
        narrowed = {**data, "topics": relayed}
    if version >= 4 and auto and named and not creates_all:
        # A topic this proxy believes exists may have gone meanwhile: not re-created.
        narrowed = {**(narrowed or data), "allow_auto_topic_creation": False}

    def complete(out: Data) -> Data:
        topics = []
        for topic in out["topics"]:
            name = topic.get("name")
            if not name:  # an unknown topic id
                topics.append(topic)
            elif caller.may(O.DESCRIBE, TOPIC, name, audit=named):
                if topic_ops:
                    topic = {**topic, "topic_authorized_operations": caller.operations(TOPIC, name)}
                topics.append(topic)
            elif named:  # named by an id the mirrors did not know yet
                topics.append(_topic_refused(None, topic.get("topic_id")))
        out = {**out, "topics": [*topics, *refused]}
        if cluster_ops:
            allowed = caller.may_cluster(O.DESCRIBE)
            out["cluster_authorized_operations"] = (
                caller.operations(CLUSTER, CLUSTER_NAME) if allowed else 0
            )
        return out

    return Verdict(request=narrowed, complete=complete)


def describe_topic_partitions(caller: Caller, request: Any) -> Verdict | None:
    named = bool(request.topics)

    def complete(out: Data) -> Data:
        topics = []
        for topic in out["topics"]:
            name = topic.get("name")
            if not name:
                topics.append(topic)
            elif caller.may(O.DESCRIBE, TOPIC, name):
                ops = caller.operations(TOPIC, name)
                topics.append({**topic, "topic_authorized_operations": ops})
            elif named:
                topics.append(_topic_refused(name))
        return {**out, "topics": topics}

    return relay(complete=complete)


def describe_cluster(caller: Caller, request: Any) -> Verdict | None:
    if not getattr(request, "include_cluster_authorized_operations", False):
        return None

    def complete(out: Data) -> Data:
        allowed = caller.may_cluster(O.DESCRIBE)
        ops = caller.operations(CLUSTER, CLUSTER_NAME) if allowed else 0
        return {**out, "cluster_authorized_operations": ops}

    return relay(complete=complete)


def _per_partition(operation: Operation, partitions: str = "partitions", **fields: Any) -> Check:
    """Topics answered per partition (ListOffsets, DeleteRecords, DescribeProducers)."""

    def check(caller: Caller, request: Any) -> Verdict | None:
        data = entity_to_data(request)
        allowed, refused = split_topics(caller, data["topics"], operation)
        answers = [partition_errors(t, code, partitions, **fields) for t, code in refused]
        return relay_part(data, allowed, answers)

    return check


def create_topics(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    counts = Counter(t["name"] for t in data["topics"])
    cluster = caller.may_cluster(O.CREATE, audit=False)
    allowed, refused = [], []
    for topic in data["topics"]:
        name = topic["name"]
        if counts[name] > 1 or cluster or caller.may(O.CREATE, TOPIC, name):
            allowed.append(topic)
        else:
            refused.append({"name": name, "error_code": TAF, "error_message": NOT_CREATED})
    hidden = {n for n in counts if not caller.may(O.DESCRIBE_CONFIGS, TOPIC, n, audit=False)}
    if not hidden:
        return relay_part(data, allowed, refused)
    if not allowed:
        return answer({"topics": refused})

    def complete(out: Data) -> Data:
        topics = [
            {
                **t,
                "configs": [],
                "num_partitions": -1,
                "replication_factor": -1,
                "topic_config_error_code": TAF,
            }
            if t["error_code"] == ErrorCode.none and t["name"] in hidden
            else t
            for t in out["topics"]
        ]
        return {**out, "topics": [*topics, *refused]}

    return Verdict(request={**data, "topics": allowed} if refused else None, complete=complete)


def _deletable(caller: Caller, name: str) -> tuple[bool, bool]:
    """(describable, deletable) as Kafka's ControllerApis.deleteTopics: both asked."""
    described = caller.may(O.DESCRIBE, TOPIC, name)
    return described, caller.may(O.DELETE, TOPIC, name) and described


def delete_topics(caller: Caller, request: Any) -> Verdict | None:
    if caller.may_cluster(O.DELETE, audit=False):
        return None
    data = entity_to_data(request)
    message = MESSAGES[TAF]
    if caller.version < 6:
        names = data["topic_names"]
        denied = [n for n in dict.fromkeys(names) if not _deletable(caller, n)[1]]
        refused = [{"name": n, "error_code": TAF, "error_message": message} for n in denied]
        kept = [n for n in names if n not in set(denied)]
        return relay_part(data, kept, refused, field="topic_names", results="responses")
    relayed: list[Data] = []
    refused = []
    for topic in data["topics"]:
        name, topic_id = topic.get("name"), topic.get("topic_id")
        by_id = isinstance(topic_id, uuid.UUID) and topic_id.int != 0
        if (name is not None) == by_id:  # neither or both: the main refuses it, deletes nothing
            relayed.append(topic)
            continue
        if by_id:
            name = caller.topics.topic_name(topic_id)
            if name is None:  # never relayed unchecked
                unknown = ErrorCode.unknown_topic_id
                refused.append({"name": None, "topic_id": topic_id, "error_code": unknown})
                continue
        described, deletable = _deletable(caller, name)
        if deletable:
            relayed.append(topic)
        else:
            refused.append(
                {
                    "name": name if described or not by_id else None,  # an id hides a name
                    "topic_id": topic_id if by_id else None,
                    "error_code": TAF,
                    "error_message": message,
                }
            )
    return relay_part(data, relayed, refused, results="responses")


def create_partitions(caller: Caller, request: Any) -> Verdict | None:
    data = entity_to_data(request)
    counts = Counter(t["name"] for t in data["topics"])
    allowed, refused = [], []
    for topic in data["topics"]:
        name = topic["name"]
        if counts[name] > 1 or caller.may(O.ALTER, TOPIC, name):
            allowed.append(topic)
        else:
            refused.append({"name": name, "error_code": TAF, "error_message": None})
    return relay_part(data, allowed, refused, results="results")


def _config_resource(resource: Data) -> tuple[ResourceType, str, ErrorCode]:
    """The ACL resource of a config resource: topic (2), group (32), else the cluster
    (broker 4, broker logger 8, client metrics 16, and any other type: fail closed)."""
    kind, name = resource["resource_type"], resource["resource_name"]
    if kind == 2:
        return TOPIC, name, TAF
    if kind == 32:
        return GROUP, name, GAF
    return CLUSTER, CLUSTER_NAME, CAF


def _configs(operation: Operation, results: str, **empty: Any) -> Check:
    def check(caller: Caller, request: Any) -> Verdict | None:
        data = entity_to_data(request)
        allowed, refused = [], []
        for resource in data["resources"]:
            rtype, name, code = _config_resource(resource)
            if caller.may(operation, rtype, name):
                allowed.append(resource)
            else:
                refused.append(
                    {
                        "error_code": code,
                        "error_message": MESSAGES[code],
                        "resource_type": resource["resource_type"],
                        "resource_name": resource["resource_name"],
                        **empty,
                    }
                )
        return relay_part(data, allowed, refused, field="resources", results=results)

    return check


CHECKS: Final[Mapping[int, Check]] = {
    2: _per_partition(O.DESCRIBE),
    3: metadata,
    19: create_topics,
    20: delete_topics,
    21: _per_partition(O.DELETE, low_watermark=-1),
    32: _configs(O.DESCRIBE_CONFIGS, "results", configs=[]),
    33: _configs(O.ALTER_CONFIGS, "responses"),
    37: create_partitions,
    44: _configs(O.ALTER_CONFIGS, "responses"),
    60: describe_cluster,
    61: _per_partition(O.READ, "partition_indexes", error_message=MESSAGES[TAF]),
    75: describe_topic_partitions,
}
