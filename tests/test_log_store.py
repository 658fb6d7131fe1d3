"""The main broker's state on its WAL: append, snapshot at segment roll, retention, replay."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from kafka_wire.record_batch import build_batch, decode_records_for_tools
from main_broker.appender import Appended, Appender
from main_broker.groups.offsets import CommittedOffset
from main_broker.groups.wiring import GroupOffsetsOnWal
from main_broker.log_store import LogStore, RegistrationClosed
from main_broker.producer_state import Verdict
from shared_wal import (
    RecordType,
    WalConfig,
    WalPosition,
    WalReader,
    WalWriter,
    open_wal_fs,
    storage,
)
from shared_wal import broker_records as wal_records


class _Offsets:
    """What the store's offsets participant (group_wiring.GroupOffsetsOnWal) asks of the group
    coordinator, as plain callables and rows."""

    def __init__(
        self,
        load: Callable[[str, list[Any]], None] | None = None,
        forget: Callable[[str, list[tuple[str, int]] | None], None] | None = None,
        committed: dict[str, list[list[Any]]] | None = None,
    ) -> None:
        self._load, self._forget = load, forget
        self.committed = committed if committed is not None else {}

    def load_offsets(self, group_id: str, rows: list[Any]) -> None:
        if self._load is not None:
            self._load(group_id, rows)

    def forget_offsets(self, group_id: str, partitions: list[tuple[str, int]] | None) -> None:
        if self._forget is not None:
            self._forget(group_id, partitions)

    def committed_offsets(self) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
        return {
            g: {(t, p): CommittedOffset(o, e, m) for t, p, o, e, m in rows}
            for g, rows in self.committed.items()
        }

    def delete_topic_offsets(self, topic: str) -> None:
        pass


def _register_offsets(store: LogStore, offsets: _Offsets) -> None:
    store.register(GroupOffsetsOnWal(offsets))  # type: ignore[arg-type]


async def _open(
    url: str,
    config: WalConfig,
    load_offsets: Callable[[str, list[Any]], None] | None = None,
    writer: str = "main-1",
    offsets: _Offsets | None = None,
) -> tuple[LogStore, WalWriter]:
    fs = open_wal_fs(url)
    holder: list[LogStore] = []
    wal = await WalWriter.open(fs, writer, config, snapshot_provider=lambda: holder[0].snapshot())
    store = LogStore(wal, WalReader(fs, writer), 1 << 20, {})
    if offsets is None and load_offsets is not None:
        offsets = _Offsets(load_offsets)
    if offsets is not None:
        _register_offsets(store, offsets)
    holder.append(store)
    store.replay(wal.replay())
    wal.on_segments_deleted = store.on_segments_deleted
    return store, wal


async def _produce(
    store: LogStore, topic: str, partition: int, values: list[bytes], pid: int = -1, seq: int = -1
) -> int:
    now = int(time.time() * 1000)
    buf = memoryview(
        bytearray(
            build_batch(
                [(b"k%d" % i, v) for i, v in enumerate(values)],
                timestamp_ms=now,
                producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1,
                base_sequence=seq,
            )
        )
    )
    appender = Appender(store.partition, lambda plog: True, lambda: None, lambda: False)
    decision = appender.decide(
        topic,
        partition,
        acks=-1,
        records_size=len(buf),
        now_ms=now,
        api_version=9,
        records=memoryview(buf),
    )
    assert isinstance(decision, Appended), decision
    # The writer applies durability itself (the ticket's on_durable) before waking us.
    position = await store.submit_intent(decision.intent).wait()
    assert decision.intent.entry.position == position
    return decision.base_offset


async def _values(store: LogStore, topic: str, partition: int) -> list[bytes]:
    plog = store.partition(topic, partition)
    assert plog is not None
    out: list[bytes] = []
    for entry in plog.iter_durable():
        data = await store.batch_bytes(entry)
        out.extend(v for _, _, _, v in decode_records_for_tools(data) if v is not None)
    return out


async def test_replay_rebuilds_topics_offsets_and_producers(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=4096)  # many rolls, each with a SNAPSHOT
    store, wal = await _open(url, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        await store.create_topic("t", 2, {"retention.ms": "1000"})
        for i in range(40):
            await _produce(
                store,
                "t",
                i % 2,
                [f"v{i}-{j}".encode() * 10 for j in range(3)],
                pid=7 if i % 2 == 0 else -1,
                seq=(i // 2) * 3 if i % 2 == 0 else -1,
            )
        await store.persist_offsets("g", [("t", 0, 12, 0, "meta")])
        pid = await store.allocate_producer_id()
        await wal.aclose()
        nursery.cancel_scope.cancel()
    assert len(wal.segments()) >= 3
    before = [await _values(store, "t", p) for p in (0, 1)]

    loaded: dict[str, list[tuple[str, int, int, int, str]]] = {}
    store2, wal2 = await _open(url, config, lambda g, o: loaded.setdefault(g, []).extend(o))
    assert store2.topics["t"].configs == {"retention.ms": "1000"}
    assert [await _values(store2, "t", p) for p in (0, 1)] == before
    plog = store2.partition("t", 0)
    assert plog is not None and plog.high_watermark == 60
    # The producer's last batch is remembered: a retry is a duplicate.
    assert plog.producers.check(7, 0, 57, 59).verdict is Verdict.DUPLICATE
    assert loaded["g"][-1] == ("t", 0, 12, 0, "meta")
    assert store2.next_producer_id > pid
    await wal2.aclose()


async def test_retention_keeps_state_through_snapshots(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=4096, retention_bytes=8192)
    store, wal = await _open(url, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        await store.create_topic("r", 1, {})
        for i in range(60):
            await _produce(store, "r", 0, [f"x{i:03}".encode() * 40])
        deleted = await wal.enforce_retention()
        await wal.aclose()
        nursery.cancel_scope.cancel()
    assert deleted, "retention should have deleted old segments"
    plog = store.partition("r", 0)
    assert plog is not None and plog.log_start_offset > 0
    store2, wal2 = await _open(url, config)
    # The topic was created in a deleted segment; the oldest segment's SNAPSHOT brings it back.
    plog2 = store2.partition("r", 0)
    assert plog2 is not None
    assert plog2.high_watermark == 60
    assert plog2.log_start_offset == plog.log_start_offset
    assert await _values(store2, "r", 0) == await _values(store, "r", 0)
    await wal2.aclose()


def test_golden_broker_record_headers() -> None:
    """The exact msgpack bytes of the broker's record headers (docs/formats.md)."""
    data = wal_records.data_header("t", 1, 100, 104, 1700000000000, (7, 0, 5, 9, 1700000000001))
    assert msgpack.packb(data, use_bin_type=True).hex() == (
        "8a"
        "a174a174"
        "a17001"
        "a162"
        "64"
        "a16c"
        "68"
        "a27473"
        "cf0000018bcfe56800"
        "a3706964"
        "07"
        "a27065"
        "00"
        "a173"
        "05"
        "a26c73"
        "09"
        "a26174"
        "cf0000018bcfe56801"
    )
    plain = wal_records.data_header("t", 0, 0, 0, -1)
    assert msgpack.packb(plain, use_bin_type=True).hex() == "85a174a174a17000a16200a16c00a27473ff"
    create = wal_records.topic_create_header("t", bytes(16), 3, {"retention.ms": "1"})
    assert msgpack.unpackb(msgpack.packb(create, use_bin_type=True)) == create
    assert msgpack.packb(wal_records.topic_delete_header("t"), use_bin_type=True).hex() == (
        "82a16bac746f7069635f64656c657465a16ea174"
    )
    assert msgpack.packb(wal_records.producer_ids_header(1000), use_bin_type=True).hex() == (
        "82a16ba470696473a47570746fcd03e8"
    )
    link = wal_records.link_header(
        wal_records.data_header("t", 0, 5, 6, 9), WalPosition("proxy-2", 0, 40, 120), 90, 3, False
    )
    assert msgpack.packb(link, use_bin_type=True).hex() == (
        "8c"
        "a174a174"
        "a17000"
        "a16205"
        "a16c06"
        "a2747309"
        "a177a770726f78792d32"
        "a2736700"
        "a2707328"
        "a26c6e78"
        "a2737a5a"
        "a16503"
        "a36c6174c2"
    )
    assert wal_records.link_target(link) == WalPosition("proxy-2", 0, 40, 120)
    header, body = wal_records.snapshot_record({"topics": [], "pid_next": 0, "offsets": {}})
    assert header == {"k": "snapshot", "v": 1}
    assert body.hex() == "83a6746f7069637390a87069645f6e65787400a76f66667365747380"
    assert RecordType.DATA == 1 and RecordType.CONTROL == 4 and RecordType.SNAPSHOT == 6


