"""Kill -9 between the steps of an object commit (issue 4, "What the tests must show" 3).

A `zonefleet main-broker` process with a SeaweedFS object store and small upload thresholds
stops itself at one step (telemetry.pause_points, ZONEFLEET_TEST_PAUSE_AT): after an upload's
PUTs and before its manifest CAS, right after the CAS, or in the middle of a WAL trim. The test
SIGKILLs it there, restarts it on the same WAL and bucket, and checks that every record a
confluent-kafka producer had acknowledged (acks=all) is read back exactly once and in order,
that objects uploaded but never committed are orphans the sweep deletes, and that the sweep
deletes no committed object.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from s3_commit import AsyncObjectStore, open_object_store
from s3_commit.manifest import Manifest, manifest_key
from s3_commit.manifest_store import sweep_orphans
from s3_commit.object_plan import DATA_PREFIX
from telemetry.pause_points import PAUSE_ENV
from tests.ports import free_port
from tests.s3_servers import SeaweedServer, seaweedfs
from tests.zone_fleet import NodeProcess

__all__ = ["seaweedfs"]  # the fixture, imported so pytest finds it

TOPIC = "crash"
PAD = b"x" * 200
STOP_TIMEOUT_S = 40.0  # during_trim waits for the WAL's first retention pass (every 5 s)


def _write_toml(data_dir: Path, url: str) -> tuple[Path, tuple[str, int], str]:
    """One main with its cluster metadata and objects in `url`; WAL segments of 64 KiB that
    retention deletes as soon as committed objects hold them (retention_bytes = 1)."""
    data_dir.mkdir(parents=True)
    port, admin = free_port(), free_port()
    path = data_dir / "fleet.toml"
    path.write_text(
        f"""\
[fleet]
cluster_id = "zonefleet-crash"
data_dir = "{data_dir}"

[[zones]]
name = "az1"
az_id = "use1-az1"

[wal]
url = "osfs://{data_dir / "wal"}"
segment_bytes = 65536
retention_bytes = 1

[metadata]
url = "{url}"
poll_interval_s = 0.2

[storage]
object_store = "{url}"
upload_threshold_bytes = 131072
upload_interval_s = 0.3

[[main_brokers]]
node_id = 1
zone = "az1"
host = "127.0.0.1"
port = {port}
admin_port = {admin}
"""
    )
    return path, ("127.0.0.1", admin), f"127.0.0.1:{port}"


@dataclass
class Acks:
    """What the producer was told: value -> offset, for acknowledged records only."""

    offsets: dict[bytes, int] = field(default_factory=dict)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_delivery(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is None:
                self.offsets[msg.value()] = msg.offset()
            else:
                self.failed += 1


def _value(i: int) -> bytes:
    return b"r-%08d-" % i + PAD


def _seq(value: bytes) -> int:
    return int(value.split(b"-")[1])


class ProduceUntilStopped(threading.Thread):
    """acks=all, idempotent, about 2,000 records/s (so the WAL fills a segment in ~0.15 s)."""

    def __init__(self, bootstrap: str, acks: Acks) -> None:
        super().__init__(name="crash-producer", daemon=True)
        self.acks = acks
        self.halt = threading.Event()
        self.sent = 0
        self.unflushed = -1
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.size": 16384,
                "message.timeout.ms": 3000,
            }
        )

    def run(self) -> None:
        while not self.halt.is_set():
            for _ in range(20):
                self.producer.produce(TOPIC, _value(self.sent), on_delivery=self.acks.on_delivery)
                self.sent += 1
            self.producer.poll(0.01)
        # Everything still in flight fails by message.timeout.ms: nothing of this producer
        # can reach the restarted broker.
        self.unflushed = self.producer.flush(15)


def _wait_stopped(node: NodeProcess) -> None:
    """Until the process stopped itself at its pause point (it must not exit or run on)."""
    assert node.proc is not None
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        pid, status = os.waitpid(node.proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(status):
            return
        assert pid == 0, f"main exited ({status}) instead of pausing:\n{node.log_tail()}"
        time.sleep(0.02)
    node.kill()
    pytest.fail(f"main never reached its pause point:\n{node.log_tail()}")


def _status(admin: tuple[str, int]) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"http://{admin[0]}:{admin[1]}/status", timeout=5).json()
    return doc


def _wait_all_uploaded(admin: tuple[str, int], end: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        objects = _status(admin)["objects"]
        if objects["pending_bytes"] == 0 and list(objects["uploaded_end"].values()) == [end]:
            return objects
        assert time.monotonic() < deadline, objects
        time.sleep(0.1)


def _read_all(bootstrap: str) -> list[tuple[int, bytes]]:
    """Offset 0 to the high watermark of the topic's one partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            offset, value = msg.offset(), msg.value()
            assert offset is not None and value is not None
            out.append((offset, value))
    finally:
        consumer.close()
    assert out and out[-1][0] == high - 1, f"read {len(out)} records of {high}"
    return out


