"""A proxy's PREPARED segments go once every main has committed its links past them, or once
they are older than a timeout; a full WAL (wal.max_bytes) answers Produce with a retriable
error until space is freed (issue 4, "Trim rules" and test 5).

The fleets are `zonefleet up --zones N` run in this process with the embedded file:// object
store, a small upload threshold and proxy WALs of small segments.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.config import FleetConfig, load_fleet_config
from kafka_wire.errors import WAL_FULL, WAL_FULL_MESSAGE
from kafka_wire.record_batch import build_batch
from main_broker.broker import MainBroker
from main_broker.links_floor import links_floor, lower
from main_broker.objects import tier as object_tier
from main_broker.objects.upload import stream_key
from proxy_broker.broker import ProxyBroker
from proxy_broker.mirror import MainMirror
from proxy_broker.prepared_trim import prepared_floor
from s3_commit import ObjectStoreError
from shared_wal import WalConfig, WalPosition
from shared_wal.batch_index import BatchEntry, BatchIndex
from shared_wal.broker_records import PreparedLink
from shared_wal.retention import prepared_segments_to_delete
from tests.raw_kafka import RawKafka
from tests.zone_fleet import (
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    create_topic,
    produce_many_batches,
    write_zones_toml,
)

PREFIX = "trim"

# -- pure ---------------------------------------------------------------------------------------


@dataclass
class _Plog:
    """What links_floor reads of a PartitionLog."""

    topic_id: bytes
    partition: int
    index: BatchIndex = field(default_factory=BatchIndex)

    @property
    def entries(self) -> list[BatchEntry]:
        return self.index.entries


def _link(writer: str, segment: int, position: int) -> PreparedLink:
    return PreparedLink(WalPosition(writer, segment, position, 100), 0, False)


def _plog(partition: int, links: list[PreparedLink | None]) -> _Plog:
    plog = _Plog(b"\x01" * 16, partition)
    for i, link in enumerate(links):
        plog.index.add(BatchEntry(i * 10, i * 10 + 9, -1, 100, None, None, link))
    return plog


def test_links_floor_is_the_lowest_link_not_in_objects_per_writer() -> None:
    a = _plog(0, [_link("proxy-1", 0, 500), None, _link("proxy-2", 4096, 10)])
    b = _plog(1, [_link("proxy-1", 4096, 0), _link("proxy-1", 0, 900)])
    plogs: list[Any] = [a, b]
    assert links_floor(plogs, {}) == {"proxy-1": 500, "proxy-2": 4106}
    # Uploaded past a's first batch: its link no longer counts; b's later, lower one does.
    up = {stream_key(a): 10}  # type: ignore[arg-type]
    assert links_floor(plogs, up) == {"proxy-1": 900, "proxy-2": 4106}
    # Everything uploaded: no writer is needed.
    up = {stream_key(a): 30, stream_key(b): 20}  # type: ignore[arg-type]
    assert links_floor(plogs, up) == {}


def test_a_new_link_only_ever_lowers_a_floor() -> None:
    floors: dict[str, int] = {}
    assert lower(floors, WalPosition("proxy-1", 4096, 100, 50))
    assert not lower(floors, WalPosition("proxy-1", 4096, 200, 50))
    assert lower(floors, WalPosition("proxy-1", 0, 4000, 50))
    assert lower(floors, WalPosition("proxy-2", 0, 0, 50))
    assert floors == {"proxy-1": 4000, "proxy-2": 0}


@dataclass
class _Main:
    connected: bool
    links: dict[str, int] | None


def test_the_proxy_floor_is_the_lowest_main_floor_and_incomplete_while_a_main_is_away() -> None:
    mains = [_Main(True, {"proxy-1": 5000, "proxy-2": 10}), _Main(True, {"proxy-1": 7000})]
    assert prepared_floor("proxy-1", mains, 9000) == (5000, True)
    assert prepared_floor("proxy-2", mains, 9000) == (10, True)
    assert prepared_floor("proxy-3", mains, 9000) == (9000, True)  # nobody needs anything
    # A main that is disconnected may need more than it last said; its last floor still holds.
    assert prepared_floor("proxy-1", [*mains, _Main(False, {"proxy-1": 3000})], 9000) == (
        3000,
        False,
    )
    # Connected but not yet synced (no full frame): unknown.
    assert prepared_floor("proxy-1", [*mains, _Main(True, None)], 9000) == (5000, False)


def test_prepared_segments_go_below_the_floor_once_old_enough_or_by_age() -> None:
    sizes = {0: 100, 100: 100, 200: 100, 300: 50}  # 300 is active
    now = 1_000_000.0
    written = {0: now - 5000, 100: now - 3000, 200: now - 500, 300: now}

    def victims(
        floor: int, min_age: float, max_age: float | None, complete: bool = True
    ) -> list[int]:
        return prepared_segments_to_delete(
            sizes,
            written,
            active=300,
            now_ms=now,
            floor=floor,
            complete=complete,
            min_age_ms=min_age,
            max_age_ms=max_age,
        )

    assert victims(200, 0, None) == [0, 100]
    assert victims(150, 0, None) == [0]  # 100 still holds needed bytes
    assert victims(10_000, 0, None) == [0, 100, 200]  # never the active segment
    assert victims(10_000, 1000, None) == [0, 100]  # 200 was sealed too recently
    assert victims(10_000, 0, None, complete=False) == []  # a main's needs are unknown
    assert victims(10_000, 0, 2000, complete=False) == [0, 100]  # ... until the age limit
    assert victims(50, 0, 2000, complete=False) == []  # never above a reported floor


def test_fleet_toml_sets_the_wal_cap_and_the_prepared_retention(tmp_path: Path) -> None:
    path, config = write_zones_toml(tmp_path, zones=2)
    assert config.mains[0].broker.wal.max_bytes is None  # no cap unless asked
    assert config.proxies[0].proxy.prepared_retention_s == 3600.0
    text = path.read_text().replace("[wal]\n", "[wal]\nmax_bytes = 1073741824\n", 1)
    text = text.replace("[[proxies]]\n", "[[proxies]]\nprepared_retention_s = -1\n")
    text = text.replace("[[proxies]]\n", "[[proxies]]\nprepared_min_age_s = 5\n")
    path.write_text(text)
    config = load_fleet_config(path, discover=None)
    assert config.mains[0].broker.wal.max_bytes == 1 << 30
    for p in config.proxies:
        assert p.proxy.wal.max_bytes == 1 << 30
        assert p.proxy.prepared_retention_s is None
        assert p.proxy.prepared_min_age_s == 5.0


# -- fleets -------------------------------------------------------------------------------------


@dataclass
class Fleet:
    config: FleetConfig
    nursery: trio.Nursery
    mains: dict[int, MainBroker] = field(default_factory=dict)
    scopes: dict[int, trio.CancelScope] = field(default_factory=dict)
    proxies: dict[int, ProxyBroker] = field(default_factory=dict)
    stopped: dict[int, trio.Event] = field(default_factory=dict)

    def bootstrap(self, node_id: int) -> str:
        node = self.proxies.get(node_id) or self.mains[node_id]
        return f"127.0.0.1:{node.bound_port}"

    def leader(self, topic: str, partition: int) -> MainBroker:
        for main in self.mains.values():
            plog = main.store.partition(topic, partition)
            if plog is not None and plog.owned:
                return main
        raise AssertionError(f"no main leads {topic}/{partition}")

    async def start_proxy(self, node_id: int) -> ProxyBroker:
        (node,) = [p.proxy for p in self.config.proxies if p.proxy.node_id == node_id]
        proxy = self.proxies[node_id] = ProxyBroker(node)
        scope = self.scopes[node_id] = trio.CancelScope()
        stopped = self.stopped[node_id] = trio.Event()
        await self.nursery.start(_run_proxy, proxy, scope, stopped)
        return proxy

    async def stop_proxy(self, node_id: int) -> None:
        self.scopes[node_id].cancel()
        await self.stopped.pop(node_id).wait()
        del self.proxies[node_id]

    async def stop_main(self, node_id: int) -> None:
        self.scopes[node_id].cancel()
        del self.mains[node_id]


async def _run_proxy(
    proxy: ProxyBroker, scope: trio.CancelScope, stopped: trio.Event, task_status: Any
) -> None:
    try:
        with scope:
            await proxy.run(task_status=task_status)
    finally:
        stopped.set()


async def _run_main(main: MainBroker, scope: trio.CancelScope, task_status: Any) -> None:
    with scope:
        await main.run(task_status=task_status)


@asynccontextmanager
async def _fleet(
    tmp_path: Path,
    zones: int,
    proxies: list[int],
    proxy_wal: WalConfig,
    main_wal_cap: int | None = None,
) -> AsyncIterator[Fleet]:
    _, config = write_zones_toml(tmp_path / "fleet", zones=zones)
    for m in config.mains:
        b = m.broker
        b.upload_threshold_bytes, b.upload_interval_s = 16 * 1024, 0.2
        b.wal = WalConfig(
            segment_bytes=4096, retention_bytes=1, retention_interval_s=0.1, max_bytes=main_wal_cap
        )
    for p in config.proxies:
        p.proxy.wal = proxy_wal
        p.proxy.prepared_min_age_s = 0.2
        p.proxy.mirror_cache_bytes = 4096  # consumers read from objects and the WAL
    async with trio.open_nursery() as nursery:
        fleet = Fleet(config, nursery)
        for m in config.mains:
            main = fleet.mains[m.broker.node_id] = MainBroker(m.broker)
            scope = fleet.scopes[m.broker.node_id] = trio.CancelScope()
            await nursery.start(_run_main, main, scope)
        for node_id in proxies:
            await fleet.start_proxy(node_id)
        yield fleet
        nursery.cancel_scope.cancel()


def _produce(bootstrap: str, zone: str, topic: str, start: int, count: int) -> None:
    produce_many_batches(bootstrap, zone, topic, PREFIX, start, count)


async def _wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.05)
    assert check(), f"timed out waiting until {what}"


def _main_needs_nothing_of_101(main: MainBroker) -> bool:
    return "proxy-101" not in main.store.links_floor


def _mirror_says_nothing_of_101_is_needed(mirror: MainMirror) -> bool:
    return mirror.links is not None and "proxy-101" not in mirror.links


def _all_uploaded(fleet: Fleet, topic: str, partitions: int) -> bool:
    for p in range(partitions):
        plog = fleet.leader(topic, p).store.partition(topic, p)
        assert plog is not None
        if plog.objects is None or plog.objects.end_offset != plog.high_watermark:
            return False
    return True


async def test_prepared_segments_go_once_uploaded_and_every_zone_still_reads_all(
    tmp_path: Path,
) -> None:
    topic, partitions, count = "trimmed", 3, 1500
    wal = WalConfig(segment_bytes=1024, retention_interval_s=0.1)
    async with _fleet(tmp_path, zones=2, proxies=[101, 102], proxy_wal=wal) as fleet:
        zones = ZoneFleet(fleet.config)
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, partitions)
        proxy = fleet.proxies[101]
        deleted: list[int] = []
        proxy.wal.on_segments_deleted = deleted.extend
        await trio.to_thread.run_sync(_produce, fleet.bootstrap(101), "az1", topic, 0, count)
        await _wait_for("every record is in objects", lambda: _all_uploaded(fleet, topic, 3))
        # Every link is in objects: no main needs anything of proxy-101 any more...
        for main in fleet.mains.values():
            await _wait_for("links floors drop", partial(_main_needs_nothing_of_101, main))
        # ... and the proxy's retention deletes every sealed PREPARED segment.
        await _wait_for("sealed segments are gone", lambda: len(proxy.wal.segments()) == 1)
        # Many segments, trimmed as uploads went on (some during the produce already).
        assert len(deleted) > 5
        assert proxy.wal.start_offset > deleted[-1]
        assert not (proxy.wal.fs.exists(f"wal/proxy-101/{deleted[0]:020d}.wal"))

        async def consume(bootstrap: str, zone: str, out: dict[str, Any]) -> None:
            out[bootstrap] = await trio.to_thread.run_sync(
                partial(consume_confluent, bootstrap, zone, topic, partitions, count)
            )

        got: dict[str, Any] = {}
        async with trio.open_nursery() as consumers:
            for node_id in fleet.proxies:
                zone = fleet.proxies[node_id].config.zone
                consumers.start_soon(consume, fleet.bootstrap(node_id), zone, got)
            for node_id, main in fleet.mains.items():
                consumers.start_soon(consume, fleet.bootstrap(node_id), main.config.zone, got)
        assert len(got) == 4
        for records in got.values():
            check_exactly_once_in_order(records, count, PREFIX)


async def test_a_disconnected_main_blocks_the_trim_until_the_timeout(tmp_path: Path) -> None:
    topic, partitions, count = "blocked", 2, 600
    # Retention is run by hand here, to look at it before and after the main goes.
    wal = WalConfig(segment_bytes=512, retention_interval_s=3600)
    async with _fleet(tmp_path, zones=2, proxies=[101], proxy_wal=wal) as fleet:
        zones = ZoneFleet(fleet.config)
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, partitions)

        def leaders() -> set[int]:
            return {
                main.config.node_id
                for main in fleet.mains.values()
                for p in range(partitions)
                if (plog := main.store.partition(topic, p)) is not None and plog.owned
            }

        await _wait_for("both mains lead a partition", lambda: leaders() == {1, 2})
        proxy = fleet.proxies[101]
        await trio.to_thread.run_sync(_produce, fleet.bootstrap(101), "az1", topic, 0, count)
        await _wait_for("every record is in objects", lambda: _all_uploaded(fleet, topic, 2))
        for node_id, mirror in proxy.mirrors.items():
            await _wait_for(
                f"main {node_id}'s floor reaches the proxy",
                partial(_mirror_says_nothing_of_101_is_needed, mirror),
            )
        sealed = proxy.wal.segments()[:-1]
        assert len(sealed) >= 3
        # With both mains synced, nothing of proxy-101 is needed.
        assert proxy.wal.prepared_trim is not None
        assert proxy.wal.prepared_trim.floor() == (proxy.wal.end_offset, True)

        await fleet.stop_main(2)
        await _wait_for("the proxy sees main 2 gone", lambda: not proxy.mirrors[2].connected)
        assert proxy.wal.prepared_trim.floor() == (proxy.wal.end_offset, False)
        status = proxy.status()
        assert status["prepared_floor_complete"] is False and status["wal_full"] is False
        now_ms = time.time() * 1000 + 10_000  # well past prepared_min_age_s
        assert await proxy.wal.enforce_retention(now_ms) == []
        assert proxy.wal.segments()[:-1] == sealed

        # Past prepared_retention_s, age alone frees them.
        retention_s = proxy.config.prepared_retention_s
        assert retention_s is not None
        later = time.time() * 1000 + (retention_s + 1) * 1000
        assert await proxy.wal.enforce_retention(later) == sealed


def _fail_uploads(main: MainBroker) -> Callable[[bool], None]:
    """Make the main's object PUTs fail (an outage of the store) until the returned switch
    is turned off."""
    tier = main.objects
    assert tier is not None
    outage = [True]
    real_put = tier.astore.put

    async def failing_put(key: str, data: Any, *args: Any, **kwargs: Any) -> Any:
        if outage[0]:
            raise ObjectStoreError(f"injected outage: PUT {key}")
        return await real_put(key, data, *args, **kwargs)

    tier.astore.put = failing_put  # type: ignore[method-assign]

    def switch(on: bool) -> None:
        outage[0] = on

    return switch


async def test_a_restarted_proxy_keeps_what_a_main_still_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, count = "restarted", 400
    monkeypatch.setattr(object_tier, "MAX_BACKOFF_S", 0.5)
    wal = WalConfig(segment_bytes=512, retention_interval_s=3600)  # retention run by hand
    async with _fleet(tmp_path, zones=2, proxies=[101, 102], proxy_wal=wal) as fleet:
        zones = ZoneFleet(fleet.config)
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, 1)
        await _wait_for("a main leads the partition", lambda: _has_leader(fleet, topic))
        main = fleet.leader(topic, 0)
        # A client in the other zone produces through its zone's proxy.
        node = 101 if main.config.zone != "az1" else 102
        zone, writer = fleet.proxies[node].config.zone, f"proxy-{node}"
        outage = _fail_uploads(main)
        await trio.to_thread.run_sync(_produce, fleet.bootstrap(node), zone, topic, 0, count)
        needed = main.store.links_floor[writer]  # nothing uploaded: the first payload
        assert needed < fleet.proxies[node].wal.segments()[-3]

        await fleet.stop_proxy(node)
        proxy = await fleet.start_proxy(node)
        assert proxy.wal.prepared_trim is not None
        mirror = proxy.mirrors[main.config.node_id]
        await mirror.synced.wait()
        await _wait_for(
            "every main is synced", lambda: all(m.connected for m in proxy.mirrors.values())
        )
        assert proxy.wal.prepared_trim.floor() == (needed, True)
        later_ms = time.time() * 1000 + 10_000  # past prepared_min_age_s
        deleted = await proxy.wal.enforce_retention(later_ms)
        assert proxy.wal.start_offset <= needed, deleted  # the payloads the main needs stay

        # The store is back: the main uploads, its floor rises, the restarted proxy trims.
        outage(False)
        await _wait_for("every record is in objects", lambda: _all_uploaded(fleet, topic, 1))
        await _wait_for(
            "the floor reaches the proxy",
            lambda: mirror.links is not None and writer not in mirror.links,
        )
        assert await proxy.wal.enforce_retention(later_ms)
        assert len(proxy.wal.segments()) == 1
        records = await trio.to_thread.run_sync(
            partial(consume_confluent, fleet.bootstrap(node), zone, topic, 1, count)
        )
        check_exactly_once_in_order(records, count, PREFIX)


def _has_leader(fleet: Fleet, topic: str) -> bool:
    try:
        fleet.leader(topic, 0)
    except AssertionError:
        return False
    return True


def _produce_raw(bootstrap: str, topic: str, partition: int, size: int) -> tuple[int, str | None]:
    batch = build_batch([(None, b"x" * size)], timestamp_ms=int(time.time() * 1000))
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}],
    }
    raw = RawKafka(bootstrap)
    try:
        resp = raw.request(0, 9, body)
    finally:
        raw.close()
    (part,) = resp.responses[0].partition_responses
    return int(part.error_code), part.error_message


async def _produce_until_refused(
    bootstrap: str, topic: str, partition: int, limit: int
) -> tuple[int, str | None]:
    for _ in range(limit):
        code, message = await trio.to_thread.run_sync(
            _produce_raw, bootstrap, topic, partition, 2000
        )
        if code != 0:
            return code, message
    raise AssertionError(f"{limit} produce requests of 2 KB were all accepted")


async def test_a_full_wal_refuses_produce_with_a_retriable_error_until_uploads_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "capped"
    monkeypatch.setattr(object_tier, "MAX_BACKOFF_S", 0.5)  # retry soon once the store is back
    wal = WalConfig(segment_bytes=4096, retention_interval_s=0.1, max_bytes=48 * 1024)
    async with _fleet(
        tmp_path, zones=1, proxies=[101], proxy_wal=wal, main_wal_cap=64 * 1024
    ) as fleet:
        zones = ZoneFleet(fleet.config)
        await trio.to_thread.run_sync(create_topic, zones, "az1", topic, 1)
        main = fleet.leader(topic, 0)
        tier = main.objects
        assert tier is not None
        outage = _fail_uploads(main)

        # Through the proxy: its PREPARED segments stay (no main committed its links) until
        # its WAL reaches the cap; then Produce gets the retriable error, and nothing crashes.
        code, message = await _produce_until_refused(fleet.bootstrap(101), topic, 0, 100)
        assert (code, message) == (WAL_FULL, WAL_FULL_MESSAGE)
        proxy = fleet.proxies[101]
        assert proxy.wal.full and proxy.wal.failed is None and proxy.ready
        # Straight to the main: its own WAL (DATA records) fills up the same way.
        code, message = await _produce_until_refused(
            fleet.bootstrap(main.config.node_id), topic, 0, 100
        )
        assert (code, message) == (WAL_FULL, WAL_FULL_MESSAGE)
        assert main.store.wal.full and not main.storage_failed
        assert tier.failures > 0 and tier.uploads == 0

        # The store comes back: uploads commit, both WALs trim, produce works again.
        outage(False)
        await _wait_for("the main's WAL has room", lambda: not main.store.wal.full, 30)
        await _wait_for("the proxy's WAL has room", lambda: not proxy.wal.full, 30)
        assert tier.uploads > 0
        for bootstrap in (fleet.bootstrap(101), fleet.bootstrap(main.config.node_id)):
            assert await trio.to_thread.run_sync(_produce_raw, bootstrap, topic, 0, 2000) == (
                0,
                None,
            )
