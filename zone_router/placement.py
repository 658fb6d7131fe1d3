"""Which main broker serves what: partition placement and group coordinators.

Both broker kinds must agree on these without talking to each other, so they are pure,
deterministic functions of names and the sorted list of main broker ids.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

__all__ = ["group_coordinator", "place_partitions"]


def _stable_hash(name: str) -> int:
    # Python's hash() is salted per process; every node must compute the same value.
    return zlib.crc32(name.encode())


def place_partitions(topic: str, count: int, mains: Sequence[int], first: int = 0) -> list[int]:
    """Leaders for partitions first..first+count-1: round-robin over the mains from a start
    that depends on the topic, so small topics do not all land on the lowest main."""
    if not mains:
        raise ValueError("no main brokers to place partitions on")
    ordered = sorted(mains)
    start = _stable_hash(topic) % len(ordered)
    return [ordered[(start + p) % len(ordered)] for p in range(first, first + count)]


def group_coordinator(group_id: str, mains: Sequence[int]) -> int:
    """The main broker that coordinates a consumer group (Kafka hashes the group onto a
    partition of __consumer_offsets; we hash it onto a main)."""
    if not mains:
        raise ValueError("no main brokers to coordinate groups")
    ordered = sorted(mains)
    return ordered[_stable_hash(group_id) % len(ordered)]
