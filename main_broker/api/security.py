"""CreateAcls, DescribeAcls, DeleteAcls, DescribeUserScramCredentials and
AlterUserScramCredentials, answered as Apache Kafka 4.x does with its StandardAuthorizer.

The ACLs and credentials are stored (`main_broker.security.state`) and enforced by the zone
proxies. Every change (and every change that failed to be written) is an audit line
(`telemetry/audit.py`: acl_change, scram_change) with the principal and peer of the request
as this main sees them: a request a proxy relays comes on listener `relay:<proxy id>` from
its client's address.

A request with a field that is exactly a type's UNKNOWN code (0) is one Kafka cannot parse,
so the connection is closed; other codes outside an enum read as UNKNOWN and get
INVALID_REQUEST per binding or filter, as in Kafka.
"""

from __future__ import annotations

import logging
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafka_wire.acl.rules import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    create_error,
    delete_filter_error,
    matching,
)
from kafka_wire.sasl.scram import MECHANISMS
from kafka_wire.security_docs import AclsDoc, ScramDoc, SecurityDocError
from kafka_wire.server_loop import CloseConnection
from main_broker.security.scram import Deletion, Upsertion, alter_credentials, describe_credentials
from s3_commit import ObjectStoreError
from shared_wal import WalError
from telemetry.audit import (
    AclEntry,
    AclsChanged,
    ScramChange,
    ScramCredentialsChanged,
    change_outcome,
)

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

log = logging.getLogger("zonefleet.main_broker.security")

__all__ = [
    "alter_user_scram_credentials",
    "create_acls",
    "delete_acls",
    "describe_acls",
    "describe_user_scram_credentials",
]

# What a failed read or write of the documents gets (Kafka: its controller did not answer):
# the metadata store, a corrupt document, or a lone main's WAL (failed, or a record too large).
_STORAGE_ERRORS = (ObjectStoreError, SecurityDocError, WalError, OSError)


def _storage_message(exc: BaseException) -> str:
    log.warning("ACL / SCRAM document unavailable: %s", exc)
    return f"The security metadata could not be read or written: {exc}"


def _enum_name(enum: type[IntEnum], code: int) -> str:
    try:
        return enum(code).name
    except ValueError:
        return f"UNKNOWN({code})"


def _code_name(code: int) -> str:
    return _enum_name(ErrorCode, code).upper()


def _audit_acls(
    broker: BrokerServices, ctx: RequestContext, api: str, acls: list[AclBinding], outcome: str
) -> None:
    conn = ctx.conn
    entries = tuple(
        AclEntry(
            _enum_name(ResourceType, b.resource_type),
            b.name,
            _enum_name(PatternType, b.pattern_type),
            b.principal,
            b.host,
            _enum_name(Operation, b.operation),
            _enum_name(Permission, b.permission),
        )
        for b in acls
    )
    broker.audit.record(
        AclsChanged(
            conn.principal, conn.peer_host, conn.peer_port, conn.listener, api, entries, outcome
        )
    )


def _filter(f: Any) -> AclFilter:
    return AclFilter(
        f.resource_type_filter,
        f.resource_name_filter,
        f.pattern_type_filter,
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )


