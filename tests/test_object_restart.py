"""Restart from the object store alone (issue 4, "What the tests must show" 2), with
`zonefleet up --zones 3` as a user runs it: once every record is in committed objects, stop the
fleet, wipe every WAL and node data directory (keeping the object store and the cluster
metadata), start it again, and every record is readable through each zone's proxy and straight
from the mains that lead the partitions, exactly once and in order."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fleet.config import FleetConfig, load_fleet_config, local_fleet_toml
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.zone_fleet import (
    Record,
    ZoneFleet,
    check_exactly_once_in_order,
    confluent_record,
    consume_confluent,
    create_topic,
    produce_confluent,
    start_up_fleet,
    true_leader_zones,
    write_zones_toml,
    zone_client_id,
)

PARTITIONS = 6
COUNT = 3000
KEEP = {"fleet.toml", "objects", "metadata"}


def _small_thresholds(path: Path) -> None:
    text = path.read_text()
    default = "upload_threshold_bytes = 524288000\nupload_interval_s = 60.0\n"
    assert default in text, "the generated fleet TOML has no default [storage] thresholds"
    path.write_text(
        text.replace(default, "upload_threshold_bytes = 65536\nupload_interval_s = 0.3\n")
    )


def _wipe_all_but_objects_and_metadata(data_dir: Path) -> None:
    wiped = sorted(p.name for p in data_dir.iterdir() if p.name not in KEEP)
    assert "wal" in wiped
    for name in wiped:
        target = data_dir / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()


def _objects(config: FleetConfig) -> list[dict[str, Any]]:
    out = []
    for m in config.mains:
        doc = httpx.get(f"http://{m.admin_host}:{m.admin_port}/status", timeout=5).json()
        out.append(doc["objects"])
    return out


def _wait_all_committed(config: FleetConfig, total: int) -> None:
    """Until the mains' manifests hold every record (offsets start at 0 per partition)."""
    deadline = time.monotonic() + 60
    while True:
        objects = _objects(config)
        uploaded = sum(sum(o["uploaded_end"].values()) for o in objects)
        if uploaded == total and all(o["pending_bytes"] == 0 for o in objects):
            return
        assert time.monotonic() < deadline, objects
        time.sleep(0.2)


def _consume_direct(fleet: ZoneFleet, topic: str) -> list[Record]:
    """Each main's partitions read from that main by a client of its zone (which the main's
    zone view names as their leader)."""
    leaders = true_leader_zones(fleet, topic)
    assert sorted(leaders) == list(range(PARTITIONS))
    out: list[Record] = []
    for m in fleet.config.mains:
        mine = [p for p, zone in leaders.items() if zone == m.broker.zone]
        if not mine:
            continue
        host, port = m.broker.advertised
        consumer = Consumer(
            {
                "bootstrap.servers": f"{host}:{port}",
                "client.id": zone_client_id(m.broker.zone),
                "group.id": f"direct-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in mine
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in mine])
        seen = dict.fromkeys(mine, -1)
        deadline = time.monotonic() + 30
        try:
            while any(seen[p] < ends[p] - 1 for p in mine):
                assert time.monotonic() < deadline, (m.broker.node_id, seen, ends)
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                record = confluent_record(msg)
                if record is not None:
                    out.append(record)
                    seen[record[0]] = record[1]
        finally:
            consumer.close()
    return out


@pytest.mark.slow
def test_restart_with_only_the_object_store_and_metadata(tmp_path: Path) -> None:
    data_dir = tmp_path / "fleet"
    path, _ = write_zones_toml(data_dir)
    _small_thresholds(path)
    topic = f"restore-{uuid.uuid4().hex[:8]}"
    proc, fleet = start_up_fleet(data_dir, config=path)
    try:
        create_topic(fleet, "az2", topic, PARTITIONS)
        produce_confluent(fleet.bootstrap("az2"), "az2", topic, COUNT, "obj")
        _wait_all_committed(fleet.config, COUNT)
    finally:
        assert proc.stop() == 0, "".join(proc.output[-40:])

    _wipe_all_but_objects_and_metadata(data_dir)

    proc, fleet = start_up_fleet(data_dir, config=path)
    try:
        direct = _consume_direct(fleet, topic)
        check_exactly_once_in_order(direct, COUNT, "obj")
        assert {r[0] for r in direct} == set(range(PARTITIONS))
        for zone in fleet.zones:
            got = consume_confluent(fleet.bootstrap(zone), zone, topic, PARTITIONS, COUNT)
            check_exactly_once_in_order(got, COUNT, "obj")
        # New records continue after the restored ones.
        produce_confluent(fleet.bootstrap("az3"), "az3", topic, 300, "new")
        got = consume_confluent(fleet.bootstrap("az1"), "az1", topic, PARTITIONS, COUNT + 300)
        check_exactly_once_in_order([r for r in got if r[2].startswith(b"new-")], 300, "new")
        assert len(got) == COUNT + 300
    finally:
        proc.stop()


def test_single_node_up_restarts_from_objects_and_metadata(tmp_path: Path) -> None:
    """`zonefleet up` with one main keeps its topics in the cluster metadata document too, so a
    restart with the WAL wiped brings back the topic and every committed record."""
    data_dir = tmp_path / "one"
    data_dir.mkdir()
    base = free_port_block(4)
    path = data_dir / "fleet.toml"
    path.write_text(local_fleet_toml(data_dir, base))
    _small_thresholds(path)
    config = load_fleet_config(path, discover=None)
    topic = f"single-{uuid.uuid4().hex[:8]}"
    count = 500

    def start() -> FleetProcess:
        return FleetProcess(data_dir, base, ["--config", str(path)]).start()

    proc = start()
    try:
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
        produce_confluent(proc.bootstrap, "us-east-1a", topic, count, "one")
        _wait_all_committed(config, count)
    finally:
        assert proc.stop() == 0, "".join(proc.output[-40:])
    _wipe_all_but_objects_and_metadata(data_dir)

    proc = start()
    try:
        got = consume_confluent(proc.bootstrap, "us-east-1a", topic, 2, count)
        check_exactly_once_in_order(got, count, "one")
    finally:
        proc.stop()
