"""Kill -9 in the middle of a log cleaning (issue 13, "Kill -9 during cleaning loses nothing").

A `zonefleet main-broker` process (file:// object store and metadata, small uploads, the
cleaner looking every 0.5 s) takes keyed updates of a compacted topic from an idempotent
confluent-kafka producer and stops itself (telemetry.pause_points) in its cleaning's second
object rewrite: after the new object's PUT and before the manifest swap, or right after the
swap. The test SIGKILLs it there and restarts it with the cleaner off: the latest acknowledged
value of every key reads back at its offset, every record read is one that was written at that
offset (records still in the WAL are served from it, cleaned or not, as Kafka may), the new
object no swap listed is the only orphan, and the replaced objects go after their delay.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fleet.config import load_fleet_config
from s3_commit import AsyncObjectStore, open_object_store
from s3_commit.manifest import Manifest, manifest_key
from s3_commit.manifest_store import sweep_orphans
from s3_commit.object_plan import DATA_PREFIX
from telemetry.pause_points import PAUSE_ENV
from tests.test_object_crash import _status, _wait_stopped, _write_toml
from tests.zone_fleet import NodeProcess

TOPIC = "crash"  # the topic name test_object_crash's helpers use
KEYS = 300
UPLOADS = "upload_interval_s = 0.3\n"


def _set_cleaner(path: Path, enable: bool) -> None:
    lines = [
        x
        for x in path.read_text().splitlines(True)
        if not x.startswith(("log_cleaner_", "compaction_"))
    ]
    at = lines.index(UPLOADS) + 1
    lines[at:at] = [
        f"log_cleaner_enable = {'true' if enable else 'false'}\n",
        "log_cleaner_interval_s = 0.5\n",
        "log_cleaner_dedupe_buffer_bytes = 1048576\n",
        "compaction_interval_s = 3600.0\n",
        "compaction_delete_delay_s = 2.0\n",
    ]
    path.write_text("".join(lines))


def _key(i: int) -> bytes:
    return b"k-%04d" % (i % KEYS)


def _value(i: int) -> bytes:
    return b"v-%08d-" % i + b"x" * 100


@dataclass
class KeyedAcks:
    offsets: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # offset -> record
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            with self.lock:
                self.offsets[msg.offset()] = (msg.key(), msg.value())


class KeyedProducer(threading.Thread):
    def __init__(self, bootstrap: str, acks: KeyedAcks) -> None:
        super().__init__(name="cleaner-crash-producer", daemon=True)
        self.acks = acks
        self.halt = threading.Event()
        self.unflushed = -1
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 3000,
            }
        )

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            for _ in range(20):
                self.producer.produce(TOPIC, _value(i), _key(i), on_delivery=self.acks.on_delivery)
                i += 1
            self.producer.poll(0.01)
        self.unflushed = self.producer.flush(15)


def _read_all(bootstrap: str) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    out: list[tuple[int, bytes, bytes]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"{len(out)} records so far"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                return out
            offset, key, value = msg.offset(), msg.key(), msg.value()
            assert offset is not None and key is not None and value is not None
            out.append((offset, key, value))
    finally:
        consumer.close()


def _stored(url: str) -> tuple[Manifest, set[str]]:
    store = open_object_store(url)
    found = store.get(manifest_key(1))
    assert found is not None
    return Manifest.from_bytes(found[0]), {info.key for info in store.list(DATA_PREFIX)}


def test_the_fleet_toml_sets_the_cleaner(tmp_path: Path) -> None:
    path, _, _ = _write_toml(tmp_path / "fleet", f"file://{tmp_path / 'objects'}")
    _set_cleaner(path, enable=False)
    broker = load_fleet_config(path).mains[0].broker
    assert not broker.log_cleaner_enable
    assert broker.log_cleaner_interval_s == 0.5
    assert broker.log_cleaner_dedupe_buffer_bytes == 1 << 20


@pytest.mark.parametrize("step", ["after_cleaner_upload:2", "after_cleaner_swap:2"])
def test_kill_9_during_cleaning_loses_nothing_and_leaks_nothing(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path / 'objects'}"
    path, admin, bootstrap = _write_toml(tmp_path / "fleet", url)
    _set_cleaner(path, enable=True)
    monkeypatch.setenv(PAUSE_ENV, step)
    node = NodeProcess("main-broker", path, 1, admin).start()
    monkeypatch.delenv(PAUSE_ENV)
    acks = KeyedAcks()
    producer: KeyedProducer | None = None
    try:
        admin_client = AdminClient({"bootstrap.servers": bootstrap})
        topics = admin_client.create_topics(
            [NewTopic(TOPIC, 1, 1, config={"cleanup.policy": "compact"})]
        )
        topics[TOPIC].result(timeout=20)
        producer = KeyedProducer(bootstrap, acks)
        producer.start()
        _wait_stopped(node)
        node.kill()  # SIGKILL a stopped process: no line after the pause point runs
    finally:
        if producer is not None:
            producer.halt.set()
            producer.join(30)
        node.kill()
    assert producer.unflushed == 0 and acks.offsets
    log = node.log_path.read_text()
    assert f"test pause at {step.split(':')[0]}" in log
    manifest, listed = _stored(url)
    stray = listed - manifest.referenced_keys()
    if step.startswith("after_cleaner_upload"):
        assert stray, "the paused rewrite's new object is in the store, unlisted"
    else:
        assert manifest.retired and not stray, "the swap listed the new object, retired the old"

    _set_cleaner(path, enable=False)  # nothing in flight after the restart but uploads
    node = NodeProcess("main-broker", path, 1, admin).start()
    try:
        records = _read_all(bootstrap)
        offsets = [o for o, _, _ in records]
        assert offsets == sorted(set(offsets))
        for o, k, v in records:
            if o in acks.offsets:
                assert acks.offsets[o] == (k, v), f"offset {o} changed"
        latest: dict[bytes, int] = {}
        for o, (k, _) in sorted(acks.offsets.items()):
            latest[k] = o
        by_offset = {o: (k, v) for o, k, v in records}
        lost = [o for o in latest.values() if by_offset.get(o) != acks.offsets[o]]
        assert not lost, f"latest acknowledged values lost at offsets {lost[:5]}"
        # The retired objects go after their delay; only the unlisted rewrite is an orphan.
        deadline = time.monotonic() + 30
        while True:
            objects = _status(admin)["objects"]
            if not objects["compaction"]["retired_objects"] and not objects["pending_bytes"]:
                break
            assert time.monotonic() < deadline, objects
            time.sleep(0.1)
        swept = trio.run(sweep_orphans, AsyncObjectStore(open_object_store(url)), 0)
        assert set(swept) == stray
        after, listed_after = _stored(url)
        assert listed_after == after.keys() and not after.retired
        assert _read_all(bootstrap) == records
    finally:
        node.stop()
