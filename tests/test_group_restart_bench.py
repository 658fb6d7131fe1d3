"""The pure parts of bench/group_restart_bench.py: the longest gap in a group's consumption over
a window after a restart, and the reads of a record read before. (The benchmark itself starts a
fleet and restarts a main; it is not part of the suite.)"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"

pytest.importorskip("confluent_kafka", reason="bench extra not installed (confluent-kafka)")


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """bench/ is a script directory, not a package: import it the way the script does."""
    sys.path.insert(0, str(BENCH))
    try:
        import group_restart_bench

        yield group_restart_bench
    finally:
        sys.path.remove(str(BENCH))


def test_the_longest_gap_inside_the_window(bench: ModuleType) -> None:
    times = [9.0, 10.1, 10.2, 13.2, 13.3, 20.0, 40.5, 41.0]
    # 13.3 -> 20.0 is the longest gap within [10, 40]; 20.0 -> 40.5 overlaps it and is longer.
    assert bench.longest_gap(times, 10.0, 40.0) == pytest.approx((20.5, 20.0))
    assert bench.longest_gap(times, 10.0, 19.0) == pytest.approx((6.7, 13.3))


def test_a_gap_that_began_before_the_restart_counts_whole(bench: ModuleType) -> None:
    # The last record before the restart at 10 came at 4; the next one at 10.5.
    times = [4.0, 10.5, 12.0, 14.0, 16.0, 18.0, 20.5]
    assert bench.longest_gap(times, 10.0, 20.0) == pytest.approx((6.5, 4.0))
    # A stall that runs past the window's end: its whole length.
    assert bench.longest_gap([7.9, 8.0, 12.0, 30.0], 10.0, 20.0) == pytest.approx((18.0, 12.0))


def test_no_record_after_the_restart_is_a_gap_to_the_window_end(bench: ModuleType) -> None:
    assert bench.longest_gap([], 10.0, 40.0) == pytest.approx((30.0, 10.0))
    assert bench.longest_gap([5.0, 9.5], 10.0, 40.0) == pytest.approx((30.5, 9.5))
    assert bench.longest_gap([5.0, 11.0], 10.0, 40.0) == pytest.approx((29.0, 11.0))


def test_records_before_and_after_do_not_make_a_gap(bench: ModuleType) -> None:
    times = [0.0, 9.0, 10.1, 10.2, 10.3, 11.0, 50.0, 100.0]
    # 0 -> 9 ends before the window, 11 -> 50 starts after it, 50 -> 100 too.
    assert bench.longest_gap(times, 10.0, 10.5) == pytest.approx((1.1, 9.0))


def test_repeat_reads_are_the_second_and_later_reads(bench: ModuleType) -> None:
    reads = [(3.0, 0, 5), (1.0, 0, 5), (2.0, 1, 5), (4.0, 0, 5), (5.0, 0, 6)]
    assert bench.repeat_reads(reads) == [3.0, 4.0]
    assert bench.count_in([3.0, 4.0], 3.5, 10.0) == 1
