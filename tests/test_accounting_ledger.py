"""Traffic accounting pieces: the JSONL ledger (golden bytes, daily files, torn lines), the
shared-WAL I/O hook, the RPC meter and the Kafka meter of a main (client-zone resolution)."""

from __future__ import annotations

import threading
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio
from confluent_kafka.admin import AdminClient

from fleet.config import parse_fleet_config
from internal_rpc import OnBytes, RpcClient, RpcPeer, RpcServer
from internal_rpc.accounting import RpcTrafficMeter
from kafka_wire.codec import RequestHeader
from kafka_wire.server_loop import ConnectionInfo
from kafka_wire.topic_bytes import split_frame
from main_broker.accounting import ClientZones
from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from shared_wal import RecordType, WalConfig, WalReader, WalWriter, open_wal_fs, set_io_hook
from telemetry import (
    DailyJsonlTrafficSink,
    MetricsRegistry,
    NodeTraffic,
    TrafficAccounting,
    TrafficKey,
    accounting_file,
    encode_rows,
    read_traffic_rows,
)
from zone_router import ZoneMap, ZoneResolver

T0 = 1_795_343_400.0  # 2026-11-22T10:30:00Z
ZONES: dict[str, str | None] = {"az1": "use1-az1", "az2": "use1-az2", "az3": "use1-az3"}
SECRET = b"ledger-test-secret-0123456789"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# --- the JSONL ledger ------------------------------------------------------------------------


def test_golden_jsonl_line(tmp_path: Path) -> None:
    """The rows docs/formats.md shows: confirms (no topic), and a Produce request of 10,000
    bytes split between its topic entries of 7,000 and 2,950 bytes."""
    clock = Clock(T0 + 12.5)
    sink = DailyJsonlTrafficSink(tmp_path, "proxy-102")
    ta = TrafficAccounting(MetricsRegistry(), "proxy-102", sink, clock=clock)
    ta.record("az2", "az1", "confirm-rpc", "confirm", 1234, 13)
    ta.record("az2", "az1", "confirm-rpc", "confirm", 66, 1)
    split = split_frame(10_000, [("orders", 7_000), ("clicks", 2_950)])
    ta.record_topics("az2", "az2", "kafka-client", "Produce", split, 1)
    assert ta.flush(now_s=T0 + 60) != []
    path = tmp_path / "accounting" / "dt=2026-11-22" / "proxy-102.jsonl"
    assert path == accounting_file(tmp_path, "proxy-102", "2026-11-22")
    assert path.read_bytes() == (
        b'{"minute":"2026-11-22T10:30:00Z","node":"proxy-102","from_zone":"az2",'
        b'"to_zone":"az1","channel":"confirm-rpc","api":"confirm","topic":"","bytes":1300,'
        b'"requests":14,"cross_zone":true}\n'
        b'{"minute":"2026-11-22T10:30:00Z","node":"proxy-102","from_zone":"az2",'
        b'"to_zone":"az2","channel":"kafka-client","api":"Produce","topic":"clicks",'
        b'"bytes":2965,"requests":0,"cross_zone":false}\n'
        b'{"minute":"2026-11-22T10:30:00Z","node":"proxy-102","from_zone":"az2",'
        b'"to_zone":"az2","channel":"kafka-client","api":"Produce","topic":"orders",'
        b'"bytes":7035,"requests":1,"cross_zone":false}\n'
    )
    docs = (Path(__file__).parent.parent / "docs" / "formats.md").read_text()
    for line in path.read_text().splitlines():
        assert f"\n{line}\n" in docs, line


def test_rows_without_a_topic_read_as_the_empty_topic(tmp_path: Path) -> None:
    old = (
        b'{"minute":"2026-11-22T10:30:00Z","node":"main-1","from_zone":"az1","to_zone":"az1",'
        b'"channel":"kafka-client","api":"Fetch","bytes":10,"requests":1,"cross_zone":false}\n'
    )
    path = tmp_path / "main-1.jsonl"
    path.write_bytes(old)
    (row,) = read_traffic_rows(path)
    assert list(row)[5:8] == ["api", "topic", "bytes"]
    assert row["topic"] == ""


