"""Warnings about bad input, rate-limited per peer and counted.

A misbehaving client (or a fuzzer) can send thousands of malformed requests a second; each is
answered (or its connection closed) and deserves a line, but not thousands of lines. Each
peer gets a small burst of lines, then one line per interval; the lines held back are counted
and said in the next line that goes out. Every warning, shown or not, increments a counter
(a metric, by kind), so the rate stays visible.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["BadInputLog"]


class _Bucket:
    __slots__ = ("suppressed", "tokens", "updated")

    def __init__(self, tokens: float, now: float) -> None:
        self.tokens = tokens
        self.updated = now
        self.suppressed = 0


class BadInputLog:
    """`warn(peer, kind, fmt, *args)`: a warning line unless the peer used up its share.

    `burst` lines at once, then one every `interval_s` per peer; at most `max_peers` peers
    are tracked (the least recently seen is forgotten first), so memory stays bounded
    whatever the number of addresses. `count(kind)` is called for every warning."""

    def __init__(
        self,
        logger: logging.Logger,
        count: Callable[[str], None] | None = None,
        *,
        burst: int = 5,
        interval_s: float = 10.0,
        max_peers: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.count = count
        self.burst = burst
        self.interval_s = interval_s
        self.max_peers = max_peers
        self.clock = clock
        self._peers: OrderedDict[str, _Bucket] = OrderedDict()

    def warn(self, peer: str, kind: str, fmt: str, *args: object) -> bool:
        """Log (or hold back) one warning; returns whether it was logged."""
        if self.count is not None:
            self.count(kind)
        now = self.clock()
        bucket = self._peers.get(peer)
        if bucket is None:
            bucket = self._peers[peer] = _Bucket(float(self.burst), now)
            if len(self._peers) > self.max_peers:
                self._peers.popitem(last=False)
        else:
            self._peers.move_to_end(peer)
            refill = (now - bucket.updated) / self.interval_s
            bucket.tokens = min(float(self.burst), bucket.tokens + refill)
            bucket.updated = now
        if bucket.tokens < 1.0:
            bucket.suppressed += 1
            return False
        bucket.tokens -= 1.0
        held, bucket.suppressed = bucket.suppressed, 0
        if held:
            fmt += " (%d more from %s held back)"
            args = (*args, held, peer)
        self.logger.warning(fmt, *args, extra={"peer": peer, "bad_input": kind})
        return True
