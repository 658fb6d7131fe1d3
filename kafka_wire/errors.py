"""Kafka error codes (kio's enum) and the sets of them that drive client behaviour."""

from __future__ import annotations

from typing import Final

from kio.schema.errors import ErrorCode

__all__ = ["RETRIABLE_METADATA_ERRORS", "ErrorCode"]

#: Errors after which Kafka clients refresh their metadata before retrying.
RETRIABLE_METADATA_ERRORS: Final[frozenset[ErrorCode]] = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.replica_not_available,
        ErrorCode.network_exception,
        ErrorCode.unknown_topic_id,
        ErrorCode.inconsistent_topic_id,
        ErrorCode.listener_not_found,
    }
)
