"""The log cleaner on a real main broker (issue 13, "Log compaction"): a compacted topic with
100k updates over 1k keys, uploaded to a file:// object store, cleaned; a confluent-kafka
consumer from offset 0 then sees at most one record per key in the cleaned range (plus the
uncleaned head), the latest value of each key, and the tombstones younger than
delete.retention.ms. A cleaning cut short at each of its steps (a failed object PUT, a failed
manifest CAS, after the PUTs, after the swap) and followed by a restart loses nothing and
leaves no garbage."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

import main_broker.objects.cleaner as cleaner_module
from fleet.inspect_cli import format_text, inspect_object, open_object_source
from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from main_broker.objects.tier import ObjectTier
from s3_commit import ObjectStoreError, open_object_store
from s3_commit.cleaner import checkpoint_key, decode_checkpoints
from s3_commit.manifest import Manifest, manifest_key
from s3_commit.manifest_store import sweep_orphans
from s3_commit.object_plan import DATA_PREFIX
from shared_wal import WalConfig
from tests.zone_fleet import consume_kafka_python, object_main_config

TOPIC = "table"
KEYS = 1000
UPDATES = 100_000
TOMBSTONED = 50  # keys 0..49 end with a tombstone


def _config(wal_dir: Path, url: str) -> BrokerConfig:
    config = object_main_config(
        wal_dir,
        url,
        # Retention deletes every segment objects hold: early offsets come from objects.
        WalConfig(segment_bytes=256 * 1024, retention_bytes=1, retention_interval_s=0.1),
        upload_threshold_bytes=1 << 40,
        upload_interval_s=0.3,
    )
    config.compaction_interval_s = 3600.0
    config.compaction_delete_delay_s = 0.5
    config.log_cleaner_interval_s = 3600.0  # the tests wake the cleaner
    return config


def _key(i: int) -> bytes:
    return b"key-%04d" % (i % KEYS)


def _value(i: int) -> bytes | None:
    if i >= UPDATES - KEYS and i % KEYS < TOMBSTONED:
        return None
    return b"value-%06d-" % i + b"v" * 40


def _produce(bootstrap: str, start: int, end: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "acks": "all",
            "enable.idempotence": True,
        }
    )
    errors: list[object] = []
    for i in range(start, end):
        while True:
            try:
                producer.produce(
                    TOPIC,
                    _value(i),
                    _key(i),
                    on_delivery=lambda err, _m: errors.append(err) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors


def _consume(bootstrap: str) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from offset 0 to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    out: list[tuple[int, bytes, bytes | None]] = []
    deadline = time.monotonic() + 60
    try:
        while True:
            assert time.monotonic() < deadline, f"{len(out)} records so far"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                return out
            offset, key = msg.offset(), msg.key()
            assert offset is not None and key is not None
            out.append((offset, key, msg.value()))
    finally:
        consumer.close()


def _latest(end: int) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for i in range(end):
        latest[_key(i)] = (i, _value(i))
    return latest


def _tier(broker: MainBroker) -> ObjectTier:
    assert broker.objects is not None
    return broker.objects


async def _wait_uploaded(broker: MainBroker, offset: int) -> None:
    tier = _tier(broker)
    with trio.fail_after(60):
        while True:
            plog = broker.store.partition(TOPIC, 0)
            if plog is not None and plog.objects is not None and plog.objects.end_offset >= offset:
                return
            await tier.upload_done.wait()


async def _clean(tier: ObjectTier) -> None:
    """Wake the cleaner and wait for a look that found nothing (more) to clean."""
    cleaner = tier.cleaner
    done = cleaner.done
    cleaner.wake()
    with trio.fail_after(120):
        await done.wait()


async def _wait_retired_deleted(tier: ObjectTier) -> None:
    with trio.fail_after(30):
        while tier.manifests.manifest.retired:
            await trio.sleep(0.1)


def _listed(url: str) -> set[str]:
    return {info.key for info in open_object_store(url).list(DATA_PREFIX)}


def _stored_manifest(url: str) -> Manifest:
    found = open_object_store(url).get(manifest_key(1))
    assert found is not None
    return Manifest.from_bytes(found[0])


def _check_compacted(
    got: list[tuple[int, bytes, bytes | None]], cleaned_end: int, total: int
) -> None:
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets))
    cleaned = [(o, k, v) for o, k, v in got if o < cleaned_end]
    keys = [k for _, k, _ in cleaned]
    assert len(keys) == len(set(keys)), "at most one record per key in the cleaned range"
    latest = _latest(cleaned_end)
    for o, k, v in cleaned:
        assert latest[k] == (o, v), f"offset {o} of {k!r} is not its latest below the end"
    # The head is untouched: every offset from the cleaned end on.
    assert [o for o, _, _ in got if o >= cleaned_end] == list(range(cleaned_end, total))
    # Each key's last record is its latest update: a consumer of the whole log sees the table.
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for o, k, v in got:
        last[k] = (o, v)
    assert last == _latest(total)


async def test_a_compacted_topic_keeps_the_latest_record_per_key(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'objects'}"
    broker = MainBroker(_config(tmp_path / "wal", url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(
            TOPIC, 1, {"cleanup.policy": "compact", "delete.retention.ms": "3600000"}
        )
        await trio.to_thread.run_sync(_produce, bootstrap, 0, UPDATES)
        await _wait_uploaded(broker, UPDATES)
        tier = _tier(broker)
        before = tier.manifests.manifest
        await _clean(tier)
        status = broker.status()["objects"]["cleaner"]
        assert status["cleanings"] == 1 and status["failures"] == 0, status
        assert status["last_cleaning"]["end"] == UPDATES
        assert status["records_removed"] >= UPDATES - KEYS
        # The checkpoint is in the store: a restart does not count the partition dirty again.
        found = open_object_store(url).get(checkpoint_key(1))
        assert found is not None
        assert list(decode_checkpoints(found[0]).values()) == [UPDATES]
        # The head: updates that come after the cleaning, uploaded but not cleaned.
        await trio.to_thread.run_sync(_produce, bootstrap, UPDATES, UPDATES + 2 * KEYS)
        total = UPDATES + 2 * KEYS
        await _wait_uploaded(broker, total)
        got = await trio.to_thread.run_sync(_consume, bootstrap)
        _check_compacted(got, UPDATES, total)
        assert len([o for o, _, _ in got if o < UPDATES]) == KEYS  # tombstones included
        tombstones = [k for o, k, v in got if o < UPDATES and v is None]
        assert len(tombstones) == TOMBSTONED  # younger than delete.retention.ms
        # kafka-python reads the cleaned log the same (gaps, empty edge batches and all).
        other = await trio.to_thread.run_sync(consume_kafka_python, bootstrap, "az1", TOPIC, 1)
        assert [(o, v) for _, o, v in other] == [(o, v) for o, _, v in got]
        # Metrics: the dirty ratio per partition and the progress counters.
        metrics = broker.registry.render()
        assert 'zonefleet_log_cleaner_dirty_ratio{topic="table",partition="0"}' in metrics
        assert "zonefleet_log_cleaner_removed_records " in metrics
        # inspect-object reads the cleaned objects; the tombstones' batch has its horizon.
        texts = []
        for key in tier.manifests.manifest.keys():
            index, reports = inspect_object(
                open_object_source(str(tmp_path / "objects" / key)), None
            )
            assert all(r.error is None for r in reports), key
            texts.append(format_text(key, index, reports, batches=True))
        assert any("delete-horizon" in t for t in texts)
        # The swapped-out objects go after their delay; nothing unlisted stays behind.
        await _wait_retired_deleted(tier)
        after = tier.manifests.manifest
        assert _listed(url) == after.keys()
        stream = after.stream(*next(iter(before.streams)))
        assert stream is not None and stream.start_offset == 0
        nursery.cancel_scope.cancel()


class Injected(Exception):
    pass


def _fail_at(step: str) -> Callable[[str], None]:
    def pause_point(at: str) -> None:
        if at == step:
            raise Injected(step)

    return pause_point


@pytest.mark.parametrize(
    "step", ["object_put", "manifest_cas", "after_cleaner_upload", "after_cleaner_swap"]
)
async def test_a_cleaning_cut_short_loses_nothing_and_leaves_no_garbage(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"file://{tmp_path / 'objects'}"
    updates = 20 * KEYS
    wal_dir = tmp_path / "wal"
    broker = MainBroker(_config(wal_dir, url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
        await trio.to_thread.run_sync(_produce, bootstrap, 0, updates)
        await _wait_uploaded(broker, updates)
        tier = _tier(broker)
        before = tier.manifests.manifest
        if step in ("object_put", "manifest_cas"):
            # The cleaning's first PUT is its first new object, the second the manifest's
            # conditional write.
            real_put = tier.astore.put
            puts = 0
            fail_at = 1 if step == "object_put" else 2

            async def put(key: str, data: bytes, **kw: Any) -> Any:
                nonlocal puts
                puts += 1
                if puts == fail_at:
                    raise ObjectStoreError("injected")
                return await real_put(key, data, **kw)

            monkeypatch.setattr(tier.astore, "put", put)
        else:
            monkeypatch.setattr(cleaner_module, "pause_point", _fail_at(step))
        await _clean(tier)
        status = tier.cleaner.status()
        assert status["failures"] == 1 and status["cleanings"] == 0, status
        after = tier.manifests.manifest
        if step == "after_cleaner_swap":
            assert after.retired and after.version == before.version + 1
        else:
            assert after == before
        nursery.cancel_scope.cancel()
    monkeypatch.undo()
    stored = _stored_manifest(url)
    stray = _listed(url) - stored.referenced_keys()
    assert bool(stray) == (step in ("manifest_cas", "after_cleaner_upload"))

    # The restart: every update reads back as before (latest per key), the retired source
    # goes after its delay, the orphan sweep takes exactly the unlisted new objects, and a
    # full cleaning then runs.
    broker = MainBroker(_config(wal_dir, url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        tier = _tier(broker)
        await _wait_retired_deleted(tier)
        assert set(await sweep_orphans(tier.astore, grace_ms=0)) == stray
        got = await trio.to_thread.run_sync(_consume, bootstrap)
        last = {k: (o, v) for o, k, v in got}
        assert last == _latest(updates)
        await _clean(tier)
        assert tier.cleaner.status()["cleanings"] == 1
        got = await trio.to_thread.run_sync(_consume, bootstrap)
        _check_compacted(got, updates, updates)
        await _wait_retired_deleted(tier)
        assert _listed(url) == tier.manifests.manifest.keys()
        nursery.cancel_scope.cancel()
    if step != "object_put":
        return
    # One more restart: the checkpoint in the store says the partition is clean.
    broker = MainBroker(_config(wal_dir, url))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        tier = _tier(broker)
        await _clean(tier)
        status = tier.cleaner.status()
        assert status["cleanings"] == 0 and list(status["checkpoints"].values()) == [updates]
        assert tier.cleaner.ratios and max(tier.cleaner.ratios.values()) == 0.0
        nursery.cancel_scope.cancel()


def _transactions(bootstrap: str) -> None:
    """Committed "c1" for k-0..9, an aborted "aborted" for the same keys, committed "c2" for
    k-10..19."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4()}"})
    producer.init_transactions(30)
    for keys, value, commit in (
        (range(10), b"c1", True),
        (range(10), b"aborted", False),
        (range(10, 20), b"c2", True),
    ):
        producer.begin_transaction()
        for k in keys:
            producer.produce(TOPIC, value, b"k-%d" % k)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)


