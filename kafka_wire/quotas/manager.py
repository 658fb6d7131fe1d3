"""The client quotas of one broker or proxy: a rate per quota type and sensor, and the
throttle time of each request, as Kafka's ClientQuotaManager and ClientRequestQuotaManager.

The caller records what a request used and gets back how long to throttle the client: the
response carries that as throttle_time_ms, and the connection is muted for as long (KIP-219).
What is recorded, as in Kafka's KafkaApis:

- PRODUCE: the Produce request's size in bytes;
- FETCH: the Fetch response's size in bytes; a throttled fetch is answered empty, and
  `unrecord` takes its bytes back;
- REQUEST: the nanoseconds the broker spent handling the request (request_percentage is a
  percentage of one thread's time, so 1 s of handling time in a 1 s window is 100).

A type with no quota configured at any level records nothing. The rates live in memory only:
a restart starts every client from zero, as in Kafka.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from kafka_wire.quotas.entities import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
    Quotas,
    ResolvedQuota,
    SensorKey,
    resolve_key,
)
from kafka_wire.quotas.rate import QuotaWindow, Rate, UsageBucket, now_ms

__all__ = [
    "INACTIVE_SENSOR_EXPIRATION_SECONDS",
    "ClientQuotaManager",
    "QuotaType",
]

#: A client's rate is dropped after this long without a record (ClientQuotaManager).
INACTIVE_SENSOR_EXPIRATION_SECONDS = 3600
_PERCENT_PER_NANOSECOND = 100 / 1e9


class QuotaType(enum.StrEnum):
    """A rate that is limited per client; its value is the quota key that limits it."""

    PRODUCE = PRODUCER_BYTE_RATE
    FETCH = CONSUMER_BYTE_RATE
    REQUEST = REQUEST_PERCENTAGE


class _Sensor:
    """One client's usage of one quota type: the sampled rate it is measured by, and the
    bucket it is throttled by (`kafka_wire.quotas.rate`)."""

    __slots__ = ("bucket", "rate")

    def __init__(self, window: QuotaWindow) -> None:
        self.rate = Rate(window)
        self.bucket = UsageBucket()


class ClientQuotaManager:
    """The configured quotas and the rates measured against them. Not thread-safe: one trio
    task at a time (a node has one event loop)."""

    __slots__ = ("_enabled", "_quotas", "_sensors", "window")

    def __init__(self, quotas: Quotas | None = None, window: QuotaWindow | None = None) -> None:
        self.window = window or QuotaWindow()
        self._sensors: dict[tuple[QuotaType, SensorKey], _Sensor] = {}
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._enabled: frozenset[QuotaType] = frozenset()
        self.set_quotas(quotas or {})

    @property
    def quotas(self) -> Mapping[QuotaEntity, Mapping[str, float]]:
        return self._quotas

    def set_quotas(self, quotas: Quotas) -> None:
        """Replaces the configured quotas (what applying an AlterClientQuotas does). Later
        records are checked against them; the usage measured so far stays, as in Kafka, where
        a changed quota updates the existing sensors. A value must be > 0 (ValueError)."""
        copied: dict[QuotaEntity, dict[str, float]] = {}
        for entity, values in quotas.items():
            for key, value in values.items():
                if not value > 0:
                    raise ValueError(f"quota {key} of {entity} must be > 0, not {value}")
            if values:
                copied[entity] = dict(values)
        self._quotas = copied
        self._enabled = frozenset(
            quota_type
            for quota_type in QuotaType
            if any(quota_type.value in values for values in copied.values())
        )

    def enabled(self, quota_type: QuotaType) -> bool:
        """Whether any level configures this type (else nothing of it is measured)."""
        return quota_type in self._enabled

    def quota(
        self, quota_type: QuotaType, user: str | None, client_id: str | None
    ) -> ResolvedQuota:
        """The quota of this type that applies to a client (user None: not authenticated)."""
        return resolve_key(self._quotas, quota_type.value, user, client_id)

    def record_and_throttle_ms(
        self,
        quota_type: QuotaType,
        user: str | None,
        client_id: str | None,
        value: float,
        now: float,
    ) -> int:
        """Records what a request used (module docstring) at `now` (seconds) and returns the
        milliseconds to throttle the client, 0 if it is within its quota. A REQUEST throttle
        is at most one window, as in Kafka; byte-rate throttles are not capped."""
        recorded = self._record(quota_type, user, client_id, value, now)
        if recorded is None:
            return 0
        sensor, quota = recorded
        if quota is None:
            return 0
        burst = quota * (self.window.samples - 1) * self.window.size_seconds
        throttle_ms = sensor.bucket.throttle_ms(quota, burst, now)
        if quota_type is QuotaType.REQUEST:
            return min(throttle_ms, self.window.size_ms)
        return throttle_ms

    def record(
        self,
        quota_type: QuotaType,
        user: str | None,
        client_id: str | None,
        value: float,
        now: float,
    ) -> None:
        """Records without a check (Kafka's recordNoThrottle: a request's network-thread time,
        known only once the response is sent); the client's next request pays for it."""
        self._record(quota_type, user, client_id, value, now)

    def unrecord(
        self,
        quota_type: QuotaType,
        user: str | None,
        client_id: str | None,
        value: float,
        now: float,
    ) -> None:
        """Takes back what was recorded: a throttled Fetch is answered empty."""
        self.record(quota_type, user, client_id, -value, now)

    def max_value_in_window(
        self, quota_type: QuotaType, user: str | None, client_id: str | None
    ) -> float | None:
        """The most one request can use without being throttled for sure, even after an idle
        window: quota * (samples - 1) * window seconds (None: no limit). A consumer's Fetch
        max_bytes is capped at this, so that a low quota cannot stall it."""
        value = self.quota(quota_type, user, client_id).value
        if value is None:
            return None
        return value * (self.window.samples - 1) * self.window.size_seconds

    def expire(self, now: float) -> int:
        """Drops the rates not recorded in for more than an hour; returns how many."""
        horizon = now_ms(now) - INACTIVE_SENSOR_EXPIRATION_SECONDS * 1000
        idle = [
            key for key, sensor in self._sensors.items() if sensor.rate.last_record_ms < horizon
        ]
        for key in idle:
            del self._sensors[key]
        return len(idle)

    def sensor_count(self) -> int:
        return len(self._sensors)

    def measured(self, quota_type: QuotaType, sensor: SensorKey, now: float) -> float | None:
        """The current rate of one sensor (None: it does not exist), for metrics and tests;
        a REQUEST rate is a percentage."""
        found = self._sensors.get((quota_type, sensor))
        return None if found is None else found.rate.measure(now)

    def _record(
        self,
        quota_type: QuotaType,
        user: str | None,
        client_id: str | None,
        value: float,
        now: float,
    ) -> tuple[_Sensor, float | None] | None:
        """Records into the client's sensor; that sensor and its quota (None: no limit), or
        None when no quota of this type is configured at all (nothing is measured then)."""
        if quota_type not in self._enabled:
            return None
        resolved = self.quota(quota_type, user, client_id)
        key = (quota_type, resolved.sensor)
        sensor = self._sensors.get(key)
        if sensor is None:
            sensor = self._sensors[key] = _Sensor(self.window)
        amount = self._amount(quota_type, value)
        sensor.rate.record(amount, now)
        sensor.bucket.add(amount, resolved.value, now)
        return sensor, resolved.value

    @staticmethod
    def _amount(quota_type: QuotaType, value: float) -> float:
        if quota_type is QuotaType.REQUEST:
            return value * _PERCENT_PER_NANOSECOND
        return value
