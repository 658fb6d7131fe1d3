"""Ledger uploads (s3_commit/ledger_uploads.py) and their staging for the report
(cost_report/staging.py): against SeaweedFS for what goes up and comes back, moto behind a
fault proxy for puts that fail; the [accounting] setting, and the wiring in both kinds of
node (docs/formats.md, "Ledger uploads")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from cost_report.ledger_files import plan_files
from cost_report.staging import stage_accounting
from fleet.config import ConfigError, parse_fleet_config
from main_broker.accounting import MainTraffic
from main_broker.config import BrokerConfig
from proxy_broker.accounting import ProxyTraffic
from proxy_broker.config import MainEndpoint, ProxyConfig
from s3_commit import FileObjectStore, ObjectStore, open_object_store
from s3_commit.ledger_uploads import LedgerUploader, LedgerUploads
from telemetry import MetricsRegistry, accounting_file, read_traffic_rows
from telemetry.ledger_upload import UploadCursor, ledger_key, parse_ledger_key
from tests.ledger_helpers import NODE, ledger_objects, local, reassemble, write
from tests.s3_servers import (
    Fault,
    FaultProxy,
    MotoServer,
    SeaweedServer,
    fault_proxy,
    moto,
    seaweedfs,
)

__all__ = ["fault_proxy", "moto", "seaweedfs"]  # fixtures, imported so pytest finds them

DAY1, DAY2 = "2021-11-21", "2021-11-22"  # long past: a test run makes rows of today
SECRET = "ledger-upload-test-secret-0123456789"
DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def seaweed_base(seaweedfs: SeaweedServer) -> str:
    return seaweedfs.bucket_url("base")  # one bucket: SeaweedFS buckets are not free


_prefixes = iter(range(1_000_000))


@pytest.fixture
def seaweed_url(seaweed_base: str) -> str:
    """A fresh prefix in the module's bucket, as an object store URL of the fleet TOML."""
    return seaweed_base.replace("/base?", f"/t{next(_prefixes)}?", 1)


# -- what goes up --------------------------------------------------------------------------


def test_uploads_complete_lines_of_every_day_once(seaweed_url: str, tmp_path: Path) -> None:
    store = open_object_store(seaweed_url)
    write(tmp_path, DAY1, 3)
    write(tmp_path, DAY2, 2)
    write(tmp_path, DAY2, 2, node="proxy-102")  # another node on the same data_dir
    uploader = LedgerUploader(store, tmp_path, NODE)

    first = uploader.upload_pending()
    size1, size2 = len(local(tmp_path, DAY1)), len(local(tmp_path, DAY2))
    assert (first.objects, first.bytes) == (2, size1 + size2)
    assert sorted(ledger_objects(store)) == [ledger_key(DAY1, NODE, 0), ledger_key(DAY2, NODE, 0)]
    assert uploader.upload_pending().objects == 0  # nothing new

    # A torn line (a crash in mid-write) waits for its newline.
    with open(accounting_file(tmp_path, NODE, DAY2), "ab") as f:
        f.write(b'{"minute":"2021-11-22T10:0')
    assert uploader.upload_pending().objects == 0
    write(tmp_path, DAY2, 2, first_minute=10)  # closes the torn line first
    third = uploader.upload_pending()
    assert third.objects == 1
    objects = ledger_objects(store)
    assert ledger_key(DAY2, NODE, size2) in objects
    for day in (DAY1, DAY2):
        assert reassemble(objects, day) == local(tmp_path, day)
    assert not any(parse_ledger_key(k)[1] == "proxy-102" for k in objects)  # type: ignore[index]
    cursor = (tmp_path / "accounting" / "_upload" / f"{NODE}.json").read_bytes()
    assert (
        cursor
        == UploadCursor(
            NODE,
            {
                f"dt={DAY1}/{NODE}.jsonl": size1,
                f"dt={DAY2}/{NODE}.jsonl": len(local(tmp_path, DAY2)),
            },
        ).encode()
    )