async def create_acls(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    bindings = [
        AclBinding(
            c.resource_type,
            c.resource_name,
            c.resource_pattern_type,
            c.principal,
            c.host,
            c.operation,
            c.permission_type,
        )
        for c in req.creations
    ]
    for b in bindings:
        if 0 in (b.resource_type, b.pattern_type, b.operation, b.permission):
            raise CloseConnection(f"CreateAcls with UNKNOWN elements: {b}")
    errors = [create_error(b) for b in bindings]
    valid = [b for b, e in zip(bindings, errors, strict=True) if e is None]
    results: list[dict[str, Any]] = [
        {"error_code": ErrorCode.invalid_request, "error_message": e}
        if e is not None
        else {"error_code": ErrorCode.none, "error_message": None}
        for e in errors
    ]
    if valid:

        def add(doc: AclsDoc) -> tuple[AclsDoc, None]:
            return doc.with_acls(valid), None

        try:
            await broker.security.change_acls(add)
            _audit_acls(broker, ctx, "CreateAcls", valid, "NONE")
        except _STORAGE_ERRORS as exc:
            failed = {
                "error_code": ErrorCode.unknown_server_error,
                "error_message": _storage_message(exc),
            }
            results = [r if r["error_code"] else dict(failed) for r in results]
            _audit_acls(broker, ctx, "CreateAcls", valid, "UNKNOWN_SERVER_ERROR")
    return {"results": results}


async def describe_acls(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    f = _filter(req)
    if f.has_unknown():
        raise CloseConnection(f"DescribeAcls with UNKNOWN elements: {f}")
    try:
        doc = await broker.security.read_acls()
    except _STORAGE_ERRORS as exc:
        return {
            "error_code": ErrorCode.unknown_server_error,
            "error_message": _storage_message(exc),
            "resources": [],
        }
    by_resource: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for b in sorted(matching(f, doc.acls)):
        by_resource.setdefault((b.resource_type, b.name, b.pattern_type), []).append(
            {
                "principal": b.principal,
                "host": b.host,
                "operation": b.operation,
                "permission_type": b.permission,
            }
        )
    resources = [
        {"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
        for (rt, name, pt), acls in by_resource.items()
    ]
    return {"error_code": ErrorCode.none, "error_message": None, "resources": resources}


def _matching_acl(b: AclBinding) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "error_message": None,
        "resource_type": b.resource_type,
        "resource_name": b.name,
        "pattern_type": b.pattern_type,
        "principal": b.principal,
        "host": b.host,
        "operation": b.operation,
        "permission_type": b.permission,
    }


async def delete_acls(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    filters = [_filter(f) for f in req.filters]
    for f in filters:
        if f.has_unknown():
            raise CloseConnection(f"DeleteAcls with UNKNOWN elements: {f}")
    errors = [delete_filter_error(f) for f in filters]

    def remove(doc: AclsDoc) -> tuple[AclsDoc, list[list[AclBinding]]]:
        # Every filter sees the ACLs as they were before the request (Kafka deletes them in
        # one atomic batch), so an ACL two filters match is listed under both.
        matched = [
            [] if e is not None else sorted(matching(f, doc.acls))
            for f, e in zip(filters, errors, strict=True)
        ]
        return doc.without_acls(b for m in matched for b in m), matched

    try:
        matched = await broker.security.change_acls(remove)
    except _STORAGE_ERRORS as exc:
        message = _storage_message(exc)
        _audit_acls(broker, ctx, "DeleteAcls", [], "UNKNOWN_SERVER_ERROR")
        return {
            "filter_results": [
                {"error_code": ErrorCode.unknown_server_error, "error_message": message}
                for _ in filters
            ]
        }
    deleted = sorted({b for acls in matched for b in acls})
    if deleted:
        _audit_acls(broker, ctx, "DeleteAcls", deleted, "NONE")
    results = []
    for e, acls in zip(errors, matched, strict=True):
        if e is not None:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": e})
        else:
            results.append(
                {
                    "error_code": ErrorCode.none,
                    "error_message": None,
                    "matching_acls": [_matching_acl(b) for b in acls],
                }
            )
    return {"filter_results": results}


async def describe_user_scram_credentials(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    users = None if req.users is None else [u.name for u in req.users]
    try:
        doc = await broker.security.read_scram()
    except _STORAGE_ERRORS as exc:
        return {
            "error_code": ErrorCode.unknown_server_error,
            "error_message": _storage_message(exc),
            "results": [],
        }
    results = [
        {
            "user": user,
            "error_code": code,
            "error_message": message,
            "credential_infos": [{"mechanism": m, "iterations": i} for m, i in infos],
        }
        for user, code, message, infos in describe_credentials(doc.credentials, users)
    ]
    return {"error_code": ErrorCode.none, "error_message": None, "results": results}


async def alter_user_scram_credentials(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    deletions = [Deletion(d.name, d.mechanism) for d in req.deletions]
    upsertions = [
        Upsertion(u.name, u.mechanism, u.iterations, bytes(u.salt), bytes(u.salted_password))
        for u in req.upsertions
    ]

    def alter(doc: ScramDoc) -> tuple[ScramDoc, list[dict[str, Any]]]:
        credentials, results = alter_credentials(doc.credentials, deletions, upsertions)
        out = [
            {"user": r.user, "error_code": r.error_code, "error_message": r.error_message}
            for r in results
        ]
        return doc.with_credentials(credentials), out

    try:
        results = await broker.security.change_scram(alter)
    except _STORAGE_ERRORS as exc:
        message = _storage_message(exc)
        users = dict.fromkeys([d.user for d in deletions] + [u.user for u in upsertions])
        results = [
            {"user": user, "error_code": ErrorCode.unknown_server_error, "error_message": message}
            for user in users
        ]
    _audit_scram(broker, ctx, deletions, upsertions, results)
    return {"results": results}


def _audit_scram(
    broker: BrokerServices,
    ctx: RequestContext,
    deletions: list[Deletion],
    upsertions: list[Upsertion],
    results: list[dict[str, Any]],
) -> None:
    """One scram_change line: each credential named, with its user's outcome (never a salt,
    a salted password or a key)."""
    if not deletions and not upsertions:
        return
    outcomes = {r["user"]: _code_name(r["error_code"]) for r in results}

    def mechanism(code: int) -> str:
        return MECHANISMS[code][0] if code in MECHANISMS else f"UNKNOWN({code})"

    changes = tuple(
        ScramChange(d.user, mechanism(d.mechanism), "delete", outcomes.get(d.user, "NONE"))
        for d in deletions
    ) + tuple(
        ScramChange(u.user, mechanism(u.mechanism), "upsert", outcomes.get(u.user, "NONE"))
        for u in upsertions
    )
    conn = ctx.conn
    broker.audit.record(
        ScramCredentialsChanged(
            conn.principal,
            conn.peer_host,
            conn.peer_port,
            conn.listener,
            "AlterUserScramCredentials",
            changes,
            change_outcome([c.outcome for c in changes]),
        )
    )


async def sasl_handshake(broker: BrokerServices, ctx: RequestContext, req: Any) -> dict[str, Any]:
    """On a listener without SASL, as Kafka answers it: ILLEGAL_SASL_STATE, no mechanisms
    (a SASL listener's gate answers before a processor sees the request)."""
    return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}


async def sasl_authenticate(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.illegal_sasl_state,
        "error_message": f"SaslAuthenticate on listener {ctx.conn.listener}, which has no SASL",
        "auth_bytes": b"",
        "session_lifetime": 0,
    }
