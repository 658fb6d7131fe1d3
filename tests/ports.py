"""Loopback ports for the servers tests start, taken below the kernel's ephemeral range.

A port found by binding port 0 comes from the ephemeral range, so any outgoing connection on
the machine (a client, boto3, a fleet's own RPC) can be given it between our check and the
server's bind. CI lost a fleet and a SeaweedFS that way ("Address already in use"). Ports
below the range are never handed to outgoing connections; a random start and a short
per-process reservation keep two of our own servers apart.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path

LOWEST_PORT = 16384
# Long enough for the slowest start between allocation and bind (a fleet under CI load);
# once a server is up, the bind check itself sees its ports as taken.
RESERVATION_S = 300.0
_FALLBACK_EPHEMERAL_LOW = 32768

_lock = threading.Lock()
_reserved: dict[int, float] = {}


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(count: int = 1) -> int:
    """A base port such that base .. base+count-1 are free now, outside the ephemeral range,
    and not handed out by this process in the last RESERVATION_S seconds."""
    high = _ephemeral_low() - count
    if high <= LOWEST_PORT:
        raise RuntimeError(f"no room below the ephemeral range for {count} ports")
    with _lock:
        now = time.monotonic()
        for port in [p for p, at in _reserved.items() if now - at > RESERVATION_S]:
            del _reserved[port]
        for _ in range(1000):
            base = random.randrange(LOWEST_PORT, high)
            ports = range(base, base + count)
            if any(p in _reserved for p in ports):
                continue
            if all(_bindable(p) for p in ports):
                _reserved.update(dict.fromkeys(ports, now))
                return base
    raise RuntimeError(f"no run of {count} free loopback ports found")


def free_port() -> int:
    return free_port_block(1)