def test_pseudo_zones_never_cross() -> None:
    assert TrafficKey("az1", "az2", "relay", "JoinGroup").cross_zone
    assert not TrafficKey("az1", "az1", "kafka-client", "Produce").cross_zone
    assert not TrafficKey("az1", "regional", "wal-write", "write").cross_zone
    assert not TrafficKey("unknown", "az1", "kafka-client", "Produce").cross_zone


def test_rows_go_to_the_file_of_their_utc_day(tmp_path: Path) -> None:
    midnight = 1_795_392_000.0  # 2026-11-23T00:00:00Z
    clock = Clock(midnight - 30)
    ta = TrafficAccounting(
        MetricsRegistry(), "main-1", DailyJsonlTrafficSink(tmp_path, "main-1"), clock=clock
    )
    ta.record("az1", "az1", "kafka-client", "Fetch", 10)
    clock.t = midnight + 5
    ta.record("az1", "az1", "kafka-client", "Fetch", 20)
    ta.flush(include_open=True)
    before = read_traffic_rows(accounting_file(tmp_path, "main-1", "2026-11-22"))
    after = read_traffic_rows(accounting_file(tmp_path, "main-1", "2026-11-23"))
    assert [(r["minute"], r["bytes"]) for r in before] == [("2026-11-22T23:59:00Z", 10)]
    assert [(r["minute"], r["bytes"]) for r in after] == [("2026-11-23T00:00:00Z", 20)]


def test_torn_lines_are_skipped_and_never_swallow_later_rows(tmp_path: Path) -> None:
    sink = DailyJsonlTrafficSink(tmp_path, "main-1")
    row = {"minute": "2026-11-22T10:30:00Z", "node": "main-1", "bytes": 1}
    sink.write([row])
    path = sink.path_for("2026-11-22")
    with open(path, "ab") as f:
        f.write(encode_rows([{**row, "bytes": 2}])[:25])  # a crash in the middle of a write
    assert read_traffic_rows(path) == [row]
    sink.write([{**row, "bytes": 3}])  # the next append first ends the torn line
    assert [r["bytes"] for r in read_traffic_rows(path)] == [1, 3]
    assert path.read_bytes().count(b"\n") == 3


def test_a_failed_write_is_retried_with_the_next_flush(tmp_path: Path) -> None:
    clock = Clock(T0 + 1)
    blocker = tmp_path / "accounting"
    blocker.write_text("not a directory")  # makes the sink's mkdir fail
    sink = DailyJsonlTrafficSink(tmp_path, "n")
    ta = TrafficAccounting(MetricsRegistry(), "n", sink, clock=clock)
    ta.record("a", "b", "relay", "Metadata", 5)
    try:
        ta.flush(now_s=T0 + 61)
    except OSError:
        pass
    else:
        raise AssertionError("the write should have failed")
    blocker.unlink()
    ta.record("a", "b", "relay", "Metadata", 7)
    ta.flush(include_open=True)
    rows = read_traffic_rows(accounting_file(tmp_path, "n", "2026-11-22"))
    assert [r["bytes"] for r in rows] == [5, 7]


def test_record_from_many_threads_loses_nothing() -> None:
    ta = TrafficAccounting(MetricsRegistry(), "n")

    def work() -> None:
        for _ in range(20_000):
            ta.record("az1", "regional", "wal-write", "write", 3)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    work()
    for t in threads:
        t.join()
    assert ta.totals() == {TrafficKey("az1", "regional", "wal-write", "write"): (300_000, 100_000)}


# --- the shared-WAL hook -----------------------------------------------------------------------


async def test_wal_io_hook_counts_writes_reads_and_scans(tmp_path: Path) -> None:
    fs = open_wal_fs(f"osfs://{tmp_path / 'wal'}")
    traffic = NodeTraffic(MetricsRegistry(), "proxy-102", "az2", storage_zone="regional")
    set_io_hook(fs, traffic.wal_io)
    other_fs = open_wal_fs(f"osfs://{tmp_path / 'wal'}")  # another node's FS: not counted
    wal = await WalWriter.open(fs, "proxy-102", WalConfig(retention_ms=None))
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        pos = await wal.append(RecordType.DATA, {"k": 1}, b"x" * 1000)
        await wal.aclose()
    WalReader(fs, "proxy-102").read_record(pos)
    assert len(list(WalReader(fs, "proxy-102").iter_records())) == 1
    assert len(list(WalReader(other_fs, "proxy-102").iter_records())) == 1
    totals = traffic.accounting.totals()
    assert totals == {
        TrafficKey("az2", "regional", "wal-write", "write"): (pos.length, 1),
        TrafficKey("regional", "az2", "wal-read", "read"): (pos.length, 1),
        TrafficKey("regional", "az2", "wal-read", "scan"): (pos.length, 1),
    }


