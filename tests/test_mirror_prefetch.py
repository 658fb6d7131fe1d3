"""A proxy's mirror reads the batches a main's LINK records point to while it tails the main's
WAL, so fetches need no read of their own; its own PREPARED payloads come from memory."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import trio

from internal_rpc import RpcClient
from kafka_wire.record_batch import build_batch
from proxy_broker.config import MainEndpoint
from proxy_broker.mirror import MainMirror, MirrorCache
from shared_wal import RecordType, WalConfig, WalPosition, WalWriter, open_wal_fs
from shared_wal.batch_reader import BatchReader
from shared_wal.broker_records import data_header, link_header
from shared_wal.reader import WalReader
from shared_wal.storage import FS

TS = 1_700_000_000_000
EPOCH = 3
OWN = "proxy-102"  # the mirroring proxy
OTHER = "proxy-103"  # a proxy in another zone


class CountingReader(BatchReader):
    """Counts which writers' directories are opened for reading, and can forbid reads."""

    def __init__(self, fs: FS) -> None:
        super().__init__(fs)
        self.opened: list[str] = []
        self.forbidden = False

    def reader_for(self, writer: str) -> WalReader:
        assert not self.forbidden, f"unexpected read of {writer}'s WAL"
        self.opened.append(writer)
        return super().reader_for(writer)


def _batch(values: list[bytes]) -> bytes:
    return build_batch([(None, v) for v in values], timestamp_ms=TS)


def _as_served(batch: bytes, base_offset: int) -> bytes:
    """The batch with baseOffset and partitionLeaderEpoch as the main assigned them."""
    return struct.pack(">q", base_offset) + batch[8:12] + struct.pack(">i", EPOCH) + batch[16:]


async def _write(
    fs: FS, writer: str, records: list[tuple[RecordType, dict[str, Any], bytes]]
) -> tuple[list[WalPosition], int]:
    """Appends the records to `writer`'s WAL; their positions and the WAL's end offset."""
    wal = await WalWriter.open(fs, writer, WalConfig(retention_ms=None))
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        positions = [await wal.append(kind, header, payload) for kind, header, payload in records]
        await wal.aclose()
    return positions, wal.end_offset


def _link(base: int, count: int, prepared: WalPosition, size: int) -> dict[str, Any]:
    data = data_header("t", 0, base, base + count - 1, TS)
    return link_header(data, prepared, size, EPOCH, False)


async def test_links_to_other_writers_are_prefetched_own_ones_are_not(tmp_path: Path) -> None:
    fs = open_wal_fs(f"osfs://{tmp_path / 'wal'}")
    other_batch = _batch([b"o0", b"o1", b"o2"])
    own_kept, own_evicted = _batch([b"k0"]), _batch([b"e0", b"e1"])
    (other_pos,), _ = await _write(fs, OTHER, [(RecordType.PREPARED, {"t": "t"}, other_batch)])
    own_positions, _ = await _write(
        fs,
        OWN,
        [
            (RecordType.PREPARED, {"t": "t"}, own_kept),
            (RecordType.PREPARED, {"t": "t"}, own_evicted),
        ],
    )
    # The main's WAL: a DATA batch, then LINKs to the other proxy and to the mirror's own.
    data_batch = build_batch([(None, b"d0"), (None, b"d1")], base_offset=0, timestamp_ms=TS)
    _, wal_end = await _write(
        fs,
        "main-1",
        [
            (RecordType.DATA, data_header("t", 0, 0, 1, TS), data_batch),
            (RecordType.LINK, _link(2, 3, other_pos, len(other_batch)), b""),
            (RecordType.LINK, _link(5, 1, own_positions[0], len(own_kept)), b""),
            (RecordType.LINK, _link(6, 2, own_positions[1], len(own_evicted)), b""),
        ],
    )
    taken: list[tuple[int, int]] = []
    in_memory = {(own_positions[0].segment, own_positions[0].position): own_kept}

    def take_prepared(segment: int, position: int) -> memoryview | None:
        taken.append((segment, position))
        payload = in_memory.pop((segment, position), None)
        return memoryview(bytearray(payload)) if payload is not None else None

    batches = CountingReader(fs)
    cache = MirrorCache(64 * 1024 * 1024)
    mirror = MainMirror(
        MainEndpoint(1, "az1", "127.0.0.1", 1, 1),
        RpcClient(102, b"s" * 32, "127.0.0.1", 1),  # never called: the test feeds the state
        batches,
        cache,
        OWN,
        take_prepared,
        lambda: None,
    )
    mirror.apply_frame(
        {
            "full": True,
            "node": 1,
            "writer": "main-1",
            "wal_end": wal_end,
            "topics": {"t": [b"\x01" * 16, 1, {}]},
            "parts": [["t", 0, EPOCH, 8, 8, 0, 8]],
        }
    )

    # A mirror nobody reads prefetches nothing: its consumers, if any come, read lazily.
    records, prefetched = await trio.to_thread.run_sync(mirror._read_chunk)
    assert len(records) == 4 and prefetched == {}
    assert set(batches.opened) == {"main-1"}

    mirror.note_read()  # a consumer reads it: from now on it prefetches
    records, prefetched = await trio.to_thread.run_sync(mirror._read_chunk)
    assert [r.type for r in records] == [RecordType.DATA] + [RecordType.LINK] * 3
    # Only the other proxy's payload was read; the mirror's own WAL was not touched.
    assert set(batches.opened) == {"main-1", OTHER}
    assert list(prefetched) == [records[1].position]
    assert bytes(prefetched[records[1].position]) == _as_served(other_batch, 2)

    for record in records:
        mirror._apply_record(record, prefetched)
    assert taken == [
        (own_positions[0].segment, own_positions[0].position),
        (own_positions[1].segment, own_positions[1].position),
    ]
    entries = mirror.topics["t"].partitions[0].index.entries
    assert [(e.base_offset, e.last_offset) for e in entries] == [(0, 1), (2, 4), (5, 5), (6, 7)]
    data, other, kept, evicted = entries
    assert other.data is not None and bytes(other.data) == _as_served(other_batch, 2)
    assert kept.data is not None and bytes(kept.data) == _as_served(own_kept, 5)
    assert evicted.data is None  # not in memory any more: read lazily, never prefetched
    assert cache.bytes == sum(e.size for e in (data, other, kept))

    # Fetching what was prefetched needs no read of the shared FS.
    batches.forbidden = True
    served = await batches.batches_bytes([data, other, kept])
    assert [bytes(b) for b in served] == [
        data_batch,
        _as_served(other_batch, 2),
        _as_served(own_kept, 5),
    ]
    batches.forbidden = False
    (lazy,) = await batches.batches_bytes([evicted])
    assert bytes(lazy) == _as_served(own_evicted, 6)
    assert batches.opened[-1] == OWN
