"""Issue 10, "Cost truth against the kernel": the cost report on a fleet run where each zone is
its own network namespace, against what the kernel carried between the namespaces.

One fleet run (the workload of test_netns_zones: 32 MiB produced in az2 to partitions whose main
is in az1 or az3, read back in az1 and az3) with `tcpdump` on every zone's `eth0` and the `ss`
socket ledger running from before the first node starts until after the last one stopped. Then
the cost report (Spark, in this process, in the root namespace) on the fleet's JSONL ledgers:

1. Its cross-zone bytes against the kernel's: the veths' `tx_bytes` less the header bytes of
   the `tx_packets` frames (Ethernet, IPv4, TCP, and ARP frames whole), within 2 %. The capture
   sees the same frames as the counters (checked exactly) and tells their header sizes.
2. Flow logs of that run: each zone's captured frames as VPC flow-log v5 records (per
   5-tuple, direction and minute: an egress record at the sender's interface, an ingress record
   at the receiver's, as AWS writes them for a flow between two logged interfaces), written with
   `cost_report.flow_logs`, read by the report with the fleet TOML as the zone map. The report's
   flow-log cross-zone bytes equal the egress records' bytes exactly (the ingress copies are not
   counted again), and agree with the ledger plus 52 header bytes (IPv4 20, TCP 32) per packet
   within 2 %.

The figures are written up in docs/cost_report.md, "Agreement with the kernel".
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netns import NamespacedFleet, TcpLedger, ZoneNamespaces
from tests.netns_capture import (
    ETHERNET_HEADER,
    IPV4_HEADER,
    TCP_HEADER_TIMESTAMPS,
    Capture,
    HeaderModel,
    flow_log_records,
    record_sum,
    retransmitted,
)
from tests.test_netns_zones import (  # noqa: F401 (fixtures)
    BATCH_BYTES,
    CONSUMER_ZONES,
    MESSAGES,
    NON_NETWORK_CHANNEL_PREFIXES,
    PARTITIONS,
    PRODUCER_ZONE,
    VALUE_BYTES,
    ledger,
    zones,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

AGREEMENT = 0.02
MODEL_TOLERANCE = 0.001
# IP and TCP headers per packet that a flow log's bytes include beyond the TCP payload.
FLOW_LOG_HEADER_BYTES = IPV4_HEADER + TCP_HEADER_TIMESTAMPS


@pytest.fixture
def capture(zones: ZoneNamespaces, tmp_path: Path) -> Iterator[Capture]:  # noqa: F811
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is not installed (Debian package tcpdump, in make apt-deps)")
    cap = Capture(zones, tmp_path / "pcap")
    try:
        yield cap.start()
    finally:
        cap.stop()


@pytest.fixture
def fleet(
    zones: ZoneNamespaces,  # noqa: F811
    ledger: TcpLedger,  # noqa: F811
    capture: Capture,
    tmp_path: Path,
) -> Iterator[NamespacedFleet]:
    """The fleet, started once the capture and the socket ledger listen."""
    f = NamespacedFleet(zones, tmp_path / "fleet")
    try:
        f.start()
        yield f
    finally:
        f.stop()
        for node in f.nodes:
            print(f.log_tail(node, 15), file=sys.stderr)


def _workload(zones: ZoneNamespaces, fleet: NamespacedFleet) -> int:  # noqa: F811
    topic = f"netns-cost-{secrets.token_hex(4)}"
    boot = fleet.bootstrap(PRODUCER_ZONE)
    meta = zones.client(
        PRODUCER_ZONE,
        "create-topic",
        bootstrap=boot,
        zone=PRODUCER_ZONE,
        topic=topic,
        partitions=PARTITIONS,
    )
    proxy_id = next(p.proxy.node_id for p in fleet.config.proxies if p.proxy.zone == PRODUCER_ZONE)
    remote = sorted(int(p) for p, leader in meta["leaders"].items() if leader == proxy_id)
    assert remote, f"no partition has its main outside {PRODUCER_ZONE}: {meta}"
    produced = zones.client(
        PRODUCER_ZONE,
        "produce",
        bootstrap=boot,
        zone=PRODUCER_ZONE,
        topic=topic,
        partitions=remote,
        messages=MESSAGES,
        value_bytes=VALUE_BYTES,
        batch_bytes=BATCH_BYTES,
    )
    expect = {p: v["count"] for p, v in produced["partitions"].items()}
    for zone in CONSUMER_ZONES:
        consumed = zones.client(
            zone, "consume", bootstrap=fleet.bootstrap(zone), zone=zone, topic=topic, expect=expect
        )
        assert consumed["partitions"] == produced["partitions"], zone
    return int(produced["payload_bytes"])


def _report(
    accounting: Path, out: Path, flow_logs: Path, zone_spec: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the report with the flow logs (local[1], in the root namespace); (summary.json,
    the flow-log reader's own per-day figures and rejected lines on the same session)."""
    pytest.importorskip("pyspark", reason="pyspark is in the 'report' extra")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from cost_report.flow_logs import read_flow_logs
    from cost_report.job import spark_session
    from cost_report.prices import load_prices
    from cost_report.report import ReportInputs, run_report
    from cost_report.zones import load_zone_map

    spark = spark_session("local[1]", "test_netns_cost_report")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        inputs = ReportInputs(
            accounting=str(accounting),
            out=out,
            prices=load_prices(None),
            flow_logs=str(flow_logs),
            zones=zone_spec,
        )
        run_report(spark, inputs, lambda msg: print(f"report: {msg}"))
        summary = json.loads((out / "summary.json").read_text())
        # The reader on its own as well: its double-captured bytes are not in the summary.
        daily, rejected = read_flow_logs(spark, str(flow_logs), load_zone_map(zone_spec))
        flows = {
            "days": [r.asDict() for r in daily.collect()],
            "rejected": [r.asDict() for r in rejected.collect()],
        }
    finally:
        spark.stop()
    return summary, flows


