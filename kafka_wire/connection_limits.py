"""Kafka's `max.connections` and `max.connections.per.ip`, without I/O.

A node asks `admit(ip)` for each accepted connection before it reads from it, and calls
`release(ip)` once the connection is gone. A refused connection is closed at once (Kafka's
acceptor does the same for a host over its per-IP quota), so thousands of connections from
one misbehaving host cannot use up the node's file descriptors and memory while its other
clients are served.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["ConnectionLimits"]


class ConnectionLimits:
    """`max_connections` in all, `max_per_ip` from one address (0: no limit)."""

    __slots__ = ("_by_ip", "max_connections", "max_per_ip", "total")

    def __init__(self, max_connections: int = 0, max_per_ip: int = 0) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.total = 0
        self._by_ip: Counter[str] = Counter()

    def admit(self, ip: str) -> str | None:
        """None when the connection may be served (it is counted); else why not."""
        if self.max_connections and self.total >= self.max_connections:
            return f"the node has {self.total} connections (max_connections)"
        if self.max_per_ip and self._by_ip[ip] >= self.max_per_ip:
            return f"{ip} has {self._by_ip[ip]} connections (max_connections_per_ip)"
        self.total += 1
        self._by_ip[ip] += 1
        return None

    def release(self, ip: str) -> None:
        self.total -= 1
        self._by_ip[ip] -= 1
        if self._by_ip[ip] <= 0:
            del self._by_ip[ip]

    def connections_from(self, ip: str) -> int:
        return self._by_ip.get(ip, 0)
