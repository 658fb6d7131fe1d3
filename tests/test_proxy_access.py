"""The zone proxy's ACL decisions on relayed requests (proxy_broker/access*.py), without I/O.

Each request is built and decoded as the wire carries it; a verdict's local answer, relayed
part and completed answer are encoded and decoded again, so every shape is one Kafka's
schema takes at that version.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kafka_wire.acl import API_ACLS, AclBinding, NameFrom, OnDeny, ResourceType
from kafka_wire.codec import (
    RequestHeader,
    build_request,
    build_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    entity_to_data,
    parse_request_header,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.security_docs import AclsDoc
from kafka_wire.server_loop import ConnectionIdentity, ConnectionInfo
from main_broker.broker import SUPPORTED_APIS
from proxy_broker.access import CHECKS, OPEN_APIS, AclSettings, NotAuthorized, ProxyAccess
from proxy_broker.access_cluster import CLUSTER_OPERATIONS
from proxy_broker.access_verdict import Verdict

TOPIC, GROUP, CLUSTER, TXN = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 2, 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
DENY, ALLOW = 2, 3
TAF, GAF = ErrorCode.topic_authorization_failed, ErrorCode.group_authorization_failed
CAF = ErrorCode.cluster_authorization_failed
TIAF = ErrorCode.transactional_id_authorization_failed
NONE = ErrorCode.none
OMITTED = -(2**31)
# Kafka's bits: READ WRITE CREATE DELETE ALTER DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS
TOPIC_OPS_ALL = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))


def access(*bindings: AclBinding, synced: bool = True) -> ProxyAccess:
    a = ProxyAccess(AclSettings(True, frozenset({"User:admin"})))
    if synced:
        a.update(AclsDoc(1, frozenset(bindings)))
    return a


def conn(principal: str) -> ConnectionInfo:
    return ConnectionInfo("10.0.0.1", 5000, 9092, "SASL", ConnectionIdentity(principal))


def alice(rtype: int, name: str, op: int, perm: int = ALLOW, pattern: int = LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, "User:alice", "*", op, perm)


class Topics:
    """The mirrors' topics, as relay.py gives them to the checks."""

    def __init__(self, **ids: uuid.UUID) -> None:
        self.ids = {v: k for k, v in ids.items()}

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self.ids.get(topic_id)

    def topic_exists(self, name: str) -> bool:
        return name in self.ids.values()


def verdict(
    a: ProxyAccess,
    who: str,
    key: int,
    version: int,
    data: dict[str, Any],
    topics: Topics | None = None,
) -> Verdict | None:
    frame = encode_request(key, version, 9, "c", build_request(key, version, data))
    header = parse_request_header(frame)
    return a.check_relayed(header, decode_request(header, bytearray(frame)), conn(who), topics)


def wire(key: int, version: int, data: dict[str, Any]) -> Any:
    """The response entity `data` makes, through its encoding."""
    header = RequestHeader(key, version, 9, "c", 0)
    frame = encode_response(header, build_response(key, version, data))
    return decode_response(key, version, frame)[1]


def answered(v: Verdict | None, key: int, version: int) -> Any:
    assert v is not None and v.answer is not None, v
    return wire(key, version, v.answer)


def relayed_part(v: Verdict | None, key: int, version: int) -> Any:
    assert v is not None and v.request is not None, v
    return build_request(key, version, v.request)


def completed(v: Verdict | None, key: int, version: int, main: dict[str, Any]) -> Any:
    """The client's answer from the main's (`main` as a response dict)."""
    assert v is not None and v.answer is None and v.complete is not None, v
    return wire(key, version, v.complete(entity_to_data(build_response(key, version, main))))


def by_name(entries: Any, field: str = "name") -> dict[Any, Any]:
    return {getattr(e, field): e for e in entries}


# -- coverage ----------------------------------------------------------------------------------


def test_every_api_a_main_serves_is_checked_or_open() -> None:
    served_by_the_proxy = {0, 1, 23}  # Produce, Fetch, OffsetForLeaderEpoch: broker.py
    unchecked = set(SUPPORTED_APIS) - set(CHECKS) - OPEN_APIS - served_by_the_proxy
    assert unchecked == set()


def test_cluster_checks_are_kafkas() -> None:
    for key, (operation, _) in CLUSTER_OPERATIONS.items():
        rules = [r for c in API_ACLS[key].checks for r in c.any_of]
        assert rules and all(r.name_from is NameFrom.CLUSTER for r in rules), key
        assert rules[0].operation == operation, key
        assert rules[0].resource_type == ResourceType.CLUSTER
    # And the per-resource ones answer per resource, as the table says.
    assert API_ACLS[20].checks[0].on_deny is OnDeny.FAIL_RESOURCE


