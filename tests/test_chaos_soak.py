"""A short chaos soak (issue 14; `bench/chaos.py`, docs/reliability.md "Chaos soak"): a 3-zone
fleet, one process per node, WAL on NFS-Ganesha, objects and metadata in SeaweedFS, under
idempotent acks=all load in every zone while one fault of each kind lands in turn. Every
acknowledged record is read exactly once, in order, through every zone, and every fault heals.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.nfs_server import GaneshaServer, GaneshaUnavailable

BENCH = Path(__file__).resolve().parent.parent / "bench"

PLAN = ("kill-main", "pause-main", "kill-proxy", "restart-nfs", "pause-store", "pause-proxy")


@pytest.fixture(scope="module")
def chaos() -> Iterator[ModuleType]:
    """bench/ is a script directory, not a package: import the module the way the script runs."""
    sys.path.insert(0, str(BENCH))
    try:
        import chaos

        yield chaos
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def ganesha_ok() -> None:
    try:
        GaneshaServer().start().stop()
    except GaneshaUnavailable as exc:
        pytest.skip(f"NFS-Ganesha cannot start here: {exc}")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("ganesha_ok")
def test_short_chaos_soak(chaos: ModuleType, tmp_path: Path) -> None:
    opts = chaos.ChaosOptions(
        minutes=6.0,  # a cap: the run ends a few seconds after the plan's last fault heals
        seed=14,
        faults_per_minute=4.0,
        plan=PLAN,
        down_s=(2.0, 4.0),
        pause_s=(2.0, 4.0),
        recovery_timeout_s=90.0,
        data_dir=tmp_path / "chaos",
    )
    report = chaos.run_chaos(opts)
    print(chaos.summary_text(report))
    assert [f["kind"] for f in report["faults"]] == list(PLAN)
    assert report["acked"] > 1000
    assert report["lost"] == 0, report["by_zone"]
    assert report["duplicates"] == 0, report["by_zone"]
    assert report["out_of_order"] == 0, report["by_zone"]
    assert report["zones_disagreeing"] == [], report["by_zone"]
    assert report["ok"], report["by_zone"]
    unrecovered = [f for f in report["faults"] if f["recovered"] < 0]
    assert not unrecovered, unrecovered
    for live in report["live_consumers"].values():
        assert live["differs_from_final_read"] == 0 and live["rewinds"] == 0, live
