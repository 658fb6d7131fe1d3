"""bench/cost_report_bench.py's ledger generator writes what the nodes write (no Spark here).

A tiny ledger (2 days, 2,000 rows) must pass the ledger reader contract line by line
(`cost_report.ledger_rows.row_problem`, `telemetry.traffic_sink.read_traffic_rows`), be the exact
text `json.dumps` gives for the row (compact, keys in the ledger's order), be deterministic in
the seed, and be found again in the cache rather than regenerated.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from cost_report.ledger_files import parse_ledger_path
from cost_report.ledger_rows import KNOWN_CHANNELS, is_cross_zone, row_problem
from cost_report.reference import reference_totals
from telemetry.traffic_sink import read_traffic_rows

BENCH = Path(__file__).resolve().parent.parent / "bench"
KEYS = [
    "minute",
    "node",
    "from_zone",
    "to_zone",
    "channel",
    "api",
    "topic",
    "bytes",
    "requests",
    "cross_zone",
]
ROWS, DAYS = 2_000, 2


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """bench/ is a script directory, not a package: import the module the way the script runs."""
    sys.path.insert(0, str(BENCH))
    try:
        import cost_report_bench

        yield cost_report_bench
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def ledger(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "ledgers"
    facts = bench.generate(root, ROWS, seed=7, days=DAYS, workers=1)
    assert facts["rows"] == ROWS
    return root


def _files(root: Path) -> list[Path]:
    return sorted(root.glob("dt=*/*.jsonl"))


def test_every_line_is_a_ledger_row(ledger: Path) -> None:
    files = _files(ledger)
    assert len(files) == 6 * DAYS  # one fleet: 3 mains + 3 proxies, a file per node-day
    rows = 0
    for path in files:
        parsed = parse_ledger_path(str(path), path.stat().st_size)
        assert parsed is not None, path
        read = read_traffic_rows(path)
        text = path.read_text(encoding="ascii").splitlines()
        assert len(read) == len(text) > 0
        minutes = []
        for line, row in zip(text, read, strict=True):
            assert row_problem(row, parsed.dt, parsed.node) is None, line
            assert list(row) == KEYS, line
            assert json.dumps(row, separators=(",", ":")) == line
            assert row["cross_zone"] == is_cross_zone(row["from_zone"], row["to_zone"])
            assert row["bytes"] >= 0 and row["requests"] >= 1
            if row["topic"]:
                assert row["channel"] == "kafka-client" and row["api"] in ("Produce", "Fetch")
            minutes.append(row["minute"])
        assert minutes == sorted(minutes), f"{path}: rows not in minute order"
        rows += len(read)
    assert rows == ROWS


def test_the_mix_looks_like_a_fleet(ledger: Path) -> None:
    t = reference_totals(ledger)
    assert t.rows == ROWS and t.rejected_rows == 0
    assert set(t.bytes_by_channel) <= set(KNOWN_CHANNELS)
    assert {"kafka-client", "confirm-rpc", "wal-write", "wal-read", "s3-put"} <= set(
        t.bytes_by_channel
    )
    assert {"Produce", "Fetch", "Metadata"} <= set(t.client_bytes_by_api)
    assert len([topic for topic in t.bytes_by_topic if topic]) >= 10
    # Payloads stay in their zone: cross-zone bytes are a small share, and so is 'unknown'.
    payload = t.client_bytes_by_api["Produce"] + t.client_bytes_by_api["Fetch"]
    assert 0 < t.cross_zone_bytes < 0.05 * payload
    assert 0 < t.unknown_zone_bytes < 0.05 * t.total_bytes
    assert set(t.bytes_by_day) == {"2026-11-01", "2026-11-02"}


def test_deterministic_in_the_seed(bench: ModuleType, ledger: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    bench.generate(again, ROWS, seed=7, days=DAYS, workers=1)
    other = tmp_path / "other"
    bench.generate(other, ROWS, seed=8, days=DAYS, workers=1)
    names = [p.relative_to(ledger) for p in _files(ledger)]
    assert names == [p.relative_to(again) for p in _files(again)]
    assert all((ledger / n).read_bytes() == (again / n).read_bytes() for n in names)
    assert any((ledger / n).read_bytes() != (other / n).read_bytes() for n in names)


def test_node_days_share_the_rows_evenly(bench: ModuleType) -> None:
    quotas = bench.day_quotas(10_000_001, 12)
    assert sum(quotas) == 10_000_001 and max(quotas) - min(quotas) <= 1
    counts = bench.key_counts([1.0, 0.5, 0.01, 0.0], 3_000)
    assert sum(counts) == 3_000 and counts[0] == bench.MINUTES and counts[3] == 0
    assert bench.fleets_for(1_000_000) == 1 and len(bench.all_nodes(10_000_000)) == 12


def test_cached_by_rows_and_seed(bench: ModuleType, tmp_path: Path) -> None:
    logs: list[str] = []
    root, facts = bench.cached_ledgers(tmp_path, 500, 3, logs.append)
    assert not facts["cached"] and facts["rows"] == 500
    assert (root / bench.MARKER).exists()
    first = {p: p.read_bytes() for p in _files(root)}
    again, facts = bench.cached_ledgers(tmp_path, 500, 3, logs.append)
    assert again == root and facts["cached"]
    assert {p: p.read_bytes() for p in _files(again)} == first
    # The marker file is not a ledger file: the reference sum (and the report) skip it.
    assert reference_totals(root).rows == 500
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial left
