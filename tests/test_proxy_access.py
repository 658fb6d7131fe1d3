"""The zone proxy's ACL decisions on relayed requests (proxy_broker/access.py), without I/O."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_wire.acl import AclBinding
from kafka_wire.codec import (
    build_request,
    decode_request,
    decode_response,
    encode_request,
    parse_request_header,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.security_docs import AclsDoc
from kafka_wire.server_loop import ConnectionIdentity, ConnectionInfo
from proxy_broker.access import AclSettings, NotAuthorized, ProxyAccess

TOPIC, GROUP, CLUSTER, TXN = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
READ, WRITE, DESCRIBE, IDEMPOTENT_WRITE = 3, 4, 8, 12
DENY, ALLOW = 2, 3


def access(*bindings: AclBinding, synced: bool = True) -> ProxyAccess:
    a = ProxyAccess(AclSettings(True, frozenset({"User:admin"})))
    if synced:
        a.update(AclsDoc(1, frozenset(bindings)))
    return a


def conn(principal: str) -> ConnectionInfo:
    return ConnectionInfo("10.0.0.1", 5000, 9092, "SASL", ConnectionIdentity(principal))


def relayed(a: ProxyAccess, who: str, key: int, version: int, data: dict[str, Any]) -> Any:
    frame = encode_request(key, version, 9, "c", build_request(key, version, data))
    header = parse_request_header(frame)
    answer = a.check_relayed(header, decode_request(header, bytearray(frame)), conn(who))
    if answer is None:
        return None
    return decode_response(key, version, b"".join(bytes(p) for p in answer))[1]


def alice(rtype: int, name: str, op: int, perm: int = ALLOW, pattern: int = LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, "User:alice", "*", op, perm)


def test_group_apis_need_read_on_the_group() -> None:
    a = access(alice(GROUP, "g", READ))
    join = {"group_id": "g", "session_timeout_ms": 6000, "rebalance_timeout_ms": 6000,
            "member_id": "", "protocol_type": "consumer", "protocols": []}  # fmt: skip
    assert relayed(a, "User:alice", 11, 9, join) is None
    denied = relayed(a, "User:alice", 11, 9, {**join, "group_id": "other"})
    assert denied.error_code == ErrorCode.group_authorization_failed
    # READ implies DESCRIBE: FindCoordinator for the group passes, for another one fails.
    assert relayed(a, "User:alice", 10, 4, {"key_type": 0, "coordinator_keys": ["g"]}) is None
    found = relayed(a, "User:alice", 10, 4, {"key_type": 0, "coordinator_keys": ["h"]})
    assert found.coordinators[0].error_code == ErrorCode.group_authorization_failed


def test_init_producer_id_idempotent_needs_write_somewhere() -> None:
    data = {"transactional_id": None, "transaction_timeout_ms": 60000}
    assert relayed(access(alice(TOPIC, "t", WRITE)), "User:alice", 22, 4, data) is None
    refused = relayed(access(), "User:alice", 22, 4, data)
    assert refused.error_code == ErrorCode.cluster_authorization_failed
    txn = relayed(access(alice(TOPIC, "t", WRITE)), "User:alice", 22, 4,
                  {**data, "transactional_id": "tx"})  # fmt: skip
    assert txn.error_code == ErrorCode.transactional_id_authorization_failed


def test_other_apis_are_for_super_users_only_and_nobody_before_the_first_read() -> None:
    create_acls = {"creations": []}
    with pytest.raises(NotAuthorized):
        relayed(access(alice(CLUSTER, "kafka-cluster", 2)), "User:alice", 30, 3, create_acls)
    assert relayed(access(), "User:admin", 30, 3, create_acls) is None
    # Before the ACL document was read, a non-super user is denied even an open-looking op.
    early = access(alice(GROUP, "g", READ), synced=False)
    hb = {"group_id": "g", "generation_id": 1, "member_id": "m"}
    assert (
        relayed(early, "User:alice", 12, 4, hb).error_code == ErrorCode.group_authorization_failed
    )


def test_metadata_filter_drops_or_refuses_topics_alice_may_not_describe() -> None:
    a = access(alice(TOPIC, "pub-", READ, pattern=PREFIXED), alice(TOPIC, "pub-x", 2, DENY))
    data = {"topics": [{"name": n, "error_code": 0, "partitions": [{"x": 1}]}
                       for n in ("pub-a", "pub-x", "secret")]}  # fmt: skip
    listed = a.filter_metadata(data, False, conn("User:alice"))
    assert [t["name"] for t in listed["topics"]] == ["pub-a"]
    named = a.filter_metadata(data, True, conn("User:alice"))
    codes = {t["name"]: (t["error_code"], t["partitions"]) for t in named["topics"]}
    assert codes["pub-a"] == (0, [{"x": 1}])
    assert codes["pub-x"] == (ErrorCode.topic_authorization_failed, [])
    assert codes["secret"] == (ErrorCode.topic_authorization_failed, [])
    assert a.filter_metadata(data, False, conn("User:admin")) == data