class Crash(BaseException):
    """The process dies: nothing after it runs."""


class CrashAfterPut:
    """A store whose put lands, and then the node dies before it hears back."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.traffic_hook = None

    def put(self, key: str, data: Any, **conditions: Any) -> str:
        self.store.put(key, data, **conditions)
        raise Crash

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_crash_between_put_and_cursor_reputs_the_same_key(seaweed_url: str, tmp_path: Path) -> None:
    store = open_object_store(seaweed_url)
    write(tmp_path, DAY1, 2)
    with pytest.raises(Crash):
        LedgerUploader(CrashAfterPut(store), tmp_path, NODE).upload_pending()  # type: ignore[arg-type]
    cursor_path = tmp_path / "accounting" / "_upload" / f"{NODE}.json"
    assert not cursor_path.exists()
    key = ledger_key(DAY1, NODE, 0)
    assert ledger_objects(store) == {key: local(tmp_path, DAY1)}

    # Restarted, the node appended more before its first pass: the same key, a superset.
    write(tmp_path, DAY1, 2, first_minute=5)
    result = LedgerUploader(store, tmp_path, NODE).upload_pending()
    assert result.objects == 1
    assert ledger_objects(store) == {key: local(tmp_path, DAY1)}
    assert UploadCursor.decode(cursor_path.read_bytes(), NODE).uploaded == {
        f"dt={DAY1}/{NODE}.jsonl": len(local(tmp_path, DAY1))
    }

    # Crash again after the put, and restart with nothing appended: the key already holds
    # the bytes, so the cursor just moves past them.
    write(tmp_path, DAY1, 1, first_minute=9)
    with pytest.raises(Crash):
        LedgerUploader(CrashAfterPut(store), tmp_path, NODE).upload_pending()  # type: ignore[arg-type]
    LedgerUploader(store, tmp_path, NODE).upload_pending()
    objects = ledger_objects(store)
    assert len(objects) == 2 and reassemble(objects, DAY1) == local(tmp_path, DAY1)
    assert UploadCursor.decode(cursor_path.read_bytes(), NODE).uploaded == {
        f"dt={DAY1}/{NODE}.jsonl": len(local(tmp_path, DAY1))
    }


def test_a_key_holding_other_bytes_is_never_overwritten(
    seaweed_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A wiped data directory (or two nodes of one name) starts the day's file again at 0:
    the object of the earlier file stays as it is."""
    store = open_object_store(seaweed_url)
    theirs = b'{"minute":"2021-11-21T09:00:00Z","node":"main-1"}\n'
    store.put(ledger_key(DAY1, NODE, 0), theirs)
    write(tmp_path, DAY1, 2)
    write(tmp_path, DAY2, 2)
    with caplog.at_level(logging.ERROR, logger="zonefleet.accounting"):
        result = LedgerUploader(store, tmp_path, NODE).upload_pending()
    assert result.objects == 1  # the other day still goes up
    objects = ledger_objects(store)
    assert objects[ledger_key(DAY1, NODE, 0)] == theirs
    assert reassemble(objects, DAY2) == local(tmp_path, DAY2)
    assert ledger_key(DAY1, NODE, 0) in caplog.text and "not uploaded" in caplog.text


def test_lost_cursor_costs_a_reupload_never_a_double_count(
    seaweed_url: str, tmp_path: Path
) -> None:
    store = open_object_store(seaweed_url)
    uploader = LedgerUploader(store, tmp_path, NODE)
    for minute in (0, 10, 20):
        write(tmp_path, DAY1, 2, first_minute=minute)
        uploader.upload_pending()
    assert len(ledger_objects(store)) == 3
    (tmp_path / "accounting" / "_upload" / f"{NODE}.json").write_bytes(b"{not json")
    write(tmp_path, DAY1, 2, first_minute=30)
    LedgerUploader(store, tmp_path, NODE).upload_pending()
    objects = ledger_objects(store)
    # The key at 0 now holds the whole file; the others lie inside it: the report keeps one.
    assert objects[ledger_key(DAY1, NODE, 0)] == local(tmp_path, DAY1)
    plan = plan_files((key, len(data)) for key, data in objects.items())
    assert [f.path for f in plan.kept] == [ledger_key(DAY1, NODE, 0)]
    assert len(plan.duplicates) == 2 and not plan.rejected