async def test_the_records_of_aborted_transactions_are_cleaned(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'objects'}"
    broker = MainBroker(_config(tmp_path / "wal", url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
        await trio.to_thread.run_sync(_transactions, bootstrap)
        plog = broker.store.partition(TOPIC, 0)
        assert plog is not None and len(plog.txns.aborted) == 1
        end = plog.high_watermark
        assert plog.last_stable_offset == end
        await _wait_uploaded(broker, end)
        tier = _tier(broker)
        await _clean(tier)
        status = tier.cleaner.status()
        assert status["cleanings"] == 1 and status["aborted_batches_removed"] >= 1, status
        # read_uncommitted: what a consumer sees once the cleaner ran holds no aborted record.
        got = await trio.to_thread.run_sync(_consume, bootstrap)
        values = {k: v for _, k, v in got}
        assert values == {
            **{b"k-%d" % k: b"c1" for k in range(10)},
            **{b"k-%d" % k: b"c2" for k in range(10, 20)},
        }
        assert len(got) == 20
        nursery.cancel_scope.cancel()


async def test_a_cleaning_interleaves_with_compaction_step_by_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One object per tick, and between the cleaner's steps the object compaction merges the
    small objects (cleaned or not): each step finds its offsets in the manifest as it is."""
    monkeypatch.setattr(cleaner_module, "STEP_BUDGET_S", 0.0)
    url = f"file://{tmp_path / 'objects'}"
    updates = 30 * KEYS
    broker = MainBroker(_config(tmp_path / "wal", url))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        bootstrap = f"127.0.0.1:{port}"
        await broker.create_topic(TOPIC, 1, {"cleanup.policy": "compact"})
        for start in range(0, updates, updates // 6):  # several uploads, several objects
            await trio.to_thread.run_sync(_produce, bootstrap, start, start + updates // 6)
            await _wait_uploaded(broker, start + updates // 6)
        tier = _tier(broker)
        assert len(tier.manifests.manifest.keys()) >= 4
        compactor = tier.compaction
        tier.config.compaction_interval_s = 0.05
        tier.config.compaction_max_object_bytes = 2 * max(
            r.size for r in next(iter(tier.manifests.manifest.streams.values())).ranges
        )  # merges of two objects at a time: several jobs, one per loop turn
        compactor.next_due = 0.0
        seen: list[int] = []  # the compactions done when each cleaner step began
        step = tier.cleaner._step

        async def recording_step(p: Any) -> None:
            seen.append(compactor.compactions)
            await step(p)

        monkeypatch.setattr(tier.cleaner, "_step", recording_step)
        await _clean(tier)
        status = tier.cleaner.status()
        assert status["cleanings"] >= 1 and status["failures"] == 0, status
        assert len(set(seen)) >= 2, f"no compaction between the cleaner's steps: {seen}"
        got = await trio.to_thread.run_sync(_consume, bootstrap)
        _check_compacted(got, updates, updates)
        nursery.cancel_scope.cancel()


async def test_a_zone_proxy_serves_the_cleaned_log(tmp_path: Path) -> None:
    """Produced through az1's proxy, cleaned on its main, read back through az2's proxy from
    the objects (its mirror cache is tiny): the proxy follows the swapped manifest."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from proxy_broker.broker import ProxyBroker
    from tests.zone_fleet import write_zones_toml

    url = f"file://{tmp_path / 'objects'}"
    _, config = write_zones_toml(tmp_path / "fleet", zones=2)
    for m in config.mains:
        b = m.broker
        b.object_store_url = url
        b.upload_threshold_bytes, b.upload_interval_s = 1 << 40, 0.3
        b.wal = WalConfig(segment_bytes=64 * 1024, retention_bytes=1, retention_interval_s=0.1)
        b.compaction_interval_s = 3600.0
        b.compaction_delete_delay_s = 0.5
        b.log_cleaner_interval_s = 3600.0
    for p in config.proxies:
        p.proxy.object_store_url = url
        p.proxy.mirror_cache_bytes = 4096  # batches below the objects' end: from objects
    updates = 10 * KEYS
    async with trio.open_nursery() as nursery:
        mains: dict[int, MainBroker] = {}
        proxies: dict[int, ProxyBroker] = {}
        for m in config.mains:
            main = mains[m.broker.node_id] = MainBroker(m.broker)
            await nursery.start(main.run)
        for p in config.proxies:
            proxy = proxies[p.proxy.node_id] = ProxyBroker(p.proxy)
            await nursery.start(proxy.run)
        near = f"127.0.0.1:{proxies[101].bound_port}"
        far = f"127.0.0.1:{proxies[102].bound_port}"

        def create() -> None:
            admin = AdminClient({"bootstrap.servers": near, "client.id": "zone=az1"})
            topics = admin.create_topics(
                [NewTopic(TOPIC, 1, 1, config={"cleanup.policy": "compact"})]
            )
            topics[TOPIC].result(timeout=20)

        await trio.to_thread.run_sync(create)
        await trio.to_thread.run_sync(_produce, near, 0, updates)
        leader = next(
            m for m in mains.values() if (plog := m.store.partition(TOPIC, 0)) and plog.owned
        )
        await _wait_uploaded(leader, updates)
        tier = _tier(leader)
        await _clean(tier)
        assert tier.cleaner.status()["cleanings"] == 1
        await _wait_retired_deleted(tier)
        node = leader.config.node_id
        with trio.fail_after(30):
            while proxies[102].mirrors[node].manifest.keys() != tier.manifests.manifest.keys():
                await trio.sleep(0.05)
        got = await trio.to_thread.run_sync(_consume, far)
        _check_compacted(got, updates, updates)
        # The main itself too: its WAL index no longer answers below the cleaned end.
        direct = await trio.to_thread.run_sync(_consume, f"127.0.0.1:{leader.bound_port}")
        assert direct == got
        nursery.cancel_scope.cancel()