# --- RPC meter -----------------------------------------------------------------------------


def test_rpc_meter_channels_and_confirm_partitions() -> None:
    ta = TrafficAccounting(MetricsRegistry(), "main-1")
    meter = RpcTrafficMeter(ta.record, "az1", {102: "az2"})
    parts = [["t", p, "proxy-102", 0, 100 * p, 500] for p in range(3)]
    confirm = meter.classify("confirm", {"parts": parts})
    assert confirm == ("confirm-rpc", "confirm", 3)
    join_group = (11).to_bytes(2, "big") + b"\x00\x05rest"
    assert meter.classify("relay", {"frame": join_group}) == ("relay", "JoinGroup", 1)
    assert meter.classify("state", {}) == ("state-stream", "state", 1)
    assert meter.classify("_handshake", {}) == ("rpc", "_handshake", 1)
    meter.count(confirm, "in", 300, 102)  # the sender books what it sends: not here
    meter.count(confirm, "out", 120, 102)
    meter.count(None, "out", 20, 999)  # a cancel to a node the map does not know
    assert ta.totals() == {
        TrafficKey("az1", "az2", "confirm-rpc", "confirm"): (120, 3),
        TrafficKey("az1", "unknown", "rpc", "cancel"): (20, 1),
    }


async def test_every_rpc_frame_is_booked_once_by_its_sender() -> None:
    server_ta = TrafficAccounting(MetricsRegistry(), "main-1")
    client_ta = TrafficAccounting(MetricsRegistry(), "proxy-102")
    # on_bytes sees every frame on each side: what the receiver read, to check the sender.
    server_read: dict[str, int] = defaultdict(int)
    client_read: dict[str, int] = defaultdict(int)

    def reads(into: dict[str, int]) -> OnBytes:
        def on_bytes(direction: str, method: str, nbytes: int, peer: int) -> None:
            if direction == "in":
                into[method] += nbytes

        return on_bytes

    async def confirm(peer: RpcPeer, params: dict[str, Any]) -> dict[str, Any]:
        return {"parts": [[0, 5, -1, -1, None]] * len(params["parts"])}

    server = RpcServer(
        1,
        SECRET,
        {"confirm": confirm},
        on_bytes=reads(server_read),
        meter=RpcTrafficMeter(server_ta.record, "az1", {102: "az2"}),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)
        client = RpcClient(
            102,
            SECRET,
            "127.0.0.1",
            port,
            on_bytes=reads(client_read),
            meter=RpcTrafficMeter(client_ta.record, "az2", {1: "az1"}),
        )
        for n in (1, 4):
            await client.call("confirm", {"parts": [["t", 0, "proxy-102", 0, 0, 10]] * n})
        await client.aclose()
        nursery.cancel_scope.cancel()
    out = TrafficKey("az2", "az1", "confirm-rpc", "confirm")
    back = TrafficKey("az1", "az2", "confirm-rpc", "confirm")
    assert client_ta.totals()[out] == (server_read["confirm"], 5)
    assert server_ta.totals()[back] == (client_read["confirm"], 5)
    hello_out = TrafficKey("az1", "az2", "rpc", "_handshake")
    assert server_ta.totals()[hello_out] == (client_read["_handshake"], 1)
    assert (
        client_ta.totals()[TrafficKey("az2", "az1", "rpc", "_handshake")][0]
        == (server_read["_handshake"])
    )
    assert {k.from_zone for k in client_ta.totals()} == {"az2"}
    assert {k.from_zone for k in server_ta.totals()} == {"az1"}


# --- Kafka clients of a main -------------------------------------------------------------------


def _header(client_id: str | None) -> RequestHeader:
    return RequestHeader(0, 9, 1, client_id, 0)


def _conn(host: str) -> ConnectionInfo:
    return ConnectionInfo(host, 40000, 9092)