def test_golden_group_deletion_headers() -> None:
    """DeleteGroups and OffsetDelete records (docs/formats.md, CONTROL)."""
    group = wal_records.group_delete_header("g1")
    assert msgpack.packb(group, use_bin_type=True).hex() == (
        "82a16bac67726f75705f64656c657465a167a26731"
    )
    some = wal_records.offsets_delete_header("g1", [("t", 0)])
    assert msgpack.packb(some, use_bin_type=True).hex() == (
        "83a16bae6f6666736574735f64656c657465a167a26731a16f9192a17400"
    )


async def test_replay_applies_group_and_offset_deletions(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path}"
    config = WalConfig(segment_bytes=1 << 20)
    store, wal = await _open(url, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        await store.create_topic("t", 2, {})
        await store.persist_offsets("gone", [("t", 0, 5, 0, "a")])
        await store.persist_offsets("kept", [("t", 0, 7, 1, "m0"), ("t", 1, 9, 1, "m1")])
        await store.persist_offsets_delete("gone", None)
        await store.persist_offsets_delete("kept", [("t", 0)])
        await wal.aclose()
        nursery.cancel_scope.cancel()
    state: dict[str, dict[tuple[str, int], tuple[Any, ...]]] = {}

    def load(group: str, rows: list[Any]) -> None:
        for row in rows:
            state.setdefault(group, {})[(row[0], row[1])] = tuple(row)

    def forget(group: str, partitions: list[tuple[str, int]] | None) -> None:
        if partitions is None:
            state.pop(group, None)
        else:
            for key in partitions:
                state.get(group, {}).pop(key, None)

    fs = open_wal_fs(url)
    wal2 = await WalWriter.open(fs, "main-1", config, snapshot_provider=lambda: store2.snapshot())
    store2 = LogStore(wal2, WalReader(fs, "main-1"), 1 << 20, {})
    _register_offsets(store2, _Offsets(load, forget))
    store2.replay(wal2.replay())
    assert state == {"kept": {("t", 1): ("t", 1, 9, 1, "m1")}}
    await wal2.aclose()


async def test_a_record_durable_just_before_a_segment_roll_is_in_the_next_snapshot(
    tmp_path: Path,
) -> None:
    """A document, an offset commit or a producer id block that is the last record of a
    segment is in the SNAPSHOT opening the next one, so it survives that segment's trim.
    Before, the change reached the store's state only when its waiter ran, and the writer
    could take the next group (and its snapshot) first: lost after the trim and a restart.
    Repeated, as trio may run either first."""
    for attempt in range(8):
        url = f"osfs://{tmp_path}/{attempt}"
        config = WalConfig(segment_bytes=2048, max_group_bytes=1024)
        offsets: dict[str, list[list[Any]]] = {}
        store, wal = await _open(url, config, offsets=_Offsets(committed=offsets))

        def committed(offsets: dict[str, list[list[Any]]] = offsets) -> None:
            offsets["g"] = [["t", 0, 42, 3, "m"]]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.put_document, "acls", b"the ACLs")
            nursery.start_soon(store.persist_offsets, "g", [("t", 0, 42, 3, "m")], committed)
            nursery.start_soon(store.allocate_producer_id)  # logs a block of producer ids
            await trio.testing.wait_all_tasks_blocked()
            # Queued behind them, in a group of its own that does not fit the first segment.
            big = wal.submit(RecordType.CONTROL, wal_records.producer_ids_header(0), bytes(3000))
            await nursery.start(wal.run)
            await big.wait()
            await wal.aclose()
            nursery.cancel_scope.cancel()
        fs = open_wal_fs(url)
        segments = storage.list_segment_ids(fs, "main-1")
        assert len(segments) == 2
        fs.remove(storage.segment_path("main-1", segments[0]))  # as a trim would
        loaded: dict[str, list[Any]] = {}
        restarted, wal2 = await _open(url, config, load_offsets=loaded.__setitem__)
        assert restarted.documents == {"acls": b"the ACLs"}
        assert loaded == {"g": [("t", 0, 42, 3, "m")]}
        assert restarted.next_producer_id > 0  # producer id 0 was handed out
        await wal2.aclose()


