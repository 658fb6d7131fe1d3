from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet_process import FleetProcess

warnings.filterwarnings("ignore", message="pkg_resources is deprecated")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcess]:
    """One `zonefleet up` per test module, started as a user would start it."""
    proc = FleetProcess(tmp_path_factory.mktemp("fleet")).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def fresh_fleet(tmp_path: Path) -> Iterator[FleetProcess]:
    proc = FleetProcess(tmp_path / "fleet").start()
    try:
        yield proc
    finally:
        proc.stop()
