"""Zone proxies read what their WAL mirrors no longer hold from the mains' committed objects,
which they learn of from the state stream (issue 4, "Read path, for mains and proxies").

The fleet is `zonefleet up --zones N` run in this process, with the embedded file:// object
store, a small upload threshold, main WALs of small segments that retention trims down to what
objects do not hold yet, and proxies with a tiny mirror cache, so that a consumer reading from
offset 0 through any proxy crosses from objects to the WAL.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from fleet.config import FleetConfig
from kafka_wire.record_batch import parse_batch_header
from main_broker.broker import MainBroker
from proxy_broker.broker import ProxyBroker
from proxy_broker.mirror import MirrorPartition
from proxy_broker.object_reads import ObjectSpan
from s3_commit.manifest import ObjectRange, StreamManifest
from shared_wal import WalConfig
from shared_wal.batch_index import BatchEntry
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    create_topic,
    produce_many_batches,
    write_zones_toml,
)

PREFIX = "rec"
SSO = "data/sso/0000018c0f0070000000000000000001"


def _mirror_partition(cached: set[int]) -> MirrorPartition:
    """Batches of 10 offsets from 100 to 200 in the WAL mirror (bytes in memory only for the
    bases in `cached`), objects holding [0, 150), high watermark 190."""
    part = MirrorPartition("t", 0, 1)
    part.apply(["t", 0, 0, 190, 190, 0, 200])
    for base in range(100, 200, 10):
        data = b"x" * 50 if base in cached else None
        part.index.add(BatchEntry(base, base + 9, -1, 50, data, None))
    part.link_objects(StreamManifest("t", (ObjectRange(0, 150, SSO, 5000),)), 42)
    return part


def test_mirror_partition_reads_below_its_memory_from_objects() -> None:
    part = _mirror_partition(cached={130, 140, 160})
    # Leading batches the objects hold and memory lost are forgotten; 130 is still in memory.
    assert part.index.entries[0].base_offset == 130

    # Below the mirror: one span up to the objects' end.
    error, entries = part.fetch_slice(0, 1000, 190, True)
    assert error == ErrorCode.none
    (span,) = entries
    assert isinstance(span, ObjectSpan)
    assert (span.base_offset, span.end, span.size, span.stream_id) == (0, 150, 1000, 42)
    # In memory: from memory, then from the WAL mirror past the objects' end (150 on).
    error, entries = part.fetch_slice(135, 1000, 190, True)
    assert error == ErrorCode.none
    assert [e.base_offset for e in entries] == [130, 140, 150, 160, 170, 180]
    # Above the objects: the WAL mirror, never past the high watermark.
    error, entries = part.fetch_slice(150, 1000, 190, True)
    assert error == ErrorCode.none
    assert [e.base_offset for e in entries] == [150, 160, 170, 180]
    # Never past the high watermark from objects either.
    error, entries = part.fetch_slice(0, 1000, 80, True)
    assert error == ErrorCode.none
    assert isinstance(entries[0], ObjectSpan) and entries[0].end == 80
    # Out of range stays out of range.
    assert part.fetch_slice(201, 1000, 190, True)[0] == ErrorCode.offset_out_of_range


def test_mirror_partition_stops_at_an_uploaded_batch_memory_lost() -> None:
    part = _mirror_partition(cached={100, 110, 130})
    error, entries = part.fetch_slice(100, 1000, 190, True)
    assert error == ErrorCode.none
    assert [e.base_offset for e in entries] == [100, 110]  # 120 follows from the objects
    error, entries = part.fetch_slice(120, 1000, 190, True)
    assert error == ErrorCode.none
    assert isinstance(entries[0], ObjectSpan) and entries[0].base_offset == 120


@dataclass
class Fleet:
    config: FleetConfig
    nursery: trio.Nursery
    mains: dict[int, MainBroker] = field(default_factory=dict)
    proxies: dict[int, ProxyBroker] = field(default_factory=dict)

    def bootstrap(self, node_id: int) -> str:
        return f"127.0.0.1:{self.proxies[node_id].bound_port}"

    async def start_proxy(self, node_id: int) -> ProxyBroker:
        (node,) = [p.proxy for p in self.config.proxies if p.proxy.node_id == node_id]
        proxy = self.proxies[node_id] = ProxyBroker(node)
        await self.nursery.start(proxy.run)
        return proxy

    def leader(self, topic: str, partition: int) -> MainBroker:
        for main in self.mains.values():
            plog = main.store.partition(topic, partition)
            if plog is not None and plog.owned:
                return main
        raise AssertionError(f"no main leads {topic}/{partition}")


@asynccontextmanager
async def _fleet(tmp_path: Path, zones: int, proxies: list[int]) -> AsyncIterator[Fleet]:
    _, config = write_zones_toml(tmp_path / "fleet", zones=zones)
    for m in config.mains:
        b = m.broker
        b.upload_threshold_bytes, b.upload_interval_s = 16 * 1024, 0.2
        # A main's WAL holds only LINKs (the payloads are in the proxies' WALs): small
        # segments and a byte budget retention exceeds at once, so only the retention floor
        # (what objects do not hold yet) keeps a segment.
        b.wal = WalConfig(segment_bytes=2048, retention_bytes=1, retention_interval_s=0.1)
    for p in config.proxies:
        assert p.proxy.object_store_url == config.mains[0].broker.object_store_url
        p.proxy.mirror_cache_bytes = 4096  # evicted batches below the objects' end: objects
    async with trio.open_nursery() as nursery:
        fleet = Fleet(config, nursery)
        for m in config.mains:
            main = fleet.mains[m.broker.node_id] = MainBroker(m.broker)
            await nursery.start(main.run)
        for node_id in proxies:
            await fleet.start_proxy(node_id)
        yield fleet
        nursery.cancel_scope.cancel()


def _produce(bootstrap: str, zone: str, topic: str, start: int, count: int) -> None:
    produce_many_batches(bootstrap, zone, topic, PREFIX, start, count)


async def _wait_uploaded_and_trimmed(fleet: Fleet, topic: str, partitions: int) -> None:
    """Every committed record of the topic is in objects, and each partition's first offsets
    are gone from its main's WAL."""
    with trio.fail_after(20):
        for p in range(partitions):
            main = fleet.leader(topic, p)
            plog = main.store.partition(topic, p)
            assert plog is not None and main.objects is not None
            while not (
                plog.objects is not None
                and plog.objects.end_offset == plog.high_watermark
                and plog.wal_start_offset > 0
            ):
                await trio.sleep(0.05)
            assert plog.log_start_offset == 0  # the objects still hold offset 0


