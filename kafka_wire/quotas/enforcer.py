"""Client quotas enforced at a node that serves Kafka clients (a zone proxy, or a main for
the clients that reach it directly): the quotas document in force, the usage measured
against it per client, and what a Produce, a Fetch or any request is throttled for.

What is recorded (`kafka_wire.quotas.manager`): a Produce request's size, a Fetch
response's record bytes, and the event-loop time the node spends starting each request
(`request_percentage`). A client over a quota gets throttle_time_ms in its Produce or Fetch
response (a throttled Fetch is answered empty and un-recorded, as in Kafka) and its
connection is muted for that long (KIP-219, `ConnectionMute`), whatever the API. The
clock is trio's; nothing here does I/O.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from kafka_wire.quotas.entities import CLIENT_QUOTA_KEYS, QuotaEntity
from kafka_wire.quotas.manager import ClientQuotaManager, QuotaType
from kafka_wire.security_docs import QuotasDoc
from kafka_wire.server_loop import ConnectionInfo

__all__ = [
    "EXPIRY_INTERVAL_S",
    "QUOTA_REFRESH_S",
    "FetchQuota",
    "QuotaEnforcer",
    "quota_user",
    "summary",
]

log = logging.getLogger("zonefleet.quotas")

#: How often a node reads the quotas document: a change is in force everywhere this long
#: plus one read after AlterClientQuotas answered.
QUOTA_REFRESH_S: Final = 5.0
#: How often usage idle for an hour is dropped.
EXPIRY_INTERVAL_S: Final = 60.0


def quota_user(principal: str) -> str:
    """The quota user of a principal (`User:alice` is alice; KafkaPrincipal's name)."""
    return principal.partition(":")[2] or principal


class FetchQuota:
    """One Fetch's view of its client's consumer_byte_rate (`kafka_wire.fetch_serving`)."""

    __slots__ = ("_client_id", "_conn", "_manager", "_user")

    def __init__(
        self, manager: ClientQuotaManager, conn: ConnectionInfo, client_id: str | None
    ) -> None:
        self._manager = manager
        self._conn = conn
        self._user = quota_user(conn.principal)
        self._client_id = client_id

    def max_bytes(self, requested: int) -> int:
        """The request's max_bytes, capped so that one response alone cannot stall the
        client behind its quota for more than the quota's window."""
        cap = self._manager.max_value_in_window(QuotaType.FETCH, self._user, self._client_id)
        return requested if cap is None else max(1, min(requested, int(cap)))

    def throttle_ms(self, response_bytes: int) -> int:
        """Records a response of this size; > 0: the client is over its quota, so the
        response is to be empty, what was recorded is taken back, and the connection is
        muted for as long."""
        manager, now = self._manager, trio.current_time()
        user, client_id = self._user, self._client_id
        throttle = manager.record_and_throttle_ms(
            QuotaType.FETCH, user, client_id, response_bytes, now
        )
        if throttle > 0:
            manager.unrecord(QuotaType.FETCH, user, client_id, response_bytes, now)
            self._conn.mute.mute_for(throttle)
        return throttle


class QuotaEnforcer:
    """The quotas in force at one node and the usage measured against them, per client."""

    def __init__(self) -> None:
        self.manager = ClientQuotaManager()
        self.version = -1  # of the quotas document in force
        self.synced = trio.Event()

    def update(self, doc: QuotasDoc) -> None:
        # ip entities limit connection creation, which a proxy does not enforce (yet).
        quotas = {
            entity: {k: v for k, v in values.items() if k in CLIENT_QUOTA_KEYS}
            for entity, values in doc.quotas.items()
            if entity.ip is None
        }
        if doc.version != self.version:
            self.manager.set_quotas({e: v for e, v in quotas.items() if v})
            if self.synced.is_set():
                log.info("client quotas now version %d: %s", doc.version, summary(quotas))
        self.version = doc.version
        self.synced.set()

    def expire_idle(self) -> int:
        """Drops the usage of clients idle for an hour (call now and then)."""
        return self.manager.expire(trio.current_time())

    def limits(self, conn: ConnectionInfo, client_id: str | None) -> bool:
        """Whether any quota applies to this client (it is then served by one node per zone:
        `zone_router.topology.Topology.proxied`)."""
        user = quota_user(conn.principal)
        return any(
            self.manager.quota(quota_type, user, client_id).value is not None
            for quota_type in QuotaType
            if self.manager.enabled(quota_type)
        )

    def produce_throttle_ms(self, conn: ConnectionInfo, client_id: str | None, nbytes: int) -> int:
        return self.manager.record_and_throttle_ms(
            QuotaType.PRODUCE, quota_user(conn.principal), client_id, nbytes, trio.current_time()
        )

    def request_throttle_ms(
        self, conn: ConnectionInfo, client_id: str | None, nanoseconds: int
    ) -> int:
        return self.manager.record_and_throttle_ms(
            QuotaType.REQUEST,
            quota_user(conn.principal),
            client_id,
            nanoseconds,
            trio.current_time(),
        )

    def fetch_quota(self, conn: ConnectionInfo, client_id: str | None) -> FetchQuota | None:
        """None when no consumer_byte_rate is configured at any level (nothing to measure)."""
        if not self.manager.enabled(QuotaType.FETCH):
            return None
        return FetchQuota(self.manager, conn, client_id)


def summary(quotas: dict[QuotaEntity, dict[str, float]]) -> str:
    return ", ".join(f"{entity} {values}" for entity, values in quotas.items()) or "none"
