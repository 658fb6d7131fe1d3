"""Kafka error codes (kio's enum) and the sets of them that drive client behaviour."""

from __future__ import annotations

from typing import Final

from kio.schema.errors import ErrorCode

__all__ = ["RETRIABLE_METADATA_ERRORS", "WAL_FULL", "WAL_FULL_MESSAGE", "ErrorCode"]

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

#: A produce refused because the broker's WAL reached its cap (`wal.max_bytes`): uploads or
#: trimming are behind. KAFKA_STORAGE_ERROR is what Kafka answers when a log directory cannot
#: take writes (a full disk takes it offline), and clients retry it: the Java client's
#: KafkaStorageException is a RetriableException (via InvalidMetadataException) and librdkafka
#: retries it after a metadata refresh. NOT_ENOUGH_REPLICAS is retriable too, but would tell an
#: operator reading client logs about replicas that do not exist here.
WAL_FULL: Final = ErrorCode.kafka_storage_error
WAL_FULL_MESSAGE: Final = "the broker's WAL is full (wal.max_bytes); retry once uploads catch up"
