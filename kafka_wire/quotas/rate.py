"""A sampled rate and the throttle time of a client over its quota (KIP-13, KIP-124), as
Kafka's `Rate` over a `WindowedSum` and `QuotaUtils.throttleTime` compute them.

A rate keeps up to `samples + 1` samples, each `size_seconds` long. A sample starts at the
first record that finds the current one complete; a sample whose last record is
`samples * size_seconds` old or more is emptied when the rate is read. The rate is the sum
of the samples over a span W that runs from the start of the oldest sample to now, but is
never less than `samples - 1` whole windows (so the first records of a new client are not
read as a burst) nor less than 1 ms.

When the rate O after a record exceeds the quota T, the client is throttled for the time
that brings O back to T had it sent nothing more: O * W / (W + X) = T, so
X = (O - T) / T * W, rounded half up to a millisecond. Byte-rate throttles are not capped
but for the int32 a response holds; request-rate throttles are capped at one window
(ClientRequestQuotaManager).

That sampled rate is what is measured (metrics). What throttles is `UsageBucket`, a leaky
bucket with the same burst Kafka's rate allows a new client, `samples - 1` windows of the
quota: a client's usage drains at the quota, and a client whose usage is over the burst
waits (usage - burst) / quota. For a client's first records it gives Kafka's throttle time;
for a client that stays over its quota it gives exactly the quota, where the sampled rate
lets a client alternate bursts and long waits as big samples leave the window (Kafka's own
TokenBucket, KIP-599, was added for that reason; a producer saturating a 512 KiB/s quota
gets 1.10-1.13x the quota over a minute with the sampled rate, 1.00x with the bucket).

Time is a float seconds clock that the caller passes in, read as whole milliseconds as
Kafka's clock is. It must not go backwards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "MAX_THROTTLE_MS",
    "QuotaWindow",
    "Rate",
    "UsageBucket",
    "now_ms",
    "throttle_time_ms",
]

MAX_THROTTLE_MS = 2**31 - 1  # an int32 field


@dataclass(frozen=True, slots=True)
class QuotaWindow:
    """`quota.window.num` (samples) and `quota.window.size.seconds`, Kafka's defaults."""

    samples: int = 11
    size_seconds: int = 1

    def __post_init__(self) -> None:
        if self.samples < 1 or self.size_seconds < 1:
            raise ValueError("quota.window.num and quota.window.size.seconds must be >= 1")

    @property
    def size_ms(self) -> int:
        return self.size_seconds * 1000


def now_ms(now: float) -> int:
    """A float seconds clock as Kafka's millisecond clock."""
    return round(now * 1000)


def throttle_time_ms(rate: float, quota: float, span_ms: int) -> int:
    """How long a client measured at `rate` over `span_ms` waits to be back at `quota` (> 0):
    (rate - quota) / quota * span, rounded half up (0 when within the quota). At most
    MAX_THROTTLE_MS, what a response's throttle_time_ms holds; Kafka casts the long to an int
    and so would answer a negative time for a client some 25 days over."""
    if rate <= quota:
        return 0
    return min(math.floor((rate - quota) / quota * span_ms + 0.5), MAX_THROTTLE_MS)


class _Sample:
    __slots__ = ("last_event_ms", "start_ms", "value")

    def __init__(self, at_ms: int) -> None:
        self.start_ms = at_ms
        self.last_event_ms = at_ms
        self.value = 0.0

    def reset(self, at_ms: int) -> None:
        self.start_ms = at_ms
        self.last_event_ms = at_ms
        self.value = 0.0


class Rate:
    """A sum per second over the last few windows; `record` adds to it."""

    __slots__ = ("_current", "_samples", "last_record_ms", "window")

    def __init__(self, window: QuotaWindow) -> None:
        self.window = window
        self._samples: list[_Sample] = []
        self._current = 0
        self.last_record_ms = 0

    def record(self, value: float, now: float) -> None:
        at = now_ms(now)
        self.last_record_ms = at
        if not self._samples:
            self._samples.append(_Sample(at))
        sample = self._samples[self._current]
        if at - sample.start_ms >= self.window.size_ms:
            # One slot more than `samples`: the oldest may still overlap the measured span.
            self._current = (self._current + 1) % (self.window.samples + 1)
            if self._current == len(self._samples):
                self._samples.append(_Sample(at))
            else:
                self._samples[self._current].reset(at)
            sample = self._samples[self._current]
        sample.value += value
        sample.last_event_ms = at

    def total(self, now: float) -> float:
        """The sum of the samples still in the span."""
        self._purge(now_ms(now))
        return sum(sample.value for sample in self._samples)

    def span_ms(self, now: float) -> int:
        """The span W that `measure` divides by."""
        at = now_ms(now)
        self._purge(at)
        if not self._samples:
            self._samples.append(_Sample(at))
        elapsed = at - min(sample.start_ms for sample in self._samples)
        least = self.window.samples - 1
        full = elapsed // self.window.size_ms
        if full < least:
            elapsed += (least - full) * self.window.size_ms
        return max(elapsed, 1)

    def measure(self, now: float) -> float:
        """The rate per second at `now`."""
        return self.total(now) / (self.span_ms(now) / 1000)

    def throttle_ms(self, quota: float, now: float) -> int:
        """0 if the rate is within `quota`, else Kafka's throttle time (uncapped)."""
        return throttle_time_ms(self.measure(now), quota, self.span_ms(now))

    def _purge(self, at_ms: int) -> None:
        expire_ms = self.window.samples * self.window.size_ms
        for sample in self._samples:
            if at_ms - sample.last_event_ms >= expire_ms:
                sample.reset(at_ms)


class UsageBucket:
    """A client's usage not yet drained by its quota: what it may still use before a
    throttle is the burst less `level`."""

    __slots__ = ("_last_ms", "level")

    def __init__(self) -> None:
        self.level = 0.0
        self._last_ms: int | None = None

    def add(self, value: float, quota: float | None, now: float) -> None:
        """Records usage (a negative value takes usage back). Without a quota nothing
        accumulates: a quota configured later starts from an empty bucket."""
        self._drain(quota, now_ms(now))
        self.level = 0.0 if quota is None else max(0.0, self.level + value)

    def throttle_ms(self, quota: float, burst: float, now: float) -> int:
        self._drain(quota, now_ms(now))
        over = self.level - burst
        if over <= 0:
            return 0
        return min(math.floor(over / quota * 1000 + 0.5), MAX_THROTTLE_MS)

    def _drain(self, quota: float | None, at_ms: int) -> None:
        if quota is not None and self._last_ms is not None and at_ms > self._last_ms:
            self.level = max(0.0, self.level - quota * (at_ms - self._last_ms) / 1000)
        self._last_ms = at_ms
