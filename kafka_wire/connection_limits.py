"""Kafka's `max.connections` and `max.connections.per.ip`, without I/O.

A node asks `admit(ip)` for each accepted connection before it reads from it, and calls
`release(ip)` once the connection is gone. A refused connection is closed at once (Kafka's
acceptor does the same for a host over its per-IP quota), so thousands of connections from
one misbehaving host cannot use up the node's file descriptors and memory while its other
clients are served.
"""

from __future__ import annotations

import resource
from collections import Counter

__all__ = ["ConnectionLimits", "raise_open_files_limit"]


def raise_open_files_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit and returns it.

    Each client connection is a file descriptor, and the usual soft limit (1,024) would refuse
    connections long before max_connections or memory does (5,000 idle connections cost a node
    about 14 MiB, docs/reliability.md); the hard limit is what the operator allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # keep the soft limit it had (macOS caps it below an infinite hard limit)
    return soft


class ConnectionLimits:
    """`max_connections` in all, `max_per_ip` from one address (0: no limit), and the bytes of
    requests one connection may have under way (read, not yet answered), which
    `kafka_wire.server_loop.serve_connection` enforces by not reading past them
    (`max_in_flight_bytes`, 0: the node's largest request, `max_request_bytes`).

    `in_flight_bytes` (all connections) and `peak_in_flight_bytes` (the most one connection
    has held) are what a node exports, so the bound can be watched."""

    __slots__ = (
        "_by_ip",
        "in_flight_bytes",
        "max_connections",
        "max_in_flight_bytes",
        "max_per_ip",
        "peak_in_flight_bytes",
        "total",
    )

    def __init__(
        self, max_connections: int = 0, max_per_ip: int = 0, max_in_flight_bytes: int = 0
    ) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.max_in_flight_bytes = max_in_flight_bytes
        self.total = 0
        self.in_flight_bytes = 0
        self.peak_in_flight_bytes = 0
        self._by_ip: Counter[str] = Counter()

    def add_in_flight(self, connection_bytes: int, delta: int) -> None:
        """One connection's bytes under way changed by `delta`, to `connection_bytes`."""
        self.in_flight_bytes += delta
        if connection_bytes > self.peak_in_flight_bytes:
            self.peak_in_flight_bytes = connection_bytes

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
