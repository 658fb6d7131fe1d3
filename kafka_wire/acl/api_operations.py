"""Which ACL checks each Kafka API needs, as Kafka 4.x's KafkaApis (and ControllerApis, for the
controller and inter-broker APIs) makes them: a data table and its lookups, no decoding.

Each API key maps to an `ApiAcl` whose `checks` a handler applies in order. A `Check` passes
when any of its `Rule`s is allowed (Kafka's "CREATE on the cluster, else CREATE on each topic"),
applies only `when` its condition holds, and on denial does `on_deny` with `error` (by default
the code of the last rule's resource type: `denial_error`). A rule names a resource type, an
operation, and where the resource names come from (`NameFrom`): the request's fields, the
answer being built (filters), or the cluster. An entry with no checks is an explicit "no ACL
check" (ApiVersions and SASL run before a principal is known; telemetry has none in Kafka).

Kafka facts worth keeping in mind (they differ from older write-ups):
- Since Kafka 3.0 (KIP-679) Produce has no IDEMPOTENT_WRITE check; an idempotent producer's
  InitProducerId needs IDEMPOTENT_WRITE on the cluster or WRITE on any topic.
- OffsetFetch needs DESCRIBE on the group (READ implies it), OffsetCommit READ.
- DescribeCluster and Metadata answer without a cluster check; DESCRIBE on the cluster only
  gates the cluster's authorized-operations field (0 when denied).
- A follower Fetch without CLUSTER_ACTION gets TOPIC_AUTHORIZATION_FAILED per partition.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from kafka_wire.acl.rules import Operation, ResourceType
from kafka_wire.errors import ErrorCode

__all__ = [
    "API_ACLS",
    "DENIAL_ERRORS",
    "ApiAcl",
    "Check",
    "NameFrom",
    "OnDeny",
    "Rule",
    "When",
    "checks_for",
    "denial_error",
]


class NameFrom(enum.Enum):
    """Where a rule's resource names come from."""

    CLUSTER = "cluster"  # the one cluster resource, rules.CLUSTER_NAME
    TOPICS = "topics"  # each topic the request names (by name, or by id resolved to one)
    GROUP_ID = "group_id"  # the request's one group id
    GROUP_IDS = "group_ids"  # each group the request names
    TRANSACTIONAL_ID = "transactional_id"  # the request's one transactional id
    TRANSACTIONAL_IDS = "transactional_ids"  # each transactional id the request names
    COORDINATOR_KEYS = "coordinator_keys"  # FindCoordinator's keys; key_type picks the type
    CONFIG_RESOURCES = "config_resources"  # each config resource; its type picks the type
    TOKEN_OWNER = "token_owner"  # CreateDelegationToken's owner principal (a USER resource)
    LISTED_TOPICS = "listed_topics"  # each topic the answer would list (all-topics requests)
    LISTED_GROUPS = "listed_groups"  # each group the answer would list
    LISTED_TRANSACTIONAL_IDS = "listed_transactional_ids"  # each id the answer would list
    LISTED_TOKENS = "listed_tokens"  # each delegation token id the answer would list
    LISTED_TOKEN_OWNERS = "listed_token_owners"  # the owner of each such token (USER)
    ANY_OF_TYPE = "any_of_type"  # any resource of the type (Authorizer.authorize_any)