async def test_every_zone_reads_every_record_from_objects_and_wal(tmp_path: Path) -> None:
    topic, partitions, first, second = "catchup", 3, 1500, 300
    async with _fleet(tmp_path, zones=3, proxies=[101, 102]) as fleet:
        zones = ZoneFleet(fleet.config)
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, partitions)
        await trio.to_thread.run_sync(_produce, fleet.bootstrap(101), "az1", topic, 0, first)
        await _wait_uploaded_and_trimmed(fleet, topic, partitions)

        # What comes next stays in the WAL only: the consumers cross from objects to the WAL.
        for main in fleet.mains.values():
            main.config.upload_threshold_bytes, main.config.upload_interval_s = 1 << 40, 3600.0
        await trio.to_thread.run_sync(_produce, fleet.bootstrap(101), "az1", topic, first, second)
        for p in range(partitions):
            plog = fleet.leader(topic, p).store.partition(topic, p)
            assert plog is not None and plog.objects is not None
            assert 0 < plog.objects.end_offset < plog.high_watermark

        # A proxy that starts now never saw the trimmed WAL: offset 0 is only in objects.
        late = await fleet.start_proxy(103)
        for p in range(partitions):
            part = late.partition(topic, p)
            assert part is not None and part.objects is not None
            assert part.log_start_offset == 0
            assert not part.index.entries or part.index.entries[0].base_offset > 0

        async def consume(node_id: int, out: dict[int, list[Any]]) -> None:
            zone = fleet.proxies[node_id].config.zone
            out[node_id] = await trio.to_thread.run_sync(
                partial(
                    consume_confluent,
                    fleet.bootstrap(node_id),
                    zone,
                    topic,
                    partitions,
                    first + second,
                )
            )

        got: dict[int, list[Any]] = {}
        async with trio.open_nursery() as consumers:
            for node_id in fleet.proxies:
                consumers.start_soon(consume, node_id, got)
        for node_id, proxy in fleet.proxies.items():
            check_exactly_once_in_order(got[node_id], first + second, PREFIX)
            offsets: dict[int, list[int]] = {}
            for p, offset, _ in got[node_id]:
                offsets.setdefault(p, []).append(offset)
            for p, seen in offsets.items():
                assert seen == list(range(len(seen))), f"proxy {node_id} partition {p}"
            assert proxy.objects is not None
            reader = proxy.objects.reader
            assert reader.block_misses > 0 and reader.gets > 0, f"proxy {node_id} read no object"
            assert proxy.objects.failures == 0
            # Booked as S3 GET traffic from the storage zone to the proxy's zone.
            zone = proxy.config.zone
            metrics = proxy.registry.render()
            assert f'to_zone="{zone}",channel="s3-get",api="GetObject"' in metrics
            # The cache and read counters an operator watches, as the reader counted them.
            assert f"zonefleet_s3_block_cache_misses {reader.block_misses}" in metrics
            assert f"zonefleet_s3_read_gets {reader.gets}" in metrics
            assert "zonefleet_s3_read_failures 0" in metrics


