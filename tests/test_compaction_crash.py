"""Kill -9 in the middle of a compaction (issue 4, "What the tests must show" 3 and 4).

A `zonefleet main-broker` process on SeaweedFS, uploading small SSOs while a producer runs,
stops itself (telemetry.pause_points) after a compaction's PUTs and before its manifest swap,
or right after the swap. The test SIGKILLs it there and restarts it (compaction off, so that
nothing new is in flight): every acknowledged record is read back exactly once and in order;
new objects the swap never listed are orphans the sweep deletes, and nothing else; objects a
swap replaced stay until the restarted main deletes them after their delay.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from s3_commit import AsyncObjectStore, open_object_store
from s3_commit.manifest import Manifest, manifest_key
from s3_commit.manifest_store import sweep_orphans
from s3_commit.object_plan import DATA_PREFIX
from tests.s3_servers import SeaweedServer, seaweedfs
from tests.test_object_crash import (
    _check,
    _kill_9_at,
    _read_all,
    _status,
    _write_toml,
)
from tests.zone_fleet import NodeProcess

__all__ = ["seaweedfs"]  # the fixture, imported so pytest finds it

UPLOADS = "upload_interval_s = 0.3\n"


def _stored(url: str) -> tuple[Manifest, set[str]]:
    store = open_object_store(url)
    found = store.get(manifest_key(1))
    assert found is not None
    return Manifest.from_bytes(found[0]), {info.key for info in store.list(DATA_PREFIX)}


def _set_compaction(path: Path, interval_s: float) -> None:
    lines = [x for x in path.read_text().splitlines(True) if not x.startswith("compaction_")]
    at = lines.index(UPLOADS) + 1
    lines[at:at] = [
        f"compaction_interval_s = {interval_s}\n",
        "compaction_small_object_bytes = 4194304\n",
        "compaction_max_object_bytes = 16777216\n",
        "compaction_delete_delay_s = 2.0\n",
    ]
    path.write_text("".join(lines))


@pytest.mark.parametrize("step", ["after_compaction_upload", "after_compaction_swap"])
def test_kill_9_during_compaction_loses_nothing_and_leaks_nothing(
    step: str, seaweedfs: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = seaweedfs.bucket_url()
    path, admin, bootstrap = _write_toml(tmp_path / "fleet", url)
    _set_compaction(path, 2.0)
    node, acks = _kill_9_at(step, path, admin, bootstrap, monkeypatch)
    assert f"test pause at {step}" in node.log_path.read_text()
    manifest, listed = _stored(url)
    stray = listed - manifest.referenced_keys()
    if step == "after_compaction_upload":
        assert stray and not manifest.retired, "the new objects are in the bucket, unlisted"
    else:
        assert manifest.retired and not stray, "the swap listed the new objects, retired the old"
        assert set(manifest.retired) <= listed

    _set_compaction(path, 3600.0)  # nothing in flight after the restart but uploads
    node = NodeProcess("main-broker", path, 1, admin).start()
    try:
        records = _read_all(bootstrap)
        _check(records, acks)
        # Retired objects go once their delay has passed, then leave the manifest.
        deadline = time.monotonic() + 30
        while _status(admin)["objects"]["compaction"]["retired_objects"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        manifest, listed = _stored(url)
        assert not manifest.retired
        # Only uploads run now, and once none is pending a sweep with no grace period is safe.
        while _status(admin)["objects"]["pending_bytes"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        swept = trio.run(sweep_orphans, AsyncObjectStore(open_object_store(url)), 0)
        assert set(swept) == stray
        after, listed_after = _stored(url)
        assert listed_after == after.keys() and manifest.keys() <= after.keys()
        assert _read_all(bootstrap) == records
    finally:
        node.stop()