def test_an_unknown_api_is_for_super_users_and_nobody_before_the_first_read() -> None:
    header = RequestHeader(57, 1, 9, "c", 0)  # UpdateFeatures: not checked here
    with pytest.raises(NotAuthorized):
        access(alice(CLUSTER, "kafka-cluster", ALL)).check_known(header, conn("User:alice"))
    access().check_known(header, conn("User:admin"))
    # Before the ACL document was read, a non-super user is denied even an open-looking op.
    early = access(alice(GROUP, "g", READ), synced=False)
    hb = {"group_id": "g", "generation_id": 1, "member_id": "m"}
    assert answered(verdict(early, "User:alice", 12, 4, hb), 12, 4).error_code == GAF
    # An authorizer that is off decides nothing.
    off = ProxyAccess(AclSettings(False))
    assert verdict(off, "User:bob", 12, 4, hb) is None


# -- groups ------------------------------------------------------------------------------------


def test_group_apis_need_read_on_the_group() -> None:
    a = access(alice(GROUP, "g", READ))
    join = {"group_id": "g", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
            "member_id": "", "protocol_type": "consumer", "protocols": []}  # fmt: skip
    assert verdict(a, "User:alice", 11, 9, join) is None
    denied = verdict(a, "User:alice", 11, 9, {**join, "group_id": "other"})
    assert answered(denied, 11, 9).error_code == GAF
    # READ implies DESCRIBE: FindCoordinator for the group passes, for another one fails,
    # and a request with both relays the allowed key only.
    assert verdict(a, "User:alice", 10, 4, {"key_type": 0, "coordinator_keys": ["g"]}) is None
    found = answered(
        verdict(a, "User:alice", 10, 4, {"key_type": 0, "coordinator_keys": ["h"]}), 10, 4
    )
    assert found.coordinators[0].error_code == GAF
    both = verdict(a, "User:alice", 10, 4, {"key_type": 0, "coordinator_keys": ["g", "h"]})
    assert relayed_part(both, 10, 4).coordinator_keys == ("g",)
    main = {"coordinators": [{"key": "g", "node_id": 1, "host": "h", "port": 1}]}
    out = by_name(completed(both, 10, 4, main).coordinators, "key")
    assert (out["g"].error_code, out["h"].error_code) == (NONE, GAF)


def test_offset_commit_needs_read_on_the_group_and_each_topic() -> None:
    a = access(alice(GROUP, "g", READ), alice(TOPIC, "t", READ))
    part = {"partition_index": 0, "committed_offset": 5}
    commit = {"group_id": "g", "member_id": "m",
              "topics": [{"name": n, "partitions": [part]} for n in ("t", "u")]}  # fmt: skip
    v = verdict(a, "User:alice", 8, 9, commit)
    assert [t.name for t in relayed_part(v, 8, 9).topics] == ["t"]
    main = {"topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]}
    out = by_name(completed(v, 8, 9, main).topics)
    assert out["t"].partitions[0].error_code == NONE
    assert out["u"].partitions[0].error_code == TAF
    # No topic allowed: answered here. No group READ: every partition GROUP_AUTHORIZATION_FAILED.
    only_u = verdict(a, "User:alice", 8, 9, {**commit, "topics": commit["topics"][1:]})
    assert answered(only_u, 8, 9).topics[0].partitions[0].error_code == TAF
    no_group = answered(verdict(a, "User:alice", 8, 9, {**commit, "group_id": "h"}), 8, 9)
    assert {p.error_code for t in no_group.topics for p in t.partitions} == {GAF}
    # v10 names topics by id: resolved by the mirrors, an unknown id never relayed.
    t_id, u_id, stray = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    by_id = {
        **commit,
        "topics": [{"topic_id": i, "partitions": [part]} for i in (t_id, u_id, stray)],
    }
    v10 = verdict(a, "User:alice", 8, 10, by_id, Topics(t=t_id, u=u_id))
    assert [t.topic_id for t in relayed_part(v10, 8, 10).topics] == [t_id]
    out10 = by_name(completed(v10, 8, 10, {"topics": []}).topics, "topic_id")
    assert out10[u_id].partitions[0].error_code == TAF
    assert out10[stray].partitions[0].error_code == ErrorCode.unknown_topic_id


def test_offset_fetch_hides_topics_alice_may_not_describe() -> None:
    a = access(alice(GROUP, "g", READ), alice(TOPIC, "t", DESCRIBE))
    named = {"group_id": "g", "topics": [{"name": n, "partition_indexes": [0]} for n in "tu"]}
    v = verdict(a, "User:alice", 9, 7, named)
    assert [t.name for t in relayed_part(v, 9, 7).topics] == ["t"]
    main = {
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 7}]}]
    }
    out = by_name(completed(v, 9, 7, main).topics)
    assert out["t"].partitions[0].committed_offset == 7
    assert (out["u"].partitions[0].error_code, out["u"].partitions[0].committed_offset) == (
        TAF,
        -1,
    )
    # All its offsets: the topics it may not describe are left out.
    every = verdict(a, "User:alice", 9, 7, {"group_id": "g", "topics": None})
    listed = {"topics": [{"name": n, "partitions": [{"partition_index": 0}]} for n in "tu"]}
    assert [t.name for t in completed(every, 9, 7, listed).topics] == ["t"]
    # Without DESCRIBE on the group: GROUP_AUTHORIZATION_FAILED (v1: in each partition).
    assert (
        answered(verdict(a, "User:alice", 9, 7, {**named, "group_id": "h"}), 9, 7).error_code == GAF
    )
    v1 = answered(verdict(a, "User:alice", 9, 1, {**named, "group_id": "h"}), 9, 1)
    assert {p.error_code for t in v1.topics for p in t.partitions} == {GAF}


