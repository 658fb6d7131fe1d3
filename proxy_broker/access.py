"""ACL enforcement at a zone proxy, decided in the zone (`[security] authorizer = true`).

The fleet's ACLs are the mains' `cluster/acls.json` (docs/formats.md); the proxy reads it
every `ACL_REFRESH_S` into a `kafka_wire.acl.Authorizer`, so a decision is a cached lookup
and never a round trip to a main in another zone. A changed ACL takes effect on every proxy
within that time plus one read. Until the document was read once, only super users pass.

What is checked, as Kafka's KafkaApis does (kafka_wire/acl/api_operations.py):
- Produce: WRITE on each topic (TOPIC_AUTHORIZATION_FAILED per partition, nothing written);
  WRITE on the transactional id of a transactional produce.
- Fetch: READ on each topic.
- Metadata: topics the principal may not DESCRIBE are left out of an all-topics answer and
  answered TOPIC_AUTHORIZATION_FAILED when named; auto-creation needs CREATE on the cluster.
- JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit: READ on the group;
  OffsetFetch and FindCoordinator for a group: DESCRIBE on it (GROUP_AUTHORIZATION_FAILED);
  FindCoordinator for a transactional id: DESCRIBE on it.
- ListOffsets: DESCRIBE on each topic; a request naming one it may not is answered in the
  proxy (TOPIC_AUTHORIZATION_FAILED there, NOT_LEADER_OR_FOLLOWER for the other topics,
  which clients retry). OffsetForLeaderEpoch (answered in the zone): DESCRIBE on each topic.
- InitProducerId: WRITE on the transactional id; without one, IDEMPOTENT_WRITE on the cluster
  or WRITE on some topic (KIP-679).
- ApiVersions, SaslHandshake, SaslAuthenticate, DescribeCluster and GetTelemetrySubscriptions:
  nothing, as in Kafka.
- Every other API (admin, transactions, ACLs, SCRAM, configs) is for super users only until
  it is checked per resource: another principal's request closes the connection, with one
  log line. Fail closed, never open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio

from kafka_wire.acl import Authorizer, Operation, ResourceType
from kafka_wire.acl.rules import CLUSTER_NAME
from kafka_wire.codec import RequestHeader, build_response, encode_response
from kafka_wire.errors import ErrorCode
from kafka_wire.security_docs import ACLS_DOC, AclsDoc
from kafka_wire.server_loop import Buffer, ConnectionInfo, api_name
from proxy_broker.documents import follow_document
from s3_commit import AsyncObjectStore
from telemetry.audit import AuditLog, OperationDenied

__all__ = ["ACL_REFRESH_S", "AclSettings", "ProxyAccess"]

log = logging.getLogger("zonefleet.proxy.access")

ACL_REFRESH_S: Final = 5.0

API_LIST_OFFSETS, API_METADATA, API_OFFSET_COMMIT, API_OFFSET_FETCH = 2, 3, 8, 9
API_FIND_COORDINATOR, API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP = 10, 11, 12, 13
API_SYNC_GROUP, API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 14, 18, 17, 36
API_OFFSET_FOR_LEADER_EPOCH, API_INIT_PRODUCER_ID = 23, 22
API_DESCRIBE_CLUSTER, API_GET_TELEMETRY_SUBSCRIPTIONS = 60, 71
GROUP_READ = {API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP}
# Kafka checks nothing on these (DescribeCluster only hides its authorized operations).
OPEN_APIS = {
    API_VERSIONS,
    API_SASL_HANDSHAKE,
    API_SASL_AUTHENTICATE,
    API_DESCRIBE_CLUSTER,
    API_GET_TELEMETRY_SUBSCRIPTIONS,
}
TOPIC, GROUP, CLUSTER, TXN = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
# What a denial on each resource type answers, as the audit log's outcome.
DENIED_OUTCOME: dict[int, str] = {
    TOPIC: "TOPIC_AUTHORIZATION_FAILED",
    GROUP: "GROUP_AUTHORIZATION_FAILED",
    CLUSTER: "CLUSTER_AUTHORIZATION_FAILED",
    TXN: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
}
CLOSED = "CONNECTION_CLOSED"


@dataclass(frozen=True)
class AclSettings:
    """Kafka's `authorizer.class.name` (on or off), `super.users` and
    `allow.everyone.if.no.acl.found`."""

    enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False


class NotAuthorized(Exception):
    """A request that only super users may send yet, from another principal."""


class ProxyAccess:
    def __init__(self, settings: AclSettings, audit: AuditLog | None = None) -> None:
        self.settings = settings
        self.audit = audit or AuditLog.off()  # every denial goes there (`denied`)
        self.authorizer = Authorizer((), settings.super_users, allow_everyone_if_no_acl_found=False)
        self.synced = trio.Event()
        self.version = -1  # of the ACL document in force

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def update(self, doc: AclsDoc) -> None:
        if not self.synced.is_set():
            # Before the first read every non-super user is denied, even with
            # allow.everyone.if.no.acl.found: no ACL found is not known yet.
            self.authorizer = Authorizer(
                doc.acls,
                self.settings.super_users,
                allow_everyone_if_no_acl_found=self.settings.allow_everyone_if_no_acl_found,
            )
            self.synced.set()
        elif doc.version != self.version:  # unchanged: keep the cached decisions
            self.authorizer = self.authorizer.with_bindings(doc.acls)
        self.version = doc.version

    async def keep_fresh(self, store: AsyncObjectStore) -> None:
        await follow_document(store, ACLS_DOC, _parse_acls, self.update, ACL_REFRESH_S)

    def allows(
        self,
        conn: ConnectionInfo,
        operation: Operation,
        rtype: int,
        name: str,
        *,
        audit: bool = True,
    ) -> bool:
        """Whether the principal may; a denial goes to the audit log unless `audit` is False
        (a topic left out of an all-topics Metadata answer, which Kafka does not log)."""
        if not self.settings.enabled:
            return True
        if self.authorizer.authorize(conn.principal, conn.peer_host, operation, rtype, name):
            return True
        if audit:
            self.denied(conn, operation, rtype, name)
        return False

    def denied(
        self,
        conn: ConnectionInfo,
        operation: Operation,
        rtype: int,
        name: str,
        api: str | None = None,
        outcome: str | None = None,
    ) -> None:
        """An audit line for a denial (rate-limited there): by default the error code a
        denial on the resource type answers."""
        self.audit.record(
            OperationDenied(
                conn.principal,
                conn.peer_host,
                conn.peer_port,
                conn.listener,
                api,
                _enum_name(ResourceType, rtype),
                name,
                _enum_name(Operation, operation),
                outcome or DENIED_OUTCOME.get(rtype, "DENIED"),
            )
        )

    def is_super(self, conn: ConnectionInfo) -> bool:
        return conn.principal in self.settings.super_users

    def visible_topics(self, conn: ConnectionInfo, names: Iterable[str]) -> set[str]:
        return {n for n in names if self.allows(conn, Operation.DESCRIBE, TOPIC, n)}

    # -- relayed requests --------------------------------------------------------------------

    def check_relayed(
        self, header: RequestHeader, request: Any, conn: ConnectionInfo
    ) -> Sequence[Buffer] | None:
        """The local answer to a relayed request this principal may not make (None: relay
        it). Raises NotAuthorized for an API only super users may use yet."""
        if not self.settings.enabled:
            return None
        key = header.api_key
        if key in OPEN_APIS or key == API_METADATA:
            return None  # Metadata: filtered in its answer (`filter_metadata`)
        if key in GROUP_READ:
            if self.allows(conn, Operation.READ, GROUP, request.group_id):
                return None
            return self._answer(header, {"error_code": ErrorCode.group_authorization_failed})
        if key == API_OFFSET_COMMIT:
            if self.allows(conn, Operation.READ, GROUP, request.group_id):
                return None
            return self._answer(header, _offset_commit_denied(request))
        if key == API_OFFSET_FETCH:
            return self._offset_fetch(header, request, conn)
        if key == API_FIND_COORDINATOR:
            return self._find_coordinator(header, request, conn)
        if key == API_INIT_PRODUCER_ID:
            return self._init_producer_id(header, request, conn)
        if key == API_LIST_OFFSETS:
            denied = [
                t.name
                for t in request.topics
                if not self.allows(conn, Operation.DESCRIBE, TOPIC, t.name)
            ]
            if not denied:
                return None
            return self._answer(header, _list_offsets_denied(request, set(denied)))
        if self.is_super(conn):
            return None
        self.denied(conn, Operation.ALL, CLUSTER, CLUSTER_NAME, api_name(key), CLOSED)
        raise NotAuthorized(
            f"api {key} is for super users only while its ACL checks are not done per "
            f"resource; {conn.principal} from {conn.peer_host}"
        )

    def _offset_fetch(
        self, header: RequestHeader, request: Any, conn: ConnectionInfo
    ) -> Sequence[Buffer] | None:
        groups = getattr(request, "groups", None)
        if header.api_version >= 8 and groups:
            denied = [
                g.group_id
                for g in groups
                if not self.allows(conn, Operation.DESCRIBE, GROUP, g.group_id)
            ]
            if not denied:
                return None
            if len(denied) < len(groups):
                raise NotAuthorized(
                    f"OffsetFetch of several groups, some not authorized ({conn.principal})"
                )
            data = {
                "groups": [
                    {"group_id": g, "error_code": ErrorCode.group_authorization_failed}
                    for g in denied
                ]
            }
            return self._answer(header, data)
        if self.allows(conn, Operation.DESCRIBE, GROUP, request.group_id):
            return None
        return self._answer(header, {"error_code": ErrorCode.group_authorization_failed})

    def _find_coordinator(
        self, header: RequestHeader, request: Any, conn: ConnectionInfo
    ) -> Sequence[Buffer] | None:
        key_type = getattr(request, "key_type", 0)
        rtype, code = (
            (TXN, ErrorCode.transactional_id_authorization_failed)
            if key_type == 1
            else (GROUP, ErrorCode.group_authorization_failed)
        )
        if header.api_version >= 4:
            keys = list(request.coordinator_keys)
            denied = [k for k in keys if not self.allows(conn, Operation.DESCRIBE, rtype, k)]
            if not denied:
                return None
            coordinators = [
                {
                    "key": k,
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                    # A key allowed in a request with a denied one is retried by the client.
                    "error_code": code if k in denied else ErrorCode.coordinator_not_available,
                    "error_message": None,
                }
                for k in keys
            ]
            return self._answer(header, {"coordinators": coordinators})
        if self.allows(conn, Operation.DESCRIBE, rtype, request.key):
            return None
        return self._answer(header, {"error_code": code, "node_id": -1, "host": "", "port": -1})

    def _init_producer_id(
        self, header: RequestHeader, request: Any, conn: ConnectionInfo
    ) -> Sequence[Buffer] | None:
        """A transactional id needs WRITE on it; an idempotent producer without one needs
        IDEMPOTENT_WRITE on the cluster or WRITE on some topic (Kafka 3+, KIP-679)."""
        txn = request.transactional_id
        if txn is not None:
            if self.allows(conn, Operation.WRITE, TXN, txn):
                return None
            code = ErrorCode.transactional_id_authorization_failed
        else:
            authz = self.authorizer
            principal, host = conn.principal, conn.peer_host
            if authz.authorize(
                principal, host, Operation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME
            ) or authz.authorize_any(principal, host, Operation.WRITE, TOPIC):
                return None
            code = ErrorCode.cluster_authorization_failed
            self.denied(conn, Operation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME, "InitProducerId")
        return self._answer(header, {"error_code": code, "producer_id": -1, "producer_epoch": -1})

    @staticmethod
    def _answer(header: RequestHeader, data: dict[str, Any]) -> Sequence[Buffer]:
        return [encode_response(header, build_response(header.api_key, header.api_version, data))]

    # -- Metadata ----------------------------------------------------------------------------

    def may_auto_create(self, conn: ConnectionInfo) -> bool:
        # Not audited, as in Kafka: most clients ask for auto-creation in every Metadata
        # request, and a denial only drops the flag.
        return self.allows(conn, Operation.CREATE, CLUSTER, CLUSTER_NAME, audit=False)

    def filter_metadata(
        self, data: dict[str, Any], requested: bool, conn: ConnectionInfo
    ) -> dict[str, Any]:
        """Topics the principal may not DESCRIBE: dropped from an all-topics answer, answered
        TOPIC_AUTHORIZATION_FAILED (without partitions) when the request named them."""
        if not self.settings.enabled:
            return data
        topics = []
        for topic in data.get("topics") or ():
            name = topic.get("name")
            if name is None or self.allows(conn, Operation.DESCRIBE, TOPIC, name, audit=requested):
                topics.append(topic)
            elif requested:
                topics.append(
                    {
                        **topic,
                        "error_code": ErrorCode.topic_authorization_failed,
                        "partitions": [],
                        "is_internal": False,
                    }
                )
        return {**data, "topics": topics}


def _parse_acls(data: bytes | None) -> AclsDoc:
    return AclsDoc() if data is None else AclsDoc.from_bytes(data)


def _enum_name(enum: type[ResourceType] | type[Operation], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return str(code)


def _offset_commit_denied(request: Any) -> dict[str, Any]:
    return {
        "topics": [
            {
                "name": t.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": ErrorCode.group_authorization_failed,
                    }
                    for p in t.partitions
                ],
            }
            for t in request.topics
        ]
    }


def _list_offsets_denied(request: Any, denied: set[str]) -> dict[str, Any]:
    """Every partition of a denied topic TOPIC_AUTHORIZATION_FAILED; the others of the same
    request are answered NOT_LEADER_OR_FOLLOWER, which clients retry (alone, next time)."""
    return {
        "topics": [
            {
                "name": t.name,
                "partitions": [
                    {
                        "partition_index": p.partition_index,
                        "error_code": ErrorCode.topic_authorization_failed
                        if t.name in denied
                        else ErrorCode.not_leader_or_follower,
                    }
                    for p in t.partitions
                ],
            }
            for t in request.topics
        ]
    }
