"""KIP-951 leader hints in Produce and Fetch responses.

A partition that fails with NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH carries the leader
the client should use next (``current_leader``), and the response lists that node's endpoint
(``node_endpoints``), so the client can move without a Metadata round trip. Produce has both
from v10; Fetch has ``current_leader`` from v12 and ``node_endpoints`` from v16.

Which node to name is the broker's business (a zone-aware broker names the node of the
client's zone), so the broker hands in a ``HintSource``; this module only picks the
partitions that need a hint and puts the answer into the results. It costs nothing when no
partition failed that way, which is every response on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kio.schema.errors import ErrorCode

from kafka_wire.hot_codecs import FetchPartitionResult, ProducePartitionResult

__all__ = [
    "FETCH_ENDPOINTS_VERSION",
    "FETCH_HINTS_VERSION",
    "HINT_ERRORS",
    "PRODUCE_HINTS_VERSION",
    "Endpoint",
    "HintSource",
    "PartitionKey",
    "fill_fetch_hints",
    "fill_produce_hints",
]

# The errors Kafka (3.7+) answers with a current leader.
HINT_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})
PRODUCE_HINTS_VERSION = 10
FETCH_HINTS_VERSION = 12
FETCH_ENDPOINTS_VERSION = 16

PartitionKey = tuple[str, int]  # (topic name, partition)
Endpoint = tuple[int, str, int, str | None]  # (node_id, host, port, rack)


class HintSource(Protocol):
    def __call__(
        self, partitions: Sequence[PartitionKey]
    ) -> tuple[Mapping[PartitionKey, tuple[int, int]], list[Endpoint]]:
        """(leader_id, leader_epoch) for the partitions whose leader is known, and the
        endpoints of those leaders. Partitions left out get no hint."""
        ...


def fill_produce_hints(
    version: int,
    topics: Sequence[tuple[str, Sequence[ProducePartitionResult]]],
    source: HintSource | None,
) -> list[Endpoint] | None:
    """Sets ``current_leader`` on the failed partitions; returns the node endpoints."""
    if source is None or version < PRODUCE_HINTS_VERSION:
        return None
    failed = [(name, p) for name, parts in topics for p in parts if p.error_code in HINT_ERRORS]
    if not failed:
        return None
    leaders, endpoints = source([(name, p.index) for name, p in failed])
    for name, p in failed:
        p.current_leader = leaders.get((name, p.index))
    return endpoints


def fill_fetch_hints(
    version: int,
    topics: Sequence[tuple[str, bytes, Sequence[FetchPartitionResult]]],
    source: HintSource | None,
) -> list[Endpoint] | None:
    """Sets ``current_leader`` on the failed partitions; returns the node endpoints (v16+)."""
    if source is None or version < FETCH_HINTS_VERSION:
        return None
    failed = [(name, p) for name, _, parts in topics for p in parts if p.error_code in HINT_ERRORS]
    if not failed:
        return None
    leaders, endpoints = source([(name, p.index) for name, p in failed])
    for name, p in failed:
        p.current_leader = leaders.get((name, p.index))
    return endpoints if version >= FETCH_ENDPOINTS_VERSION else None