def test_offset_fetch_of_several_groups_answers_each() -> None:
    a = access(alice(GROUP, "g", DESCRIBE), alice(TOPIC, "t", DESCRIBE))
    groups = [
        {"group_id": "g", "topics": [{"name": n, "partition_indexes": [0]} for n in "tu"]},
        {"group_id": "h", "topics": None},
    ]
    v = verdict(a, "User:alice", 9, 8, {"groups": groups})
    assert [g.group_id for g in relayed_part(v, 9, 8).groups] == ["g"]
    main = {
        "groups": [
            {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]}
        ]
    }
    out = by_name(completed(v, 9, 8, main).groups, "group_id")
    assert out["h"].error_code == GAF
    assert {t.name: t.partitions[0].error_code for t in out["g"].topics} == {"t": NONE, "u": TAF}
    # One group with a topic she may not describe: that topic is not asked for.
    alone = verdict(a, "User:alice", 9, 8, {"groups": groups[:1]})
    assert [t.name for t in relayed_part(alone, 9, 8).groups[0].topics] == ["t"]


def test_describe_list_and_delete_groups() -> None:
    a = access(alice(GROUP, "g", READ), alice(GROUP, "d", DELETE))
    v = verdict(
        a, "User:alice", 15, 5, {"groups": ["g", "h"], "include_authorized_operations": True}
    )
    assert relayed_part(v, 15, 5).groups == ("g",)
    out = by_name(
        completed(v, 15, 5, {"groups": [{"group_id": "g", "group_state": "Stable"}]}).groups,
        "group_id",
    )
    assert out["h"].error_code == GAF
    # READ on the group: READ and DESCRIBE (bits 3 and 8) of GROUP's READ, DESCRIBE, DELETE.
    assert out["g"].authorized_operations == (1 << READ) | (1 << DESCRIBE)
    assert out["h"].authorized_operations == OMITTED
    # ListGroups: the groups she may describe, without DESCRIBE on the cluster.
    listed = verdict(a, "User:alice", 16, 4, {})
    main = {"groups": [{"group_id": n, "protocol_type": "consumer"} for n in ("g", "d", "x")]}
    assert [g.group_id for g in completed(listed, 16, 4, main).groups] == ["g", "d"]
    wide = access(alice(CLUSTER, "kafka-cluster", DESCRIBE))
    assert verdict(wide, "User:alice", 16, 4, {}) is None
    # DeleteGroups: DELETE per group.
    deleted = verdict(a, "User:alice", 42, 2, {"groups_names": ["d", "g"]})
    assert relayed_part(deleted, 42, 2).groups_names == ("d",)
    results = by_name(
        completed(deleted, 42, 2, {"results": [{"group_id": "d"}]}).results, "group_id"
    )
    assert (results["d"].error_code, results["g"].error_code) == (NONE, GAF)


