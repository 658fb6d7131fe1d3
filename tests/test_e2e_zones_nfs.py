"""The zone fleet with its shared WAL on real NFS (nfs-ganesha, `[wal] url = "nfs://..."`):
a producer in az2, consumers in every zone, each through its own zone's proxy (issue 3, item 5).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared_wal.storage import WAL_ROOT
from tests.nfs_server import GaneshaServer, GaneshaUnavailable
from tests.zone_fleet import (
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    consume_kafka_python,
    create_topic,
    produce_confluent,
    start_up_fleet,
    write_zones_toml,
)

PARTITIONS = 4
N = 2000


@pytest.fixture
def ganesha() -> Iterator[GaneshaServer]:
    try:
        server = GaneshaServer().start()
    except GaneshaUnavailable as exc:
        pytest.skip(f"NFS-Ganesha cannot start here: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nfs_fleet(tmp_path: Path, ganesha: GaneshaServer) -> Iterator[tuple[ZoneFleet, Path]]:
    wal_dir = f"fleet-{uuid.uuid4().hex[:8]}"
    path, _ = write_zones_toml(tmp_path / "fleet", wal_url=f"{ganesha.url}/{wal_dir}")
    proc, fleet = start_up_fleet(tmp_path / "fleet", config=path)
    try:
        yield fleet, ganesha.local_subdir / wal_dir
    finally:
        proc.stop()


def test_round_trip_over_nfs(nfs_fleet: tuple[ZoneFleet, Path]) -> None:
    fleet, wal_on_server = nfs_fleet
    assert all(m.broker.wal_url.startswith("nfs://") for m in fleet.config.mains)
    assert all(p.proxy.wal_url.startswith("nfs://") for p in fleet.config.proxies)
    topic = f"nfs-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az2", topic, PARTITIONS)
    produce_confluent(fleet.bootstrap("az2"), "az2", topic, N, "nfs")
    for zone in fleet.zones:
        check_exactly_once_in_order(
            consume_confluent(fleet.bootstrap(zone), zone, topic, PARTITIONS, N), N, "nfs"
        )
    check_exactly_once_in_order(
        consume_kafka_python(fleet.bootstrap("az3"), "az3", topic, PARTITIONS), N, "nfs"
    )
    # The payload really went through the NFS server: the az2 proxy's PREPARED segments and
    # every main's WAL are files in the export.
    writers = {p.name for p in (wal_on_server / WAL_ROOT).iterdir()}
    az2_proxy = next(p.proxy for p in fleet.config.proxies if p.proxy.zone == "az2")
    assert az2_proxy.writer_id in writers, writers
    segments = (wal_on_server / WAL_ROOT / az2_proxy.writer_id).glob("*.wal")
    prepared = sum(f.stat().st_size for f in segments)
    assert prepared > N * len(b"nfs-0000"), prepared
    assert {f"main-{m.broker.node_id}" for m in fleet.config.mains} <= writers
