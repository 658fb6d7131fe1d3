"""Idempotent producers over the wire: retried duplicates, sequence gaps, epochs, restart."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_wire.record_batch import build_batch
from tests.fleet_process import FleetProcess
from tests.raw_kafka import RawKafka
from tests.test_e2e_clients import create_topic

PRODUCE, INIT_PID = 0, 22


def _produce(conn: RawKafka, topic: str, batch: bytes, version: int = 9) -> Any:
    resp = conn.request(
        PRODUCE,
        version,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )
    return resp.responses[0].partition_responses[0]


def _batch(pid: int, epoch: int, seq: int, n: int, tag: str) -> bytes:
    return build_batch(
        [(None, f"{tag}-{i}".encode()) for i in range(n)],
        timestamp_ms=int(time.time() * 1000),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def _init_pid(conn: RawKafka) -> tuple[int, int]:
    resp = conn.request(
        INIT_PID,
        4,
        {
            "transactional_id": None,
            "transaction_timeout_ms": 60000,
            "producer_id": -1,
            "producer_epoch": -1,
        },
    )
    assert resp.error_code == ErrorCode.none
    return resp.producer_id, resp.producer_epoch


def test_duplicate_gap_and_epoch(fleet: FleetProcess) -> None:
    topic = f"idem-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic, partitions=1)
    conn = RawKafka(fleet.bootstrap)
    try:
        pid, epoch = _init_pid(conn)
        first = _produce(conn, topic, _batch(pid, epoch, 0, 5, "a"))
        assert first.error_code == ErrorCode.none and first.base_offset == 0
        second = _produce(conn, topic, _batch(pid, epoch, 5, 5, "b"))
        assert second.error_code == ErrorCode.none and second.base_offset == 5
        # The retried first batch returns its original offset and is not appended again.
        retry = _produce(conn, topic, _batch(pid, epoch, 0, 5, "a"))
        assert retry.error_code == ErrorCode.none and retry.base_offset == 0
        # A gap in the sequence is rejected.
        gap = _produce(conn, topic, _batch(pid, epoch, 20, 5, "c"))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        # An older epoch is fenced.
        bumped = _produce(conn, topic, _batch(pid, epoch + 1, 0, 1, "d"))
        assert bumped.error_code == ErrorCode.none and bumped.base_offset == 10
        stale = _produce(conn, topic, _batch(pid, epoch, 10, 1, "e"))
        assert stale.error_code == ErrorCode.invalid_producer_epoch
        # The log end is 11: the duplicate and the rejected batches added nothing.
        assert conn.latest_offset(topic) == 11
    finally:
        conn.close()


def test_producer_state_survives_restart(tmp_path: Path) -> None:
    fleet = FleetProcess(tmp_path / "fleet").start()
    topic = f"idem-r-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(fleet.bootstrap, topic, partitions=1)
        conn = RawKafka(fleet.bootstrap)
        pid, epoch = _init_pid(conn)
        assert _produce(conn, topic, _batch(pid, epoch, 0, 3, "x")).base_offset == 0
        conn.close()
    finally:
        fleet.kill()
    again = FleetProcess(tmp_path / "fleet", base_port=fleet.base_port).start()
    try:
        conn = RawKafka(again.bootstrap)
        retry = _produce(conn, topic, _batch(pid, epoch, 0, 3, "x"))
        assert retry.error_code == ErrorCode.none and retry.base_offset == 0
        gap = _produce(conn, topic, _batch(pid, epoch, 9, 1, "y"))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        new_pid, _ = _init_pid(conn)
        assert new_pid != pid, "producer ids must not be reused after a restart"
        conn.close()
    finally:
        again.stop()