def test_report_agrees_with_the_kernel(
    zones: ZoneNamespaces,  # noqa: F811
    ledger: TcpLedger,  # noqa: F811
    capture: Capture,
    fleet: NamespacedFleet,
    tmp_path: Path,
) -> None:
    payload = _workload(zones, fleet)

    # Everything the fleet ever sent: its nodes stopped cleanly (the ledgers are flushed), then
    # the capture (nothing is left to cross a veth) and the counters.
    fleet.stop()
    assert all(n.proc.returncode == 0 for n in fleet.nodes), [
        (n.label, n.proc.returncode) for n in fleet.nodes
    ]
    sockets = {z: ledger.sockets(z) for z in zones.zones}
    capture.stop()
    capture.read()
    counters = {z: zones.interface_counters(z) for z in zones.zones}
    assert not capture.check_complete(), capture.check_complete()

    # -- the kernel's view --------------------------------------------------------------------
    sent = HeaderModel.of(capture.egress())
    tx_bytes = sum(c.tx_bytes for c in counters.values())
    tx_packets = sum(c.tx_packets for c in counters.values())
    assert (sent.frame_bytes, sent.frames) == (tx_bytes, tx_packets)
    kernel_payload = tx_bytes - sent.exact_header_bytes  # = the frames' TCP payload
    model_payload = tx_bytes - sent.model_header_bytes
    socket_payload = sum(s.bytes_received for socks in sockets.values() for s in socks)
    n_sockets = sum(map(len, sockets.values()))

    # -- the flow logs of the run -------------------------------------------------------------
    az_ids = {z.name: z.az_id or z.name for z in fleet.config.zones}
    records = flow_log_records(capture, az_ids)
    flow_dir = tmp_path / "flow-logs"
    from cost_report.flow_logs import write_flow_log  # pyspark is needed from here on

    for zone in zones.zones:
        mine = [r for r in records if r[13] == f"eni-{zone}"]
        write_flow_log(flow_dir / f"{az_ids[zone]}.log", mine)
    egress_bytes, egress_packets = record_sum(records, "egress")
    # Ingress records from another zone's address repeat an egress record (not counted again);
    # the rest come from no zone's address (the bridge's own IGMP reports, from 0.0.0.0).
    zone_addresses = {zones.address(z) for z in zones.zones}
    ingress_bytes, _ = record_sum((r for r in records if r[0] in zone_addresses), "ingress")
    stray_bytes, _ = record_sum((r for r in records if r[0] not in zone_addresses), "ingress")

    # -- the report ---------------------------------------------------------------------------
    summary, flows = _report(
        fleet.config.data_dir / "accounting", tmp_path / "report", flow_dir, str(fleet.config_path)
    )
    ledger_bytes = int(summary["cross_zone_bytes"])
    by_channel = {r["channel"]: r for r in summary["by_channel"]}
    local_channels = {
        ch: r["cross_zone_bytes"]
        for ch, r in by_channel.items()
        if ch.startswith(NON_NETWORK_CHANNEL_PREFIXES)
    }
    report_flow_bytes = sum(int(d["cross_zone_bytes"]) for d in flows["days"])
    double_captured = sum(int(d["double_captured_bytes"]) for d in flows["days"])
    unknown_flow_bytes = sum(int(d["unknown_zone_bytes"]) for d in flows["days"])
    sources = summary["sources"]
    summary_flow_bytes = sum(int(s["flow_log_cross_zone_bytes"] or 0) for s in sources)
    summary_unknown = sum(int(s.get("flow_log_unknown_zone_bytes") or 0) for s in sources)
    flow_payload = report_flow_bytes - FLOW_LOG_HEADER_BYTES * egress_packets

    pairs = _by_zone_pair(zones, capture, summary)
    _print_figures(
        payload=payload,
        ledger_bytes=ledger_bytes,
        by_channel=by_channel,
        tx_bytes=tx_bytes,
        tx_packets=tx_packets,
        sent=sent,
        kernel_payload=kernel_payload,
        model_payload=model_payload,
        socket_payload=socket_payload,
        n_sockets=n_sockets,
        records=len(records),
        egress=(egress_bytes, egress_packets),
        ingress_bytes=ingress_bytes,
        stray_bytes=stray_bytes,
        report_flow_bytes=report_flow_bytes,
        summary_flow_bytes=summary_flow_bytes,
        flow_payload=flow_payload,
        pairs=pairs,
    )

    failures: list[str] = []
    # The ledger's cross-zone bytes are the network channels' only: the shared WAL and the
    # object store are booked to the pseudo-zone 'regional', which never crosses.
    if any(local_channels.values()):
        failures.append(f"cross-zone bytes on local channels: {local_channels}")
    # Three kernel views of the TCP payload: the frames' own headers, the fixed-size model
    # over the interface counters, and the sockets' byte counters.
    # The fixed-size model misses only odd headers: a reset answering a segment of no socket
    # has no timestamps (12 B less), SACK blocks (none on a lossless veth).
    if abs(model_payload - kernel_payload) > MODEL_TOLERANCE * kernel_payload:
        failures.append(f"header model: {model_payload} B, frames' own headers {kernel_payload} B")
    # (A socket counts its peer's FIN as a byte, and never counts what reached it closed: a
    # frame a node sent while its peer was shutting down, answered by a reset.)
    if abs(socket_payload - kernel_payload) > 0.001 * kernel_payload + 64 * n_sockets:
        failures.append(f"sockets received {socket_payload} B, the veths carried {kernel_payload}")
    if abs(ledger_bytes - kernel_payload) > AGREEMENT * kernel_payload:
        failures.append(
            f"report cross-zone {ledger_bytes} B vs kernel payload {kernel_payload} B "
            f"({ledger_bytes / kernel_payload - 1:+.2%}; eth0 tx {tx_bytes} B / {tx_packets} "
            f"frames, {sent.exact_header_bytes} B of headers)"
        )
    for (src, dst), (kernel, _, booked) in sorted(pairs.items()):
        if abs(booked - kernel) > AGREEMENT * kernel:
            failures.append(f"{src} -> {dst}: ledger {booked} B, kernel payload {kernel} B")
    # The flow logs: what was written is what the report counts, each flow once.
    if flows["rejected"]:
        failures.append(f"flow-log records rejected: {flows['rejected']}")
    if report_flow_bytes != egress_bytes:
        failures.append(f"flow logs: report {report_flow_bytes} B, written egress {egress_bytes}")
    if double_captured != ingress_bytes:
        failures.append(f"flow logs: ingress {ingress_bytes} B written, {double_captured} B seen")
    if unknown_flow_bytes != stray_bytes:
        failures.append(f"flow logs: {stray_bytes} B from no zone, {unknown_flow_bytes} B unknown")
    if ingress_bytes != egress_bytes:
        failures.append(f"the zones received {ingress_bytes} B of IP, sent {egress_bytes} B")
    if summary_flow_bytes != egress_bytes:
        failures.append(f"summary flow-log bytes {summary_flow_bytes}, written {egress_bytes}")
    if summary_unknown != stray_bytes:
        failures.append(f"summary flow-log unknown {summary_unknown} B, from no zone {stray_bytes}")
    expected_flow = ledger_bytes + FLOW_LOG_HEADER_BYTES * egress_packets
    if abs(report_flow_bytes - expected_flow) > AGREEMENT * ledger_bytes:
        failures.append(
            f"flow logs {report_flow_bytes} B vs ledger {ledger_bytes} B + "
            f"{FLOW_LOG_HEADER_BYTES} B x {egress_packets} packets = {expected_flow} B"
        )
    assert not failures, "\n".join(failures)


