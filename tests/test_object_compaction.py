"""Background compaction on a real S3 server (SeaweedFS), issue 4 "What the tests must show" 4:
small StreamSetObjects are merged, the manifest swap keeps every offset, the replaced objects
are deleted only after the swap and its delay (also across a restart), a consumer reading from
offset 0 gets every record exactly once, from a main and through a zone proxy, and a compaction
that fails before its CAS or is abandoned leaves the manifest as it was and no object behind
for good."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from main_broker.objects.tier import ObjectTier
from proxy_broker.broker import ProxyBroker
from s3_commit import AsyncObjectStore, ObjectStoreError, open_object_store
from s3_commit.manifest import Manifest, manifest_key
from s3_commit.manifest_store import sweep_orphans
from s3_commit.object_plan import DATA_PREFIX, ObjectKind, parse_object_key
from shared_wal import WalConfig
from tests.s3_servers import SeaweedServer, seaweedfs
from tests.zone_fleet import (
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    create_topic,
    object_main_config,
    produce_many_batches,
    write_zones_toml,
)

__all__ = ["seaweedfs"]  # the fixture, imported so pytest finds it

TOPIC = "compacted"
PARTITIONS = 3
ROUND = 120  # records per produce round; each round becomes one upload, so one SSO


@pytest.fixture
def bucket_url(seaweedfs: SeaweedServer) -> Iterator[str]:
    yield seaweedfs.bucket_url()


def _compaction_settings(b: BrokerConfig, delete_delay_s: float) -> None:
    # Off until a test turns it on; every object of these tests is "small".
    b.compaction_interval_s = 3600.0
    b.compaction_small_object_bytes = 1 << 20
    b.compaction_max_object_bytes = 4 << 20
    b.compaction_delete_delay_s = delete_delay_s


def _config(wal_dir: Path, url: str, delete_delay_s: float) -> BrokerConfig:
    config = object_main_config(
        wal_dir,
        url,
        # Retention deletes every segment objects hold: early offsets come from objects.
        WalConfig(segment_bytes=32 * 1024, retention_bytes=1, retention_interval_s=0.1),
        # Uploads by the interval only: one per produce round.
        upload_threshold_bytes=1 << 40,
        upload_interval_s=0.2,
    )
    _compaction_settings(config, delete_delay_s)
    return config


def _value(i: int) -> bytes:
    return b"rec-%d-" % i + b"p" * 200


def _produce(bootstrap: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    errors: list[Any] = []
    for i in range(start, start + count):
        producer.produce(
            TOPIC,
            _value(i),
            partition=i % PARTITIONS,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors


def _consume(bootstrap: str, count: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record from offset 0, until `count` and EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    out: list[tuple[int, int, bytes]] = []
    at_eof = dict.fromkeys(range(PARTITIONS), False)
    deadline = time.monotonic() + 30
    try:
        while not (len(out) >= count and all(at_eof.values())):
            assert time.monotonic() < deadline, f"{len(out)} of {count} records"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            partition = msg.partition() or 0
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_eof[partition] = True
                continue
            at_eof[partition] = False
            offset, value = msg.offset(), msg.value()
            assert offset is not None and value is not None
            out.append((partition, offset, value))
    finally:
        consumer.close()
    return out


def _check_all(got: list[tuple[int, int, bytes]], count: int) -> None:
    assert sorted(v for _, _, v in got) == sorted(_value(i) for i in range(count))
    for p in range(PARTITIONS):
        offsets = [o for q, o, _ in got if q == p]
        assert offsets == list(range(len(offsets))), f"partition {p}"


def _ssos(keys: set[str]) -> set[str]:
    return {k for k in keys if parse_object_key(k)[0] is ObjectKind.STREAM_SET}


def _listed(url: str) -> set[str]:
    return {info.key for info in open_object_store(url).list(DATA_PREFIX)}


def _stored_manifest(url: str) -> Manifest:
    found = open_object_store(url).get(manifest_key(1))
    assert found is not None
    return Manifest.from_bytes(found[0])


def _spans(manifest: Manifest) -> dict[Any, tuple[int, int]]:
    return {k: (s.start_offset, s.end_offset) for k, s in manifest.streams.items()}


def _tier(broker: MainBroker) -> ObjectTier:
    assert broker.objects is not None
    return broker.objects


async def _wait_uploaded(broker: MainBroker) -> None:
    tier = _tier(broker)
    with trio.fail_after(30):
        while True:
            plogs = [broker.store.partition(TOPIC, p) for p in range(PARTITIONS)]
            if all(
                p is not None and p.objects is not None and p.objects.end_offset == p.high_watermark
                for p in plogs
            ):
                return
            await tier.upload_done.wait()


async def _produce_rounds(broker: MainBroker, bootstrap: str, start: int, rounds: int) -> int:
    for r in range(rounds):
        await trio.to_thread.run_sync(_produce, bootstrap, start + r * ROUND, ROUND)
        await _wait_uploaded(broker)
    return start + rounds * ROUND


async def _compact(tier: ObjectTier) -> None:
    """Turn compaction on and wait for a pass that found nothing (more) to do."""
    compactor = tier.compaction
    tier.config.compaction_interval_s = 0.2
    compactor.next_due = 0.0
    with trio.fail_after(30):
        done = compactor.done
        await done.wait()
    tier.config.compaction_interval_s = 3600.0
    compactor.next_due = time.monotonic() + 3600.0


async def _wait_retired_deleted(tier: ObjectTier) -> None:
    with trio.fail_after(30):
        while tier.manifests.manifest.retired:
            await trio.sleep(0.1)


async def test_small_objects_merge_and_the_old_go_after_the_swap(
    bucket_url: str, tmp_path: Path
) -> None:
    wal_dir = tmp_path / "wal"
    broker = MainBroker(_config(wal_dir, bucket_url, delete_delay_s=8.0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, PARTITIONS, {})
        count = await _produce_rounds(broker, bootstrap, 0, 5)
        tier = _tier(broker)
        before = tier.manifests.manifest
        sources = _ssos(before.keys())
        assert len(sources) >= 5 and _listed(bucket_url) == before.keys()

        await _compact(tier)
        after = tier.manifests.manifest
        status = broker.status()["objects"]["compaction"]
        assert status["compactions"] >= 1 and status["failures"] == 0
        assert len(_ssos(after.keys())) < len(sources)
        assert _spans(after) == _spans(before)
        assert set(after.retired) == before.keys() - after.keys() and after.retired
        # The swap reached the store; the replaced objects are still there for late readers.
        assert _stored_manifest(bucket_url) == after
        assert _listed(bucket_url) == after.keys() | set(after.retired)
        for p in range(PARTITIONS):
            plog = broker.store.partition(TOPIC, p)
            assert plog is not None and plog.objects is after.stream(plog.topic_id, p)
            assert plog.log_start_offset == 0 < plog.wal_start_offset
        metrics = broker.registry.render()
        assert "zonefleet_s3_compactions " in metrics and "zonefleet_s3_retired_objects " in metrics
        got = await trio.to_thread.run_sync(_consume, bootstrap, count)
        _check_all(got, count)
        nursery.cancel_scope.cancel()

    # A restart before the delay passed: the manifest still names the replaced objects, so
    # no sweep takes them early, and the restarted main deletes them when their time comes.
    stored = _stored_manifest(bucket_url)
    assert stored.retired and _listed(bucket_url) == stored.referenced_keys()
    broker = MainBroker(_config(wal_dir, bucket_url, delete_delay_s=8.0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        tier = _tier(broker)
        assert tier.manifests.manifest.retired == stored.retired
        gone = await sweep_orphans(tier.astore, grace_ms=0)
        assert gone == []  # retired objects are referenced
        await _wait_retired_deleted(tier)
        assert tier.compaction.objects_deleted == len(stored.retired)
        assert _listed(bucket_url) == tier.manifests.manifest.keys() == stored.keys()
        assert _stored_manifest(bucket_url).retired == {}
        misses = tier.reader.block_misses
        got = await trio.to_thread.run_sync(_consume, bootstrap, count)
        _check_all(got, count)
        assert tier.reader.block_misses > misses  # read from the new objects
        nursery.cancel_scope.cancel()


async def test_a_failed_or_abandoned_compaction_changes_nothing(
    bucket_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = MainBroker(_config(tmp_path / "wal", bucket_url, delete_delay_s=0.5))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, PARTITIONS, {})
        count = await _produce_rounds(broker, bootstrap, 0, 3)
        tier = _tier(broker)
        before = tier.manifests.manifest
        real_update = tier.manifests.update

        # 1. The objects went up, the CAS did not happen (as if killed between the two).
        async def cas_fails(change: Callable[[Manifest], Manifest]) -> Manifest:
            raise ObjectStoreError("injected: the manifest CAS never happened")

        monkeypatch.setattr(tier.manifests, "update", cas_fails)
        await _compact(tier)
        compactor = tier.compaction
        assert compactor.failures == 1 and compactor.compactions == 0
        assert tier.manifests.manifest is before and _stored_manifest(bucket_url) == before
        orphans = _listed(bucket_url) - before.keys()
        assert orphans and all(parse_object_key(k) for k in orphans)
        # Only the unlisted new objects are orphans; the sweep takes them and nothing else.
        gone = await sweep_orphans(AsyncObjectStore(open_object_store(bucket_url)), grace_ms=0)
        assert set(gone) == orphans and _listed(bucket_url) == before.keys()
        got = await trio.to_thread.run_sync(_consume, bootstrap, count)
        _check_all(got, count)

        # 2. Retention dropped a source between the plan and the swap: the job is abandoned
        # and its new objects deleted at once.
        victim = sorted(_ssos(before.keys()))[0]

        async def retention_first(change: Callable[[Manifest], Manifest]) -> Manifest:
            await real_update(lambda m: m.without_objects([victim]))
            return await real_update(change)

        monkeypatch.setattr(tier.manifests, "update", retention_first)
        await _compact(tier)
        assert compactor.abandoned == 1 and compactor.compactions == 0
        dropped = tier.manifests.manifest
        assert dropped.keys() == before.keys() - {victim} and not dropped.retired
        assert _listed(bucket_url) == before.keys()  # the victim is retention's to delete

        # 3. Without interference the next pass swaps.
        monkeypatch.setattr(tier.manifests, "update", real_update)
        await _compact(tier)
        assert compactor.compactions == 1
        assert _spans(tier.manifests.manifest) == _spans(dropped)
        await _wait_retired_deleted(tier)
        assert _listed(bucket_url) == tier.manifests.manifest.keys() | {victim}
        nursery.cancel_scope.cancel()


# -- through zone proxies -------------------------------------------------------------------


@asynccontextmanager
async def _zone_fleet(
    tmp_path: Path, url: str
) -> AsyncIterator[tuple[ZoneFleet, dict[int, MainBroker], dict[int, ProxyBroker]]]:
    _, config = write_zones_toml(tmp_path / "fleet", zones=2)
    for m in config.mains:
        b = m.broker
        b.object_store_url = url
        b.upload_threshold_bytes, b.upload_interval_s = 1 << 40, 0.2
        b.wal = WalConfig(segment_bytes=2048, retention_bytes=1, retention_interval_s=0.1)
        _compaction_settings(b, delete_delay_s=1.0)
    for p in config.proxies:
        p.proxy.object_store_url = url
        p.proxy.mirror_cache_bytes = 4096  # batches below the objects' end: from objects
    mains: dict[int, MainBroker] = {}
    proxies: dict[int, ProxyBroker] = {}
    async with trio.open_nursery() as nursery:
        for m in config.mains:
            main = mains[m.broker.node_id] = MainBroker(m.broker)
            await nursery.start(main.run)
        for p in config.proxies:
            proxy = proxies[p.proxy.node_id] = ProxyBroker(p.proxy)
            await nursery.start(proxy.run)
        yield ZoneFleet(config), mains, proxies
        nursery.cancel_scope.cancel()


async def _each_main(
    mains: dict[int, MainBroker], fn: Callable[[ObjectTier], Awaitable[None]]
) -> None:
    async with trio.open_nursery() as nursery:
        for main in mains.values():
            nursery.start_soon(fn, _tier(main))


async def _wait_all_uploaded(mains: dict[int, MainBroker], topic: str, partitions: int) -> None:
    with trio.fail_after(30):
        for p in range(partitions):
            while True:
                plogs = [m.store.partition(topic, p) for m in mains.values()]
                if any(
                    plog is not None
                    and plog.owned
                    and plog.objects is not None
                    and plog.objects.end_offset == plog.high_watermark > 0
                    for plog in plogs
                ):
                    break
                await trio.sleep(0.05)


async def test_a_proxy_reads_every_record_after_compaction(bucket_url: str, tmp_path: Path) -> None:
    topic, partitions, per_round, rounds = "compacted-zones", 2, 150, 4
    async with _zone_fleet(tmp_path, bucket_url) as (zones, mains, proxies):
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, partitions)
        bootstrap = f"127.0.0.1:{proxies[101].bound_port}"
        for r in range(rounds):
            await trio.to_thread.run_sync(
                produce_many_batches, bootstrap, "az1", topic, "rec", r * per_round, per_round
            )
            await _wait_all_uploaded(mains, topic, partitions)
        before = {n: _tier(m).manifests.manifest for n, m in mains.items()}
        assert sum(len(_ssos(m.keys())) for m in before.values()) >= rounds

        await _each_main(mains, _compact)
        await _each_main(mains, _wait_retired_deleted)
        for node, main in mains.items():
            tier = _tier(main)
            after = tier.manifests.manifest
            assert _spans(after) == _spans(before[node])
            if len(_ssos(before[node].keys())) >= 2:
                assert tier.compaction.compactions >= 1, node
                assert len(_ssos(after.keys())) < len(_ssos(before[node].keys()))
        assert _listed(bucket_url) == set().union(
            *(_tier(m).manifests.manifest.keys() for m in mains.values())
        )
        # Each proxy mirrors the swapped manifests (the state stream's rows).
        with trio.fail_after(30):
            for proxy in proxies.values():
                for node, main in mains.items():
                    while (
                        proxy.mirrors[node].manifest.keys() != _tier(main).manifests.manifest.keys()
                    ):
                        await trio.sleep(0.05)

        far = proxies[102]
        assert far.objects is not None
        misses = far.objects.reader.block_misses
        got = await trio.to_thread.run_sync(
            partial(
                consume_confluent,
                f"127.0.0.1:{far.bound_port}",
                far.config.zone,
                topic,
                partitions,
                rounds * per_round,
            )
        )
        check_exactly_once_in_order(got, rounds * per_round, "rec")
        for p in range(partitions):
            offsets = [o for q, o, _ in got if q == p]
            assert offsets == list(range(len(offsets)))
        assert far.objects.reader.block_misses > misses and far.objects.failures == 0


def test_fleet_storage_sets_sweep_and_compaction(tmp_path: Path) -> None:
    import tomllib

    from fleet.config import ConfigError, local_fleet_toml, parse_fleet_config

    text = local_fleet_toml(tmp_path, 19000)
    (main,) = parse_fleet_config(tomllib.loads(text), tmp_path).mains
    b = main.broker
    assert (b.orphan_sweep_interval_s, b.orphan_grace_s) == (600.0, 600.0)
    assert (b.compaction_interval_s, b.compaction_delete_delay_s) == (300.0, 30.0)
    assert (b.compaction_small_object_bytes, b.compaction_max_object_bytes) == (32 << 20, 128 << 20)
    settings = (
        "orphan_sweep_interval_s = 5.0\norphan_grace_s = 7.5\ncompaction_interval_s = 2.0\n"
        "compaction_small_object_bytes = 1000\ncompaction_max_object_bytes = 9000\n"
        "compaction_delete_delay_s = 0.5\n"
    )
    tuned = text.replace("upload_interval_s = 60.0\n", "upload_interval_s = 60.0\n" + settings)
    (main,) = parse_fleet_config(tomllib.loads(tuned), tmp_path).mains
    b = main.broker
    assert (b.orphan_sweep_interval_s, b.orphan_grace_s) == (5.0, 7.5)
    assert (b.compaction_interval_s, b.compaction_delete_delay_s) == (2.0, 0.5)
    assert (b.compaction_small_object_bytes, b.compaction_max_object_bytes) == (1000, 9000)
    bad = text.replace(
        "upload_interval_s = 60.0\n", "upload_interval_s = 60.0\ncompaction_interval_s = 0\n"
    )
    with pytest.raises(ConfigError, match="compaction_interval_s"):
        parse_fleet_config(tomllib.loads(bad), tmp_path)
