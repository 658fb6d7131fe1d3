"""ACL enforcement at a zone proxy, decided in the zone (`[security] authorizer = true`).

The fleet's ACLs are the mains' `cluster/acls.json` (docs/formats.md); the proxy reads it
every `ACL_REFRESH_S` into a `kafka_wire.acl.Authorizer`, so a decision is a cached lookup
and never a round trip to a main in another zone. A changed ACL takes effect on every proxy
within that time plus one read. Until the document was read once, only super users pass.

Every API a main serves is checked as Kafka 4.x's KafkaApis, ControllerApis and AuthHelper
check it (kafka_wire/acl/api_operations.py is the table), with Kafka's error codes:
- Produce and Fetch in broker.py and produce.py / fetch, OffsetForLeaderEpoch there too;
- a relayed request by `check_relayed`, which returns a `Verdict` (access_verdict.py):
  answered here when nothing is allowed, the allowed part relayed and the denied part joined
  into the main's answer when Kafka answers per resource, answers filtered and their
  `authorized_operations` set for the principal. The checks per API are in
  access_topics.py (Metadata, topics, configs, DescribeCluster), access_groups.py (groups,
  transactions, FindCoordinator, InitProducerId) and access_cluster.py (ACLs, SCRAM,
  quotas, reassignments, log dirs: the cluster resource);
- ApiVersions, SaslHandshake, SaslAuthenticate and GetTelemetrySubscriptions: nothing, as in
  Kafka;
- an API none of these knows is for super users only: another principal's request closes
  the connection, with one log line (`check_known`, before the request is queued). Fail
  closed, never open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import trio

from kafka_wire.acl import Authorizer, Operation, ResourceType, authorized_operations
from kafka_wire.acl.rules import CLUSTER_NAME
from kafka_wire.codec import RequestHeader
from kafka_wire.security_docs import ACLS_DOC, AclsDoc
from kafka_wire.server_loop import ConnectionInfo, api_name
from proxy_broker import access_cluster, access_groups, access_topics
from proxy_broker.access_verdict import (
    Caller,
    Check,
    NotAuthorized,
    NoTopics,
    TopicIndex,
    Verdict,
)
from proxy_broker.documents import follow_document
from s3_commit import AsyncObjectStore
from telemetry.audit import AuditLog, OperationDenied

__all__ = ["ACL_REFRESH_S", "CHECKS", "OPEN_APIS", "AclSettings", "NotAuthorized", "ProxyAccess"]

log = logging.getLogger("zonefleet.proxy.access")

ACL_REFRESH_S: Final = 5.0

API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 18, 17, 36
API_GET_TELEMETRY_SUBSCRIPTIONS = 71
# Kafka checks nothing on these.
OPEN_APIS: Final = frozenset(
    {API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE, API_GET_TELEMETRY_SUBSCRIPTIONS}
)
#: The checks of each relayed API that is not open.
CHECKS: Final[Mapping[int, Check]] = {
    **access_topics.CHECKS,
    **access_groups.CHECKS,
    **access_cluster.CHECKS,
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
        api: str | None = None,
    ) -> bool:
        """Whether the principal may; a denial goes to the audit log unless `audit` is False
        (where Kafka does not log one: a topic left out of an all-topics Metadata answer)."""
        if not self.settings.enabled:
            return True
        if self.authorizer.authorize(conn.principal, conn.peer_host, operation, rtype, name):
            return True
        if audit:
            self.denied(conn, operation, rtype, name, api)
        return False

    def allows_any(self, conn: ConnectionInfo, operation: Operation, rtype: int) -> bool:
        """Whether some resource of the type may get `operation` (Kafka's
        authorizeByResourceType); not audited."""
        if not self.settings.enabled:
            return True
        return self.authorizer.authorize_any(conn.principal, conn.peer_host, operation, rtype)

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

    def authorized_operations(self, conn: ConnectionInfo, rtype: ResourceType, name: str) -> int:
        """The authorized-operations bit field of a resource for the principal, as Kafka's
        AuthHelper.authorizedOperations (every supported operation without an authorizer)."""
        if not self.settings.enabled:
            return authorized_operations(rtype)
        return self.authorizer.authorized_operations(conn.principal, conn.peer_host, rtype, name)

    # -- relayed requests --------------------------------------------------------------------

    def check_known(self, header: RequestHeader, conn: ConnectionInfo) -> None:
        """Raises NotAuthorized for an API nothing here checks, from a non-super user."""
        key = header.api_key
        if not self.settings.enabled or key in OPEN_APIS or key in CHECKS or self.is_super(conn):
            return
        self.denied(conn, Operation.ALL, CLUSTER, CLUSTER_NAME, api_name(key), CLOSED)
        raise NotAuthorized(
            f"api {key} is for super users only: no ACL check is known for it; "
            f"{conn.principal} from {conn.peer_host}"
        )

    def check_relayed(
        self,
        header: RequestHeader,
        request: Any,
        conn: ConnectionInfo,
        topics: TopicIndex | None = None,
    ) -> Verdict | None:
        """What to do with a request a main answers (None: relay it as it came, and its
        answer too). `topics`: the mirrors' topics, for requests that name topics by id and
        for auto-creation. Raises NotAuthorized as `check_known` does."""
        if not self.settings.enabled or header.api_key in OPEN_APIS:
            return None
        self.check_known(header, conn)
        check = CHECKS.get(header.api_key)
        if check is None:  # a super user's
            return None
        return check(Caller(self, conn, header, topics or NoTopics()), request)


def _parse_acls(data: bytes | None) -> AclsDoc:
    return AclsDoc() if data is None else AclsDoc.from_bytes(data)


def _enum_name(enum: type[ResourceType] | type[Operation], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return str(code)
