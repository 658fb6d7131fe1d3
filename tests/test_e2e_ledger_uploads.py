"""Ledger uploads end to end: `zonefleet up --config` runs a main broker with a `file://`
object store and carries Kafka traffic. After a clean stop the store holds exactly each
ledger file; after a kill -9 the next start uploads every minute the file had closed
(docs/formats.md, "Ledger uploads")."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from s3_commit import FileObjectStore
from telemetry import iter_accounting_files, read_traffic_rows
from tests.fleet_process import FleetProcess
from tests.ledger_helpers import NODE, ledger_objects, reassemble
from tests.ports import free_port_block

TOPIC = "ledger-e2e"
# A minute must close and the 15 s flusher run before a ledger line exists.
FIRST_LINE_DEADLINE_S = 100.0
UPLOAD_DEADLINE_S = 30.0


def start(data_dir: Path, upload_interval_s: float) -> FleetProcess:
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port_block(2)
    config = data_dir / "fleet.toml"
    config.write_text(
        f"""\
[fleet]
cluster_id = "ledger-e2e"
data_dir = "{data_dir}"

[[zones]]
name = "az1"
az_id = "use1-az1"

[wal]
url = "osfs://{data_dir / "wal"}"

[storage]
object_store = "file://{data_dir / "objects"}"

[accounting]
upload_interval_s = {upload_interval_s}

[[main_brokers]]
node_id = 1
zone = "az1"
host = "127.0.0.1"
port = {port}
admin_port = {port + 1}
"""
    )
    return FleetProcess(data_dir, port, ["--config", str(config)]).start()


def produce(bootstrap: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": "ledger zone=az1"})
    for i in range(count):
        producer.produce(TOPIC, b"v" * 1000 + str(i).encode())
    assert producer.flush(30) == 0


def own_ledgers(data_dir: Path) -> dict[str, bytes]:
    """day -> the main's ledger file of that day."""
    return {
        path.parent.name.removeprefix("dt="): path.read_bytes()
        for path in iter_accounting_files(data_dir)
        if path.name == f"{NODE}.jsonl"
    }


def assert_store_holds_exactly(data_dir: Path) -> None:
    ledgers = own_ledgers(data_dir)
    assert ledgers, "the main wrote no ledger"
    objects = ledger_objects(FileObjectStore(data_dir / "objects"))
    for day, data in ledgers.items():
        assert reassemble(objects, day) == data, f"{day}: the store does not hold the file"


def test_clean_stop_leaves_exactly_the_ledger_in_the_store(tmp_path: Path) -> None:
    data_dir = tmp_path / "fleet"
    proc = start(data_dir, upload_interval_s=1)
    try:
        produce(proc.bootstrap, 50)
    finally:
        assert proc.stop() == 0
    assert_store_holds_exactly(data_dir)
    rows = [
        r
        for day in own_ledgers(data_dir)
        for r in read_traffic_rows(data_dir / "accounting" / f"dt={day}" / f"{NODE}.jsonl")
    ]
    produced = sum(
        r["bytes"] for r in rows if r["channel"] == "kafka-client" and r["api"] == "Produce"
    )
    assert produced > 50 * 1000


@pytest.mark.slow
def test_kill_9_then_restart_loses_no_closed_minute(tmp_path: Path) -> None:
    data_dir = tmp_path / "fleet"
    # An interval longer than the test: only the pass at start uploads anything.
    proc = start(data_dir, upload_interval_s=3600)
    try:
        deadline = time.monotonic() + FIRST_LINE_DEADLINE_S
        while not own_ledgers(data_dir):
            assert time.monotonic() < deadline, "no ledger line was flushed"
            produce(proc.bootstrap, 5)
            time.sleep(0.5)
        at_kill = own_ledgers(data_dir)
    finally:
        proc.kill()
    store = FileObjectStore(data_dir / "objects")
    assert ledger_objects(store) == {}, "the ledger went up before the kill: nothing to prove"

    proc = start(data_dir, upload_interval_s=3600)
    try:
        deadline = time.monotonic() + UPLOAD_DEADLINE_S
        for day, data in at_kill.items():
            closed = data[: data.rfind(b"\n") + 1]  # every line the crash left whole
            while reassemble(ledger_objects(store), day)[: len(closed)] != closed:
                assert time.monotonic() < deadline, f"{day}: closed minutes not uploaded"
                time.sleep(0.2)
        produce(proc.bootstrap, 5)
    finally:
        assert proc.stop() == 0
    assert_store_holds_exactly(data_dir)
