"""The main broker's object tier on a real S3 server (SeaweedFS): committed batches go into
objects with a manifest, the WAL is trimmed only below what objects hold, and a consumer reads
every record exactly once from objects and WAL, also after a restart with an empty WAL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Producer

from fleet import cli
from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from s3_commit import open_object_store
from s3_commit.manifest import Manifest, manifest_key
from s3_commit.object_format import check_block, decode_object
from shared_wal import WalConfig
from tests.s3_servers import (
    Fault,
    FaultProxy,
    MotoServer,
    SeaweedServer,
    fault_proxy,
    moto,
    seaweedfs,
)
from tests.zone_fleet import consume_partition, object_main_config

__all__ = ["fault_proxy", "moto", "seaweedfs"]  # fixtures, imported so pytest finds them

TOPIC = "tiered"
VALUE = b"v" * 300


@pytest.fixture(scope="module")
def bucket_url(seaweedfs: SeaweedServer) -> Iterator[str]:
    yield seaweedfs.bucket_url()


def _config(wal_dir: Path, url: str, *, uploads: bool = True) -> BrokerConfig:
    return object_main_config(
        wal_dir,
        url,
        # Small segments and a byte budget that retention would exceed at once: only the
        # retention floor (what objects hold) keeps anything.
        WalConfig(segment_bytes=96 * 1024, retention_bytes=1, retention_interval_s=0.1),
        upload_threshold_bytes=64 * 1024 if uploads else 1 << 40,
        upload_interval_s=0.3 if uploads else 3600.0,
    )


def _produce(bootstrap: str, start: int, count: int) -> None:
    # Small batches, so that the WAL holds many records over several segments.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "batch.size": 16384}
    )
    errors: list[Any] = []

    def delivered(error: Any, _msg: Any) -> None:
        if error is not None:
            errors.append(error)

    for i in range(start, start + count):
        producer.produce(TOPIC, VALUE + str(i).encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(20) == 0 and not errors


def _expected(count: int) -> list[tuple[int, bytes]]:
    return [(i, VALUE + str(i).encode()) for i in range(count)]


async def _wait_uploaded(broker: MainBroker, end: int) -> None:
    tier = broker.objects
    assert tier is not None
    with trio.fail_after(20):
        while min(tier.tracker.uploaded_end.values(), default=0) < end:
            await tier.upload_done.wait()


async def test_commit_trim_and_read_back_across_restarts(bucket_url: str, tmp_path: Path) -> None:
    # 1. Produce past the threshold: objects appear, the WAL is trimmed below them only.
    broker = MainBroker(_config(tmp_path / "wal", bucket_url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, 1, {})
        await trio.to_thread.run_sync(_produce, bootstrap, 0, 1500)
        plog = broker.store.partition(TOPIC, 0)
        assert plog is not None and plog.high_watermark == 1500
        await _wait_uploaded(broker, 1500)
        tier = broker.objects
        assert tier is not None and tier.uploads >= 1 and tier.tracker.pending_bytes == 0
        with trio.move_on_after(20):
            while plog.wal_start_offset == 0:  # retention runs every 0.1 s
                await trio.sleep(0.05)
        wal = broker.store.wal
        first = plog.entries[0].position if plog.entries else None
        assert plog.wal_start_offset > 0, (wal.segments(), wal.retention_floor, first)
        assert plog.log_start_offset == 0 < plog.wal_start_offset
        status = broker.status()["objects"]
        assert status["uploads"] == tier.uploads and status["put_requests"] >= tier.uploads
        assert status["uploaded_end"] == {f"{plog.topic_id.hex()}/0": 1500}
        metrics = broker.registry.render()
        assert "zonefleet_s3_uploads " in metrics
        # Offsets below the WAL come from objects, the rest from the WAL: each exactly once.
        misses = tier.reader.block_misses
        got = await trio.to_thread.run_sync(consume_partition, bootstrap, TOPIC, 0, 1500)
        assert got == _expected(1500)
        assert tier.reader.block_misses > misses  # the early offsets came from objects
        nursery.cancel_scope.cancel()

    # The manifest lists valid objects that inspect-object decodes.
    store = open_object_store(bucket_url)
    found = store.get(manifest_key(1))
    assert found is not None
    manifest = Manifest.from_bytes(found[0])
    stream = next(iter(manifest.streams.values()))
    assert stream.topic == TOPIC and stream.start_offset == 0 and stream.end_offset == 1500
    listed = {info.key: info.size for info in store.list("data/")}
    assert set(listed) == manifest.keys()
    for rng in stream.ranges:
        data = store.get(rng.key)
        assert data is not None and len(data[0]) == rng.size == listed[rng.key]
        index = decode_object(data[0])
        for entry in index.entries:
            check_block(memoryview(data[0])[entry.position : entry.position + entry.size], entry)
    base, query = bucket_url.split("?")
    assert cli.main(["inspect-object", f"{base}/{stream.ranges[0].key}?{query}"]) == 0

    # 2. Records not yet uploaded survive a restart that keeps the WAL.
    broker = MainBroker(_config(tmp_path / "wal", bucket_url, uploads=False))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        await trio.to_thread.run_sync(_produce, f"127.0.0.1:{port}", 1500, 300)
        tier = broker.objects
        assert tier is not None and list(tier.tracker.uploaded_end.values()) == [1500]
        assert tier.tracker.observe(tier._owned()) > 0  # committed, not uploaded
        nursery.cancel_scope.cancel()
    broker = MainBroker(_config(tmp_path / "wal", bucket_url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        got = await trio.to_thread.run_sync(consume_partition, f"127.0.0.1:{port}", TOPIC, 0, 1800)
        assert got == _expected(1800)
        await _wait_uploaded(broker, 1800)
        nursery.cancel_scope.cancel()

    # 3. An empty WAL directory, the same object store: every committed record is back, and
    # new records continue after them.
    broker = MainBroker(_config(tmp_path / "wal-empty", bucket_url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        plog = broker.store.partition(TOPIC, 0)
        assert plog is not None and (plog.log_start_offset, plog.high_watermark) == (0, 1800)
        await trio.to_thread.run_sync(_produce, bootstrap, 1800, 50)
        got = await trio.to_thread.run_sync(consume_partition, bootstrap, TOPIC, 0, 1850)
        assert got == _expected(1850)
        nursery.cancel_scope.cancel()


def test_fleet_storage_section(tmp_path: Path) -> None:
    import tomllib

    from fleet.config import local_fleet_toml, local_zones_fleet_toml, parse_fleet_config

    text = local_fleet_toml(tmp_path, 19000).replace(
        f'object_store = "file://{tmp_path / "objects"}"', 'object_store = "file://objects"'
    )
    (main,) = parse_fleet_config(tomllib.loads(text), tmp_path).mains
    assert main.broker.object_store_url == f"file://{tmp_path / 'objects'}"
    assert main.broker.upload_threshold_bytes == 500 * 1024 * 1024
    assert main.broker.upload_interval_s == 60.0
    zones = parse_fleet_config(
        tomllib.loads(local_zones_fleet_toml(tmp_path, 19000, 2, "s" * 32)), tmp_path
    )
    assert {m.broker.object_store_url for m in zones.mains} == {f"file://{tmp_path / 'objects'}"}
    no_storage = text.split("[storage]")[0] + "[[main_brokers]]" + text.split("[[main_brokers]]")[1]
    (plain,) = parse_fleet_config(tomllib.loads(no_storage), tmp_path).mains
    assert plain.broker.object_store_url is None


async def test_s3_faults_do_not_stop_produce_and_uploads_resume(
    moto: MotoServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    url = moto.bucket_url("faults", endpoint=fault_proxy.endpoint, max_attempts=1)
    config = _config(tmp_path / "wal", url)
    config.metadata_url = None
    broker = MainBroker(config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, 1, {})
        fault_proxy.inject(Fault(status=500, code="InternalError", method="PUT"), times=3)
        await trio.to_thread.run_sync(_produce, bootstrap, 0, 600)  # every record acked
        await _wait_uploaded(broker, 600)
        tier = broker.objects
        assert tier is not None and tier.failures >= 1 and tier.last_error is None
        got = await trio.to_thread.run_sync(consume_partition, bootstrap, TOPIC, 0, 600)
        assert got == _expected(600)
        nursery.cancel_scope.cancel()


async def test_a_main_waits_for_an_unreachable_store_then_serves(
    moto: MotoServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """The manifest says what objects hold: until it is read the main does not serve, and it
    keeps trying (no crash, no serving with a guessed log) until the store answers."""
    url = moto.bucket_url("unreachable", endpoint=fault_proxy.endpoint, max_attempts=1)
    config = _config(tmp_path / "wal", url)
    config.metadata_url = None
    fault_proxy.inject(Fault(status=503, code="ServiceUnavailable", method="GET"), times=3)
    broker = MainBroker(config)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            port = await nursery.start(broker.run)
        tier = broker.objects
        assert tier is not None and tier.failures >= 3, "the main should have retried"
        assert tier.last_error is None
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, 1, {})
        await trio.to_thread.run_sync(_produce, bootstrap, 0, 50)
        got = await trio.to_thread.run_sync(consume_partition, bootstrap, TOPIC, 0, 50)
        assert got == _expected(50)
        nursery.cancel_scope.cancel()
