"""Whether a Produce partition may go on at all, before its batch is looked at: the one
admission rule a main's direct produce, a main's confirm and a zone proxy all apply.

Pure: each caller says what it knows (its own WAL's health, whether the partition exists and
is led where the records go). A `Refusal` is what the partition is answered with.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_wire.errors import WAL_FULL, WAL_FULL_MESSAGE, ErrorCode

__all__ = ["Refusal", "produce_admission"]

VALID_ACKS = (0, 1, -1)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A partition's error answer: code, message, and Kafka's per-record errors (index of
    the record in its batch, message)."""

    error_code: ErrorCode
    message: str | None = None
    record_errors: tuple[tuple[int, str | None], ...] = ()


INVALID_ACKS = Refusal(ErrorCode.invalid_required_acks)
UNKNOWN_PARTITION = Refusal(ErrorCode.unknown_topic_or_partition)
NOT_LEADER = Refusal(ErrorCode.not_leader_or_follower)
WAL_IS_FULL = Refusal(WAL_FULL, WAL_FULL_MESSAGE)
EMPTY_RECORDS = Refusal(ErrorCode.invalid_record, "empty records")


def produce_admission(
    *,
    acks: int,
    known: bool,
    leads: bool,
    storage_failure: str | None,
    wal_full: bool,
    records_size: int | None,
) -> Refusal | None:
    """None when the partition may be appended to; otherwise why not, in Kafka's order of
    checks. `known`: the partition exists here; `leads`: the records go to its leader (a
    proxy: it knows which main leads it); `storage_failure`: why the WAL these records go to
    takes no writes (None when it does); `records_size`: the batch's size (None: no records)."""
    if acks not in VALID_ACKS:
        return INVALID_ACKS
    if not known:
        return UNKNOWN_PARTITION
    if not leads:
        return NOT_LEADER
    if storage_failure is not None:
        return Refusal(ErrorCode.kafka_storage_error, storage_failure)
    if wal_full:
        return WAL_IS_FULL
    if not records_size:
        return EMPTY_RECORDS
    return None