async def test_a_participant_registering_after_replay_started_is_refused(tmp_path: Path) -> None:
    """Wiring order cannot matter silently: a participant that would have missed the records
    already replayed is refused, as are two owners of one section or record kind."""
    store, wal = await _open(f"osfs://{tmp_path}", WalConfig())
    with pytest.raises(RegistrationClosed, match="after its WAL replay started"):
        _register_offsets(store, _Offsets())

    class _Listener:
        def topic_deleted(self, name: str, topic_id: bytes | None) -> None:
            pass

    with pytest.raises(RegistrationClosed):
        store.listen_topic_deletions(_Listener())
    await wal.aclose()

    fs = open_wal_fs(f"osfs://{tmp_path}")
    wal2 = await WalWriter.open(fs, "main-1", WalConfig())
    fresh = LogStore(wal2, WalReader(fs, "main-1"), 1 << 20, {})
    _register_offsets(fresh, _Offsets())
    with pytest.raises(ValueError, match="taken"):
        _register_offsets(fresh, _Offsets())
    await wal2.aclose()


async def test_snapshot_body_keeps_its_sections_and_their_order(tmp_path: Path) -> None:
    """The SNAPSHOT record is msgpack of the body: the registry writes the sections in the
    order the previous release did, an unowned one empty, and the transactions' sections
    (issue 13) after them, so a node of either version reads the other's snapshots (the
    previous release ignores sections it does not know)."""
    committed = {"g": [["t", 0, 5, 1, "m"]]}
    store, wal = await _open(
        f"osfs://{tmp_path}", WalConfig(), offsets=_Offsets(committed=committed)
    )
    store.documents["acls"] = b"x"
    header, payload = store.snapshot()
    body = {
        "topics": [],
        "pid_next": 0,
        "offsets": committed,
        "docs": {"acls": b"x"},
        "groups": {},
        "consumer_groups": {},
        "txn_offsets": {},
        "transactions": {},
    }
    assert (header, payload) == wal_records.snapshot_record(body)
    assert list(wal_records.decode_snapshot(memoryview(payload))) == list(body)
    await wal.aclose()