class When(enum.Enum):
    """The condition under which a check applies."""

    ALWAYS = "always"
    TRANSACTIONAL = "transactional"  # a transactional id is set (Produce: transactional records)
    NOT_TRANSACTIONAL = "not_transactional"  # no transactional id (an idempotent producer)
    TWO_PHASE_COMMIT = "two_phase_commit"  # InitProducerId with enable_2pc (KIP-939)
    FROM_BROKER = "from_broker"  # a follower (replica_id >= 0); AddPartitionsToTxn v4+
    FROM_CLIENT = "from_client"  # a consumer (replica_id < 0); AddPartitionsToTxn v0-3
    AUTO_CREATE = "auto_create"  # topics missing and the request lets the broker create them
    OPERATIONS_REQUESTED = "operations_requested"  # include_cluster_authorized_operations
    CONFIGS_RETURNED = "configs_returned"  # CreateTopics answers with the new topics' configs
    KEY_GROUP = "key_group"  # FindCoordinator key_type 0
    KEY_TRANSACTION = "key_transaction"  # key_type 1
    KEY_SHARE = "key_share"  # key_type 2 ("group:topicId:partition")
    CONFIG_TOPIC = "config_topic"  # config resource type 2
    CONFIG_BROKER = "config_broker"  # config resource type 4 (BROKER) or 8 (BROKER_LOGGER)
    CONFIG_CLIENT_METRICS = "config_client_metrics"  # config resource type 16
    CONFIG_GROUP = "config_group"  # config resource type 32
    OWNER_GIVEN = "owner_given"  # CreateDelegationToken for another owner


class OnDeny(enum.Enum):
    """What a denial does to the answer."""

    FAIL_REQUEST = "fail_request"  # the whole request gets the error
    FAIL_RESOURCE = "fail_resource"  # that resource (topic, partition, group, id) gets it
    FILTER = "filter"  # the resource is left out of the answer, without an error
    NO_OPERATIONS = "no_operations"  # the authorized-operations field is 0


@dataclass(frozen=True, slots=True)
class Rule:
    resource_type: ResourceType
    operation: Operation
    name_from: NameFrom


#: The error a denial on a resource of each type returns, as Kafka's KafkaApis answers.
DENIAL_ERRORS: Final[Mapping[ResourceType, ErrorCode]] = MappingProxyType(
    {
        ResourceType.TOPIC: ErrorCode.topic_authorization_failed,
        ResourceType.GROUP: ErrorCode.group_authorization_failed,
        ResourceType.CLUSTER: ErrorCode.cluster_authorization_failed,
        ResourceType.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
        ResourceType.DELEGATION_TOKEN: ErrorCode.delegation_token_authorization_failed,
        ResourceType.USER: ErrorCode.delegation_token_authorization_failed,
    }
)


def denial_error(resource_type: ResourceType) -> ErrorCode:
    """The *_AUTHORIZATION_FAILED code for a denial on a resource of this type."""
    return DENIAL_ERRORS[resource_type]


@dataclass(frozen=True, slots=True)
class Check:
    any_of: tuple[Rule, ...]  # passes when any rule allows, tried in order
    when: When = When.ALWAYS
    on_deny: OnDeny = OnDeny.FAIL_RESOURCE
    error_override: ErrorCode | None = None

    @property
    def error(self) -> ErrorCode:
        """The code a denial returns: the override, else that of the last rule's type."""
        if self.error_override is not None:
            return self.error_override
        return denial_error(self.any_of[-1].resource_type)


@dataclass(frozen=True, slots=True)
class ApiAcl:
    api_key: int
    name: str  # kio's name of the API
    checks: tuple[Check, ...]  # empty: no ACL check
    note: str = ""


# -- building blocks ------------------------------------------------------------------------

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
X, DT, U = ResourceType.TRANSACTIONAL_ID, ResourceType.DELEGATION_TOKEN, ResourceType.USER
O = Operation  # noqa: E741 - reads as a table
REQ, RES, FILTER, NO_OPS = (
    OnDeny.FAIL_REQUEST,
    OnDeny.FAIL_RESOURCE,
    OnDeny.FILTER,
    OnDeny.NO_OPERATIONS,
)


def _check(
    resource_type: ResourceType,
    operation: Operation,
    name_from: NameFrom,
    on_deny: OnDeny,
    when: When = When.ALWAYS,
    error: ErrorCode | None = None,
) -> Check:
    return Check((Rule(resource_type, operation, name_from),), when, on_deny, error)


def _cluster(operation: Operation, on_deny: OnDeny = REQ, when: When = When.ALWAYS) -> Check:
    return _check(C, operation, NameFrom.CLUSTER, on_deny, when)


