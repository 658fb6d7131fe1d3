"""The main broker's WAL record vocabulary: headers of its DATA, LINK, CONTROL and SNAPSHOT
records, and how a LINK's batch is rebuilt from the proxy's PREPARED record it points to.

A main writes these; proxies tail them and a new owner replays a dead main's WAL, so the keys
are part of the on-disk format documented in docs/formats.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from kafka_wire.record_batch import assign_offsets, parse_batch_header, stamp_log_append_time
from shared_wal.reader import WalReader
from shared_wal.record import CorruptRecord, RecordType, WalPosition

SNAPSHOT_VERSION = 1


def data_header(
    topic: str,
    partition: int,
    base_offset: int,
    last_offset: int,
    max_timestamp: int,
    producer: tuple[int, int, int, int, int] | None = None,
    transactional: bool = False,
) -> dict[str, Any]:
    """Header of a DATA record; `producer` is (id, epoch, base seq, last seq, append time ms).
    A transactional batch's header says so (`tx`), so replay knows the transactions a
    partition has open without reading the batch."""
    header: dict[str, Any] = {
        "t": topic,
        "p": partition,
        "b": base_offset,
        "l": last_offset,
        "ts": max_timestamp,
    }
    if producer is not None:
        header["pid"], header["pe"], header["s"], header["ls"], header["at"] = producer
        if transactional:
            header["tx"] = 1
    return header


def marker_header(
    topic: str,
    partition: int,
    offset: int,
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
) -> dict[str, Any]:
    """Header of the DATA record of a transaction marker (a control batch): `cm` is its
    type (1 COMMIT, 0 ABORT), so replay closes the producer's transaction from the header."""
    return {
        "t": topic,
        "p": partition,
        "b": offset,
        "l": offset,
        "ts": timestamp,
        "pid": producer_id,
        "pe": producer_epoch,
        "cm": int(commit),
    }


def link_header(
    data: dict[str, Any],
    prepared: WalPosition,
    batch_size: int,
    leader_epoch: int,
    log_append_time: bool,
) -> dict[str, Any]:
    """Header of a LINK record: a DATA header whose batch bytes live in a proxy's PREPARED
    record. A reader rebuilds the served batch by patching base offset and leader epoch (and,
    for LogAppendTime, stamping `ts`), exactly as the main did when it appended."""
    return {
        **data,
        "w": prepared.writer,
        "sg": prepared.segment,
        "ps": prepared.position,
        "ln": prepared.length,
        "sz": batch_size,
        "e": leader_epoch,
        "lat": log_append_time,
    }


def link_target(header: dict[str, Any]) -> WalPosition:
    return WalPosition(header["w"], header["sg"], header["ps"], header["ln"])


def topic_create_header(
    name: str, topic_id: bytes, partitions: int, configs: dict[str, str]
) -> dict[str, Any]:
    return {"k": "topic_create", "n": name, "id": topic_id, "np": partitions, "c": configs}


def topic_delete_header(name: str) -> dict[str, Any]:
    return {"k": "topic_delete", "n": name}


def topic_configs_header(name: str, configs: dict[str, str]) -> dict[str, Any]:
    """The topic's whole explicit config set after AlterConfigs/IncrementalAlterConfigs."""
    return {"k": "topic_configs", "n": name, "c": configs}


def topic_partitions_header(name: str, partitions: int) -> dict[str, Any]:
    """CreatePartitions: the topic's new (larger) partition count."""
    return {"k": "topic_partitions", "n": name, "np": partitions}


def log_start_header(topic: str, partition: int, offset: int) -> dict[str, Any]:
    """DeleteRecords: the partition's log start moved up to `offset`."""
    return {"k": "log_start", "t": topic, "p": partition, "o": offset}


def document_header(name: str, data: bytes) -> dict[str, Any]:
    """A whole small document a lone main keeps on its WAL (ACLs, SCRAM credentials)."""
    return {"k": "doc", "n": name, "b": data}


def producer_ids_header(up_to: int) -> dict[str, Any]:
    return {"k": "pids", "upto": up_to}


def offsets_header(group_id: str, offsets: list[tuple[str, int, int, int, str]]) -> dict[str, Any]:
    return {"k": "offsets", "g": group_id, "o": [list(o) for o in offsets]}


def group_delete_header(group_id: str) -> dict[str, Any]:
    return {"k": "group_delete", "g": group_id}


def offsets_delete_header(group_id: str, partitions: list[tuple[str, int]]) -> dict[str, Any]:
    return {"k": "offsets_delete", "g": group_id, "o": [list(p) for p in partitions]}


def snapshot_record(body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    return {"k": "snapshot", "v": SNAPSHOT_VERSION}, msgpack.packb(body, use_bin_type=True)


def decode_snapshot(payload: memoryview | bytes) -> dict[str, Any]:
    body: dict[str, Any] = msgpack.unpackb(payload, raw=False)
    return body


@dataclass(frozen=True, slots=True)
class PreparedLink:
    """How to rebuild a linked batch: the PREPARED record, and the patches the main applied."""

    target: WalPosition
    leader_epoch: int
    log_append_time: bool

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> PreparedLink:
        return cls(link_target(header), header["e"], header["lat"])


def read_prepared(reader: WalReader, position: WalPosition) -> bytearray:
    """Blocking: a proxy's PREPARED payload, as a writable copy the caller may patch."""
    record = reader.read_record(position)
    if record.type != RecordType.PREPARED:
        raise CorruptRecord(
            f"{position} is a {record.type.name} record, not PREPARED",
            segment=position.segment,
            position=position.position,
        )
    return bytearray(record.payload)


def rebuild_linked_batch(
    reader: WalReader, link: PreparedLink, base_offset: int, max_timestamp: int
) -> bytearray:
    """Blocking: the batch exactly as the main served it when it appended the LINK."""
    buf = read_prepared(reader, link.target)
    view = memoryview(buf)
    info = parse_batch_header(view, 0)
    assign_offsets(view, info, base_offset, link.leader_epoch)
    if link.log_append_time:
        stamp_log_append_time(view, info, max_timestamp)
    return buf