def test_offset_delete_needs_delete_on_the_group_and_read_on_each_topic() -> None:
    a = access(alice(GROUP, "g", DELETE), alice(TOPIC, "t", READ))
    request = {
        "group_id": "g",
        "topics": [{"name": n, "partitions": [{"partition_index": 0}]} for n in "tu"],
    }
    v = verdict(a, "User:alice", 47, 0, request)
    assert [t.name for t in relayed_part(v, 47, 0).topics] == ["t"]
    out = by_name(
        completed(
            v, 47, 0, {"topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]}
        ).topics
    )
    assert out["u"].partitions[0].error_code == TAF
    assert (
        answered(verdict(a, "User:alice", 47, 0, {**request, "group_id": "h"}), 47, 0).error_code
        == GAF
    )


def test_consumer_group_apis() -> None:
    a = access(alice(GROUP, "g", READ), alice(TOPIC, "t", READ))
    hb = {"group_id": "g", "member_id": "m", "member_epoch": 0, "subscribed_topic_names": ["t"]}
    assert verdict(a, "User:alice", 68, 0, hb) is None
    refused = answered(
        verdict(a, "User:alice", 68, 0, {**hb, "subscribed_topic_names": ["t", "s"]}), 68, 0
    )
    assert refused.error_code == TAF and "s" in (refused.error_message or "")
    assert (
        answered(verdict(a, "User:alice", 68, 0, {**hb, "group_id": "h"}), 68, 0).error_code == GAF
    )
    # ConsumerGroupDescribe: a group whose assignment names a topic she may not describe.
    v = verdict(
        a, "User:alice", 69, 0, {"group_ids": ["g", "h"], "include_authorized_operations": True}
    )
    assert relayed_part(v, 69, 0).group_ids == ("g",)

    def member(topic: str) -> dict[str, Any]:
        assignment = {
            "topic_partitions": [{"topic_id": uuid.uuid4(), "topic_name": topic, "partitions": [0]}]
        }
        return {"member_id": "m", "assignment": assignment, "target_assignment": assignment}

    ok = completed(v, 69, 0, {"groups": [{"group_id": "g", "members": [member("t")]}]})
    groups = by_name(ok.groups, "group_id")
    assert groups["g"].error_code == NONE and groups["h"].error_code == GAF
    assert groups["g"].authorized_operations == (1 << READ) | (1 << DESCRIBE)
    hidden = completed(v, 69, 0, {"groups": [{"group_id": "g", "members": [member("secret")]}]})
    assert (hidden.groups[0].error_code, hidden.groups[0].members) == (TAF, ())


# -- transactions ------------------------------------------------------------------------------


def test_init_producer_id_idempotent_needs_write_somewhere() -> None:
    data = {"transactional_id": None, "transaction_timeout_ms": 60000}
    assert verdict(access(alice(TOPIC, "t", WRITE)), "User:alice", 22, 4, data) is None
    refused = answered(verdict(access(), "User:alice", 22, 4, data), 22, 4)
    assert refused.error_code == CAF
    txn = verdict(
        access(alice(TOPIC, "t", WRITE)), "User:alice", 22, 4, {**data, "transactional_id": "tx"}
    )
    assert answered(txn, 22, 4).error_code == TIAF


def test_transaction_apis_need_write_on_the_transactional_id() -> None:
    a = access(alice(TXN, "tx", WRITE), alice(TOPIC, "t", WRITE), alice(TOPIC, "t", READ),
               alice(GROUP, "g", READ))  # fmt: skip
    add: dict[str, Any] = {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 1,
           "v3_and_below_producer_epoch": 0,
           "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]}]}  # fmt: skip
    assert verdict(a, "User:alice", 24, 3, add) is None
    with_u = {
        **add,
        "v3_and_below_topics": [*add["v3_and_below_topics"], {"name": "u", "partitions": [0]}],
    }
    out = by_name(
        answered(verdict(a, "User:alice", 24, 3, with_u), 24, 3).results_by_topic_v3_and_below
    )
    assert [p.partition_error_code for p in out["t"].results_by_partition] == [
        ErrorCode.operation_not_attempted
    ] * 2
    assert out["u"].results_by_partition[0].partition_error_code == TAF
    other = answered(
        verdict(a, "User:alice", 24, 3, {**add, "v3_and_below_transactional_id": "x"}), 24, 3
    )
    assert (
        other.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == TIAF
    )
    assert answered(verdict(a, "User:alice", 24, 4, {"transactions": []}), 24, 4).error_code == CAF
    # AddOffsetsToTxn, EndTxn.
    offsets = {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0, "group_id": "g"}
    assert verdict(a, "User:alice", 25, 3, offsets) is None
    assert (
        answered(verdict(a, "User:alice", 25, 3, {**offsets, "group_id": "h"}), 25, 3).error_code
        == GAF
    )
    assert (
        answered(
            verdict(a, "User:alice", 25, 3, {**offsets, "transactional_id": "x"}), 25, 3
        ).error_code
        == TIAF
    )
    end = {"transactional_id": "x", "producer_id": 1, "producer_epoch": 0, "committed": True}
    assert answered(verdict(a, "User:alice", 26, 3, end), 26, 3).error_code == TIAF
    # TxnOffsetCommit: READ per topic as OffsetCommit.
    part = {"partition_index": 0, "committed_offset": 3}
    topics = [{"name": n, "partitions": [part]} for n in "tu"]
    commit = {"transactional_id": "tx", "group_id": "g", "producer_id": 1, "producer_epoch": 0,
              "member_id": "", "topics": topics}  # fmt: skip
    v = verdict(a, "User:alice", 28, 3, commit)
    assert [t.name for t in relayed_part(v, 28, 3).topics] == ["t"]
    assert by_name(completed(v, 28, 3, {"topics": []}).topics)["u"].partitions[0].error_code == TAF
    no_txn = answered(verdict(a, "User:alice", 28, 3, {**commit, "transactional_id": "x"}), 28, 3)
    assert {p.error_code for t in no_txn.topics for p in t.partitions} == {TIAF}


def test_describe_and_list_transactions_show_what_alice_may_describe() -> None:
    a = access(alice(TXN, "tx", DESCRIBE), alice(TOPIC, "t", DESCRIBE))
    v = verdict(a, "User:alice", 65, 0, {"transactional_ids": ["tx", "ty"]})
    assert relayed_part(v, 65, 0).transactional_ids == ("tx",)
    in_txn = [{"topic": "t", "partitions": [0]}, {"topic": "u", "partitions": [0]}]
    state = {"transactional_id": "tx", "transaction_state": "Ongoing", "topics": in_txn}
    main: dict[str, Any] = {"transaction_states": [state]}
    states = by_name(completed(v, 65, 0, main).transaction_states, "transactional_id")
    assert [t.topic for t in states["tx"].topics] == ["t"]
    assert states["ty"].error_code == TIAF
    listed = verdict(a, "User:alice", 66, 0, {})
    main = {
        "transaction_states": [
            {"transactional_id": n, "producer_id": 1, "transaction_state": "Ongoing"}
            for n in ("tx", "ty")
        ]
    }
    assert [s.transactional_id for s in completed(listed, 66, 0, main).transaction_states] == ["tx"]


# -- topics and configs ------------------------------------------------------------------------


def test_metadata_filter_drops_or_refuses_topics_alice_may_not_describe() -> None:
    a = access(alice(TOPIC, "pub-", READ, pattern=PREFIXED), alice(TOPIC, "pub-x", ALL, DENY))
    main = {
        "topics": [
            {"name": n, "partitions": [{"partition_index": 0}]}
            for n in ("pub-a", "pub-x", "secret")
        ]
    }
    every = verdict(
        a, "User:alice", 3, 12, {"topics": None, "include_topic_authorized_operations": True}
    )
    listed = completed(every, 3, 12, main).topics
    assert [t.name for t in listed] == ["pub-a"]
    assert listed[0].topic_authorized_operations == (1 << READ) | (1 << DESCRIBE)
    topics = Topics(**{"pub-a": uuid.uuid4(), "pub-x": uuid.uuid4(), "secret": uuid.uuid4()})
    three = [{"name": n} for n in ("pub-a", "pub-x", "secret")]
    named = verdict(
        a, "User:alice", 3, 12, {"topics": three, "allow_auto_topic_creation": False}, topics
    )
    assert [t.name for t in relayed_part(named, 3, 12).topics] == ["pub-a"]
    out = completed(named, 3, 12, {"topics": main["topics"][:1]}).topics
    codes = {t.name: (t.error_code, len(t.partitions)) for t in out}
    assert codes == {"pub-a": (NONE, 1), "pub-x": (TAF, 0), "secret": (TAF, 0)}
    assert all(t.topic_authorized_operations == OMITTED for t in out)  # not asked for
    # A topic named by id is refused without its name.
    secret_id = next(i for i, n in topics.ids.items() if n == "secret")
    v = verdict(a, "User:alice", 3, 12, {"topics": [{"topic_id": secret_id}]}, topics)
    hidden = completed(v, 3, 12, {"topics": []}).topics[0]
    assert (hidden.name, hidden.topic_id, hidden.error_code) == (None, secret_id, TAF)
    # The admin sees everything, with every topic operation.
    admin = verdict(
        a, "User:admin", 3, 12, {"topics": None, "include_topic_authorized_operations": True}
    )
    assert [t.topic_authorized_operations for t in completed(admin, 3, 12, main).topics] == [
        TOPIC_OPS_ALL
    ] * 3


def test_metadata_auto_creates_only_with_create() -> None:
    a = access(alice(TOPIC, "new-", DESCRIBE, pattern=PREFIXED), alice(TOPIC, "new-ok", CREATE),
               alice(TOPIC, "old", DESCRIBE))  # fmt: skip
    topics = Topics(old=uuid.uuid4())
    request: dict[str, Any] = {
        "topics": [{"name": n} for n in ("new-ok", "new-no", "old")],
        "allow_auto_topic_creation": True,
    }
    v = verdict(a, "User:alice", 3, 9, request, topics)
    relayed = relayed_part(v, 3, 9)
    # new-no may not be created: refused here; old exists but alice may not create it,
    # so in case it went meanwhile the relayed request does not auto-create.
    assert [t.name for t in relayed.topics] == ["new-ok", "old"]
    assert relayed.allow_auto_topic_creation is False
    out = by_name(completed(v, 3, 9, {"topics": []}).topics)
    assert out["new-no"].error_code == TAF
    # Metadata v1-3 always auto-create: the refused topic is not relayed either.
    v1 = verdict(
        a, "User:alice", 3, 1, {"topics": [{"name": "new-ok"}, {"name": "new-no"}]}, topics
    )
    assert [t.name for t in relayed_part(v1, 3, 1).topics] == ["new-ok"]
    # CREATE on the cluster: as it came.
    wide = access(
        alice(TOPIC, "new-", DESCRIBE, pattern=PREFIXED), alice(CLUSTER, "kafka-cluster", CREATE)
    )
    new = {**request, "topics": request["topics"][:2]}
    assert verdict(wide, "User:alice", 3, 9, new, topics).request is None  # type: ignore[union-attr]


def test_metadata_and_describe_cluster_cluster_operations() -> None:
    a = access(alice(CLUSTER, "kafka-cluster", DESCRIBE))
    v = verdict(
        a, "User:alice", 3, 10, {"topics": None, "include_cluster_authorized_operations": True}
    )
    assert completed(v, 3, 10, {"topics": []}).cluster_authorized_operations == 1 << DESCRIBE
    nobody = verdict(access(), "User:bob", 60, 1, {"include_cluster_authorized_operations": True})
    assert completed(nobody, 60, 1, {"cluster_id": "c"}).cluster_authorized_operations == 0
    mine = verdict(a, "User:alice", 60, 1, {"include_cluster_authorized_operations": True})
    assert (
        completed(mine, 60, 1, {"cluster_id": "c"}).cluster_authorized_operations == 1 << DESCRIBE
    )
    assert verdict(a, "User:alice", 60, 1, {"include_cluster_authorized_operations": False}) is None


def test_describe_topic_partitions_filters_and_sets_operations() -> None:
    a = access(alice(TOPIC, "t", READ))
    main: dict[str, Any] = {"topics": [{"name": n, "partitions": []} for n in ("t", "secret")]}
    every = completed(verdict(a, "User:alice", 75, 0, {"topics": []}), 75, 0, main)
    assert [(t.name, t.topic_authorized_operations) for t in every.topics] == [
        ("t", (1 << READ) | (1 << DESCRIBE))
    ]
    named = verdict(a, "User:alice", 75, 0, {"topics": [{"name": "t"}, {"name": "secret"}]})
    codes = {t.name: t.error_code for t in completed(named, 75, 0, main).topics}
    assert codes == {"t": NONE, "secret": TAF}


def test_create_topics_needs_create_and_hides_configs_without_describe_configs() -> None:
    a = access(alice(TOPIC, "mine-", CREATE, pattern=PREFIXED))
    request = {
        "topics": [
            {"name": n, "num_partitions": 1, "replication_factor": 1} for n in ("mine-a", "x")
        ]
    }
    v = verdict(a, "User:alice", 19, 7, request)
    assert [t.name for t in relayed_part(v, 19, 7).topics] == ["mine-a"]
    main = {"topics": [{"name": "mine-a", "num_partitions": 1, "replication_factor": 1,
                        "configs": [{"name": "retention.ms", "value": "1"}]}]}  # fmt: skip
    out = by_name(completed(v, 19, 7, main).topics)
    assert (out["x"].error_code, out["x"].error_message) == (TAF, "Authorization failed.")
    created = out["mine-a"]
    assert (created.error_code, created.topic_config_error_code, created.configs) == (NONE, TAF, ())
    assert created.num_partitions == -1
    # Nothing she may create: answered here, nothing relayed.
    only_x = answered(verdict(a, "User:alice", 19, 7, {"topics": request["topics"][1:]}), 19, 7)
    assert only_x.topics[0].error_code == TAF
    # CREATE on the cluster and DESCRIBE_CONFIGS: relayed and answered as they came.
    wide = access(alice(CLUSTER, "kafka-cluster", CREATE), alice(TOPIC, "*", DESCRIBE_CONFIGS))
    assert verdict(wide, "User:alice", 19, 7, request) is None


def test_delete_topics_needs_delete_and_hides_names_named_by_id() -> None:
    a = access(alice(TOPIC, "d", DELETE), alice(TOPIC, "v", DESCRIBE))
    v = verdict(a, "User:alice", 20, 5, {"topic_names": ["d", "v", "x"]})
    assert relayed_part(v, 20, 5).topic_names == ("d",)
    out = by_name(completed(v, 20, 5, {"responses": [{"name": "d"}]}).responses)
    assert (out["d"].error_code, out["v"].error_code, out["x"].error_code) == (NONE, TAF, TAF)
    ids = {n: uuid.uuid4() for n in ("d", "v", "x")}
    stray = uuid.uuid4()
    v6 = verdict(
        a,
        "User:alice",
        20,
        6,
        {"topics": [{"topic_id": i} for i in [*ids.values(), stray]]},
        Topics(**ids),
    )
    assert [t.topic_id for t in relayed_part(v6, 20, 6).topics] == [ids["d"]]
    out6 = by_name(completed(v6, 20, 6, {"responses": []}).responses, "topic_id")
    assert (out6[ids["v"]].name, out6[ids["v"]].error_code) == ("v", TAF)  # she may describe v
    assert (out6[ids["x"]].name, out6[ids["x"]].error_code) == (None, TAF)
    assert out6[stray].error_code == ErrorCode.unknown_topic_id
    assert (
        verdict(
            access(alice(CLUSTER, "kafka-cluster", DELETE)),
            "User:alice",
            20,
            5,
            {"topic_names": ["x"]},
        )
        is None
    )


def test_create_partitions_delete_records_and_describe_producers_per_topic() -> None:
    a = access(alice(TOPIC, "t", ALTER), alice(TOPIC, "t", DELETE), alice(TOPIC, "t", READ))
    grow = {"topics": [{"name": n, "count": 3} for n in "tu"], "timeout_ms": 1000}
    v = verdict(a, "User:alice", 37, 3, grow)
    assert [t.name for t in relayed_part(v, 37, 3).topics] == ["t"]
    assert by_name(completed(v, 37, 3, {"results": [{"name": "t"}]}).results)["u"].error_code == TAF
    trim = {
        "topics": [{"name": n, "partitions": [{"partition_index": 0, "offset": 1}]} for n in "tu"]
    }
    v = verdict(a, "User:alice", 21, 2, trim)
    u = by_name(completed(v, 21, 2, {"topics": []}).topics)["u"].partitions[0]
    assert (u.error_code, u.low_watermark) == (TAF, -1)
    producers = {"topics": [{"name": n, "partition_indexes": [0, 1]} for n in "tu"]}
    v = verdict(a, "User:alice", 61, 0, producers)
    assert [t.name for t in relayed_part(v, 61, 0).topics] == ["t"]
    u_parts = by_name(completed(v, 61, 0, {"topics": []}).topics)["u"].partitions
    assert [(p.partition_index, p.error_code) for p in u_parts] == [(0, TAF), (1, TAF)]
    # ListOffsets: DESCRIBE per topic, the others relayed.
    lo = {
        "replica_id": -1,
        "topics": [
            {"name": n, "partitions": [{"partition_index": 0, "timestamp": -1}]} for n in "tu"
        ],
    }
    v = verdict(a, "User:alice", 2, 9, lo)
    assert [t.name for t in relayed_part(v, 2, 9).topics] == ["t"]
    assert by_name(completed(v, 2, 9, {"topics": []}).topics)["u"].partitions[0].error_code == TAF


def test_configs_are_checked_per_resource() -> None:
    a = access(alice(TOPIC, "t", DESCRIBE_CONFIGS), alice(TOPIC, "a", ALTER_CONFIGS))
    describe = {"resources": [{"resource_type": 2, "resource_name": "t"},
                              {"resource_type": 2, "resource_name": "u"},
                              {"resource_type": 4, "resource_name": "1"},
                              {"resource_type": 32, "resource_name": "g"}]}  # fmt: skip
    v = verdict(a, "User:alice", 32, 4, describe)
    assert [r.resource_name for r in relayed_part(v, 32, 4).resources] == ["t"]
    main = {
        "results": [
            {"resource_type": 2, "resource_name": "t", "configs": [{"name": "x", "value": "1"}]}
        ]
    }
    out = by_name(completed(v, 32, 4, main).results, "resource_name")
    assert [out[n].error_code for n in ("t", "u", "1", "g")] == [NONE, TAF, CAF, GAF]
    assert out["1"].error_message == "Cluster authorization failed."
    for key, version in ((33, 2), (44, 1)):
        alter: dict[str, Any] = {
            "resources": [
                {"resource_type": 2, "resource_name": n, "configs": []} for n in ("a", "t")
            ]
        }
        v = verdict(a, "User:alice", key, version, alter)
        assert [r.resource_name for r in relayed_part(v, key, version).resources] == ["a"]
        answers = completed(
            v, key, version, {"responses": [{"resource_type": 2, "resource_name": "a"}]}
        )
        assert by_name(answers.responses, "resource_name")["t"].error_code == TAF
    # DESCRIBE_CONFIGS on the cluster covers brokers, as ALTER_CONFIGS implies it.
    ops = access(alice(CLUSTER, "kafka-cluster", ALTER_CONFIGS))
    assert verdict(ops, "User:alice", 32, 4, {"resources": describe["resources"][2:3]}) is None


# -- the cluster resource ----------------------------------------------------------------------

CLUSTER_REQUESTS: dict[int, tuple[int, dict[str, Any]]] = {
    29: (
        3,
        {"resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1, "permission_type": 1},
    ),
    30: (
        3,
        {
            "creations": [
                {
                    "resource_type": 2,
                    "resource_name": "t",
                    "principal": "User:alice",
                    "host": "*",
                    "operation": 2,
                    "permission_type": 3,
                }
            ]
            * 2
        },
    ),
    31: (
        3,
        {
            "filters": [
                {
                    "resource_type_filter": 1,
                    "pattern_type_filter": 1,
                    "operation": 1,
                    "permission_type": 1,
                }
            ]
        },
    ),
    34: (2, {"dirs": [{"path": "/d", "topics": [{"name": "t", "partitions": [0, 1]}]}]}),
    35: (4, {"topics": None}),
    43: (2, {"election_type": 0, "topic_partitions": [{"topic": "t", "partitions": [0]}]}),
    45: (0, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "replicas": [1]}]}]}),
    46: (0, {"topics": [{"name": "t", "partition_indexes": [0, 1]}]}),
    48: (1, {"components": [], "strict": False}),
    49: (1, {"entries": [{"entity": [{"entity_type": "user", "entity_name": "bob"}], "ops": []}]}),
    50: (0, {"users": [{"name": "bob"}]}),
    51: (0, {"deletions": [{"name": "bob", "mechanism": 1}], "upsertions": []}),
}


