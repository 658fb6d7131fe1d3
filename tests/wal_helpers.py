"""Setup shared by the WAL tests: a filesystem per backend, configs and writing a log.

Use the fixture by binding it in the test module (``wal_fs = wal_helpers.wal_fs``):
tests/conftest.py is shared with the rest of the suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from shared_wal import RecordType, WalConfig, WalPosition, WalWriter, open_wal_fs
from shared_wal.storage import FS


@pytest.fixture(params=["mem", "osfs"])
def wal_fs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FS]:
    url = "mem://" if request.param == "mem" else f"osfs://{tmp_path / 'root'}"
    filesystem = open_wal_fs(url)
    yield filesystem
    filesystem.close()


def no_retention(**kw: Any) -> WalConfig:
    """A config that never deletes segments by age; tests trigger retention themselves."""
    return WalConfig(retention_ms=None, **kw)


@asynccontextmanager
async def running(wal: WalWriter) -> AsyncIterator[WalWriter]:
    """Runs the writer's loop for the body, then closes the writer."""
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        yield wal
        await wal.aclose()


async def write_log(
    fs: FS,
    n: int,
    payload: Callable[[int], bytes],
    *,
    writer: str = "w1",
    config: WalConfig | None = None,
) -> tuple[WalWriter, list[WalPosition]]:
    """Appends ``n`` DATA records ({"i": i}, ``payload(i)``) one by one, then closes the log."""
    wal = await WalWriter.open(fs, writer, config or no_retention())
    async with running(wal):
        positions = [await wal.append(RecordType.DATA, {"i": i}, payload(i)) for i in range(n)]
    return wal, positions
