"""Issue 3, test 4: each zone in its own network namespace; the kernel counts cross-zone bytes.

Every node runs as its own process in its zone's namespace and every client talks only to its
zone's proxy, so whatever crosses a zone's veth is cross-zone traffic. The kernel's TCP payload
counters of the sockets between namespaces (`ss -tin` for open ones, `ss -tinE` for those that
closed) must agree with the fleet's own traffic accounting (/metrics and the JSONL files) within
5 %; the veth interface counters, which add IP/TCP headers and ACKs, bound both.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.netns import (
    InterfaceCounters,
    NamespacedFleet,
    NetnsUnavailable,
    TcpLedger,
    TcpSocket,
    ZoneNamespaces,
)

pytestmark = pytest.mark.slow

ZONES = ("az1", "az2", "az3")
PRODUCER_ZONE = "az2"
CONSUMER_ZONES = ("az1", "az3")
PARTITIONS = 6
BATCH_BYTES = 64 * 1024
VALUE_BYTES = 1024
MESSAGES = 32 * 1024  # 32 MiB of payload in 64 KiB batches
AGREEMENT = 0.05
MAX_HEADER_BYTES = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps
MAX_CROSS_ZONE_RATIO = 0.005
# Traffic that never touches a socket between zones here (the shared WAL is a local directory).
NON_NETWORK_CHANNEL_PREFIXES = ("wal", "s3")


@dataclass(frozen=True)
class TrafficSample:
    node: str
    from_zone: str
    to_zone: str
    channel: str
    api: str
    bytes: float


_SAMPLE = re.compile(r"^(\w+)\{(.*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def traffic_samples(node: str, metrics_text: str) -> list[TrafficSample]:
    """The `zonefleet_traffic_bytes_total` series of one node's Prometheus text."""
    out = []
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) != "zonefleet_traffic_bytes_total":
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        out.append(
            TrafficSample(
                node,
                labels.get("from_zone", ""),
                labels.get("to_zone", ""),
                labels.get("channel", ""),
                labels.get("api", ""),
                float(m.group(3)),
            )
        )
    return out


@pytest.fixture
def zones() -> Iterator[ZoneNamespaces]:
    ns = ZoneNamespaces(ZONES)
    try:
        ns.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        yield ns
    finally:
        ns.destroy()


@pytest.fixture
def ledger(zones: ZoneNamespaces, tmp_path: Path) -> Iterator[TcpLedger]:
    tcp = TcpLedger(zones, tmp_path / "ss")
    try:
        yield tcp.start()
    finally:
        tcp.stop()


@pytest.fixture
def netns_fleet(
    zones: ZoneNamespaces, ledger: TcpLedger, tmp_path: Path
) -> Iterator[NamespacedFleet]:
    fleet = NamespacedFleet(zones, tmp_path / "fleet")
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()
        # The node logs, for whoever reads a failure report.
        for node in fleet.nodes:
            print(fleet.log_tail(node, 15), file=sys.stderr)


@dataclass
class KernelView:
    sockets: dict[str, list[TcpSocket]]
    interfaces: dict[str, InterfaceCounters]

    @property
    def payload_received(self) -> int:
        return sum(s.bytes_received for socks in self.sockets.values() for s in socks)

    @property
    def payload_acked(self) -> int:
        # bytes_acked also counts the SYN of the sockets that connected.
        return sum(max(0, s.bytes_acked - 1) for socks in self.sockets.values() for s in socks)

    @property
    def wire_tx(self) -> int:
        return sum(c.tx_bytes for c in self.interfaces.values())

    @property
    def wire_rx(self) -> int:
        return sum(c.rx_bytes for c in self.interfaces.values())


def _kernel_view(ns: ZoneNamespaces, ledger: TcpLedger) -> KernelView:
    return KernelView(
        {z: ledger.sockets(z) for z in ns.zones},
        {z: ns.interface_counters(z) for z in ns.zones},
    )


