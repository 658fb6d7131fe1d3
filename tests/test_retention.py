"""Topic retention over committed objects and DeleteTopics' object removal (issue 4, section 5).

The pure decision (which ranges expire, which objects may go), the partition log's view of a
moved log start, and, on a real S3 server (SeaweedFS), a main that advances log starts by
retention.ms and retention.bytes, deletes expired objects but keeps a StreamSetObject another
topic still uses, removes a deleted topic's objects, and keeps the log start across a restart
with an empty WAL; then, with a zone proxy, that a proxy answers below the new start as the main
does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from kafka_wire.record_batch import build_batch, parse_batch_header
from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from main_broker.objects.retention_policy import (
    StreamRetention,
    apply_retention,
    expired_log_start,
    range_time_ms,
    retire_unreferenced,
    unreferenced,
    without_topics,
)
from main_broker.partition_log import PartitionLog
from main_broker.topic_config import EffectiveTopicConfig
from proxy_broker.broker import ProxyBroker
from s3_commit import open_object_store
from s3_commit.manifest import (
    Manifest,
    ObjectRange,
    StreamKey,
    StreamManifest,
    StreamShare,
    UploadedObject,
    new_object_id,
)
from s3_commit.object_plan import sso_key
from shared_wal import WalConfig, WalPosition
from tests.raw_kafka import RawKafka
from tests.s3_servers import SeaweedServer, seaweedfs
from tests.zone_fleet import consume_partition, object_main_config, write_zones_toml, zone_client_id

__all__ = ["seaweedfs"]  # the fixture, imported so pytest finds it

NOW = 1_800_000_000_000
HOUR = 3_600_000
T1, T2 = bytes(range(16)), bytes(range(16, 32))


def _sso(n: int) -> str:
    return sso_key(f"{n:032x}")


def _stream(*ranges: tuple[int, int, int, int]) -> StreamManifest:
    """Ranges (start, end, max timestamp, bytes), each in its own object."""
    return StreamManifest(
        "t", tuple(ObjectRange(s, e, _sso(s + 1), 10_000, ts, n) for s, e, ts, n in ranges)
    )


# -- the pure decision ------------------------------------------------------------------------


def test_time_retention_drops_the_expired_prefix_only() -> None:
    stream = _stream(
        (0, 10, NOW - 3 * HOUR, 100),
        (10, 20, NOW - 2 * HOUR, 100),
        (20, 30, NOW - 10, 100),  # not expired: what follows stays too
        (30, 40, NOW - 5 * HOUR, 100),
    )
    assert expired_log_start(stream, StreamRetention(HOUR, -1), NOW) == 20
    assert expired_log_start(stream, StreamRetention(4 * HOUR, -1), NOW) is None
    assert expired_log_start(stream, StreamRetention(-1, -1), NOW) is None
    assert expired_log_start(stream, StreamRetention(0, -1), NOW) == 40  # everything goes


def test_size_retention_keeps_at_least_retention_bytes_counting_the_wal() -> None:
    stream = _stream((0, 10, NOW, 100), (10, 20, NOW, 200), (20, 30, NOW, 300))
    # 600 in objects: dropping the first leaves 500 >= 450, the second would leave 300.
    assert expired_log_start(stream, StreamRetention(-1, 450), NOW) == 10
    assert expired_log_start(stream, StreamRetention(-1, 300), NOW) == 20
    assert expired_log_start(stream, StreamRetention(-1, 601), NOW) is None
    # WAL bytes above the objects count towards the size: more of the objects may go.
    assert expired_log_start(stream, StreamRetention(-1, 300, wal_bytes=300), NOW) == 30
    # With both limits, whichever drops more wins.
    assert expired_log_start(stream, StreamRetention(HOUR, 450), NOW) == 10


def test_ranges_without_timestamps_or_bytes_fall_back_to_object_time_and_size() -> None:
    created = NOW - 2 * HOUR
    rng = ObjectRange(0, 10, sso_key(new_object_id(created)), 5000)  # 5-element form
    assert range_time_ms(rng) == created
    stream = StreamManifest("t", (rng,))
    assert expired_log_start(stream, StreamRetention(HOUR, -1), NOW) == 10
    assert expired_log_start(stream, StreamRetention(3 * HOUR, -1), NOW) is None
    assert expired_log_start(stream, StreamRetention(-1, 0), NOW) == 10  # its size: 5000
    undated = ObjectRange(0, 10, _sso(7), 5000)  # an id the sweep cannot date either
    assert range_time_ms(undated) is None


def _upload(
    manifest: Manifest, key: str, shares: list[tuple[StreamKey, int, int, int]]
) -> Manifest:
    obj = UploadedObject(
        key, 10_000, tuple(StreamShare(k, "t", s, e, ts, 100) for k, s, e, ts in shares)
    )
    return manifest.with_upload([obj])


def test_a_shared_object_goes_only_when_no_stream_references_it() -> None:
    a, b = StreamKey(T1, 0), StreamKey(T2, 0)
    m = _upload(Manifest(1), _sso(1), [(a, 0, 10, NOW - 3 * HOUR), (b, 0, 5, NOW - 10)])
    m = _upload(m, _sso(2), [(a, 10, 20, NOW - 10)])
    limits = {a: StreamRetention(HOUR, -1), b: StreamRetention(HOUR, -1)}
    retained = apply_retention(m, limits, NOW)
    assert retained.stream(T1, 0).log_start == 10  # type: ignore[union-attr]
    assert unreferenced(m, retained) == set()  # stream b still has a range in SSO 1
    assert apply_retention(retained, limits, NOW) is retained
    later = apply_retention(retained, limits, NOW + 2 * HOUR)
    assert unreferenced(retained, later) == {_sso(1), _sso(2)}
    # The freed objects are retired (referenced until deleted, after the delay) in the same CAS.
    retired = retire_unreferenced(retained, later, NOW + 10_000)
    assert retired.retired == {_sso(1): NOW + 10_000, _sso(2): NOW + 10_000}
    assert retired.referenced_keys() == {_sso(1), _sso(2)} and retired.keys() == set()
    assert Manifest.from_bytes(retired.to_bytes()) == retired
    assert retire_unreferenced(retired, retired, NOW) is retired
    assert retire_unreferenced(m, retained, NOW) is retained  # nothing freed
    # Every range expired: the streams stay with their ends as log starts.
    assert later.stream(T1, 0).end_offset == 20 and later.stream(T2, 0).end_offset == 5  # type: ignore[union-attr]
    # DeleteTopics: by deleted id, or (with cluster metadata) every topic not live.
    assert unreferenced(m, without_topics(m, {T2})) == set()
    assert without_topics(m, {T1, T2}).streams == {}
    assert without_topics(m, (), live={T1}).keys() == m.keys()
    assert set(without_topics(m, (), live={T1}).streams) == {a}
    assert without_topics(m, ()) is m


def test_compact_only_topics_are_not_retained() -> None:
    assert EffectiveTopicConfig.from_explicit({}, {}).retention_deletes
    compact = EffectiveTopicConfig.from_explicit({"cleanup.policy": "compact"}, {})
    assert not compact.retention_deletes
    both = EffectiveTopicConfig.from_explicit({"cleanup.policy": "compact,delete"}, {})
    assert both.retention_deletes and both.compacted


# -- the partition log ------------------------------------------------------------------------


def _plog(batches: int, per_batch: int = 10) -> PartitionLog:
    plog = PartitionLog("t", 0, T1, EffectiveTopicConfig.from_explicit({}, {}))
    for i in range(batches):
        buf = bytearray(build_batch([(None, b"x" * 50)] * per_batch, timestamp_ms=1000 + i))
        entry = plog.append(memoryview(buf), parse_batch_header(buf), 0)
        plog.mark_durable(entry, WalPosition("main-1", 0, 1000 * i, 500))
    return plog


def test_a_moved_log_start_hides_what_the_wal_still_holds_below_it() -> None:
    plog = _plog(6)  # offsets 0..59 in the WAL index
    uploaded = _stream((0, 20, NOW, 100), (20, 40, NOW, 100))
    assert not plog.adopt_objects(uploaded) and plog.log_start_offset == 0
    retained = StreamManifest("t", uploaded.ranges[1:], 20)
    assert plog.adopt_objects(retained)
    assert plog.log_start_offset == 20 and plog.wal_start_offset == 20
    assert plog.fetch_slice(10, 1 << 20, 60, True).error == ErrorCode.offset_out_of_range
    assert plog.fetch_slice(20, 1 << 20, 60, True).error == ErrorCode.none
    # Every range expired: the log starts where the objects ended, the WAL serves the rest.
    assert plog.adopt_objects(StreamManifest("t", (), 40))
    assert (plog.log_start_offset, plog.wal_start_offset, plog.high_watermark) == (40, 40, 60)
    first = plog.fetch_slice(40, 1 << 20, 60, True).entries[0]
    assert first.base_offset == 40


def test_a_restart_with_an_empty_wal_continues_after_a_retained_stream() -> None:
    plog = PartitionLog("t", 0, T1, EffectiveTopicConfig.from_explicit({}, {}))
    assert plog.adopt_objects(StreamManifest("t", (), 500))
    assert (plog.log_start_offset, plog.next_offset, plog.high_watermark) == (500, 500, 500)
    assert plog.fetch_slice(0, 100, 500, True).error == ErrorCode.offset_out_of_range


def test_fleet_storage_section_sets_the_retention_interval_and_delete_delay(
    tmp_path: Path,
) -> None:
    import tomllib

    from fleet.config import ConfigError, local_fleet_toml, parse_fleet_config

    text = local_fleet_toml(tmp_path, 19000)
    (main,) = parse_fleet_config(tomllib.loads(text), tmp_path).mains
    assert (main.broker.retention_check_interval_s, main.broker.retention_delete_delay_s) == (
        30.0,
        10.0,
    )
    tuned = text.replace("[storage]\n", "[storage]\nretention_check_interval_s = 2.5\n")
    tuned = tuned.replace("[storage]\n", "[storage]\nretention_delete_delay_s = 0.5\n")
    (main,) = parse_fleet_config(tomllib.loads(tuned), tmp_path).mains
    assert (main.broker.retention_check_interval_s, main.broker.retention_delete_delay_s) == (
        2.5,
        0.5,
    )
    bad = text.replace("[storage]\n", "[storage]\nretention_check_interval_s = 0\n")
    with pytest.raises(ConfigError, match="retention_check_interval_s"):
        parse_fleet_config(tomllib.loads(bad), tmp_path)


# -- a main on SeaweedFS ----------------------------------------------------------------------

VALUE = b"r" * 300


@pytest.fixture(scope="module")
def bucket_url(seaweedfs: SeaweedServer) -> Iterator[str]:
    yield seaweedfs.bucket_url()


def _config(wal_dir: Path, url: str) -> BrokerConfig:
    return object_main_config(
        wal_dir,
        url,
        WalConfig(segment_bytes=64 * 1024, retention_bytes=1, retention_interval_s=0.1),
        # The test decides what each upload holds (`upload_once`): never on its own.
        upload_threshold_bytes=1 << 40,
        upload_interval_s=3600.0,
        retention_check_interval_s=0.1,
        retention_delete_delay_s=0.2,
    )


def _produce(
    bootstrap: str, topic: str, start: int, count: int, timestamp_ms: int, client_id: str = ""
) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "client.id": client_id}
    )
    errors: list[Any] = []

    def delivered(error: Any, _msg: Any) -> None:
        if error is not None:
            errors.append(error)

    for i in range(start, start + count):
        producer.produce(
            topic, VALUE + str(i).encode(), timestamp=timestamp_ms, on_delivery=delivered
        )
        producer.poll(0)
    assert producer.flush(20) == 0 and not errors


def _watermarks(bootstrap: str, topic: str, client_id: str = "") -> tuple[int, int]:
    """ListOffsets earliest and latest."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"w-{uuid.uuid4()}",
            "client.id": client_id,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return low, high


