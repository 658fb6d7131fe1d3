"""How long a failed authentication waits before its answer, per peer host.

Kafka delays the answer to a failed authentication by `connection.failed.authentication.
delay.ms` (100 ms) so that a password guesser gets fewer tries a second. Here the delay also
doubles with each failure from the same host within a window, up to a cap, and a success
resets it. The table of hosts is bounded: the oldest entries go first.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["FailedAuthDelay"]


class FailedAuthDelay:
    def __init__(
        self,
        base_ms: int = 100,
        max_ms: int = 5000,
        window_s: float = 60.0,
        max_hosts: int = 10_000,
    ) -> None:
        self.base_s = max(0, base_ms) / 1000
        self.max_s = max(self.base_s, max_ms / 1000)
        self.window_s = window_s
        self.max_hosts = max_hosts
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # count, last

    def failed(self, host: str, now: float) -> float:
        """Records a failure from `host`; returns the seconds its answer should wait."""
        count, last = self._failures.pop(host, (0, now))
        count = count + 1 if now - last <= self.window_s else 1
        self._failures[host] = (count, now)
        while len(self._failures) > self.max_hosts:
            self._failures.popitem(last=False)
        return min(self.max_s, self.base_s * 2 ** min(count - 1, 16))

    def succeeded(self, host: str) -> None:
        self._failures.pop(host, None)
