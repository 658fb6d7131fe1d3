"""BatchIndex: offset and timestamp lookups, byte-limited slices, dropping retained-out batches."""

from __future__ import annotations

from shared_wal import WalPosition
from shared_wal.batch_index import BatchEntry, BatchIndex


def _entry(base: int, count: int, ts: int, size: int, segment: int | None = None) -> BatchEntry:
    position = WalPosition("w1", segment, base * 100, size) if segment is not None else None
    return BatchEntry(base, base + count - 1, ts, size, None, position)


def _index(specs: list[tuple[int, int, int, int | None]], start: int = 0) -> BatchIndex:
    """specs: (record count, max timestamp, size, segment) of consecutive batches."""
    index = BatchIndex(start)
    offset = start
    for count, ts, size, segment in specs:
        index.add(_entry(offset, count, ts, size, segment))
        offset += count
    return index


def _bases(entries: list[BatchEntry]) -> list[int]:
    return [e.base_offset for e in entries]


def test_end_offset_starts_at_start_and_follows_adds() -> None:
    index = BatchIndex(40)
    assert (index.end_offset, index.entries) == (40, [])
    index.add(_entry(40, 5, 1, 10))
    index.add(_entry(45, 1, 2, 10))
    assert index.end_offset == 46
    assert _bases(index.entries) == [40, 45]
    assert BatchIndex().end_offset == 0


def test_first_index_at_finds_the_batch_holding_an_offset() -> None:
    index = _index([(3, 1, 10, None), (2, 2, 10, None), (4, 3, 10, None)])  # 0-2, 3-4, 5-8
    assert [index.first_index_at(o) for o in range(10)] == [0, 0, 0, 1, 1, 2, 2, 2, 2, 3]
    assert BatchIndex().first_index_at(0) == 0


def test_first_index_at_before_the_first_batch() -> None:
    index = _index([(2, 1, 10, None)], start=10)
    assert index.first_index_at(3) == 0
    assert index.first_index_at(12) == 1


def test_fetch_slice_takes_whole_batches_within_max_bytes() -> None:
    index = _index([(2, 1, 100, None), (2, 2, 100, None), (2, 3, 100, None)])
    assert _bases(index.fetch_slice(0, 250, 6, must_return_one=False)) == [0, 2]
    assert _bases(index.fetch_slice(0, 300, 6, must_return_one=False)) == [0, 2, 4]
    # Starting inside a batch returns that whole batch.
    assert _bases(index.fetch_slice(3, 1000, 6, must_return_one=False)) == [2, 4]
    assert index.fetch_slice(6, 1000, 6, must_return_one=False) == []


def test_fetch_slice_kip74_first_batch_may_exceed_max_bytes() -> None:
    index = _index([(1, 1, 500, None), (1, 2, 10, None)])
    assert index.fetch_slice(0, 100, 2, must_return_one=False) == []
    # Only the first batch may overflow; the second still has to fit what is left.
    assert _bases(index.fetch_slice(0, 100, 2, must_return_one=True)) == [0]
    assert _bases(index.fetch_slice(0, 0, 2, must_return_one=True)) == [0]


def test_fetch_slice_stops_at_upper() -> None:
    index = _index([(2, 1, 10, None), (3, 2, 10, None), (1, 3, 10, None)])  # 0-1, 2-4, 5
    assert _bases(index.fetch_slice(0, 1000, 5, must_return_one=True)) == [0, 2]
    # A batch straddling the bound is not served at all.
    assert _bases(index.fetch_slice(0, 1000, 4, must_return_one=True)) == [0]
    assert index.fetch_slice(0, 1000, 0, must_return_one=True) == []


def test_bytes_available_counts_below_upper() -> None:
    index = _index([(2, 1, 10, None), (2, 2, 20, None), (2, 3, 40, None)])
    assert index.bytes_available(0, 6) == 70
    assert index.bytes_available(2, 6) == 60
    assert index.bytes_available(3, 4) == 20
    assert index.bytes_available(0, 3) == 10
    assert index.bytes_available(6, 6) == 0


def test_timestamp_lookups_use_the_running_maximum() -> None:
    # Timestamps out of order: batch 1 has a lower max than batch 0.
    index = _index([(1, 100, 1, None), (1, 50, 1, None), (1, 300, 1, None), (1, 300, 1, None)])
    found = index.first_batch_at_timestamp(60, 4)
    assert found is not None and found.base_offset == 0
    found = index.first_batch_at_timestamp(101, 4)
    assert found is not None and found.base_offset == 2
    assert index.first_batch_at_timestamp(301, 4) is None
    assert index.first_batch_at_timestamp(101, 2) is None  # the match is not below upper
    best = index.max_timestamp_entry(4)
    assert best is not None and best.base_offset == 2  # the earliest of the tied maxima
    best = index.max_timestamp_entry(2)
    assert best is not None and best.base_offset == 0
    assert index.max_timestamp_entry(0) is None


def test_iter_below() -> None:
    index = _index([(2, 1, 1, None), (2, 1, 1, None), (2, 1, 1, None)])
    assert _bases(list(index.iter_below(4))) == [0, 2]
    assert _bases(list(index.iter_below(5))) == [0, 2]
    assert list(index.iter_below(0)) == []


def test_drop_segments_drops_the_leading_batches_only() -> None:
    index = _index([(1, 10, 1, 0), (1, 20, 1, 0), (1, 30, 1, 1), (1, 40, 1, 0), (1, 50, 1, None)])
    assert index.drop_segments({5}) == 0
    # Segment 0 also holds batch 3, but batch 2 (segment 1) is kept, so batch 3 stays too.
    assert index.drop_segments({0}) == 2
    assert _bases(index.entries) == [2, 3, 4]
    assert index.end_offset == 5
    # Lookups still line up with the remaining entries.
    assert index.first_index_at(3) == 1
    found = index.first_batch_at_timestamp(35, 5)
    assert found is not None and found.base_offset == 3
    # A batch not yet durable (no position) stops the drop.
    assert index.drop_segments({0, 1}) == 2
    assert _bases(index.entries) == [4]


def test_drop_front_keeps_end_offset_and_indexes_consistent() -> None:
    index = _index([(2, 5, 10, None), (2, 7, 20, None), (2, 9, 30, None)])
    index.drop_front(1)
    assert _bases(index.entries) == [2, 4]
    assert index.bytes_available(0, 6) == 50
    found = index.first_batch_at_timestamp(1, 6)
    assert found is not None and found.base_offset == 2
    index.drop_front(0)
    assert len(index.entries) == 2
    index.drop_front(5)
    assert (index.entries, index.end_offset) == ([], 6)
    assert index.first_batch_at_timestamp(1, 6) is None
    index.add(_entry(6, 1, 1, 1))
    assert (_bases(index.entries), index.end_offset) == ([6], 7)


def test_partition_log_reexports_batch_entry() -> None:
    from main_broker.partition_log import BatchEntry as Reexported

    assert Reexported is BatchEntry