def test_a_catch_up_goes_up_in_bounded_objects(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "objects")
    write(tmp_path, DAY1, 12)
    line = len(local(tmp_path, DAY1)) // 12
    result = LedgerUploader(store, tmp_path, NODE, max_object_bytes=3 * line + 5).upload_pending()
    objects = ledger_objects(store)
    assert result.objects == len(objects) == 4
    assert all(len(data) <= 3 * line + 5 for data in objects.values())
    assert reassemble(objects, DAY1) == local(tmp_path, DAY1)


# -- failures ------------------------------------------------------------------------------


async def _run_until(uploads: LedgerUploads, done: Any) -> None:
    """Run the schedule until `done()`, polling with a deadline."""
    async with trio.open_nursery() as nursery:
        await nursery.start(uploads.run)
        with trio.fail_after(DEADLINE_S):
            while not done():
                await uploads.pass_done.wait()
        nursery.cancel_scope.cancel()


async def test_a_failed_put_is_retried_on_the_next_tick(
    moto: MotoServer, fault_proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = moto.bucket_url("ledgers", endpoint=fault_proxy.endpoint, max_attempts=1)
    write(tmp_path, DAY1, 3)
    flushes, requests = [], []

    async def flush() -> None:
        flushes.append(trio.current_time())

    uploads = await LedgerUploads.open(
        url,
        tmp_path,
        NODE,
        flush,
        interval_s=0.05,
        traffic_hook=lambda op, n: requests.append((op, n)),
    )
    fault_proxy.inject(Fault(status=500, code="InternalError", method="PUT"))
    with caplog.at_level(logging.WARNING, logger="zonefleet.accounting"):
        await _run_until(uploads, lambda: uploads.last_success is not None)
    assert fault_proxy.injected == 1 and uploads.failures == 1 and uploads.passes >= 2
    assert "ledger upload of main-1 failed" in caplog.text
    assert flushes, "each tick flushes the closed minutes first"
    objects = ledger_objects(uploads.uploader.store)
    assert reassemble(objects, DAY1) == local(tmp_path, DAY1)
    assert ("PutObject", len(local(tmp_path, DAY1))) in requests  # booked like any S3 call


async def test_a_put_that_landed_unanswered_goes_up_once(
    moto: MotoServer, fault_proxy: FaultProxy, tmp_path: Path
) -> None:
    """The put reached the store but its answer was lost: the next pass finds the key with
    the file's bytes and moves the cursor without putting them again."""
    url = moto.bucket_url("ledgers", endpoint=fault_proxy.endpoint, max_attempts=1)
    write(tmp_path, DAY1, 3)

    async def flush() -> None:
        pass

    uploads = await LedgerUploads.open(url, tmp_path, NODE, flush, interval_s=0.05)
    fault_proxy.inject(Fault(drop=True, method="PUT"))
    await _run_until(uploads, lambda: uploads.last_success is not None)
    assert fault_proxy.injected == 1 and uploads.failures == 1
    objects = ledger_objects(uploads.uploader.store)
    assert objects == {ledger_key(DAY1, NODE, 0): local(tmp_path, DAY1)}
    cursor = UploadCursor.decode(
        (tmp_path / "accounting" / "_upload" / f"{NODE}.json").read_bytes(), NODE
    )
    assert cursor.uploaded == {f"dt={DAY1}/{NODE}.jsonl": len(local(tmp_path, DAY1))}


class StuckStore:
    """A store whose puts hang until released."""

    traffic_hook = None

    def __init__(self) -> None:
        self.release = threading.Event()

    def put(self, key: str, data: Any, **conditions: Any) -> str:
        self.release.wait(30)
        raise OSError("released")


async def test_the_last_upload_at_shutdown_is_bounded(tmp_path: Path) -> None:
    store = StuckStore()
    write(tmp_path, DAY1, 1)

    async def flush() -> None:
        pass

    uploads = LedgerUploads(LedgerUploader(store, tmp_path, NODE), flush)  # type: ignore[arg-type]
    started = time.monotonic()
    try:
        await uploads.final_upload(timeout_s=0.3)
    finally:
        store.release.set()
    assert time.monotonic() - started < 5


# -- configuration and wiring ----------------------------------------------------------------


def _fleet_doc(accounting: dict[str, Any] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "fleet": {"data_dir": "data"},
        "zones": [{"name": "az1"}, {"name": "az2"}],
        "internal": {"secret": SECRET},
        "storage": {"object_store": "file://objects"},
        "main_brokers": [{"node_id": 1, "zone": "az1", "port": 19092, "rpc_port": 19094}],
        "proxies": [{"node_id": 102, "zone": "az2", "port": 19112}],
    }
    if accounting is not None:
        doc["accounting"] = accounting
    return doc


def test_upload_interval_setting(tmp_path: Path) -> None:
    default = parse_fleet_config(_fleet_doc(None), tmp_path, discover=None)
    assert default.mains[0].broker.ledger_upload_interval_s == 600.0
    assert default.proxies[0].proxy.ledger_upload_interval_s == 600.0
    config = parse_fleet_config(_fleet_doc({"upload_interval_s": 30}), tmp_path, discover=None)
    assert config.mains[0].broker.ledger_upload_interval_s == 30.0
    assert config.proxies[0].proxy.ledger_upload_interval_s == 30.0
    assert config.proxies[0].proxy.object_store_url == f"file://{tmp_path / 'objects'}"
    for bad in (3601, 0, -5, "soon"):
        with pytest.raises(ConfigError, match=r"\[accounting\] upload_interval_s"):
            parse_fleet_config(_fleet_doc({"upload_interval_s": bad}), tmp_path, discover=None)


def _store_ops(totals: dict[Any, tuple[int, int]]) -> set[tuple[str, str]]:
    return {(key.channel, key.api) for key in totals if key.channel.startswith("s3-")}


@pytest.fixture
def objects_url(tmp_path: Path) -> Iterator[str]:
    yield f"file://{tmp_path / 'objects'}"


@pytest.mark.parametrize("role", ["main", "proxy"])
async def test_nodes_upload_their_ledger_at_start_tick_and_stop(
    role: str, tmp_path: Path, objects_url: str
) -> None:
    """Both kinds of node: what a previous run left is uploaded at start, each tick uploads
    the closed lines, and a clean stop flushes the open minute and uploads it."""
    data_dir = tmp_path / "data"
    traffic: MainTraffic | ProxyTraffic
    if role == "main":
        node = "main-1"
        cfg = BrokerConfig(1, "az1", "mem://", data_dir=data_dir, object_store_url=objects_url)
        cfg.ledger_upload_interval_s = 0.05
        traffic = MainTraffic(cfg, MetricsRegistry())
    else:
        node = "proxy-102"
        main = MainEndpoint(1, "az1", "127.0.0.1", 9092, 9094)
        pcfg = ProxyConfig(102, "az2", "mem://", SECRET.encode(), [main], data_dir=data_dir)
        pcfg.object_store_url = objects_url
        pcfg.ledger_upload_interval_s = 0.05
        traffic = ProxyTraffic(pcfg, MetricsRegistry())
    write(data_dir, DAY1, 2, node=node)  # left by an earlier run
    store = FileObjectStore(tmp_path / "objects")
    async with trio.open_nursery() as nursery:
        await nursery.start(traffic.run)
        uploads = traffic.ledger.uploads
        assert uploads is not None and uploads.interval_s == 0.05
        with trio.fail_after(DEADLINE_S):
            while reassemble(ledger_objects(store), DAY1, node) != local(data_dir, DAY1, node):
                await uploads.pass_done.wait()
        traffic.node.record("az2", "az2", "kafka-client", "Produce", 4096)
        nursery.cancel_scope.cancel()
    await traffic.aclose()
    objects = ledger_objects(store)
    days = sorted({parse_ledger_key(k)[0] for k in objects})  # type: ignore[index]
    assert len(days) == 2  # the earlier run's day and today's
    for day in days:
        assert reassemble(objects, day, node) == local(data_dir, day, node)
    today = read_traffic_rows(accounting_file(data_dir, node, days[-1]))
    assert [r["bytes"] for r in today if r["api"] == "Produce"] == [4096]
    assert ("s3-put", "PutObject") in _store_ops(traffic.node.accounting.totals())


# -- staging for the report --------------------------------------------------------------------


def _upload_two_nodes(store: ObjectStore, data_dir: Path) -> None:
    for node in ("main-1", "proxy-102"):
        uploader = LedgerUploader(store, data_dir, node)
        write(data_dir, DAY1, 2, node=node)
        uploader.upload_pending()
        write(data_dir, DAY1, 3, node=node, first_minute=5)
        write(data_dir, DAY2, 1, node=node)
        uploader.upload_pending()


def _check_staged(staged: list[Path], dest: Path, store: ObjectStore, data_dir: Path) -> None:
    objects = {k: v for k, v in ledger_objects(store).items() if parse_ledger_key(k)}
    assert staged == sorted(dest / key.removeprefix("accounting/") for key in objects)
    for key, data in objects.items():
        assert (dest / key.removeprefix("accounting/")).read_bytes() == data
    # What the report reads from the staged copy is each node's day exactly once.
    plan = plan_files((str(p), p.stat().st_size) for p in staged)
    assert not plan.duplicates and not plan.rejected and not plan.ignored
    for node in ("main-1", "proxy-102"):
        for day in (DAY1, DAY2):
            kept = sorted(
                (f.start, Path(f.path)) for f in plan.kept if (f.dt, f.node) == (day, node)
            )
            assert b"".join(p.read_bytes() for _, p in kept) == local(data_dir, day, node)


def test_staging_from_seaweedfs(seaweed_url: str, tmp_path: Path) -> None:
    store = open_object_store(seaweed_url)
    _upload_two_nodes(store, tmp_path / "data")
    # Not ledger objects: skipped.
    store.put("accounting/_upload/main-1.json", b"{}")
    store.put("accounting/README", b"hello")
    store.put("data/sso/00000000000000000000000000000001", b"x")
    dest = tmp_path / "staged"
    staged = stage_accounting(seaweed_url, dest)
    assert len(staged) == 6  # per node: two objects of DAY1, one of DAY2
    _check_staged(staged, dest, store, tmp_path / "data")
    assert not (dest / "_upload").exists() and not (dest / "README").exists()

    # Again into the same directory: unchanged copies stay, a grown object is fetched again.
    before = {p: p.stat().st_ino for p in staged}
    write(tmp_path / "data", DAY2, 2, first_minute=30)
    LedgerUploader(store, tmp_path / "data", "main-1").upload_pending()
    again = stage_accounting(seaweed_url, dest)
    assert len(again) == 7
    assert all(p.stat().st_ino == before[p] for p in staged)
    _check_staged(again, dest, store, tmp_path / "data")
    only_day2 = stage_accounting(seaweed_url, tmp_path / "day2", date_from=DAY2, date_to=DAY2)
    assert [p.parent.name for p in only_day2] == [f"dt={DAY2}"] * 3


def test_staging_from_a_file_store(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "objects")
    _upload_two_nodes(store, tmp_path / "data")
    dest = tmp_path / "staged"
    staged = stage_accounting(f"file://{tmp_path / 'objects'}", dest)
    _check_staged(staged, dest, store, tmp_path / "data")
    assert stage_accounting(f"file://{tmp_path / 'empty'}", tmp_path / "none") == []
