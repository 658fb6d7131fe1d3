"""A mirror that no fetch reads follows its main lazily (at most every IDLE_TAIL_S); one that a
consumer reads follows every end the main publishes, and a fetch wakes an idle one at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from internal_rpc import RpcClient
from kafka_wire.record_batch import build_batch
from proxy_broker import mirror as mirror_module
from proxy_broker.config import MainEndpoint
from proxy_broker.mirror import MainMirror, MirrorCache
from shared_wal import RecordType, WalConfig, WalWriter, open_wal_fs
from shared_wal.batch_reader import BatchReader
from shared_wal.broker_records import data_header

TS = 1_700_000_000_000
IDLE_TAIL_S = 0.6
READ_ACTIVE_S = 1.5


async def test_idle_mirror_tails_lazily_and_a_fetch_makes_it_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mirror_module, "IDLE_TAIL_S", IDLE_TAIL_S)
    monkeypatch.setattr(mirror_module, "READ_ACTIVE_S", READ_ACTIVE_S)
    fs = open_wal_fs(f"osfs://{tmp_path / 'wal'}")
    wal = await WalWriter.open(fs, "main-1", WalConfig(retention_ms=None))
    mirror = MainMirror(
        MainEndpoint(1, "az1", "127.0.0.1", 1, 1),
        RpcClient(102, b"s" * 32, "127.0.0.1", 1),  # never called: the test feeds the state
        BatchReader(fs),
        MirrorCache(1 << 20),
        "proxy-102",
        lambda segment, position: None,
        lambda: None,
    )
    next_offset = 0

    async def append_and_publish() -> float:
        """One DATA batch in the main's WAL and a delta with the new end; when it was sent."""
        nonlocal next_offset
        batch = build_batch([(None, b"v")], base_offset=next_offset, timestamp_ms=TS)
        header = data_header("t", 0, next_offset, next_offset, TS)
        await wal.append(RecordType.DATA, header, batch)
        next_offset += 1
        hw = next_offset
        mirror.apply_frame({"wal_end": wal.end_offset, "parts": [["t", 0, 0, hw, hw, 0, hw]]})
        return trio.current_time()

    async def seen_after(sent: float, timeout: float = 5.0) -> float:
        """Seconds from `sent` until the mirror's index holds every published batch."""
        part = mirror.topics["t"].partitions[0]
        with trio.fail_after(timeout):
            while part.index.end_offset < next_offset:
                await trio.sleep(0.005)
        return trio.current_time() - sent

    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        await append_and_publish()
        mirror.apply_frame(
            {
                "full": True,
                "node": 1,
                "writer": "main-1",
                "wal_end": wal.end_offset,
                "topics": {"t": [b"\x01" * 16, 1, {}]},
                "parts": [["t", 0, 0, 1, 1, 0, 1]],
            }
        )
        nursery.start_soon(mirror._tail)
        await seen_after(trio.current_time())  # the first catch-up does not wait

        # Nobody reads the mirror: a new batch waits for the next idle round.
        assert await seen_after(await append_and_publish()) >= IDLE_TAIL_S * 0.8

        # A fetch reads it: an idle mirror is woken at once, then follows every end.
        part = mirror.topics["t"].partitions[0]
        sent = await append_and_publish()
        await trio.sleep(0.05)  # the tail is in its idle wait by now
        part.fetch_slice(0, 1 << 20, next_offset, True)
        assert await seen_after(sent) < IDLE_TAIL_S / 2
        for _ in range(3):
            part.fetch_slice(0, 1 << 20, next_offset, True)
            assert await seen_after(await append_and_publish()) < IDLE_TAIL_S / 2
        await wal.aclose()
        nursery.cancel_scope.cancel()
