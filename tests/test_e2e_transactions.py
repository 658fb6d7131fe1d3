"""Transactions against `zonefleet up` (one main), with stock clients over real sockets:
confluent-kafka, kafka-python and aiokafka transactional producers, read_committed readers
(kcat among them), zombie fencing, the coordinator's timeout abort, and refused bad input.
The same through the zone proxies, with kill -9, is tests/test_e2e_transactions_zones.py."""

from __future__ import annotations

import asyncio
import datetime
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from kafka import KafkaProducer
from kio.schema.errors import ErrorCode

from kafka_wire.control_batch import build_marker
from kafka_wire.record_batch import build_batch
from tests.fleet_process import FleetProcess
from tests.raw_kafka import RawKafka
from tests.test_e2e_clients import create_topic

KCAT = shutil.which("kcat")
LIST_OFFSETS, PRODUCE, INIT_PID, ADD_PARTITIONS, END_TXN, TXN_OFFSET_COMMIT = 2, 0, 22, 24, 26, 28
FIND_COORDINATOR = 10


def _topic(prefix: str = "txn") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _txn_producer(bootstrap: str, tid: str, **extra: object) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **extra})


def _read(
    bootstrap: str, topic: str, partitions: int, isolation: str, expect: int, timeout: float = 20
) -> list[bytes]:
    """Values from offset 0 until `expect` arrived (then a moment for any extra), or timeout."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if len(got) >= expect:
                    break  # a whole poll with nothing new after the expected count
                continue
            value = msg.value()
            if msg.error() or value is None:
                continue
            got.append(value)
    finally:
        consumer.close()
    return got


def _list_offset(raw: RawKafka, topic: str, partition: int, isolation: int) -> int:
    resp = raw.request(
        LIST_OFFSETS,
        5,
        {
            "replica_id": -1,
            "isolation_level": isolation,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}
                    ],
                }
            ],
        },
    )
    part = resp.topics[0].partitions[0]
    assert part.error_code == ErrorCode.none
    return int(part.offset)


def _values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_commit_and_abort_read_committed_and_uncommitted(fleet: FleetProcess) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=2)
    producer = _txn_producer(fleet.bootstrap, f"tid-{topic}")
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, value in enumerate(_values("c", 10)):
        producer.produce(topic, value, partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i, value in enumerate(_values("a", 6)):
        producer.produce(topic, value, partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i, value in enumerate(_values("d", 4)):
        producer.produce(topic, value, partition=i % 2)
    producer.commit_transaction(30)

    committed = _read(fleet.bootstrap, topic, 2, "read_committed", 14)
    assert sorted(committed) == sorted(_values("c", 10) + _values("d", 4))
    everything = _read(fleet.bootstrap, topic, 2, "read_uncommitted", 20)
    assert sorted(everything) == sorted(_values("c", 10) + _values("a", 6) + _values("d", 4))


def test_nothing_after_the_last_stable_offset_is_read_committed(fleet: FleetProcess) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=1)
    plain = Producer({"bootstrap.servers": fleet.bootstrap, "enable.idempotence": True})
    plain.produce(topic, b"before", partition=0)
    plain.flush(30)
    producer = _txn_producer(fleet.bootstrap, f"tid-{topic}")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open-0", partition=0)
    producer.flush(30)
    # A record after the open transaction's first one: above the LSO until it ends.
    plain.produce(topic, b"after", partition=0)
    plain.flush(30)
    raw = RawKafka(fleet.bootstrap)
    try:
        assert _list_offset(raw, topic, 0, isolation=0) == 3  # the high watermark
        assert _list_offset(raw, topic, 0, isolation=1) == 1  # the last stable offset
        # DescribeProducers shows where the open transaction starts.
        producers = raw.request(61, 0, {"topics": [{"name": topic, "partition_indexes": [0]}]})
        starts = {
            p.current_txn_start_offset for p in producers.topics[0].partitions[0].active_producers
        }
        assert starts == {-1, 1}  # the plain idempotent producer, the transactional one
        assert _read(fleet.bootstrap, topic, 1, "read_committed", 1, timeout=5) == [b"before"]
        producer.commit_transaction(30)
        # The marker takes an offset: 4 records' worth of offsets, all stable now.
        assert _list_offset(raw, topic, 0, isolation=1) == 4
    finally:
        raw.close()
    got = _read(fleet.bootstrap, topic, 1, "read_committed", 3)
    assert got == [b"before", b"open-0", b"after"]


def test_a_zombie_is_fenced_by_the_next_producer_with_its_id(fleet: FleetProcess) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=1)
    tid = f"tid-{topic}"
    zombie = _txn_producer(fleet.bootstrap, tid)
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    zombie.flush(30)
    successor = _txn_producer(fleet.bootstrap, tid)
    # Its InitProducerId aborts the zombie's open transaction and bumps the epoch.
    successor.init_transactions(30)
    successor.begin_transaction()
    successor.produce(topic, b"successor", partition=0)
    successor.commit_transaction(30)
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(10)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    assert _read(fleet.bootstrap, topic, 1, "read_committed", 1) == [b"successor"]


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(
    fleet: FleetProcess,
) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=1)
    producer = _txn_producer(fleet.bootstrap, f"tid-{topic}", **{"transaction.timeout.ms": 1500})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"late", partition=0)
    producer.flush(30)
    raw = RawKafka(fleet.bootstrap)
    try:
        assert _list_offset(raw, topic, 0, isolation=1) == 0
        deadline = time.monotonic() + 20
        while _list_offset(raw, topic, 0, isolation=1) == 0:
            assert time.monotonic() < deadline, "the coordinator never aborted the transaction"
            time.sleep(0.1)
        assert _list_offset(raw, topic, 0, isolation=1) == 2  # the record and the ABORT marker
    finally:
        raw.close()
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)
    assert _read(fleet.bootstrap, topic, 1, "read_committed", 0, timeout=3) == []


def test_kafka_python_and_aiokafka_transactions_read_by_kcat(fleet: FleetProcess) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=1)
    kp = KafkaProducer(bootstrap_servers=fleet.bootstrap, transactional_id=f"kp-{topic}")
    kp.init_transactions()
    kp.begin_transaction()
    for value in _values("kp", 3):
        kp.send(topic, value, partition=0)
    kp.commit_transaction()
    kp.begin_transaction()
    kp.send(topic, b"kp-aborted", partition=0)
    kp.flush()
    kp.abort_transaction()
    kp.close()

    async def aiokafka_txns() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=fleet.bootstrap, transactional_id=f"aio-{topic}"
        )
        await producer.start()
        try:
            async with producer.transaction():
                for value in _values("aio", 3):
                    await producer.send_and_wait(topic, value, partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aio-aborted", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(aiokafka_txns())
    expected = _values("kp", 3) + _values("aio", 3)
    assert _read(fleet.bootstrap, topic, 1, "read_committed", 6) == expected
    if KCAT is None:
        pytest.skip("kcat is not installed (make test installs it)")
    out = subprocess.run(
        [KCAT, "-b", fleet.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
         "-q", "-X", "isolation.level=read_committed", "-f", "%s\\n"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert out.split() == [v.decode() for v in expected]


def _txn_batch(pid: int, epoch: int, seq: int, values: Iterable[bytes]) -> bytes:
    return build_batch(
        [(None, v) for v in values],
        timestamp_ms=int(time.time() * 1000),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
    )


def _produce(raw: RawKafka, topic: str, batch: bytes, tid: str | None) -> ErrorCode:
    resp = raw.request(
        PRODUCE,
        9,
        {
            "transactional_id": tid,
            "acks": -1,
            "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )
    return ErrorCode(resp.responses[0].partition_responses[0].error_code)


def _init(raw: RawKafka, tid: str | None, timeout_ms: int = 60000) -> tuple[ErrorCode, int, int]:
    resp = raw.request(
        INIT_PID,
        4,
        {
            "transactional_id": tid,
            "transaction_timeout": datetime.timedelta(milliseconds=timeout_ms),
            "producer_id": -1,
            "producer_epoch": -1,
        },
    )
    return ErrorCode(resp.error_code), resp.producer_id, resp.producer_epoch


def test_bad_transactional_input_is_refused(fleet: FleetProcess) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=1)
    raw = RawKafka(fleet.bootstrap)
    try:
        assert _init(raw, "")[0] == ErrorCode.invalid_request
        assert _init(raw, "x" * 2000)[0] == ErrorCode.invalid_request
        assert _init(raw, "fine", timeout_ms=24 * 3600 * 1000)[0] == (
            ErrorCode.invalid_transaction_timeout
        )
        find = raw.request(FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": [""]})
        assert find.coordinators[0].error_code == ErrorCode.invalid_request
        # A key type the fleet does not offer fails fast instead of being retried for ever.
        share = raw.request(FIND_COORDINATOR, 4, {"key_type": 2, "coordinator_keys": ["g"]})
        assert share.coordinators[0].error_code == ErrorCode.invalid_request

        tid = f"tid-{topic}"
        code, pid, epoch = _init(raw, tid)
        assert code == ErrorCode.none
        # A partition of a topic that does not exist: nothing is added.
        add = raw.request(
            ADD_PARTITIONS,
            3,
            {
                "v3_and_below_transactional_id": tid,
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [
                    {"name": topic, "partitions": [0]},
                    {"name": f"missing-{topic}", "partitions": [0]},
                ],
            },
        )
        codes = {
            t.name: t.results_by_partition[0].partition_error_code
            for t in add.results_by_topic_v3_and_below
        }
        assert codes == {
            topic: ErrorCode.operation_not_attempted,
            f"missing-{topic}": ErrorCode.unknown_topic_or_partition,
        }
        # A marker (a control batch) in a client's Produce is refused.
        marker = build_marker(True, pid, epoch, 0, int(time.time() * 1000))
        assert _produce(raw, topic, marker, tid) == ErrorCode.invalid_record
        # A transactional batch for a partition not added to the transaction is refused
        # (KIP-890's check: it would open a transaction nobody ends)...
        assert _produce(raw, topic, _txn_batch(pid, epoch, 0, [b"t"]), tid) == (
            ErrorCode.invalid_txn_state
        )
        # ... and taken once it is added; then the producer's plain batch is refused while
        # the transaction is open.
        added = raw.request(
            ADD_PARTITIONS,
            3,
            {
                "v3_and_below_transactional_id": tid,
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [{"name": topic, "partitions": [0]}],
            },
        )
        [result] = added.results_by_topic_v3_and_below
        assert result.results_by_partition[0].partition_error_code == ErrorCode.none
        assert _produce(raw, topic, _txn_batch(pid, epoch, 0, [b"t"]), tid) == ErrorCode.none
        plain = build_batch(
            [(None, b"p")],
            timestamp_ms=int(time.time() * 1000),
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=1,
        )
        assert _produce(raw, topic, plain, None) == ErrorCode.invalid_txn_state
        # An old epoch ends nothing.
        end = raw.request(
            END_TXN,
            3,
            {
                "transactional_id": tid,
                "producer_id": pid,
                "producer_epoch": epoch - 1,
                "committed": True,
            },
        )
        assert end.error_code == ErrorCode.producer_fenced
        # A TxnOffsetCommit naming a generation the group does not have is refused.
        commit = raw.request(
            TXN_OFFSET_COMMIT,
            3,
            {
                "transactional_id": tid,
                "group_id": f"group-{topic}",
                "producer_id": pid,
                "producer_epoch": epoch,
                "generation_id": 7,
                "member_id": "someone",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 1,
                                "committed_leader_epoch": -1,
                                "committed_metadata": None,
                            }
                        ],
                    }
                ],
            },
        )
        assert commit.topics[0].partitions[0].error_code == ErrorCode.illegal_generation
    finally:
        raw.close()


def test_describe_and_list_transactions(fleet: FleetProcess) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=2)
    tid = f"tid-{topic}"
    producer = _txn_producer(fleet.bootstrap, tid)
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"x", partition=1)
    producer.flush(30)
    raw = RawKafka(fleet.bootstrap)
    try:
        described = raw.request(65, 0, {"transactional_ids": [tid, f"unknown-{topic}"]})
        ongoing, unknown = described.transaction_states
        assert ongoing.error_code == ErrorCode.none
        assert ongoing.transaction_state == "Ongoing"
        assert [(t.topic, list(t.partitions)) for t in ongoing.topics] == [(topic, [1])]
        assert unknown.error_code == ErrorCode.transactional_id_not_found
        listed = raw.request(66, 1, {"state_filters": ["Ongoing", "Bogus"]})
        assert tid in {t.transactional_id for t in listed.transaction_states}
        assert list(listed.unknown_state_filters) == ["Bogus"]
        producer.commit_transaction(30)
        listed = raw.request(66, 0, {"state_filters": ["Ongoing"]})
        assert tid not in {t.transactional_id for t in listed.transaction_states}
        done = raw.request(65, 0, {"transactional_ids": [tid]}).transaction_states[0]
        assert done.transaction_state == "CompleteCommit"
    finally:
        raw.close()


def test_aborted_transactions_survive_uploads_and_kill_9(tmp_path: Path) -> None:
    """The partition's aborted-transaction index outlives both the WAL segments that held the
    transactions (uploaded, then deleted: 64 KiB segments, retention_bytes = 1) and a kill -9:
    after the restart a read_committed reader from offset 0 still skips the aborted ones."""
    from tests.test_object_crash import _status, _write_toml
    from tests.zone_fleet import NodeProcess

    path, admin, bootstrap = _write_toml(tmp_path / "fleet", f"file://{tmp_path / 'objects'}")
    node = NodeProcess("main-broker", path, 1, admin).start()
    topic = "txn-durable"
    try:
        create_topic(bootstrap, topic, partitions=1)
        producer = _txn_producer(bootstrap, "tid-durable")
        producer.init_transactions(30)
        committed: list[bytes] = []
        for txn in range(12):
            producer.begin_transaction()
            values = [b"%d-%d-" % (txn, i) + b"x" * 2000 for i in range(20)]
            for value in values:
                producer.produce(topic, value, partition=0)
            if txn % 3 == 1:
                producer.flush(30)
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
                committed += values
        deadline = time.monotonic() + 60
        while True:
            objects = _status(admin)["objects"]
            uploaded = list(objects["uploaded_end"].values())
            # 240 records and 12 markers, all in objects.
            if objects["pending_bytes"] == 0 and uploaded == [252]:
                break
            assert time.monotonic() < deadline, objects
            time.sleep(0.1)
        node.kill()
        node = NodeProcess("main-broker", path, 1, admin).start()
        assert _read(bootstrap, topic, 1, "read_committed", len(committed)) == committed
    finally:
        node.stop()


def test_offsets_of_an_open_transaction_are_unstable_until_it_commits(
    fleet: FleetProcess,
) -> None:
    topic = _topic()
    create_topic(fleet.bootstrap, topic, partitions=1)
    tid, group = f"tid-{topic}", f"group-{topic}"
    raw = RawKafka(fleet.bootstrap)

    def fetch(require_stable: bool) -> tuple[int, int]:
        resp = raw.request(
            9,
            7,
            {
                "group_id": group,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "require_stable": require_stable,
            },
        )
        part = resp.topics[0].partitions[0]
        return int(part.error_code), int(part.committed_offset)

    def commit_offsets(pid: int, epoch: int) -> ErrorCode:
        resp = raw.request(
            TXN_OFFSET_COMMIT,
            3,
            {
                "transactional_id": tid,
                "group_id": group,
                "producer_id": pid,
                "producer_epoch": epoch,
                "generation_id": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 42,
                                "committed_leader_epoch": -1,
                                "committed_metadata": None,
                            }
                        ],
                    }
                ],
            },
        )
        return ErrorCode(resp.topics[0].partitions[0].error_code)

    try:
        code, pid, epoch = _init(raw, tid)
        assert code == ErrorCode.none
        # Offsets of a transaction that did not add the group first are refused.
        assert commit_offsets(pid, epoch) == ErrorCode.invalid_txn_state
        added = raw.request(
            25,
            3,
            {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
             "group_id": group},
        )  # fmt: skip
        assert added.error_code == ErrorCode.none
        assert commit_offsets(pid, epoch) == ErrorCode.none
        assert fetch(require_stable=True) == (ErrorCode.unstable_offset_commit, -1)
        assert fetch(require_stable=False) == (ErrorCode.none, -1)  # not committed yet
        end = raw.request(
            END_TXN,
            3,
            {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
             "committed": True},
        )  # fmt: skip
        assert end.error_code == ErrorCode.none
        assert fetch(require_stable=True) == (ErrorCode.none, 42)
    finally:
        raw.close()