def _between_zones(from_zone: str, to_zone: str, channel: str, zone_names: dict[str, str]) -> bool:
    """Booked from one zone's namespace to another's, over a socket (what the veths carry)."""
    src, dst = zone_names.get(from_zone, from_zone), zone_names.get(to_zone, to_zone)
    return (
        src != dst
        and src in ZONES
        and dst in ZONES
        and not channel.startswith(NON_NETWORK_CHANNEL_PREFIXES)
    )


def _cross_zone_app_bytes(samples: list[TrafficSample], zone_names: dict[str, str]) -> int:
    total = sum(
        s.bytes for s in samples if _between_zones(s.from_zone, s.to_zone, s.channel, zone_names)
    )
    return int(total)


def _cross_zone_jsonl_bytes(accounting_dir: Path, zone_names: dict[str, str]) -> int:
    total = 0
    for path in sorted(accounting_dir.glob("dt=*/*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if _between_zones(row["from_zone"], row["to_zone"], row["channel"], zone_names):
                total += int(row["bytes"])
    return total


def test_cross_zone_bytes_agree_with_the_kernel(
    zones: ZoneNamespaces, ledger: TcpLedger, netns_fleet: NamespacedFleet
) -> None:
    fleet = netns_fleet
    topic = f"netns-{secrets.token_hex(4)}"
    producer_boot = fleet.bootstrap(PRODUCER_ZONE)
    meta = zones.client(
        PRODUCER_ZONE,
        "create-topic",
        bootstrap=producer_boot,
        zone=PRODUCER_ZONE,
        topic=topic,
        partitions=PARTITIONS,
    )
    # The az2 client sees az2 nodes only; partitions led by its proxy have their main elsewhere.
    own_zone, own_addr = PRODUCER_ZONE, zones.address(PRODUCER_ZONE)
    assert all(a.startswith(f"{own_addr}:") for a in meta["brokers"].values()), meta
    proxy_id = next(p.proxy.node_id for p in fleet.config.proxies if p.proxy.zone == own_zone)
    remote = sorted(int(p) for p, leader in meta["leaders"].items() if leader == proxy_id)
    assert remote, f"no partition has its main outside {PRODUCER_ZONE}: {meta}"

    base_kernel, base_samples = _kernel_view(zones, ledger), _app_samples(fleet)
    produced = zones.client(
        PRODUCER_ZONE,
        "produce",
        bootstrap=producer_boot,
        zone=PRODUCER_ZONE,
        topic=topic,
        partitions=remote,
        messages=MESSAGES,
        value_bytes=VALUE_BYTES,
        batch_bytes=BATCH_BYTES,
    )
    payload = produced["payload_bytes"]
    assert payload == MESSAGES * VALUE_BYTES
    expect = {p: v["count"] for p, v in produced["partitions"].items()}
    for zone in CONSUMER_ZONES:
        consumed = zones.client(
            zone, "consume", bootstrap=fleet.bootstrap(zone), zone=zone, topic=topic, expect=expect
        )
        # Every record, in order, byte for byte (the digests chain the values per partition).
        assert consumed["partitions"] == produced["partitions"], zone

    # While the nodes still run: their /metrics.
    kernel = _kernel_view(zones, ledger)
    samples = _app_samples(fleet)
    zone_names = {z.az_id: z.name for z in fleet.config.zones if z.az_id}
    _print_report(kernel, base_kernel, payload)

    for zone, socks in kernel.sockets.items():
        assert socks, f"no socket between {zone} and another zone"
    _check_complete(kernel)
    received = kernel.payload_received
    # The fleet's own properties: gathered, so one run shows every shortfall at once.
    failures: list[str] = []
    window = received - base_kernel.payload_received
    ratio = window / payload
    if ratio > MAX_CROSS_ZONE_RATIO:
        failures.append(f"cross-zone bytes are {ratio:.3%} of the payload (limit 0.5 %)")

    app = _cross_zone_app_bytes(samples, zone_names)
    app_window = app - _cross_zone_app_bytes(base_samples, zone_names)
    _print_app(samples, zone_names, app, app_window)
    if not samples:
        failures.append("no node exports zonefleet_traffic_bytes_total: no traffic accounting")
    if app > kernel.wire_tx:
        failures.append(f"app accounting {app} B exceeds the veths' {kernel.wire_tx} B")
    if abs(app - received) > AGREEMENT * received:
        failures.append(f"since start: app accounting {app} B vs kernel TCP payload {received} B")
    if abs(app_window - window) > AGREEMENT * window:
        failures.append(f"workload: app accounting {app_window} B vs kernel TCP payload {window} B")

    # The JSONL ledger, flushed by a clean shutdown, against every byte of the fleet's life.
    fleet.stop()
    final = _kernel_view(zones, ledger)
    _check_complete(final)
    assert all(n.proc.returncode == 0 for n in fleet.nodes), [
        n.proc.returncode for n in fleet.nodes
    ]
    jsonl = _cross_zone_jsonl_bytes(fleet.config.data_dir / "accounting", zone_names)
    lifetime = final.payload_received
    print(f"cross-zone over the fleet's life: kernel {lifetime} B, JSONL accounting {jsonl} B")
    if abs(jsonl - lifetime) > AGREEMENT * lifetime:
        failures.append(f"lifetime: JSONL accounting {jsonl} B vs kernel TCP payload {lifetime} B")
    assert not failures, "\n".join(failures)


def _check_complete(kernel: KernelView) -> None:
    """The socket ledger is whole: both ends of each connection, and all the veths carried."""
    received, acked = kernel.payload_received, kernel.payload_acked
    # What one end sent the other got (closed sockets add a FIN byte, in-flight bytes differ).
    assert abs(acked - received) <= 0.001 * received + 4096, (acked, received)
    # Beyond the payload the veths carry at most a full set of headers per packet (GSO makes
    # that fewer), so the bytes of a connection the ledger missed show up here.
    packets = sum(c.tx_packets for c in kernel.interfaces.values())
    assert received <= kernel.wire_tx <= received + MAX_HEADER_BYTES * packets + 4096, (
        f"veth tx {kernel.wire_tx} B is not TCP payload {received} B plus headers of {packets} "
        "packets: traffic crossed zones on sockets the ledger did not see"
    )


def _app_samples(fleet: NamespacedFleet) -> list[TrafficSample]:
    return [s for node in fleet.nodes for s in traffic_samples(node.label, fleet.metrics(node))]


def _print_report(kernel: KernelView, base: KernelView, payload: int) -> None:
    received, window = kernel.payload_received, kernel.payload_received - base.payload_received
    print(
        f"\ncross-zone, kernel: TCP payload {received} B since start, {window} B in the workload "
        f"({window / payload:.4%} of {payload} B produced); "
        f"{sum(map(len, kernel.sockets.values()))} sockets; "
        f"veth tx {kernel.wire_tx} B, rx {kernel.wire_rx} B"
    )
    for zone, c in kernel.interfaces.items():
        socks = kernel.sockets[zone]
        print(
            f"  {zone}: eth0 tx {c.tx_bytes} B / {c.tx_packets} pkts, rx {c.rx_bytes} B / "
            f"{c.rx_packets} pkts; sockets out {sum(s.bytes_acked for s in socks)} B, "
            f"in {sum(s.bytes_received for s in socks)} B"
        )
        for sock in socks:
            if sock.bytes_acked + sock.bytes_received > 1 << 20:
                print(f"    big: {sock}")


def _print_app(
    samples: list[TrafficSample], zone_names: dict[str, str], app: int, window: int
) -> None:
    print(f"cross-zone, app accounting: {app} B since start, {window} B in the workload")
    totals: dict[tuple[str, str, str, str], float] = {}
    for s in samples:
        src, dst = zone_names.get(s.from_zone, s.from_zone), zone_names.get(s.to_zone, s.to_zone)
        if src != dst:
            key = (src, dst, s.channel, s.api)
            totals[key] = totals.get(key, 0.0) + s.bytes
    for key, nbytes in sorted(totals.items()):
        print(f"  {' -> '.join(key[:2])} {key[2]}/{key[3]}: {int(nbytes)} B")
