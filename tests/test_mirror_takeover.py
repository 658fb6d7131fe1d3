"""A proxy's mirror of a main that takes back a partition it led before (A→B→…→A): the
`takeover` record in the main's WAL restarts the mirror's log at the adopted objects' end, as
it restarts the main's own; the batches of the main's first time as leader are not served
across the gap to the taken-over batches (a fetch there skipped every offset in between)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from internal_rpc import RpcClient
from internal_rpc.state_frames import PartitionRow
from kafka_wire.record_batch import build_batch
from main_broker.cluster.reassignment import Move, Tail, takeover_header
from proxy_broker.config import MainEndpoint
from proxy_broker.mirror import MainMirror, MirrorCache
from proxy_broker.object_reads import ObjectSpan
from s3_commit.manifest import ObjectRange, StreamManifest
from shared_wal import RecordType, WalPosition, WalRecord, open_wal_fs
from shared_wal.batch_reader import BatchReader
from shared_wal.broker_records import data_header

TS = 1_700_000_000_000
SSO = "data/sso/0000018c0f0070000000000000000001"


class _Wal:
    """Main 1's WAL records as the mirror's tail hands them over (no file behind them)."""

    def __init__(self) -> None:
        self.position = 0

    def record(self, rtype: RecordType, header: dict[str, object], payload: bytes) -> WalRecord:
        at = WalPosition("main-1", 0, self.position, 100)
        self.position += 100
        return WalRecord(rtype, header, memoryview(payload), at)

    def data(self, base: int, count: int = 10) -> WalRecord:
        batch = build_batch([(None, b"v")] * count, base_offset=base, timestamp_ms=TS)
        return self.record(RecordType.DATA, data_header("t", 0, base, base + count - 1, TS), batch)


def _mirror() -> MainMirror:
    mirror = MainMirror(
        MainEndpoint(1, "az1", "127.0.0.1", 1, 1),
        RpcClient(102, b"s" * 32, "127.0.0.1", 1),  # never called: the test feeds the state
        BatchReader(open_wal_fs("mem://")),
        MirrorCache(1 << 20),
        "proxy-102",
        lambda segment, position: None,
        lambda: None,
    )
    mirror.apply_frame(
        {
            "full": True,
            "node": 1,
            "writer": "main-1",
            "wal_end": 0,
            "topics": {"t": [b"\x01" * 16, 1, {}, [1]]},
            "parts": [["t", 0, 0, 20, 20, 0, 20]],
        }
    )
    return mirror


def test_a_takeover_record_restarts_the_mirrors_log_at_the_adopted_objects_end() -> None:
    mirror, wal = _mirror(), _Wal()
    part = mirror.topics["t"].partitions[0]
    # Main 1 led the partition first (epoch 0): [0, 20), bytes in memory.
    for base in (0, 10):
        mirror._apply_record(wal.data(base), {})
    assert part.index.end_offset == 20
    # Moved away to mains 2 and 3 (which appended up to 50 and uploaded it), and back to 1.
    tail = Tail(50, log_start=0)
    takeover = takeover_header(Move("t", 0, 3, 1, 3), tail)
    mirror._apply_record(wal.record(RecordType.CONTROL, takeover, b""), {})
    mirror._apply_record(wal.data(50), {})
    part.apply(PartitionRow("t", 0, 3, 60, 60, 0, 60))
    part.link_objects(StreamManifest("t", (ObjectRange(0, 50, SSO, 5000),)), 42)

    for offset in (0, 10, 19, 20, 49):
        error, entries = part.fetch_slice(offset, 1 << 20, 60, True)
        # Before: from 10 on, the old batches and then the one at 50 (20..49 skipped).
        assert error == ErrorCode.none and len(entries) == 1, (offset, entries)
        span = entries[0]
        assert isinstance(span, ObjectSpan) and (span.base_offset, span.end) == (offset, 50)
    error, entries = part.fetch_slice(50, 1 << 20, 60, True)
    assert error == ErrorCode.none
    assert [(e.base_offset, e.last_offset) for e in entries] == [(50, 59)]
    assert part.visible_end == 60
    assert [(e.base_offset, e.last_offset) for e in part.index.entries] == [(50, 59)]


def test_a_takeover_record_of_another_partition_or_topic_changes_nothing() -> None:
    mirror, wal = _mirror(), _Wal()
    part = mirror.topics["t"].partitions[0]
    mirror._apply_record(wal.data(0), {})
    for topic, partition in (("t", 1), ("u", 0)):
        header = takeover_header(Move(topic, partition, 3, 1, 3), Tail(50))
        mirror._apply_record(wal.record(RecordType.CONTROL, header, b""), {})
    assert [(e.base_offset, e.last_offset) for e in part.index.entries] == [(0, 9)]
    # Other CONTROL records are not the mirror's concern.
    mirror._apply_record(wal.record(RecordType.CONTROL, {"k": "pids", "upto": 1000}, b""), {})
    assert part.index.end_offset == 10


def test_a_fetch_below_a_takeover_waits_for_the_adopted_objects() -> None:
    """The `takeover` record can reach the mirror (through the WAL tail) before the main's
    manifest with the adopted objects (through the state stream): meanwhile a fetch below the
    takeover's start gets nothing, never the batches after it (a client skipped the adopted
    offsets; a takeover within about 0.3 s of a kill did that)."""
    mirror, wal = _mirror(), _Wal()
    part = mirror.topics["t"].partitions[0]
    takeover = takeover_header(Move("t", 0, 3, 1, 3), Tail(50, log_start=0))
    mirror._apply_record(wal.record(RecordType.CONTROL, takeover, b""), {})
    mirror._apply_record(wal.data(50), {})
    part.apply(PartitionRow("t", 0, 3, 60, 60, 0, 60))
    for offset in (0, 20, 49):
        assert part.fetch_slice(offset, 1 << 20, 60, True) == (ErrorCode.none, [])
    # An older manifest of the stream, not reaching the takeover's start yet: the same.
    part.link_objects(StreamManifest("t", (ObjectRange(0, 20, SSO, 2000),)), 42)
    error, entries = part.fetch_slice(30, 1 << 20, 60, True)
    assert (error, entries) == (ErrorCode.none, [])
    # The manifest with the adopted objects: every offset reads.
    part.link_objects(StreamManifest("t", (ObjectRange(0, 50, SSO, 5000),)), 42)
    for offset in (0, 20, 49):
        error, entries = part.fetch_slice(offset, 1 << 20, 60, True)
        assert error == ErrorCode.none and len(entries) == 1
        assert isinstance(entries[0], ObjectSpan) and entries[0].end == 50
    error, entries = part.fetch_slice(50, 1 << 20, 60, True)
    assert [(e.base_offset, e.last_offset) for e in entries] == [(50, 59)]