def _print_figures(**f: Any) -> None:
    sent: HeaderModel = f["sent"]
    kp, lb = f["kernel_payload"], f["ledger_bytes"]
    eb, ep = f["egress"]
    again = sum(v[1] for v in f["pairs"].values())
    print(
        f"\nworkload: {f['payload']} B produced\n"
        f"eth0 tx (all zones): {f['tx_bytes']} B in {f['tx_packets']} frames "
        f"{dict(sorted(sent.kinds.items()))}, the largest {sent.largest} B\n"
        f"  header bytes: frames' own {sent.exact_header_bytes} B, model "
        f"{sent.model_header_bytes} B ({ETHERNET_HEADER}+{IPV4_HEADER}+{TCP_HEADER_TIMESTAMPS} "
        "per TCP frame, +8 per SYN, 42 per ARP)\n"
        f"  kernel TCP payload {kp} B, {again} B of it retransmitted (model "
        f"{f['model_payload']} B; sockets received "
        f"{f['socket_payload']} B on {f['n_sockets']} sockets)\n"
        f"report cross-zone (ledger): {lb} B = {lb / kp:.4f} x kernel payload "
        f"({lb / kp - 1:+.3%}); interface bytes are {f['tx_bytes'] / lb:.3f} x the ledger\n"
        f"flow logs: {f['records']} records, egress {eb} B / {ep} packets, ingress "
        f"{f['ingress_bytes']} B from zones + {f['stray_bytes']} B from no zone; "
        f"report counted {f['report_flow_bytes']} B "
        f"(summary.json: {f['summary_flow_bytes']} B)\n"
        f"  flow-log bytes - {FLOW_LOG_HEADER_BYTES} B x packets = {f['flow_payload']} B = "
        f"{f['flow_payload'] / lb:.4f} x ledger ({f['flow_payload'] / lb - 1:+.3%})"
    )
    for ch, r in sorted(f["by_channel"].items()):
        print(f"  channel {ch}: {r['bytes']} B, cross-zone {r['cross_zone_bytes']} B")
    for (src, dst), (kernel, again, booked) in sorted(f["pairs"].items()):
        print(
            f"  {src} -> {dst}: kernel payload {kernel} B ({again} B retransmitted), "
            f"ledger {booked} B ({booked - kernel:+}; {booked - (kernel - again):+} against the "
            "payload sent once)"
        )


def _by_zone_pair(
    ns: ZoneNamespaces, capture: Capture, summary: dict[str, Any]
) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(from zone, to zone) -> (kernel TCP payload, of it retransmitted, the report's
    cross-zone bytes)."""
    out: dict[tuple[str, str], list[int]] = {}
    for f in capture.egress():
        src, dst = ns.zone_of(f.src), ns.zone_of(f.dst)
        if f.is_tcp and src and dst:
            out.setdefault((src, dst), [0, 0, 0])[0] += f.payload
    for cap in capture.zones.values():
        for (src_addr, dst_addr), n in retransmitted(cap.egress()).items():
            src, dst = ns.zone_of(src_addr), ns.zone_of(dst_addr)
            if src and dst:
                out.setdefault((src, dst), [0, 0, 0])[1] += n
    for r in summary["zone_matrix"]:
        if r["cross_zone"]:
            out.setdefault((r["from_zone"], r["to_zone"]), [0, 0, 0])[2] += int(r["bytes"])
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}
