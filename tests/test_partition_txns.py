"""One partition's transactions (main_broker.partition_txns, through main_broker.partition_log):
the last stable offset, the aborted-transaction index a read_committed fetch is told of,
trimming, the snapshot of a prefix, replay of the WAL's DATA headers (`tx`, `cm`) giving what
the append path gave, and properties over random interleavings of producers' transactional
batches and markers: the LSO never passes an open transaction, and a reader that applies the
aborted list as Kafka's consumer does sees exactly the committed records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kafka_wire.control_batch import ControlType, build_marker, marker_type
from kafka_wire.record_batch import build_batch, decode_records_for_tools, parse_batch_header
from main_broker.partition_log import BatchEntry, PartitionLog
from main_broker.partition_txns import AbortedTxn, PartitionTxns
from main_broker.producer_state import Verdict
from main_broker.topic_config import EffectiveTopicConfig
from shared_wal import WalPosition
from shared_wal import broker_records as wal_records

NOW = 1_764_201_600_000
EPOCH = 0


# -- PartitionTxns ------------------------------------------------------------------------------


def test_the_first_transactional_batch_opens_and_its_marker_closes() -> None:
    txns = PartitionTxns()
    assert txns.first_unstable_offset() is None and not txns.is_open(7)
    txns.on_transactional_batch(7, 10)
    txns.on_transactional_batch(7, 15)  # the same transaction: its first offset stays
    txns.on_transactional_batch(8, 12)
    assert txns.open_producers() == {7: 10, 8: 12}
    assert txns.first_unstable_offset() == 10
    assert txns.on_marker(7, 20, commit=True) is None  # a commit leaves nothing behind
    assert txns.first_unstable_offset() == 12 and not txns.is_open(7)
    assert txns.on_marker(8, 21, commit=False) == AbortedTxn(8, 12, 21)
    assert txns.first_unstable_offset() is None
    assert txns.aborted == [AbortedTxn(8, 12, 21)]
    # A marker of a producer with nothing open (an empty transaction, a marker sent again)
    # changes nothing.
    assert txns.on_marker(9, 22, commit=False) is None
    assert txns.on_marker(8, 23, commit=False) is None
    assert txns.aborted == [AbortedTxn(8, 12, 21)]
    # The producer's next transaction opens afresh.
    txns.on_transactional_batch(7, 30)
    assert txns.open_producers() == {7: 30}


def test_the_oldest_open_transaction_holds_the_lso_whatever_the_order_they_close() -> None:
    txns = PartitionTxns()
    for pid, first in ((1, 0), (2, 5), (3, 9)):
        txns.on_transactional_batch(pid, first)
    txns.on_marker(2, 12, commit=True)
    assert txns.first_unstable_offset() == 0
    txns.on_marker(1, 13, commit=False)
    assert txns.first_unstable_offset() == 9
    txns.on_transactional_batch(1, 14)
    assert txns.first_unstable_offset() == 9
    txns.on_marker(3, 15, commit=True)
    assert txns.first_unstable_offset() == 14


def _aborted(*rows: tuple[int, int, int]) -> PartitionTxns:
    txns = PartitionTxns()
    txns.reset({}, [AbortedTxn(*r) for r in rows])
    return txns


def test_aborted_between_follows_kafkas_rule() -> None:
    """A fetch of [start, end) is told of the aborted transactions with first < end and
    last (the ABORT marker) >= start."""
    txns = _aborted((1, 10, 20), (2, 15, 30), (3, 40, 41))
    rows = txns.aborted
    assert txns.aborted_between(0, 10) == []  # first == end: not in range
    assert txns.aborted_between(0, 11) == rows[:1]
    assert txns.aborted_between(20, 21) == rows[:2]  # last == start: in range
    assert txns.aborted_between(21, 40) == rows[1:2]
    assert txns.aborted_between(21, 41) == rows[1:]
    assert txns.aborted_between(31, 40) == []
    assert txns.aborted_between(42, 100) == []
    assert txns.aborted_between(0, 100) == rows
    for start in range(0, 45):
        for end in range(start, 45):
            want = [a for a in rows if a.first_offset < end and a.last_offset >= start]
            assert txns.aborted_between(start, end) == want, (start, end)


def test_aborted_transactions_stay_sorted_by_their_marker() -> None:
    txns = PartitionTxns()
    for pid, first in ((1, 0), (2, 1), (3, 2)):
        txns.on_transactional_batch(pid, first)
    txns.on_marker(1, 9, commit=False)
    txns.on_marker(3, 5, commit=False)  # a marker applied late keeps the index ordered
    txns.on_marker(2, 7, commit=False)
    assert [a.last_offset for a in txns.aborted] == [5, 7, 9]
    assert txns.aborted_between(6, 8) == [AbortedTxn(2, 1, 7), AbortedTxn(1, 0, 9)]
    assert txns.aborted_between(8, 9) == [AbortedTxn(1, 0, 9)]
    assert txns.aborted == [AbortedTxn(3, 2, 5), AbortedTxn(2, 1, 7), AbortedTxn(1, 0, 9)]


def test_trim_forgets_what_lies_below_the_log_start() -> None:
    txns = _aborted((1, 10, 20), (2, 15, 30))
    assert not txns.trim(20)  # its marker is still in the log
    assert txns.trim(21)
    assert txns.aborted == [AbortedTxn(2, 15, 30)]
    assert not txns.trim(21)
    assert txns.trim(1000) and txns.aborted == []


def test_to_snapshot_describes_the_prefix_below() -> None:
    """The state of the records below `below`: what the records from `below` on open is
    left out, and an aborted transaction whose marker they hold is still open."""
    txns = PartitionTxns()
    txns.on_transactional_batch(1, 10)
    txns.on_transactional_batch(2, 30)
    txns.on_marker(1, 42, commit=False)  # aborted [10, 42]
    txns.on_transactional_batch(3, 50)  # open from 50
    txns.on_transactional_batch(4, 61)  # open from 61
    txns.on_transactional_batch(5, 5)
    txns.on_marker(5, 8, commit=False)  # aborted [5, 8]
    assert txns.to_snapshot(100) == {
        "o": [[2, 30], [3, 50], [4, 61]],
        "a": [[5, 5, 8], [1, 10, 42]],
    }
    assert txns.to_snapshot(61) == {"o": [[2, 30], [3, 50]], "a": [[5, 5, 8], [1, 10, 42]]}
    assert txns.to_snapshot(42) == {"o": [[2, 30], [1, 10]], "a": [[5, 5, 8]]}
    assert txns.to_snapshot(11) == {"o": [[1, 10]], "a": [[5, 5, 8]]}
    assert txns.to_snapshot(10) == {"o": [], "a": [[5, 5, 8]]}
    assert txns.to_snapshot(8) == {"o": [[5, 5]], "a": []}
    assert txns.to_snapshot(0) == {"o": [], "a": []}
    # Read back: the open transactions by first offset, the aborted by marker.
    back = PartitionTxns.from_snapshot(msgpack.unpackb(msgpack.packb(txns.to_snapshot(42))))
    assert back.open_producers() == {1: 10, 2: 30}
    assert list(back.open_producers()) == [1, 2]
    assert back.first_unstable_offset() == 10
    assert back.aborted == [AbortedTxn(5, 5, 8)]
    # A snapshot of the previous release has no "tx".
    empty = PartitionTxns.from_snapshot(None)
    assert empty.open_producers() == {} and empty.aborted == []


# -- PartitionLog: the append path, as LogStore drives it ---------------------------------------


def _plog() -> PartitionLog:
    return PartitionLog("t", 0, b"\x01" * 16, EffectiveTopicConfig.from_explicit({}, {}))


@dataclass
class Record:
    """A WAL DATA record the append path wrote: replay reads these back."""

    header: dict[str, Any]
    payload: bytes
    entry: BatchEntry
    marker: tuple[int, bool] | None  # (producer id, commit) of a marker


@dataclass
class Driver:
    """Appends to a PartitionLog as main_broker.log_store does (offsets at append, the high
    watermark and the markers at durability, WAL order), keeping the DATA records."""

    plog: PartitionLog = field(default_factory=_plog)
    records: list[Record] = field(default_factory=list)
    durable: int = 0  # how many of `records` are durable
    sequences: dict[int, int] = field(default_factory=dict)

    def produce(self, pid: int, values: list[bytes], transactional: bool = True) -> Record:
        seq = self.sequences.get(pid, 0) if pid >= 0 else -1
        buf = memoryview(
            bytearray(
                build_batch(
                    [(None, v) for v in values],
                    timestamp_ms=NOW,
                    producer_id=pid,
                    producer_epoch=EPOCH if pid >= 0 else -1,
                    base_sequence=seq,
                    transactional=transactional,
                )
            )
        )
        batch = parse_batch_header(buf)
        if transactional and not self.plog.txns.is_open(pid):
            # The coordinator added the partition to the transaction (AddPartitionsToTxn),
            # which lets the transaction's first batch open it here (KIP-890's check, where
            # the partition has it).
            allow = getattr(self.plog.txns, "allow", None)
            if allow is not None:
                allow(pid, EPOCH)
        check = self.plog.check_producer(batch)
        assert check.verdict is Verdict.APPEND, check
        entry = self.plog.append(buf, batch, NOW)
        producer = None
        if pid >= 0:
            self.sequences[pid] = seq + len(values)
            producer = (pid, EPOCH, seq, seq + len(values) - 1, NOW)
        header = wal_records.data_header(
            "t", 0, entry.base_offset, entry.last_offset, entry.max_timestamp, producer,
            transactional,
        )  # fmt: skip
        record = Record(header, bytes(buf), entry, None)
        self.records.append(record)
        return record

    def end(self, pid: int, commit: bool) -> Record:
        buf = memoryview(bytearray(build_marker(commit, pid, EPOCH, 0, NOW)))
        assert self.plog.check_marker(pid, EPOCH) is None
        entry = self.plog.append_marker(buf, parse_batch_header(buf), NOW)
        header = wal_records.marker_header(
            "t", 0, entry.base_offset, entry.max_timestamp, pid, EPOCH, commit
        )
        record = Record(header, bytes(buf), entry, (pid, commit))
        self.records.append(record)
        return record

    def make_durable(self, count: int | None = None) -> None:
        end = len(self.records) if count is None else min(len(self.records), self.durable + count)
        for i in range(self.durable, end):
            record = self.records[i]
            self.plog.mark_durable(record.entry, WalPosition("main-1", 0, i, 1))
            if record.marker is not None:
                pid, commit = record.marker
                self.plog.apply_marker(pid, record.entry.base_offset, commit)
        self.durable = end

    def replayed(self, start: int = 0, snapshot: dict[str, Any] | None = None) -> PartitionLog:
        """A PartitionLog rebuilt from the durable records (from a snapshot, optionally)."""
        plog = _plog()
        if snapshot is not None:
            plog.restore_snapshot(snapshot)
        for i, record in enumerate(self.records[start : self.durable], start):
            payload = memoryview(bytearray(record.payload))
            plog.replay_batch(record.header, payload, WalPosition("main-1", 0, i, 1))
        return plog


def read_committed(plog: PartitionLog, start: int = 0) -> list[bytes]:
    """What a read_committed consumer sees from `start`: batches below the LSO, filtered with
    the aborted list the fetch returns, as Kafka's consumer (Fetcher/CompletedFetch) does: an
    aborted transaction's producer is skipped from the batch holding its first offset until
    its ABORT marker; control batches are never shown."""
    lso = plog.last_stable_offset
    aborted = sorted(plog.aborted_transactions(start, lso), key=lambda a: a[1])
    skipping: set[int] = set()
    seen: list[bytes] = []
    for entry in plog.entries:
        if entry.last_offset < start:
            continue
        if entry.base_offset >= lso:
            break
        assert entry.data is not None
        batch = parse_batch_header(entry.data)
        if batch.is_control:
            if marker_type(entry.data, batch) == ControlType.ABORT:
                skipping.discard(batch.producer_id)
            continue
        if batch.is_transactional:
            while aborted and aborted[0][1] <= batch.last_offset:
                skipping.add(aborted.pop(0)[0])
            if batch.producer_id in skipping:
                continue
        seen.extend(v for _o, _t, _k, v in decode_records_for_tools(entry.data) if v is not None)
    return seen


def _state(plog: PartitionLog) -> tuple[Any, ...]:
    """What transactions change of a partition: its offsets and its SNAPSHOT entry's "tx".
    (Producer rows are test_producer_state's: the table keeps a producer's last 5 batches,
    so batches not yet durable may push durable ones out of the append path's snapshot.)"""
    snapshot = plog.to_snapshot()
    hw = plog.high_watermark
    return (
        hw,
        plog.last_stable_offset,
        {pid: first for pid, first in plog.txns.open_producers().items() if first < hw},
        plog.txns.aborted,
        snapshot["no"],
        snapshot["tx"],
    )


def test_lso_is_the_first_open_offset_or_the_high_watermark() -> None:
    d = Driver()
    d.produce(-1, [b"p0", b"p1"], transactional=False)  # offsets 0-1
    d.make_durable()
    assert d.plog.last_stable_offset == d.plog.high_watermark == 2
    d.produce(7, [b"a", b"b"])  # 2-3: opens producer 7's transaction at 2
    assert d.plog.txns.open_producers() == {7: 2}
    assert d.plog.last_stable_offset == 2  # not durable yet: the HW
    d.make_durable()
    d.produce(-1, [b"p2"], transactional=False)  # 4
    d.produce(8, [b"c"])  # 5
    d.make_durable()
    assert (d.plog.high_watermark, d.plog.last_stable_offset) == (6, 2)
    commit = d.end(7, commit=True)  # 6
    assert commit.entry.base_offset == 6
    assert d.plog.last_stable_offset == 2  # a marker counts once it is durable
    d.make_durable()
    assert (d.plog.high_watermark, d.plog.last_stable_offset) == (7, 5)
    d.end(8, commit=False)  # 7
    d.make_durable()
    assert (d.plog.high_watermark, d.plog.last_stable_offset) == (8, 8)
    assert d.plog.aborted_transactions(0, 8) == [(8, 5)]
    assert d.plog.aborted_transactions(6, 8) == [(8, 5)]
    assert d.plog.aborted_transactions(0, 5) == []
    assert read_committed(d.plog) == [b"p0", b"p1", b"a", b"b", b"p2"]
    # The markers are control batches the broker built, with the producer's id and epoch.
    marker = d.plog.entries[-1]
    assert marker.data is not None
    info = parse_batch_header(marker.data)
    assert (info.is_control, info.is_transactional, info.base_offset) == (True, True, 7)
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (8, EPOCH, -1)
    assert marker_type(marker.data, info) == ControlType.ABORT


def test_a_producer_with_an_open_transaction_may_not_write_outside_it() -> None:
    d = Driver()
    d.produce(7, [b"a"])
    plain = memoryview(
        bytearray(
            build_batch([(None, b"x")], timestamp_ms=NOW, producer_id=7, producer_epoch=0,
                        base_sequence=1)
        )
    )  # fmt: skip
    check = d.plog.check_producer(parse_batch_header(plain))
    assert (check.verdict, check.error) == (Verdict.REJECT, ErrorCode.invalid_txn_state)
    # Once its marker is durable it may.
    d.end(7, commit=True)
    d.make_durable()
    assert d.plog.check_producer(parse_batch_header(plain)).verdict is Verdict.APPEND


def test_a_transactional_batch_needs_a_producer_id() -> None:
    buf = build_batch([(None, b"x")], timestamp_ms=NOW, transactional=True)
    check = _plog().check_producer(parse_batch_header(buf))
    assert (check.verdict, check.error) == (Verdict.REJECT, ErrorCode.invalid_record)


def test_a_marker_of_an_older_epoch_is_refused_and_a_newer_one_fences() -> None:
    d = Driver()
    d.produce(7, [b"a"])
    assert d.plog.check_marker(7, EPOCH) is None
    assert d.plog.check_marker(99, 5) is None  # a producer the partition never saw
    # The coordinator's abort of a timed-out transaction bumps the epoch: the marker
    # carries it, and the old epoch is fenced on the partition from then on.
    buf = memoryview(bytearray(build_marker(False, 7, EPOCH + 1, 0, NOW)))
    d.plog.append_marker(buf, parse_batch_header(buf), NOW)
    assert d.plog.check_marker(7, EPOCH) == ErrorCode.invalid_producer_epoch
    late = build_batch(
        [(None, b"z")], timestamp_ms=NOW, producer_id=7, producer_epoch=EPOCH, base_sequence=1,
        transactional=True,
    )  # fmt: skip
    assert d.plog.check_producer(parse_batch_header(late)).verdict is Verdict.REJECT


def test_trim_by_the_log_start() -> None:
    d = Driver()
    d.produce(7, [b"a"])  # 0
    d.end(7, commit=False)  # 1
    d.produce(8, [b"b"])  # 2
    d.end(8, commit=False)  # 3
    d.produce(-1, [b"c"], transactional=False)  # 4
    d.make_durable()
    assert [a.producer_id for a in d.plog.txns.aborted] == [7, 8]
    assert d.plog.delete_records(2)
    assert [a.producer_id for a in d.plog.txns.aborted] == [8]
    assert d.plog.aborted_transactions(2, 5) == [(8, 2)]
    assert read_committed(d.plog, 2) == [b"c"]


def test_replay_of_tx_and_cm_headers_rebuilds_the_append_paths_state() -> None:
    d = Driver()
    d.produce(7, [b"a"])
    d.produce(8, [b"b"])
    d.produce(-1, [b"c"], transactional=False)
    d.produce(7, [b"d"])
    d.end(7, commit=False)
    d.produce(9, [b"e"])
    d.end(9, commit=True)
    d.make_durable()
    d.produce(10, [b"f"])  # not durable: replay never sees it
    replayed = d.replayed()
    assert _state(replayed) == _state(d.plog)
    assert replayed.txns.open_producers() == {8: 1}
    assert replayed.txns.aborted == [AbortedTxn(7, 0, 4)]
    assert read_committed(replayed) == read_committed(d.plog) == []  # 8 holds the LSO at 1
    assert d.plog.txns.open_producers() == {8: 1, 10: 7}
    # The headers say it all: `tx` on transactional batches, `cm` on markers.
    assert [r.header.get("tx") for r in d.records] == [1, 1, None, 1, None, 1, None, 1]
    assert [r.header.get("cm") for r in d.records] == [None] * 4 + [0, None, 1, None]
    d.end(8, commit=True)
    d.make_durable()
    assert _state(d.replayed()) == _state(d.plog)
    assert d.plog.last_stable_offset == 7  # producer 10's transaction, now durable
    assert read_committed(d.replayed()) == read_committed(d.plog) == [b"b", b"c", b"e"]


def test_a_partition_snapshot_carries_its_transactions() -> None:
    d = Driver()
    d.produce(7, [b"a"])  # 0
    d.produce(8, [b"b"])  # 1
    d.end(7, commit=False)  # 2
    d.make_durable()
    d.produce(9, [b"c"])  # 3, not durable
    snap = d.plog.to_snapshot()
    assert snap["tx"] == {"o": [[8, 1]], "a": [[7, 0, 2]]}
    d.make_durable()
    restored = d.replayed(start=3, snapshot=snap)
    assert _state(restored) == _state(d.plog)
    assert restored.to_snapshot()["pr"] == d.plog.to_snapshot()["pr"]
    assert restored.last_stable_offset == 1


# -- properties ---------------------------------------------------------------------------------

PRODUCERS = (1, 2, 3)
_OP = st.one_of(
    st.tuples(st.just("data"), st.sampled_from((-1, *PRODUCERS)), st.integers(1, 3)),
    st.tuples(st.just("end"), st.sampled_from(PRODUCERS), st.booleans()),
    st.tuples(st.just("durable"), st.integers(1, 4), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_OP, max_size=60), st.booleans(), st.data())
def test_random_interleavings(ops: list[tuple[str, int, Any]], settle: bool, data: Any) -> None:
    d = Driver()
    # The model: a transaction is open from its first batch until its marker is durable.
    open_first: dict[int, int] = {}
    ending: dict[int, int] = {}  # producer -> its marker's record, not durable yet
    outcome: dict[int, bool] = {}  # record index -> committed (transactional batches)
    txn_batches: dict[int, list[int]] = {}  # producer -> record indexes of its open txn
    snapshots: list[tuple[int, dict[str, Any]]] = []
    count = 0

    def settle_markers() -> None:
        for pid, i in list(ending.items()):
            if i < d.durable:
                marker = d.records[i].marker
                assert marker is not None
                del ending[pid]
                open_first.pop(pid, None)
                for j in txn_batches.pop(pid, []):
                    outcome[j] = marker[1]

    def check() -> None:
        plog = d.plog
        lso, hw = plog.last_stable_offset, plog.high_watermark
        assert lso <= hw
        for first in open_first.values():
            assert lso <= first
        assert lso == min([hw, *open_first.values()])

    for op, a, b in ops:
        if op == "data":
            if a in ending:
                continue  # the coordinator starts no transaction before the markers are in
            values = [b"%d-%d" % (count, i) for i in range(b)]
            count += 1
            record = d.produce(a, values, transactional=a >= 0)
            if a >= 0:
                open_first.setdefault(a, record.entry.base_offset)
                txn_batches.setdefault(a, []).append(len(d.records) - 1)
        elif op == "end":
            if a in ending:
                continue
            d.end(a, b)
            ending[a] = len(d.records) - 1
        else:
            d.make_durable(a)
            settle_markers()
            snapshots.append((d.durable, d.plog.to_snapshot()))
        check()
    if settle:
        d.make_durable()
        settle_markers()
        check()

    # The reader sees exactly the committed records (and the plain ones) below the LSO.
    lso = d.plog.last_stable_offset
    want: list[bytes] = []
    for i, record in enumerate(d.records):
        if record.marker is not None or record.entry.base_offset >= lso:
            continue
        transactional = record.header.get("tx") == 1
        assert not transactional or i in outcome  # below the LSO: ended
        if not transactional or outcome[i]:
            want.extend(v for _o, _t, _k, v in decode_records_for_tools(record.payload) if v)
    assert read_committed(d.plog) == want
    start = data.draw(st.integers(0, max(d.plog.high_watermark, 0)), label="fetch start")
    got = read_committed(d.plog, start)
    assert set(got) <= set(want)

    # Replay of the durable records gives the append path's state.
    replayed = d.replayed()
    assert _state(replayed) == _state(d.plog)
    assert read_committed(replayed) == want

    # So does a SNAPSHOT taken on the way, followed by the records after it.
    if snapshots:
        durable, snap = data.draw(st.sampled_from(snapshots), label="snapshot")
        assert _state(d.replayed(durable, snap)) == _state(d.plog)

    # And the state of a prefix (a takeover's start), followed by the rest of the records.
    boundaries = [r.entry.base_offset for r in d.records[: d.durable]] + [replayed.high_watermark]
    cut = data.draw(st.sampled_from(boundaries), label="cut")
    rest = _plog()
    rest.reset_for_takeover(cut, 0, [], 0, replayed.txns.to_snapshot(cut))
    for i, record in enumerate(d.records[: d.durable]):
        if record.entry.base_offset >= cut:
            payload = memoryview(bytearray(record.payload))
            rest.replay_batch(record.header, payload, WalPosition("main-1", 0, i, 1))
    assert rest.txns.open_producers() == replayed.txns.open_producers()
    assert rest.txns.aborted == replayed.txns.aborted
    assert rest.last_stable_offset == replayed.last_stable_offset
