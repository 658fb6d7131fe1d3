"""Transaction markers: the control batches a partition leader appends to end a transaction.

A marker is a v2 batch with the control and transactional attribute bits, the producer's id
and epoch, no sequence, and one record whose key is the control record type (version int16 0,
type int16: 0 ABORT, 1 COMMIT) and whose value is the EndTransactionMarker (version int16 0,
coordinator epoch int32), as Kafka's ControlRecordType and EndTransactionMarker.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from kafka_wire.errors import ErrorCode
from kafka_wire.record_batch import (
    BatchInfo,
    Buffer,
    InvalidBatch,
    build_batch,
    decode_records_for_tools,
)

__all__ = ["ControlType", "build_marker", "marker_type"]

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
CONTROL_KEY_VERSION = 0
MARKER_VALUE_VERSION = 0


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1


def build_marker(
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp_ms: int,
) -> bytes:
    """The control batch ending a transaction (base offset 0: the leader assigns it)."""
    kind = ControlType.COMMIT if commit else ControlType.ABORT
    key = _KEY.pack(CONTROL_KEY_VERSION, kind)
    value = _VALUE.pack(MARKER_VALUE_VERSION, coordinator_epoch)
    return build_batch(
        [(key, value)],
        timestamp_ms=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )


def marker_type(buf: Buffer, batch: BatchInfo) -> ControlType:
    """The type of the control record in a control batch (for tools and tests: the broker
    keeps the type in its WAL record header and never reads a marker back)."""
    view = memoryview(buf)[batch.position : batch.position + batch.size]
    records = decode_records_for_tools(view)
    if not batch.is_control or len(records) != 1 or records[0][2] is None:
        raise InvalidBatch(ErrorCode.corrupt_message, "not a control batch with one record")
    key = records[0][2]
    if len(key) < _KEY.size:
        raise InvalidBatch(ErrorCode.corrupt_message, "control record key too short")
    _version, kind = _KEY.unpack_from(key)
    try:
        return ControlType(kind)
    except ValueError:
        raise InvalidBatch(ErrorCode.corrupt_message, f"unknown control type {kind}") from None
