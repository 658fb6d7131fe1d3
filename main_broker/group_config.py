"""Settings of the group coordinators (classic and KIP-848 consumer groups)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GroupConfig:
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 300
    group_max_size: int = 2**31 - 1
    offset_metadata_max_bytes: int = 4096
    # A member that joined but never completed a rebalance is dropped after this (Kafka: 5 min).
    new_member_join_timeout_ms: int = 300_000
    # An Empty group without offsets is forgotten after this.
    empty_group_retention_ms: int = 600_000
    # KIP-848 consumer groups (Kafka's group.consumer.* defaults).
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000