def _config_checks(operation: Operation) -> tuple[Check, ...]:
    # DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: per resource, by its type.
    src = NameFrom.CONFIG_RESOURCES
    return (
        _check(T, operation, src, RES, When.CONFIG_TOPIC),
        _check(C, operation, src, RES, When.CONFIG_BROKER),
        _check(C, operation, src, RES, When.CONFIG_CLIENT_METRICS),
        _check(G, operation, src, RES, When.CONFIG_GROUP),
    )


_CREATE_TOPIC = Check(
    (Rule(C, O.CREATE, NameFrom.CLUSTER), Rule(T, O.CREATE, NameFrom.TOPICS)), on_deny=RES
)
_TOPICS = NameFrom.TOPICS
_LISTED = NameFrom.LISTED_TOPICS
_GROUP = NameFrom.GROUP_ID
_TXN = NameFrom.TRANSACTIONAL_ID

_ENTRIES: tuple[ApiAcl, ...] = (
    ApiAcl(
        0,
        "produce",
        (
            _check(X, O.WRITE, _TXN, REQ, When.TRANSACTIONAL),
            _check(T, O.WRITE, _TOPICS, RES),
        ),
        "No IDEMPOTENT_WRITE check since Kafka 3.0 (KIP-679): InitProducerId makes it.",
    ),
    ApiAcl(
        1,
        "fetch",
        (
            _check(
                C,
                O.CLUSTER_ACTION,
                NameFrom.CLUSTER,
                RES,
                When.FROM_BROKER,
                ErrorCode.topic_authorization_failed,
            ),
            _check(T, O.READ, _TOPICS, RES, When.FROM_CLIENT),
        ),
        "A follower without CLUSTER_ACTION gets TOPIC_AUTHORIZATION_FAILED per partition.",
    ),
    ApiAcl(2, "list_offsets", (_check(T, O.DESCRIBE, _TOPICS, RES),)),
    ApiAcl(
        3,
        "metadata",
        (
            _check(T, O.DESCRIBE, _TOPICS, RES),
            _check(T, O.DESCRIBE, _LISTED, FILTER),
            Check(_CREATE_TOPIC.any_of, When.AUTO_CREATE, RES),
            _cluster(O.DESCRIBE, NO_OPS, When.OPERATIONS_REQUESTED),
        ),
        "Named topics not described get TOPIC_AUTHORIZATION_FAILED; an all-topics request "
        "lists only the described ones. Topic authorized operations come from "
        "Authorizer.authorized_operations.",
    ),
    # 4-7 (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) are ZooKeeper-era
    # and unknown to kio.
    ApiAcl(
        8,
        "offset_commit",
        (_check(G, O.READ, _GROUP, REQ), _check(T, O.READ, _TOPICS, RES)),
    ),
    ApiAcl(
        9,
        "offset_fetch",
        (
            _check(G, O.DESCRIBE, NameFrom.GROUP_IDS, RES),
            _check(T, O.DESCRIBE, _TOPICS, RES),
            _check(T, O.DESCRIBE, _LISTED, FILTER),
        ),
        "v0-7 name one group (its error is the request's); v8+ several, each with its own.",
    ),
    ApiAcl(
        10,
        "find_coordinator",
        (
            _check(G, O.DESCRIBE, NameFrom.COORDINATOR_KEYS, RES, When.KEY_GROUP),
            _check(X, O.DESCRIBE, NameFrom.COORDINATOR_KEYS, RES, When.KEY_TRANSACTION),
            _check(C, O.CLUSTER_ACTION, NameFrom.CLUSTER, RES, When.KEY_SHARE),
        ),
    ),
    ApiAcl(11, "join_group", (_check(G, O.READ, _GROUP, REQ),)),
    ApiAcl(12, "heartbeat", (_check(G, O.READ, _GROUP, REQ),)),
    ApiAcl(13, "leave_group", (_check(G, O.READ, _GROUP, REQ),)),
    ApiAcl(14, "sync_group", (_check(G, O.READ, _GROUP, REQ),)),
    ApiAcl(15, "describe_groups", (_check(G, O.DESCRIBE, NameFrom.GROUP_IDS, RES),)),
    ApiAcl(
        16,
        "list_groups",
        (
            Check(
                (
                    Rule(C, O.DESCRIBE, NameFrom.CLUSTER),
                    Rule(G, O.DESCRIBE, NameFrom.LISTED_GROUPS),
                ),
                on_deny=FILTER,
            ),
        ),
        "DESCRIBE on the cluster lists every group; without it, the groups it may DESCRIBE.",
    ),
    ApiAcl(17, "sasl_handshake", ()),
    ApiAcl(18, "api_versions", ()),
    ApiAcl(
        19,
        "create_topics",
        (_CREATE_TOPIC, _check(T, O.DESCRIBE_CONFIGS, _TOPICS, RES, When.CONFIGS_RETURNED)),
        "Without DESCRIBE_CONFIGS a created topic's configs carry TOPIC_AUTHORIZATION_FAILED "
        "in topic_config_error_code.",
    ),
    ApiAcl(
        20,
        "delete_topics",
        (_check(T, O.DELETE, _TOPICS, RES),),
        "A topic named by id that may not be described answers as an unknown topic id.",
    ),
    ApiAcl(21, "delete_records", (_check(T, O.DELETE, _TOPICS, RES),)),
    ApiAcl(
        22,
        "init_producer_id",
        (
            _check(X, O.WRITE, _TXN, REQ, When.TRANSACTIONAL),
            _check(X, O.TWO_PHASE_COMMIT, _TXN, REQ, When.TWO_PHASE_COMMIT),
            Check(
                (
                    Rule(C, O.IDEMPOTENT_WRITE, NameFrom.CLUSTER),
                    Rule(T, O.WRITE, NameFrom.ANY_OF_TYPE),
                ),
                When.NOT_TRANSACTIONAL,
                REQ,
                ErrorCode.cluster_authorization_failed,
            ),
        ),
    ),
    ApiAcl(
        23,
        "offset_for_leader_epoch",
        (
            _cluster(O.CLUSTER_ACTION, REQ, When.FROM_BROKER),
            _check(T, O.DESCRIBE, _TOPICS, RES),
        ),
    ),
    ApiAcl(
        24,
        "add_partitions_to_txn",
        (
            _check(X, O.WRITE, NameFrom.TRANSACTIONAL_IDS, REQ, When.FROM_CLIENT),
            _cluster(O.CLUSTER_ACTION, REQ, When.FROM_BROKER),
            _check(T, O.WRITE, _TOPICS, RES),
        ),
        "v0-3 come from producers; v4+ from brokers verifying transactions.",
    ),
    ApiAcl(
        25,
        "add_offsets_to_txn",
        (_check(X, O.WRITE, _TXN, REQ), _check(G, O.READ, _GROUP, REQ)),
    ),
    ApiAcl(26, "end_txn", (_check(X, O.WRITE, _TXN, REQ),)),
    ApiAcl(27, "write_txn_markers", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(
        28,
        "txn_offset_commit",
        (
            _check(X, O.WRITE, _TXN, REQ),
            _check(G, O.READ, _GROUP, REQ),
            _check(T, O.READ, _TOPICS, RES),
        ),
    ),
    ApiAcl(29, "describe_acls", (_cluster(O.DESCRIBE),)),
    ApiAcl(30, "create_acls", (_cluster(O.ALTER),)),
    ApiAcl(31, "delete_acls", (_cluster(O.ALTER),)),
    ApiAcl(32, "describe_configs", _config_checks(O.DESCRIBE_CONFIGS)),
    ApiAcl(33, "alter_configs", _config_checks(O.ALTER_CONFIGS)),
    ApiAcl(34, "alter_replica_log_dirs", (_cluster(O.ALTER, RES),), "Per partition."),
    ApiAcl(35, "describe_log_dirs", (_cluster(O.DESCRIBE),)),
    ApiAcl(36, "sasl_authenticate", ()),
    ApiAcl(37, "create_partitions", (_check(T, O.ALTER, _TOPICS, RES),)),
    ApiAcl(
        38,
        "create_delegation_token",
        (_check(U, O.CREATE_TOKENS, NameFrom.TOKEN_OWNER, REQ, When.OWNER_GIVEN),),
        "Tokens need a SASL (not token) authenticated principal; that is not an ACL check.",
    ),
    ApiAcl(
        39,
        "renew_delegation_token",
        (),
        "No ACL: the token's owner or one of its renewers may renew it.",
    ),
    ApiAcl(
        40,
        "expire_delegation_token",
        (),
        "No ACL: the token's owner or one of its renewers may expire it.",
    ),
    ApiAcl(
        41,
        "describe_delegation_token",
        (
            Check(
                (
                    Rule(DT, O.DESCRIBE, NameFrom.LISTED_TOKENS),
                    Rule(U, O.DESCRIBE_TOKENS, NameFrom.LISTED_TOKEN_OWNERS),
                ),
                on_deny=FILTER,
            ),
        ),
        "A token's owner and renewers see it without an ACL.",
    ),
    ApiAcl(42, "delete_groups", (_check(G, O.DELETE, NameFrom.GROUP_IDS, RES),)),
    ApiAcl(43, "elect_leaders", (_cluster(O.ALTER),)),
    ApiAcl(44, "incremental_alter_configs", _config_checks(O.ALTER_CONFIGS)),
    ApiAcl(45, "alter_partition_reassignments", (_cluster(O.ALTER),)),
    ApiAcl(46, "list_partition_reassignments", (_cluster(O.DESCRIBE),)),
    ApiAcl(
        47,
        "offset_delete",
        (_check(G, O.DELETE, _GROUP, REQ), _check(T, O.READ, _TOPICS, RES)),
    ),
    ApiAcl(48, "describe_client_quotas", (_cluster(O.DESCRIBE_CONFIGS),)),
    ApiAcl(49, "alter_client_quotas", (_cluster(O.ALTER_CONFIGS),)),
    ApiAcl(50, "describe_user_scram_credentials", (_cluster(O.DESCRIBE),)),
    ApiAcl(51, "alter_user_scram_credentials", (_cluster(O.ALTER),)),
    ApiAcl(52, "vote", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(53, "begin_quorum_epoch", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(54, "end_quorum_epoch", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(55, "describe_quorum", (_cluster(O.DESCRIBE),)),
    ApiAcl(56, "alter_partition", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(57, "update_features", (_cluster(O.ALTER),)),
    ApiAcl(58, "envelope", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(59, "fetch_snapshot", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(
        60,
        "describe_cluster",
        (_cluster(O.DESCRIBE, NO_OPS, When.OPERATIONS_REQUESTED),),
        "Answered to anyone; DESCRIBE on the cluster only gates cluster_authorized_operations.",
    ),
    ApiAcl(61, "describe_producers", (_check(T, O.READ, _TOPICS, RES),)),
    ApiAcl(62, "broker_registration", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(63, "broker_heartbeat", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(64, "unregister_broker", (_cluster(O.ALTER),)),
    ApiAcl(
        65,
        "describe_transactions",
        (
            _check(X, O.DESCRIBE, NameFrom.TRANSACTIONAL_IDS, RES),
            _check(T, O.DESCRIBE, _LISTED, FILTER),
        ),
        "A described transaction lists only the topics the principal may describe.",
    ),
    ApiAcl(
        66,
        "list_transactions",
        (_check(X, O.DESCRIBE, NameFrom.LISTED_TRANSACTIONAL_IDS, FILTER),),
    ),
    ApiAcl(67, "allocate_producer_ids", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(
        68,
        "consumer_group_heartbeat",
        (
            _check(G, O.READ, _GROUP, REQ),
            _check(T, O.DESCRIBE, _TOPICS, REQ),
            _check(T, O.DESCRIBE, _LISTED, FILTER),
        ),
        "Subscribed topic names need DESCRIBE (else the request fails with "
        "TOPIC_AUTHORIZATION_FAILED); a regex subscription matches only described topics.",
    ),
    ApiAcl(
        69,
        "consumer_group_describe",
        (
            _check(G, O.DESCRIBE, NameFrom.GROUP_IDS, RES),
            _check(T, O.DESCRIBE, _LISTED, RES),
        ),
        "A group whose assignments name a topic the principal may not describe fails with "
        "TOPIC_AUTHORIZATION_FAILED.",
    ),
    ApiAcl(70, "controller_registration", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(71, "get_telemetry_subscriptions", ()),
    ApiAcl(72, "push_telemetry", ()),
    ApiAcl(73, "assign_replicas_to_dirs", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(74, "list_config_resources", (_cluster(O.DESCRIBE_CONFIGS),)),
    ApiAcl(
        75,
        "describe_topic_partitions",
        (_check(T, O.DESCRIBE, _TOPICS, RES), _check(T, O.DESCRIBE, _LISTED, FILTER)),
    ),
    ApiAcl(
        76,
        "share_group_heartbeat",
        (_check(G, O.READ, _GROUP, REQ), _check(T, O.DESCRIBE, _TOPICS, REQ)),
    ),
    ApiAcl(
        77,
        "share_group_describe",
        (
            _check(G, O.DESCRIBE, NameFrom.GROUP_IDS, RES),
            _check(T, O.DESCRIBE, _LISTED, RES),
        ),
    ),
    ApiAcl(78, "share_fetch", (_check(G, O.READ, _GROUP, REQ), _check(T, O.READ, _TOPICS, RES))),
    ApiAcl(
        79,
        "share_acknowledge",
        (_check(G, O.READ, _GROUP, REQ), _check(T, O.READ, _TOPICS, RES)),
    ),
    ApiAcl(80, "add_raft_voter", (_cluster(O.ALTER),)),
    ApiAcl(81, "remove_raft_voter", (_cluster(O.ALTER),)),
    ApiAcl(82, "update_raft_voter", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(83, "initialize_share_group_state", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(84, "read_share_group_state", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(85, "write_share_group_state", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(86, "delete_share_group_state", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(87, "read_share_group_state_summary", (_cluster(O.CLUSTER_ACTION),)),
    ApiAcl(
        88,
        "streams_group_heartbeat",
        (
            _check(G, O.READ, _GROUP, REQ),
            _check(T, O.DESCRIBE, _TOPICS, REQ),
            Check(_CREATE_TOPIC.any_of, When.AUTO_CREATE, RES),
        ),
        "TOPICS: the topology's source, repartition and changelog topics; AUTO_CREATE: the "
        "internal topics the group coordinator would create (a missing CREATE is reported "
        "in the answer's status, not as the request's error).",
    ),
    ApiAcl(
        89,
        "streams_group_describe",
        (
            _check(G, O.DESCRIBE, NameFrom.GROUP_IDS, RES),
            _check(T, O.DESCRIBE, _LISTED, RES),
        ),
    ),
    ApiAcl(
        90,
        "describe_share_group_offsets",
        (
            _check(G, O.DESCRIBE, NameFrom.GROUP_IDS, RES),
            _check(T, O.DESCRIBE, _TOPICS, RES),
            _check(T, O.DESCRIBE, _LISTED, FILTER),
        ),
    ),
    ApiAcl(
        91,
        "alter_share_group_offsets",
        (_check(G, O.READ, _GROUP, REQ), _check(T, O.READ, _TOPICS, RES)),
    ),
    ApiAcl(
        92,
        "delete_share_group_offsets",
        (_check(G, O.DELETE, _GROUP, REQ), _check(T, O.READ, _TOPICS, RES)),
    ),
)

#: The ACL checks of each API key, as KafkaApis / ControllerApis make them.
API_ACLS: Final[Mapping[int, ApiAcl]] = MappingProxyType({e.api_key: e for e in _ENTRIES})


def checks_for(api_key: int) -> tuple[Check, ...]:
    """The checks a request of this API key needs, in order; () when it needs none. An API
    key outside the table raises KeyError: nothing says what it may do, so refuse it."""
    return API_ACLS[api_key].checks