def _fetch_error(bootstrap: str, topic: str, offset: int) -> int:
    raw = RawKafka(bootstrap)
    try:
        (part,) = raw.fetch(topic, {0: offset}).values()
    finally:
        raw.close()
    return int(part.error_code)


def _admin(
    bootstrap: str, create: dict[str, dict[str, str]], delete: list[str], client_id: str = ""
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id})
    if delete:
        for future in admin.delete_topics(delete, operation_timeout=10).values():
            future.result()
    if create:
        topics = [NewTopic(n, 1, 1, config=c) for n, c in create.items()]
        for future in admin.create_topics(topics, operation_timeout=10).values():
            future.result()


def _expected(topic_start: int, end: int) -> list[tuple[int, bytes]]:
    return [(i, VALUE + str(i).encode()) for i in range(topic_start, end)]


async def _until(check: Any, timeout: float = 30.0) -> None:
    """Poll a condition the broker's background tasks bring about (bounded)."""
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.05)


def _bucket_keys(url: str) -> set[str]:
    return {info.key for info in open_object_store(url).list("data/")}


async def _until_deleted(url: str, key: str, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while key in await trio.to_thread.run_sync(_bucket_keys, url):
            await trio.sleep(0.1)


async def test_retention_and_delete_topics_on_seaweedfs(bucket_url: str, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    old = now - 2 * HOUR
    broker = MainBroker(_config(tmp_path / "wal", bucket_url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        tier, retention = broker.objects, broker.retention
        assert tier is not None and retention is not None
        await trio.to_thread.run_sync(
            _admin,
            bootstrap,
            {
                "expiring": {"retention.ms": str(HOUR)},
                "kept": {},
                "sized": {"retention.bytes": "150000"},
            },
            [],
        )

        async def upload() -> set[str]:
            before = tier.manifests.manifest.keys()
            assert await tier.upload_once() > 0
            return tier.manifests.manifest.keys() - before

        # S0: old records of "expiring" alone; S1: older ones of "expiring" with fresh ones of
        # "kept" (a shared StreamSetObject); S2: fresh records of "expiring".
        await trio.to_thread.run_sync(_produce, bootstrap, "expiring", 0, 100, old)
        (s0,) = await upload()
        await trio.to_thread.run_sync(_produce, bootstrap, "expiring", 100, 100, old)
        await trio.to_thread.run_sync(_produce, bootstrap, "kept", 0, 200, now)
        (s1,) = await upload()
        await trio.to_thread.run_sync(_produce, bootstrap, "expiring", 200, 200, now)
        (s2,) = await upload()
        shared = tier.manifests.manifest
        assert {r.key for s in shared.streams.values() for r in s.ranges if s.topic == "kept"} == {
            s1
        }
        # Four uploads of about 65 KB for "sized", which keeps at least 150000 bytes.
        for i in range(4):
            await trio.to_thread.run_sync(_produce, bootstrap, "sized", 200 * i, 200, now)
            await upload()

        expiring = broker.store.partition("expiring", 0)
        sized = broker.store.partition("sized", 0)
        assert expiring is not None and sized is not None
        await _until(lambda: expiring.log_start_offset == 200)
        await _until(lambda: sized.log_start_offset > 0)
        await _until_deleted(bucket_url, s0)
        keys = await trio.to_thread.run_sync(_bucket_keys, bucket_url)
        assert {s1, s2} <= keys  # S1: "kept" still reads from it
        assert s0 not in tier.manifests.manifest.keys()

        # retention.ms: ListOffsets earliest is the new start; below it OFFSET_OUT_OF_RANGE;
        # from it every kept record exactly once.
        assert await trio.to_thread.run_sync(_watermarks, bootstrap, "expiring") == (200, 400)
        assert await trio.to_thread.run_sync(_fetch_error, bootstrap, "expiring", 150) == 1
        assert await trio.to_thread.run_sync(_fetch_error, bootstrap, "expiring", 200) == 0
        got = await trio.to_thread.run_sync(
            consume_partition, bootstrap, "expiring", OFFSET_BEGINNING, 200
        )
        assert got == _expected(200, 400)

        # retention.bytes: at least 150000 bytes stay, and dropping one more range would not.
        stream = tier.manifests.manifest.stream(sized.topic_id, 0)
        assert stream is not None and stream.log_start == sized.log_start_offset
        kept_bytes = [r.nbytes for r in stream.ranges]
        assert all(n > 0 for n in kept_bytes) and len(kept_bytes) < 4
        assert sum(kept_bytes) >= 150_000 > sum(kept_bytes) - kept_bytes[0]
        low, high = await trio.to_thread.run_sync(_watermarks, bootstrap, "sized")
        assert (low, high) == (stream.start_offset, 800) and low % 200 == 0
        got = await trio.to_thread.run_sync(
            consume_partition, bootstrap, "sized", OFFSET_BEGINNING, high - low
        )
        assert got == _expected(low, 800)

        # DeleteTopics: the deleted topic's stream leaves the manifest; S1 (whose "expiring"
        # range expired) is no longer referenced and goes; S2 stays.
        kept_id = broker.store.topics["kept"].topic_id
        await trio.to_thread.run_sync(_admin, bootstrap, {}, ["kept"])
        await _until_deleted(bucket_url, s1)
        assert all(k.topic_id != kept_id for k in tier.manifests.manifest.streams)
        assert s2 in await trio.to_thread.run_sync(_bucket_keys, bucket_url)
        # Recreated under the same name: a new topic id, and none of the old data.
        recreate: dict[str, dict[str, str]] = {"kept": {}}
        await trio.to_thread.run_sync(_admin, bootstrap, recreate, [])
        await _until(lambda: "kept" in broker.store.topics)
        assert broker.store.topics["kept"].topic_id != kept_id
        assert await trio.to_thread.run_sync(_watermarks, bootstrap, "kept") == (0, 0)
        assert retention.status()["objects_retired"] >= 2
        assert not {s0, s1} & tier.manifests.manifest.retired.keys()  # deleted, then dropped
        nursery.cancel_scope.cancel()

    # A restart with an empty WAL directory: the log starts come back from the manifest.
    broker = MainBroker(_config(tmp_path / "wal-empty", bucket_url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        expiring = broker.store.partition("expiring", 0)
        assert expiring is not None
        assert (expiring.log_start_offset, expiring.high_watermark) == (200, 400)
        assert await trio.to_thread.run_sync(_watermarks, bootstrap, "expiring") == (200, 400)
        assert await trio.to_thread.run_sync(_fetch_error, bootstrap, "expiring", 0) == 1
        got = await trio.to_thread.run_sync(
            consume_partition, bootstrap, "expiring", OFFSET_BEGINNING, 200
        )
        assert got == _expected(200, 400)
        assert await trio.to_thread.run_sync(_watermarks, bootstrap, "kept") == (0, 0)
        nursery.cancel_scope.cancel()


# -- a zone proxy -------------------------------------------------------------------------------


async def test_a_proxy_answers_below_the_new_log_start_as_the_main_does(tmp_path: Path) -> None:
    _, config = write_zones_toml(tmp_path / "fleet", zones=1)
    for m in config.mains:
        b = m.broker
        b.upload_threshold_bytes, b.upload_interval_s = 1 << 40, 3600.0
        b.retention_check_interval_s, b.retention_delete_delay_s = 0.1, 0.2
        b.wal = WalConfig(segment_bytes=2048, retention_bytes=1, retention_interval_s=0.1)
    (main_node,) = config.mains
    (proxy_node,) = config.proxies
    zone = proxy_node.proxy.zone
    client = zone_client_id(zone)
    topic = "proxied"
    now = int(time.time() * 1000)
    async with trio.open_nursery() as nursery:
        main = MainBroker(main_node.broker)
        await nursery.start(main.run)
        proxy = ProxyBroker(proxy_node.proxy)
        await nursery.start(proxy.run)
        bootstrap = f"127.0.0.1:{proxy.bound_port}"
        tier = main.objects
        assert tier is not None
        settings = {topic: {"retention.ms": str(HOUR)}}
        await trio.to_thread.run_sync(_admin, bootstrap, settings, [], client)
        await _until(lambda: main.store.partition(topic, 0) is not None)
        plog = main.store.partition(topic, 0)
        assert plog is not None
        for start, timestamp in ((0, now - 2 * HOUR), (100, now)):
            await trio.to_thread.run_sync(_produce, bootstrap, topic, start, 100, timestamp, client)
            await _until(lambda end=start + 100: plog.high_watermark == end)  # type: ignore[misc]
            assert await tier.upload_once() > 0
        await _until(lambda: plog.log_start_offset == 100)
        part = proxy.partition(topic, 0)
        assert part is not None
        await _until(lambda: part.log_start_offset == 100)  # the state stream's "ls"
        assert part.objects is not None and part.objects.log_start == 100
        # Through the proxy: Fetch below the start is OFFSET_OUT_OF_RANGE, ListOffsets earliest
        # is the new start, and a consumer from the beginning reads the kept records once.
        assert await trio.to_thread.run_sync(_fetch_error, bootstrap, topic, 50) == 1
        assert await trio.to_thread.run_sync(_watermarks, bootstrap, topic, client) == (100, 200)
        got = await trio.to_thread.run_sync(
            consume_partition, bootstrap, topic, OFFSET_BEGINNING, 100, client
        )
        assert got == _expected(100, 200)
        nursery.cancel_scope.cancel()
