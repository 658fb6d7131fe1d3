"""The formats transactions added, byte for byte (docs/formats.md): the COMMIT/ABORT control
batch, the DATA headers of a marker and of a transactional batch, the `txn_offsets` and
`txn_offsets_end` CONTROL records and the SNAPSHOT's `txn_offsets` and `transactions`
sections, a partition SNAPSHOT entry's `tx`, the internal RPC `write_txn_markers`, and the
state stream's `txns` rows. (The `txn` CONTROL record is in tests/test_txn_state.py.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from internal_rpc.messages import (
    AllowTxn,
    AllowTxnResult,
    MalformedMessage,
    TxnMarker,
    TxnMarkerResult,
    UnsupportedMessageVersion,
    WriteTxnMarkers,
    WriteTxnMarkersResult,
)
from internal_rpc.state_frames import AbortedRow, StateFrame
from kafka_wire.control_batch import ControlType, build_marker, marker_type
from kafka_wire.record_batch import InvalidBatch, build_batch, parse_batch_header
from main_broker.groups.txn_offsets import PendingTxnOffsets
from main_broker.partition_log import PartitionLog
from main_broker.partition_txns import AbortedTxn
from main_broker.topic_config import EffectiveTopicConfig
from main_broker.txn.coordinator import TxnCoordinator
from main_broker.txn.state import TxnMetadata, TxnState
from shared_wal import RecordType
from shared_wal import broker_records as wal_records
from tests.test_txn_state import CONTROL_GOLDEN, EMPTY_GOLDEN, RECORD_GOLDEN

TS = 1_764_201_600_000


def _hex(obj: Any) -> str:
    return msgpack.packb(obj, use_bin_type=True).hex()


# -- the control batch ---------------------------------------------------------------------------

# build_marker(True, producer id 4000, epoch 3, coordinator epoch 7, TS): 78 bytes.
COMMIT_MARKER_GOLDEN = (
    "0000000000000000"  # baseOffset 0 (the leader assigns it)
    "00000042"  # batchLength 66
    "ffffffff"  # partitionLeaderEpoch -1 (assigned with the offset)
    "02"  # magic
    "62277456"  # crc32c
    "0030"  # attributes: transactional (0x10) | control (0x20)
    "00000000"  # lastOffsetDelta 0
    "0000019ac29c1400"  # baseTimestamp
    "0000019ac29c1400"  # maxTimestamp
    "0000000000000fa0"  # producerId 4000
    "0003"  # producerEpoch 3
    "ffffffff"  # baseSequence -1
    "00000001"  # one record:
    "20"  # length 16 (varint)
    "00"  # attributes
    "00"  # timestampDelta
    "00"  # offsetDelta
    "08"  # key length 4
    "00000001"  # key: version 0, type 1 (COMMIT)
    "0c"  # value length 6
    "000000000007"  # value: version 0, coordinator epoch 7
    "00"  # no headers
)
ABORT_MARKER_GOLDEN = (
    "000000000000000000000042ffffffff02"
    "9619a21e"  # crc32c
    "0030000000000000019ac29c14000000019ac29c14000000000000000fa00003ffffffff00000001"
    "2000000008"
    "00000000"  # key: version 0, type 0 (ABORT)
    "0c00000000000700"
)


def test_golden_control_batches() -> None:
    commit = build_marker(True, 4000, 3, 7, TS)
    abort = build_marker(False, 4000, 3, 7, TS)
    assert (len(commit), commit.hex()) == (78, COMMIT_MARKER_GOLDEN)
    assert (len(abort), abort.hex()) == (78, ABORT_MARKER_GOLDEN)
    for buf, kind in ((commit, ControlType.COMMIT), (abort, ControlType.ABORT)):
        info = parse_batch_header(buf)
        assert (info.is_control, info.is_transactional) == (True, True)
        assert (info.producer_id, info.producer_epoch, info.base_sequence) == (4000, 3, -1)
        assert (info.record_count, info.last_offset_delta, info.max_timestamp) == (1, 0, TS)
        assert marker_type(buf, info) == kind


def test_marker_type_refuses_what_is_not_a_marker() -> None:
    data = build_batch([(b"\x00\x00\x00\x01", b"")], timestamp_ms=TS)
    with pytest.raises(InvalidBatch, match="not a control batch"):
        marker_type(data, parse_batch_header(data))
    odd = build_batch([(b"\x00\x00\x00\x05", b"")], timestamp_ms=TS, control=True)
    with pytest.raises(InvalidBatch, match="unknown control type 5"):
        marker_type(odd, parse_batch_header(odd))
    short = build_batch([(b"\x00", b"")], timestamp_ms=TS, control=True)
    with pytest.raises(InvalidBatch, match="too short"):
        marker_type(short, parse_batch_header(short))


# -- WAL DATA headers ----------------------------------------------------------------------------

MARKER_HEADER_GOLDEN = (
    "88"
    "a174a66f7264657273"  # "t": "orders"
    "a17000"  # "p": 0
    "a1622a"  # "b": 42
    "a16c2a"  # "l": 42
    "a27473cf0000019ac29c1400"  # "ts"
    "a3706964cd0fa0"  # "pid": 4000
    "a2706503"  # "pe": 3
    "a2636d01"  # "cm": 1 (COMMIT)
)
# The DATA golden of tests/test_log_store.py, transactional: one more key, "tx": 1.
TX_DATA_HEADER_GOLDEN = (
    "8ba174a174a17001a16264a16c68a27473cf0000018bcfe56800a370696407a2706500a17305a26c7309"
    "a26174cf0000018bcfe56801"
    "a2747801"  # "tx": 1
)


def test_golden_data_headers_of_transactions() -> None:
    marker = wal_records.marker_header("orders", 0, 42, TS, 4000, 3, True)
    assert _hex(marker) == MARKER_HEADER_GOLDEN
    abort = wal_records.marker_header("orders", 0, 42, TS, 4000, 3, False)
    assert _hex(abort) == MARKER_HEADER_GOLDEN[:-2] + "00"
    tx = wal_records.data_header(
        "t", 1, 100, 104, 1700000000000, (7, 0, 5, 9, 1700000000001), transactional=True
    )
    assert _hex(tx) == TX_DATA_HEADER_GOLDEN
    # Without a producer there is no transaction: no "tx".
    assert "tx" not in wal_records.data_header("t", 0, 0, 0, -1, None, transactional=True)
    assert "tx" not in wal_records.data_header("t", 0, 0, 0, -1, (7, 0, 5, 9, 1))


# -- CONTROL records and SNAPSHOT sections -------------------------------------------------------

TXN_OFFSETS_GOLDEN = (
    "84"
    "a16bab74786e5f6f666673657473"  # "k": "txn_offsets"
    "a167a26731"  # "g": "g1"
    "a3706964cd0fa0"  # "pid": 4000
    "a16f92"  # "o": [
    "95a66f7264657273002a03a0"  # ["orders", 0, 42, 3, ""],
    "95a66f72646572730107ffa16d"  # ["orders", 1, 7, -1, "m"]]
)
TXN_OFFSETS_END_GOLDEN = (
    "84a16baf74786e5f6f6666736574735f656e64a167a26731a3706964cd0fa0"
    "a163c3"  # "c": true (committed)
)
TXN_OFFSETS_SECTION_GOLDEN = (
    "81a267319192cd0fa09295a66f7264657273002a03a095a66f72646572730107ffa16d"
)
TRANSACTIONS_SECTION_GOLDEN = "81a17491" + EMPTY_GOLDEN


class _Wal:
    def __init__(self) -> None:
        self.records: list[tuple[RecordType, dict[str, Any]]] = []

    async def append(self, rtype: RecordType, header: dict[str, Any], on_durable: Any) -> None:
        self.records.append((rtype, header))
        on_durable()


class _Store:
    def __init__(self) -> None:
        self.wal = _Wal()


class _Table:
    def __init__(self) -> None:
        self.committed: list[tuple[str, list[Any]]] = []

    async def commit(self, group_id: str, offsets: list[Any], max_bytes: int) -> dict[Any, int]:
        self.committed.append((group_id, offsets))
        return {}


@pytest.mark.parametrize("commit", [True, False])
def test_golden_txn_offsets_records_and_section(commit: bool) -> None:
    store, table = _Store(), _Table()
    pending = PendingTxnOffsets(store, table, 4096)  # type: ignore[arg-type]
    offsets = [("orders", 0, 42, 3, ""), ("orders", 1, 7, -1, "m")]

    async def run() -> None:
        await pending.add("g1", 4000, offsets)
        assert pending.unstable_partitions("g1") == {("orders", 0), ("orders", 1)}
        assert _hex(pending.snapshot()) == TXN_OFFSETS_SECTION_GOLDEN
        await pending.complete("g1", 4000, commit)
        await pending.complete("g1", 4000, commit)  # a marker sent again: nothing more

    trio.run(run)
    (add_type, add), (end_type, end) = store.wal.records
    assert add_type == end_type == RecordType.CONTROL
    assert _hex(add) == TXN_OFFSETS_GOLDEN
    assert _hex(end) == TXN_OFFSETS_END_GOLDEN[:-2] + ("c3" if commit else "c2")
    # The offsets wait until the marker: a commit makes them ordinary offsets, an abort
    # drops them.
    assert table.committed == ([("g1", offsets)] if commit else [])
    assert pending.snapshot() == {} and pending.unstable_partitions("g1") == set()
    # Replay and restore rebuild the pending offsets from the same bytes.
    again = PendingTxnOffsets(store, table, 4096)  # type: ignore[arg-type]
    again.replay(msgpack.unpackb(bytes.fromhex(TXN_OFFSETS_GOLDEN)))
    assert _hex(again.snapshot()) == TXN_OFFSETS_SECTION_GOLDEN
    again.replay(msgpack.unpackb(bytes.fromhex(TXN_OFFSETS_END_GOLDEN)))
    assert again.snapshot() == {}
    again.restore(msgpack.unpackb(bytes.fromhex(TXN_OFFSETS_SECTION_GOLDEN)))
    assert again.unstable_partitions("g1") == {("orders", 0), ("orders", 1)}


def test_golden_transactions_section() -> None:
    coordinator = TxnCoordinator(None, 900_000, lambda: None)  # type: ignore[arg-type]
    empty = TxnMetadata("x-1", 4000, 0, 60000, TxnState.EMPTY, update_ms=TS)
    coordinator.state.apply(empty)
    assert _hex(coordinator.snapshot()) == TRANSACTIONS_SECTION_GOLDEN
    # A record replayed is applied as it is.
    coordinator.replay(msgpack.unpackb(bytes.fromhex(CONTROL_GOLDEN)))
    assert coordinator.state.get("tx-1") == TxnMetadata.from_record(
        msgpack.unpackb(bytes.fromhex(RECORD_GOLDEN))
    )
    other = TxnCoordinator(None, 900_000, lambda: None)  # type: ignore[arg-type]
    other.restore(msgpack.unpackb(bytes.fromhex(TRANSACTIONS_SECTION_GOLDEN)))
    assert other.state.txns == {"x-1": empty}
    other.restore({})  # a snapshot of the previous release: no transactions
    assert other.state.txns == {}


# A partition at HW 60: producer 4000's transaction [10, 42] aborted, 4001's open from 30,
# 4002's from 50; 4003's batch at 61 is not durable, so not in the snapshot.
PARTITION_SNAPSHOT_GOLDEN = (
    "85a26c7300a26e6f3ca16500a2707290"  # "ls": 0, "no": 60, "e": 0, "pr": []
    "a27478"  # "tx":
    "82"
    "a16f92"  # "o": [
    "92cd0fa11e"  # [4001, 30],
    "92cd0fa232"  # [4002, 50]],
    "a16191"  # "a": [
    "93cd0fa00a2a"  # [4000, 10, 42]]
)


def test_golden_partition_snapshot_entry() -> None:
    plog = PartitionLog("orders", 0, bytes(16), EffectiveTopicConfig.from_explicit({}, {}))
    plog.high_watermark = plog.index.end_offset = 60
    for pid, first in ((4000, 10), (4001, 30)):
        plog.txns.on_transactional_batch(pid, first)
    plog.txns.on_marker(4000, 42, commit=False)
    plog.txns.on_transactional_batch(4002, 50)
    plog.txns.on_transactional_batch(4003, 61)
    assert _hex(plog.to_snapshot()) == PARTITION_SNAPSHOT_GOLDEN
    back = PartitionLog("orders", 0, bytes(16), EffectiveTopicConfig.from_explicit({}, {}))
    back.restore_snapshot(msgpack.unpackb(bytes.fromhex(PARTITION_SNAPSHOT_GOLDEN)))
    assert back.txns.open_producers() == {4001: 30, 4002: 50}
    assert back.txns.aborted == [AbortedTxn(4000, 10, 42)]
    assert back.last_stable_offset == 30


# -- internal RPC: write_txn_markers -------------------------------------------------------------

MARKERS = WriteTxnMarkers((TxnMarker(4000, 3, True, 0, (("orders", 0), ("orders", 1)), ("g1",)),))
MARKERS_GOLDEN = (
    "82"
    "a26d7601"  # "mv": 1
    "a76d61726b657273"
    "91"  # "markers": [
    "96cd0fa003c300"  # [4000, 3, true, 0,
    "9292a66f726465727300"
    "92a66f726465727301"  # [["orders", 0], ["orders", 1]],
    "91a26731"  # ["g1"]]]
)
RESULTS = WriteTxnMarkersResult(
    (TxnMarkerResult((("orders", 0, 0), ("orders", 1, 6)), (("g1", 0),)),)
)
RESULTS_GOLDEN = (
    "82"
    "a26d7601"  # "mv": 1
    "a7726573756c7473"
    "91"  # "results": [
    "92"
    "9293a66f726465727300"
    "0093a66f72646572730106"  # [["orders", 0, 0], ["orders", 1, 6]],
    "9192a2673100"  # [["g1", 0]]]
)


def test_golden_write_txn_markers() -> None:
    assert _hex(MARKERS.to_wire()) == MARKERS_GOLDEN
    assert WriteTxnMarkers.from_wire(msgpack.unpackb(bytes.fromhex(MARKERS_GOLDEN))) == MARKERS
    assert _hex(RESULTS.to_wire()) == RESULTS_GOLDEN
    assert WriteTxnMarkersResult.from_wire(msgpack.unpackb(bytes.fromhex(RESULTS_GOLDEN))) == (
        RESULTS
    )


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ({"mv": 1, "markers": [[4000, 3, 1, 0, [], []]]}, r"markers\[0\]\.commit must be a bool"),
        ({"mv": 1, "markers": [[4000, 3, True, 0, []]]}, r"markers\[0\]"),
        ({"mv": 1, "markers": [[4000, 3, True, 0, [["t"]], []]]}, r"partitions"),
        ({"mv": 1, "markers": [["x", 3, True, 0, [], []]]}, r"producer_id"),
        ({"mv": 1}, r"write_txn_markers\.markers"),
    ],
)
def test_malformed_write_txn_markers_are_refused_by_name(msg: Any, match: str) -> None:
    with pytest.raises(MalformedMessage, match=match):
        WriteTxnMarkers.from_wire(msg)


def test_write_txn_markers_of_a_newer_version_are_refused() -> None:
    with pytest.raises(UnsupportedMessageVersion):
        WriteTxnMarkers.from_wire({"mv": 2, "markers": []})
    with pytest.raises(UnsupportedMessageVersion):
        WriteTxnMarkersResult.from_wire({"mv": 2, "results": []})
    with pytest.raises(MalformedMessage, match=r"results\[0\]"):
        WriteTxnMarkersResult.from_wire({"mv": 1, "results": [[[["t", 0]], []]]})


# -- internal RPC: allow_txn ----------------------------------------------------------------------

ALLOW = AllowTxn(4000, 3, (("orders", 0),), ("g1",))
ALLOW_GOLDEN = (
    "85"
    "a26d7601"  # "mv": 1
    "a3706964cd0fa0"  # "pid": 4000
    "a2706503"  # "pe": 3
    "a570617274739192a66f726465727300"  # "parts": [["orders", 0]]
    "a667726f75707391a26731"  # "groups": ["g1"]
)
ALLOW_RESULT = AllowTxnResult(TxnMarkerResult((("orders", 0, 0),), (("g1", 16),)))
ALLOW_RESULT_GOLDEN = (
    "82"
    "a26d7601"  # "mv": 1
    "a6726573756c74"  # "result":
    "929193a66f726465727300009192a2673110"  # [[["orders", 0, 0]], [["g1", 16]]]
)


def test_golden_allow_txn() -> None:
    assert _hex(ALLOW.to_wire()) == ALLOW_GOLDEN
    assert AllowTxn.from_wire(msgpack.unpackb(bytes.fromhex(ALLOW_GOLDEN))) == ALLOW
    assert _hex(ALLOW_RESULT.to_wire()) == ALLOW_RESULT_GOLDEN
    decoded = AllowTxnResult.from_wire(msgpack.unpackb(bytes.fromhex(ALLOW_RESULT_GOLDEN)))
    assert decoded == ALLOW_RESULT
    with pytest.raises(UnsupportedMessageVersion):
        AllowTxn.from_wire({"mv": 2})
    with pytest.raises(MalformedMessage, match="allow_txn"):
        AllowTxn.from_wire({"mv": 1, "pid": "x", "pe": 0, "parts": [], "groups": []})


# -- the state stream's txns ---------------------------------------------------------------------

TXNS_FRAME = StateFrame(
    8192,
    txns=(
        AbortedRow("orders", 0, ((4000, 10, 42), (4001, 30, 55))),
        AbortedRow("orders", 1, ()),
    ),
)
TXNS_FRAME_GOLDEN = (
    "83"
    "a26d7601"  # "mv": 1
    "a777616c5f656e64cd2000"  # "wal_end": 8192
    "a474786e73"
    "92"  # "txns": [
    "93a66f726465727300"
    "92"
    "93cd0fa00a2a"
    "93cd0fa11e37"  # ["orders", 0, [[4000, 10, 42], [4001, 30, 55]]],
    "93a66f72646572730190"  # ["orders", 1, []]]
)


def test_golden_state_frame_txns() -> None:
    packed = msgpack.packb(TXNS_FRAME.to_wire(1), use_bin_type=True)
    assert (len(packed), packed.hex()) == (54, TXNS_FRAME_GOLDEN)
    assert StateFrame.from_wire(msgpack.unpackb(packed, raw=False)) == TXNS_FRAME
    # No rows, no key: a frame of a main without transactions is as before.
    assert "txns" not in StateFrame(8192).to_wire()
    bad = {"mv": 1, "wal_end": 1, "txns": [["orders", 0, [[4000, "10", 42]]]]}
    with pytest.raises(MalformedMessage, match=r"state\.txns\[0\]\.aborted\[0\]\.first_offset"):
        StateFrame.from_wire(bad)


# -- the documentation holds every golden --------------------------------------------------------


def _doc() -> str:
    return (Path(__file__).parent.parent / "docs" / "formats.md").read_text()


def test_the_control_batch_in_the_docs() -> None:
    """The annotated block of "Transaction markers (control batches)": hex, then three or
    more spaces, then what it is."""
    doc = _doc()
    section = doc[doc.index("### Transaction markers (control batches)") :]
    block = section.split("```")[1]
    hex_part = "".join(re.split(r" {3,}", line)[0] for line in block.strip().splitlines())
    assert hex_part.replace(" ", "") == COMMIT_MARKER_GOLDEN


@pytest.mark.parametrize(
    "golden",
    [
        MARKER_HEADER_GOLDEN,
        TX_DATA_HEADER_GOLDEN,
        RECORD_GOLDEN,
        TXN_OFFSETS_GOLDEN,
        TXN_OFFSETS_END_GOLDEN,
        TXN_OFFSETS_SECTION_GOLDEN,
        TRANSACTIONS_SECTION_GOLDEN,
        PARTITION_SNAPSHOT_GOLDEN,
        MARKERS_GOLDEN,
        RESULTS_GOLDEN,
        ALLOW_GOLDEN,
        ALLOW_RESULT_GOLDEN,
        TXNS_FRAME_GOLDEN,
    ],
)
def test_the_goldens_are_in_the_docs(golden: str) -> None:
    assert golden in re.sub(r"\s+", "", _doc()), f"{golden} is not in docs/formats.md"