def test_client_zone_on_a_main_tag_then_cidr_then_unknown() -> None:
    zones = ClientZones(
        ZoneResolver(ZoneMap.from_mapping(ZONES), {"10.1.0.0/16": "az1", "10.1.2.0/24": "az3"})
    )
    assert zones(_header("zone=az2"), _conn("10.1.2.3")) == "az2"  # the tag wins over CIDR
    assert zones(_header("app,ws_az=use1-az3"), _conn("192.0.2.1")) == "az3"  # AZ id works
    assert zones(_header("plain-client"), _conn("10.1.2.3")) == "az3"  # longest prefix
    assert zones(_header("plain-client"), _conn("10.1.9.9")) == "az1"
    assert zones(_header("zone=nowhere"), _conn("192.0.2.1")) == "unknown"
    assert zones(_header(None), _conn("::ffff:10.1.2.3")) == "az3"
    assert zones.resolver.unknown_values["nowhere"] == 1
    zones(_header("zone=nowhere"), _conn("192.0.2.1"))  # cached: resolved (and logged) once
    assert zones.resolver.unknown_values["nowhere"] == 1


async def test_a_direct_client_of_a_main_is_booked_to_its_tagged_zone(tmp_path: Path) -> None:
    main = MainBroker(
        BrokerConfig(
            node_id=1, zone="az1", wal_url=f"osfs://{tmp_path / 'wal'}", port=0, zones=ZONES
        )
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(main.run)

        def list_topics(client_id: str) -> None:
            admin = AdminClient(
                {"bootstrap.servers": f"127.0.0.1:{main.bound_port}", "client.id": client_id}
            )
            admin.list_topics("ledger-topic", timeout=10)

        await trio.to_thread.run_sync(list_topics, "zone=az3")
        await trio.to_thread.run_sync(list_topics, "no-zone-here")
        await trio.to_thread.run_sync(list_topics, "zone=atlantis")  # ignored, and counted
        nursery.cancel_scope.cancel()
    metrics = main.registry.render()
    assert 'zonefleet_zone_unknown_values_total{source="client_id"} 1' in metrics
    totals = main.traffic.node.accounting.totals()
    kafka = {k for k in totals if k.channel == "kafka-client"}
    assert TrafficKey("az3", "az1", "kafka-client", "Metadata") in kafka
    assert TrafficKey("az1", "az3", "kafka-client", "Metadata") in kafka
    assert TrafficKey("unknown", "az1", "kafka-client", "Metadata") in kafka
    assert {k.from_zone for k in kafka} | {k.to_zone for k in kafka} == {"az1", "az3", "unknown"}
    # 127.0.0.1 matches no CIDR, so an untagged client stays unknown (and never "crosses").
    assert not any(k.cross_zone for k in kafka if "unknown" in (k.from_zone, k.to_zone))


# --- fleet config ------------------------------------------------------------------------------


def test_fleet_config_hands_accounting_settings_to_every_node(tmp_path: Path) -> None:
    doc = tomllib.loads(
        f"""
[fleet]
data_dir = "{tmp_path / "data"}"
storage_zone = "fsx-az1"
[internal]
secret = "{SECRET.decode()}"
[[zones]]
name = "az1"
az_id = "use1-az1"
[[zones]]
name = "az2"
az_id = "use1-az2"
[cidrs]
"10.2.0.0/16" = "use1-az2"
[[main_brokers]]
node_id = 1
zone = "az1"
port = 0
admin_port = 0
rpc_port = 19994
[[proxies]]
node_id = 102
zone = "use1-az2"
port = 0
admin_port = 0
"""
    )
    config = parse_fleet_config(doc, tmp_path, discover=None)
    broker, proxy = config.mains[0].broker, config.proxies[0].proxy
    assert broker.data_dir == proxy.data_dir == tmp_path / "data"
    assert broker.storage_zone == proxy.storage_zone == "fsx-az1"
    assert broker.peer_zones[102] == "az2"
    assert broker.zones == {"az1": "use1-az1", "az2": "use1-az2"}
    assert broker.cidrs == {"10.2.0.0/16": "az2"}
    traffic = MainBroker(broker).traffic
    assert traffic.rpc.node_zones[102] == "az2"
    assert traffic.client_zones(_header(None), _conn("10.2.3.4")) == "az2"
    default = parse_fleet_config(
        {"main_brokers": [{"node_id": 1, "zone": "az1"}]}, tmp_path, discover=None
    )
    assert default.mains[0].broker.storage_zone == "regional"
