"""Bounded retries with jittered exponential backoff, for object-store requests.

The store decides what is retriable; this module only paces the attempts and gives up after
`max_attempts`. "Full jitter" (a uniform delay up to the exponential cap) spreads the retries
of many writers that were throttled at the same moment.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["RetriesExhausted", "RetryPolicy", "call_with_retries"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 6  # the first attempt included
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def delay_s(self, retry: int) -> float:
        """The pause before retry number `retry` (0 for the first retry)."""
        cap = min(self.max_delay_s, self.base_delay_s * (2**retry))
        return self.rng.uniform(0.0, cap)


class RetriesExhausted(Exception):
    """Every attempt failed with a retriable error; `last` is the final one."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        super().__init__(f"gave up after {attempts} attempts: {last}")
        self.attempts = attempts
        self.last = last


def call_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy,
    retriable: Callable[[BaseException], bool],
    *,
    on_retry: Callable[[BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn` until it returns, raises something not `retriable`, or the attempts run out
    (RetriesExhausted). `on_retry` sees each retriable failure before the pause."""
    for attempt in range(policy.max_attempts):
        try:
            return fn()
        except Exception as exc:
            if not retriable(exc):
                raise
            if on_retry is not None:
                on_retry(exc)
            if attempt + 1 >= policy.max_attempts:
                raise RetriesExhausted(policy.max_attempts, exc) from exc
            sleep(policy.delay_s(attempt))
    raise AssertionError("unreachable")
