"""Client quotas at a zone proxy: the fleet's `cluster/quotas.json`, followed every
`QUOTA_REFRESH_S` into the proxy's `QuotaEnforcer` (kafka_wire/quotas/enforcer.py), which
throttles this zone's clients (issue 15).

A proxy is to its zone's clients what a Kafka broker is to its own: Kafka enforces a quota
on each broker separately, and so does each proxy (and each main, for the clients that
reach it directly), with no traffic between zones. A client whose connections all go to
its zone's nodes is limited to its quota at each of them; a client id used from three
zones at once gets the quota in each, as a Kafka client spread over three brokers does.
"""

from __future__ import annotations

from typing import NoReturn

import trio

from kafka_wire.quotas.enforcer import EXPIRY_INTERVAL_S, QUOTA_REFRESH_S, QuotaEnforcer
from kafka_wire.security_docs import QUOTAS_DOC, QuotasDoc
from proxy_broker.documents import follow_document
from s3_commit import AsyncObjectStore

__all__ = ["keep_quotas_fresh"]


async def keep_quotas_fresh(quotas: QuotaEnforcer, store: AsyncObjectStore) -> NoReturn:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expire_idle, quotas)
        await follow_document(store, QUOTAS_DOC, QuotasDoc.parse, quotas.update, QUOTA_REFRESH_S)
    raise AssertionError("unreachable")  # follow_document never returns


async def _expire_idle(quotas: QuotaEnforcer) -> None:
    while True:
        await trio.sleep(EXPIRY_INTERVAL_S)
        quotas.expire_idle()