def _errors(entity: Any) -> set[int]:
    """Every error code in an answer."""
    found: set[int] = set()
    data = entity_to_data(entity)

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k.endswith("error_code") and v:
                    found.add(int(v))
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(data)
    return found


@pytest.mark.parametrize("key", sorted(CLUSTER_REQUESTS))
def test_cluster_apis_need_their_operation_on_the_cluster(key: int) -> None:
    version, request = CLUSTER_REQUESTS[key]
    operation = CLUSTER_OPERATIONS[key][0]
    assert set(CLUSTER_OPERATIONS) == set(CLUSTER_REQUESTS)
    refused = answered(verdict(access(), "User:alice", key, version, request), key, version)
    assert _errors(refused) == {CAF}
    allowed = access(alice(CLUSTER, "kafka-cluster", operation))
    assert verdict(allowed, "User:alice", key, version, request) is None
    assert verdict(access(), "User:admin", key, version, request) is None


def test_cluster_answers_name_what_was_asked() -> None:
    creations = answered(verdict(access(), "User:alice", 30, 3, CLUSTER_REQUESTS[30][1]), 30, 3)
    assert len(creations.results) == 2
    scram = answered(verdict(access(), "User:alice", 51, 0, CLUSTER_REQUESTS[51][1]), 51, 0)
    assert [r.user for r in scram.results] == ["bob"]
    dirs = answered(verdict(access(), "User:alice", 34, 2, CLUSTER_REQUESTS[34][1]), 34, 2)
    assert [p.partition_index for p in dirs.results[0].partitions] == [0, 1]
