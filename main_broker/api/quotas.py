"""DescribeClientQuotas and AlterClientQuotas, answered as Apache Kafka 4.x does.

The quotas are the fleet's `cluster/quotas.json` (a lone main: its WAL), changed by
compare-and-swap like the ACLs (`main_broker.security.state`); the checks and filters are
`kafka_wire.quotas.admin`'s. Who enforces them: each zone proxy for its own zone's clients
(`proxy_broker.quotas`), from its copy of the document.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kafka_wire.quotas import admin
from kafka_wire.quotas.admin import (
    AlterOutcome,
    FilterComponent,
    InvalidQuotaFilter,
    QuotaAlteration,
    QuotaFilter,
    QuotaOp,
)
from kafka_wire.security_docs import QuotasDoc, SecurityDocError
from s3_commit import ObjectStoreError
from shared_wal import WalError

if TYPE_CHECKING:
    from main_broker.api.services import BrokerServices
    from main_broker.request import RequestContext

__all__ = ["alter_client_quotas", "describe_client_quotas"]

log = logging.getLogger("zonefleet.main_broker.quotas")

_STORAGE_ERRORS = (ObjectStoreError, SecurityDocError, WalError, OSError)


def _storage_message(exc: BaseException) -> str:
    log.warning("quotas document unavailable: %s", exc)
    return f"The client quotas could not be read or written: {exc}"


def _wire_entity(entity: dict[str, str | None]) -> list[dict[str, Any]]:
    return [{"entity_type": kind, "entity_name": name} for kind, name in entity.items()]


async def describe_client_quotas(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    try:
        components = [FilterComponent(c.entity_type, c.match_type, c.match) for c in req.components]
        quota_filter = QuotaFilter.parse(components, req.strict)
    except InvalidQuotaFilter as exc:
        return {"error_code": exc.error_code, "error_message": exc.message, "entries": None}
    try:
        doc = await broker.security.read_quotas()
    except _STORAGE_ERRORS as exc:
        return {
            "error_code": ErrorCode.unknown_server_error,
            "error_message": _storage_message(exc),
            "entries": None,
        }
    entries = [
        {
            "entity": _wire_entity(entity.to_kafka()),
            "values": [{"key": key, "value": value} for key, value in sorted(values.items())],
        }
        for entity, values in admin.describe_client_quotas(doc.quotas, quota_filter)
    ]
    return {"error_code": ErrorCode.none, "error_message": None, "entries": entries}


async def alter_client_quotas(
    broker: BrokerServices, ctx: RequestContext, req: Any
) -> dict[str, Any]:
    alterations = [
        QuotaAlteration(
            {e.entity_type: e.entity_name for e in entry.entity},
            [QuotaOp.from_wire(op.key, op.value, op.remove) for op in entry.ops],
        )
        for entry in req.entries
    ]

    def alter(doc: QuotasDoc) -> tuple[QuotasDoc, AlterOutcome]:
        outcome = admin.alter_client_quotas(doc.quotas, alterations)
        if req.validate_only:
            return doc, outcome
        return doc.with_quotas(outcome.quotas), outcome

    try:
        outcome = await broker.security.change_quotas(alter)
    except _STORAGE_ERRORS as exc:
        message = _storage_message(exc)
        return {
            "entries": [
                {
                    "error_code": ErrorCode.unknown_server_error,
                    "error_message": message,
                    "entity": _wire_entity(dict(a.entity)),
                }
                for a in alterations
            ]
        }
    if not req.validate_only:
        for result in outcome.results:
            if result.error_code == ErrorCode.none:
                log.info(
                    "client quotas of %s changed by %s", dict(result.entity), ctx.conn.principal
                )
    return {
        "entries": [
            {
                "error_code": r.error_code,
                "error_message": r.error_message,
                "entity": _wire_entity(dict(r.entity)),
            }
            for r in outcome.results
        ]
    }