def _check(records: list[tuple[int, bytes]], acks: Acks) -> None:
    offsets = [o for o, _ in records]
    assert offsets == list(range(len(records))), "offsets not dense from 0 (lost or repeated)"
    seqs = [_seq(v) for _, v in records]
    assert seqs == sorted(set(seqs)), "a record repeated or out of order"
    by_offset = dict(records)
    lost = [v for v, o in acks.offsets.items() if by_offset.get(o) != v]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:2]}"


def _kill_9_at(
    step: str, path: Path, admin: tuple[str, int], bootstrap: str, mp: pytest.MonkeyPatch
) -> tuple[NodeProcess, Acks]:
    """Start the main of `path` so that it stops at pause point `step`, produce to a new topic
    until it has stopped there, and SIGKILL it: the killed node, and what it acknowledged (every
    record sent was answered, and some were)."""
    mp.setenv(PAUSE_ENV, step)
    node = NodeProcess("main-broker", path, 1, admin).start()
    mp.delenv(PAUSE_ENV)
    acks = Acks()
    producer: ProduceUntilStopped | None = None
    try:
        admin_client = AdminClient({"bootstrap.servers": bootstrap})
        admin_client.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(timeout=20)
        producer = ProduceUntilStopped(bootstrap, acks)
        producer.start()
        _wait_stopped(node)
        node.kill()  # SIGKILL a stopped process: no line after the pause point runs
    finally:
        if producer is not None:
            producer.halt.set()
            producer.join(30)
        node.kill()
    assert producer.unflushed == 0 and len(acks.offsets) > 0
    return node, acks


def _committed_and_listed(url: str) -> tuple[set[str], set[str]]:
    store = open_object_store(url)
    found = store.get(manifest_key(1))
    committed = Manifest.from_bytes(found[0]).keys() if found is not None else set()
    return committed, {info.key for info in store.list(DATA_PREFIX)}


@pytest.mark.parametrize("step", ["after_upload:3", "after_manifest:3", "during_trim"])
def test_kill_9_at_a_commit_step_loses_nothing_and_leaks_nothing(
    step: str, seaweedfs: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = seaweedfs.bucket_url()
    path, admin, bootstrap = _write_toml(tmp_path / "fleet", url)
    node, acks = _kill_9_at(step, path, admin, bootstrap, monkeypatch)
    log = node.log_path.read_text()
    assert f"test pause at {step.split(':')[0]}" in log
    committed, listed = _committed_and_listed(url)
    stray = listed - committed
    if step.startswith("after_upload"):
        assert stray, "the paused upload's objects must be in the bucket, unlisted"
    elif step.startswith("after_manifest"):
        assert not stray and committed, "the CAS listed every object uploaded"
    else:
        segments = sorted(int(p.stem) for p in (tmp_path / "fleet" / "wal").rglob("*.wal"))
        assert segments and segments[0] > 0, "the trim deleted the oldest segment, then stopped"

    node = NodeProcess("main-broker", path, 1, admin).start()
    try:
        records = _read_all(bootstrap)
        _check(records, acks)
        # New records continue after the recovered ones, and go up as objects too.
        after = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(200):
            after.produce(TOPIC, _value(10_000_000 + i))
        assert after.flush(20) == 0
        end = len(records) + 200
        _wait_all_uploaded(admin, end)
        # No upload runs now (nothing is pending): a sweep with no grace period is safe.
        committed, listed = _committed_and_listed(url)
        swept = trio.run(sweep_orphans, AsyncObjectStore(open_object_store(url)), 0)
        assert set(swept) == listed - committed and stray <= set(swept)
        committed_after, listed_after = _committed_and_listed(url)
        assert committed_after == committed and listed_after == committed
        again = _read_all(bootstrap)
        assert again[: len(records)] == records and len(again) == end
        assert [_seq(v) for _, v in again[len(records) :]] == list(range(10_000_000, 10_000_200))
    finally:
        node.stop()