def _fetch(bootstrap: str, topic: str, offsets: dict[int, int]) -> dict[int, Any]:
    raw = RawKafka(bootstrap)
    try:
        return raw.fetch(topic, offsets)
    finally:
        raw.close()


def _first_offset(part: Any) -> int | None:
    records = part.records
    if not records:
        return None
    return parse_batch_header(memoryview(bytes(records)), 0).base_offset


async def test_a_corrupt_or_missing_object_fails_only_its_partition(tmp_path: Path) -> None:
    topic, partitions, count = "damaged", 2, 600
    async with _fleet(tmp_path, zones=2, proxies=[101, 102]) as fleet:
        zones = ZoneFleet(fleet.config)
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, partitions)
        await trio.to_thread.run_sync(_produce, fleet.bootstrap(101), "az1", topic, 0, count)
        await _wait_uploaded_and_trimmed(fleet, topic, partitions)
        for main in fleet.mains.values():
            main.config.upload_threshold_bytes, main.config.upload_interval_s = 1 << 40, 3600.0

        url = fleet.config.mains[0].broker.object_store_url
        assert url is not None and url.startswith("file://")
        objects_dir = Path(url.removeprefix("file://"))
        keys: dict[int, str] = {}
        for p in range(partitions):
            plog = fleet.leader(topic, p).store.partition(topic, p)
            assert plog is not None and plog.objects is not None
            rng = plog.objects.find(0)
            assert rng is not None
            keys[p] = rng.key
        corrupt, missing = objects_dir / keys[0], objects_dir / keys[1]
        original = corrupt.read_bytes()
        damaged = bytearray(original)
        damaged[100] ^= 0xFF  # inside the first DataBlock: its CRC no longer matches
        corrupt.write_bytes(bytes(damaged))
        os.rename(missing, missing.with_name(missing.name + ".away"))

        proxy = fleet.proxies[102]
        assert proxy.objects is not None
        proxy.objects.evict(list(keys.values()))
        for main in fleet.mains.values():
            assert main.objects is not None
            main.objects.reader.evict(list(keys.values()))

        # Through a proxy: both partitions answer KAFKA_STORAGE_ERROR, nothing crashes.
        got = await trio.to_thread.run_sync(_fetch, fleet.bootstrap(102), topic, {0: 0, 1: 0})
        for p in range(partitions):
            assert got[p].error_code == ErrorCode.kafka_storage_error, (p, got[p])
            assert not got[p].records
            assert got[p].high_watermark > 0
        assert proxy.objects.failures >= 2
        # Offsets the WAL mirror holds in the same request are still served.
        plog1 = fleet.leader(topic, 1).store.partition(topic, 1)
        assert plog1 is not None and plog1.objects is not None
        wal_offset = plog1.high_watermark - 1
        got = await trio.to_thread.run_sync(
            _fetch, fleet.bootstrap(102), topic, {0: 0, 1: wal_offset}
        )
        assert got[0].error_code == ErrorCode.kafka_storage_error
        assert got[1].error_code == ErrorCode.none and _first_offset(got[1]) is not None

        # Through the leading main directly: the same per-partition error.
        main = fleet.leader(topic, 0)
        host, port = main.config.advertised
        got = await trio.to_thread.run_sync(_fetch, f"{host}:{port}", topic, {0: 0})
        assert got[0].error_code == ErrorCode.kafka_storage_error

        # The objects come back: so do the records, from the same proxy.
        corrupt.write_bytes(original)
        os.rename(missing.with_name(missing.name + ".away"), missing)
        got = await trio.to_thread.run_sync(_fetch, fleet.bootstrap(102), topic, {0: 0, 1: 0})
        for p in range(partitions):
            assert got[p].error_code == ErrorCode.none and _first_offset(got[p]) == 0
        assert proxy.ready and not fleet.nursery.cancel_scope.cancel_called
