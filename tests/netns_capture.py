"""What the kernel put on each zone's `eth0`: a packet capture per zone namespace, its frames,
the header bytes among them, and VPC flow-log records built from it.

Every zone's `eth0` carries only cross-zone traffic (tests/netns.py), so a capture of it holds
every byte that crossed a zone boundary. `tcpdump` (Debian package `tcpdump`) writes the frames'
first 128 bytes (all of Ethernet, IPv4 and TCP headers) with their full length, in both
directions; a frame whose source IPv4 address (ARP: sender address) is the zone's own was sent
by the zone (egress), any other was received (ingress).

**Frames and packets.** A capture sees a frame where the interface counters count one: once
per socket buffer the veth transmits. TCP on a veth uses GSO without ever segmenting, so a
large write can be one frame of up to 64 KiB with one set of headers, where a real NIC would put
one set per MSS segment on the wire. The sum of the egress frames' lengths equals the
interface's `tx_bytes` and their number `tx_packets`, exactly (`Capture.check_complete`).

**Header bytes of a frame** (`Frame.header_bytes`): Ethernet 14, IPv4 `IHL x 4` (20: no
options), TCP `data offset x 4` (20 + options: 32 for an established segment with the 12-byte
timestamp option Linux uses by default, 40 for a SYN or SYN-ACK carrying MSS, SACK-permitted,
timestamps and window scale, more for an ACK carrying SACK blocks). A frame that is not
TCP/IPv4 (ARP: 42 bytes) is all header. The TCP payload of a frame is its length minus its
header bytes; a pure ACK, a SYN, a FIN or an RST has none.
"""

from __future__ import annotations

import struct
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.netns import ZONE_IFACE, ZoneNamespaces

__all__ = [
    "ETHERNET_HEADER",
    "IPV4_HEADER",
    "TCP_HEADER_SYN",
    "TCP_HEADER_TIMESTAMPS",
    "Capture",
    "Frame",
    "HeaderModel",
    "flow_log_records",
    "parse_pcap",
    "retransmitted",
]

ETHERNET_HEADER = 14
IPV4_HEADER = 20
TCP_HEADER_TIMESTAMPS = 20 + 12  # NOP, NOP, timestamps (10)
TCP_HEADER_SYN = 20 + 20  # MSS 4, SACK-permitted 2, timestamps 10, NOP 1, window scale 3
SNAPLEN = 128
ETH_P_IP = 0x0800
ETH_P_ARP = 0x0806
IPPROTO_TCP = 6
TCP_FIN, TCP_SYN, TCP_RST = 0x01, 0x02, 0x04


@dataclass(frozen=True)
class Frame:
    """One captured frame: `length` is the frame's length on the interface (not the snapshot)."""

    ts: float
    length: int
    ethertype: int
    src: str = ""  # IPv4 source (ARP: sender protocol address)
    dst: str = ""
    protocol: int = 0
    sport: int = 0
    dport: int = 0
    ip_header: int = 0
    tcp_header: int = 0
    tcp_flags: int = 0
    seq: int = 0

    @property
    def is_tcp(self) -> bool:
        return self.ethertype == ETH_P_IP and self.protocol == IPPROTO_TCP and self.tcp_header > 0

    @property
    def ip_bytes(self) -> int:
        """The IP packet's length (what a VPC flow log counts); 0 for a frame that is not IP."""
        return self.length - ETHERNET_HEADER if self.ethertype == ETH_P_IP else 0

    @property
    def header_bytes(self) -> int:
        if not self.is_tcp:
            return self.length
        return ETHERNET_HEADER + self.ip_header + self.tcp_header

    @property
    def payload(self) -> int:
        return self.length - self.header_bytes

    @property
    def kind(self) -> str:
        """The frame's class in the header model: syn, fin, rst, data, ack, arp or other."""
        if self.ethertype == ETH_P_ARP:
            return "arp"
        if not self.is_tcp:
            return "other"
        if self.tcp_flags & TCP_SYN:
            return "syn"
        if self.tcp_flags & TCP_RST:
            return "rst"
        if self.tcp_flags & TCP_FIN:
            return "fin"
        return "data" if self.payload else "ack"


def _ipv4(raw: bytes) -> str:
    return ".".join(str(b) for b in raw)


def parse_pcap(path: Path) -> list[Frame]:
    """The frames of a classic pcap file of link type Ethernet (what tcpdump -w writes)."""
    data = path.read_bytes()
    if len(data) < 24:
        raise ValueError(f"{path}: not a pcap file ({len(data)} bytes)")
    magic = data[:4]
    formats = {
        b"\xd4\xc3\xb2\xa1": ("<", 1e-6),
        b"\xa1\xb2\xc3\xd4": (">", 1e-6),
        b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
        b"\xa1\xb2\x3c\x4d": (">", 1e-9),
    }
    if magic not in formats:
        raise ValueError(f"{path}: not a pcap file (magic {magic.hex()})")
    endian, tick = formats[magic]
    linktype = struct.unpack_from(endian + "I", data, 20)[0] & 0x0FFFFFFF
    if linktype != 1:
        raise ValueError(f"{path}: link type {linktype}, not Ethernet")
    record = struct.Struct(endian + "IIII")
    frames: list[Frame] = []
    pos = 24
    while pos + record.size <= len(data):
        sec, frac, caplen, length = record.unpack_from(data, pos)
        pos += record.size
        pkt = data[pos : pos + caplen]
        pos += caplen
        if len(pkt) < caplen:
            raise ValueError(f"{path}: truncated at byte {pos}")
        frames.append(_frame(sec + frac * tick, length, pkt))
    return frames


def _frame(ts: float, length: int, pkt: bytes) -> Frame:
    if len(pkt) < ETHERNET_HEADER:
        return Frame(ts, length, 0)
    ethertype = struct.unpack_from("!H", pkt, 12)[0]
    ip = pkt[ETHERNET_HEADER:]
    if ethertype == ETH_P_ARP and len(ip) >= 28:
        return Frame(ts, length, ethertype, _ipv4(ip[14:18]), _ipv4(ip[24:28]))
    if ethertype != ETH_P_IP or len(ip) < 20:
        return Frame(ts, length, ethertype)
    ihl = (ip[0] & 0x0F) * 4
    protocol = ip[9]
    src, dst = _ipv4(ip[12:16]), _ipv4(ip[16:20])
    tcp = ip[ihl:]
    if protocol != IPPROTO_TCP or len(tcp) < 14:
        return Frame(ts, length, ethertype, src, dst, protocol, ip_header=ihl)
    sport, dport, seq = struct.unpack_from("!HHI", tcp, 0)
    doff = (tcp[12] >> 4) * 4
    return Frame(ts, length, ethertype, src, dst, protocol, sport, dport, ihl, doff, tcp[13], seq)


def retransmitted(frames: Iterable[Frame]) -> dict[tuple[str, str], int]:
    """Per (source address, destination address): the TCP payload bytes of `frames` (one
    sender's, in capture order) that repeat sequence numbers sent before: retransmissions."""
    sent_up_to: dict[tuple[str, int, str, int], int] = {}
    out: dict[tuple[str, str], int] = {}
    for f in frames:
        if not f.is_tcp or not f.payload:
            continue
        flow = (f.src, f.sport, f.dst, f.dport)
        end = (f.seq + f.payload) % (1 << 32)
        top = sent_up_to.get(flow)
        if top is None:
            sent_up_to[flow] = end
            continue
        behind = (top - f.seq) % (1 << 32)  # bytes of this frame at or below the top sent
        if behind >= 1 << 31:  # all new: the frame starts above the top
            behind = 0
        repeated = min(behind, f.payload)
        if repeated:
            out[(f.src, f.dst)] = out.get((f.src, f.dst), 0) + repeated
        if repeated < f.payload:
            sent_up_to[flow] = end
    return out


@dataclass
class ZoneCapture:
    zone: str
    address: str
    path: Path
    proc: subprocess.Popen[bytes]
    stats: str = ""
    stopped: bool = False
    frames: list[Frame] = field(default_factory=list)

    def egress(self) -> list[Frame]:
        return [f for f in self.frames if f.src == self.address]

    def ingress(self) -> list[Frame]:
        return [f for f in self.frames if f.src != self.address]


class Capture:
    """`tcpdump -i eth0` in every zone namespace: `start()` before the fleet, `stop()` after."""

    def __init__(self, ns: ZoneNamespaces, out_dir: Path) -> None:
        self.ns = ns
        self.out_dir = out_dir
        self.zones: dict[str, ZoneCapture] = {}

    def start(self, timeout: float = 10.0) -> Capture:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for zone in self.ns.zones:
            path = self.out_dir / f"{zone}.pcap"
            cmd = [
                "tcpdump", "-i", ZONE_IFACE, "-n", "-s", str(SNAPLEN),
                # Each packet written as it comes, as root (tcpdump would otherwise drop to its
                # own user, who cannot write into pytest's 0700 tmp_path).
                "-U", "--immediate-mode", "-Z", "root", "-B", "8192", "-w", str(path),
            ]  # fmt: skip
            proc = subprocess.Popen(
                self.ns.argv(zone, cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            self.zones[zone] = ZoneCapture(zone, self.ns.address(zone), path, proc)
        deadline = time.monotonic() + timeout
        for cap in self.zones.values():
            assert cap.proc.stderr is not None
            # "listening on eth0, ..." once the capture is attached to the interface.
            line = cap.proc.stderr.readline().decode(errors="replace")
            if "listening on" not in line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tcpdump in {cap.zone} did not start: {line}")
        return self

    def stop(self) -> None:
        """Stop every tcpdump (SIGTERM: it flushes the file and prints its drop counts)."""
        for cap in self.zones.values():
            if cap.proc.poll() is None:
                cap.proc.terminate()
        for cap in self.zones.values():
            if cap.stopped:
                continue
            try:
                _, err = cap.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                cap.proc.kill()
                _, err = cap.proc.communicate()
            cap.stats += err.decode(errors="replace")
            cap.stopped = True

    def read(self) -> Capture:
        for cap in self.zones.values():
            cap.frames = parse_pcap(cap.path)
        return self

    def dropped(self) -> dict[str, int]:
        """Per zone, the packets tcpdump reported dropped (by the kernel or the interface)."""
        out = {}
        for zone, cap in self.zones.items():
            total = 0
            for line in cap.stats.splitlines():
                words = line.split()
                if "dropped" in words and words[0].isdigit():
                    total += int(words[0])
            out[zone] = total
        return out

    def egress(self) -> list[Frame]:
        return [f for cap in self.zones.values() for f in cap.egress()]

    def ingress(self) -> list[Frame]:
        return [f for cap in self.zones.values() for f in cap.ingress()]

    def check_complete(self) -> list[str]:
        """Each zone's egress frames against its eth0 counters: [] when they are the same
        bytes and packets (and tcpdump dropped nothing)."""
        problems = []
        for zone, n in self.dropped().items():
            if n:
                problems.append(f"tcpdump in {zone} dropped {n} packets: {self.zones[zone].stats}")
        for zone, cap in self.zones.items():
            c = self.ns.interface_counters(zone)
            out = cap.egress()
            nbytes = sum(f.length for f in out)
            if (nbytes, len(out)) != (c.tx_bytes, c.tx_packets):
                problems.append(
                    f"{zone}: captured egress {nbytes} B / {len(out)} frames, "
                    f"eth0 tx {c.tx_bytes} B / {c.tx_packets} packets"
                )
        return problems


@dataclass(frozen=True)
class HeaderModel:
    """Frames of one capture by class, and what the fixed-size header model makes of them.

    The model: every TCP frame carries 14 + 20 + 32 = 66 header bytes (Ethernet, IPv4, TCP with
    timestamps), a SYN or SYN-ACK 74 (its options: 8 more), an ARP frame is 42 bytes of header,
    any other frame (not TCP/IPv4) is all header.
    `exact_header_bytes` is what each frame's own IHL and data offset say.
    """

    frames: int
    frame_bytes: int
    kinds: dict[str, int]
    exact_header_bytes: int
    payload: int
    ip_bytes: int
    other_bytes: int  # frames neither TCP/IPv4 nor ARP (IGMP, ...): all header
    largest: int  # the longest frame (above 1514: a GSO frame, one header set for many MSS)

    @classmethod
    def of(cls, frames: Sequence[Frame]) -> HeaderModel:
        return cls(
            frames=len(frames),
            frame_bytes=sum(f.length for f in frames),
            kinds=dict(Counter(f.kind for f in frames)),
            exact_header_bytes=sum(f.header_bytes for f in frames),
            payload=sum(f.payload for f in frames),
            ip_bytes=sum(f.ip_bytes for f in frames),
            other_bytes=sum(f.length for f in frames if f.kind == "other"),
            largest=max((f.length for f in frames), default=0),
        )

    @property
    def tcp_frames(self) -> int:
        return sum(n for k, n in self.kinds.items() if k not in ("arp", "other"))

    @property
    def model_header_bytes(self) -> int:
        """Header bytes by the fixed-size model, from the class counts alone."""
        return (
            self.tcp_frames * (ETHERNET_HEADER + IPV4_HEADER + TCP_HEADER_TIMESTAMPS)
            + self.kinds.get("syn", 0) * (TCP_HEADER_SYN - TCP_HEADER_TIMESTAMPS)
            + self.kinds.get("arp", 0) * 42
            + self.other_bytes
        )


def flow_log_records(
    capture: Capture, az_ids: dict[str, str], *, window_s: int = 60, ingress: bool = True
) -> list[tuple[object, ...]]:
    """VPC flow-log v5 records of what each zone's eth0 carried, as tuples in the order of
    `cost_report.flow_logs.FlowLogRecord`.

    As AWS aggregates: one record per interface, direction and 5-tuple (srcaddr, dstaddr,
    srcport, dstport, protocol) per `window_s` window of the packets' times; `bytes` the IP
    packets' lengths (frame length less the 14-byte Ethernet header; ARP and other non-IP
    frames are not logged, as AWS does not log them), `packets` their number, `start`/`end`
    the first and last packet's epoch second. An egress record for the frames the zone sent
    (`az-id` the zone's), an ingress record for those it received when `ingress` is true.
    """
    groups: dict[tuple[str, str, str, str, int, int, int, int], list[Frame]] = {}
    for zone, cap in capture.zones.items():
        for f in cap.frames:
            if f.ethertype != ETH_P_IP:
                continue
            direction = "egress" if f.src == cap.address else "ingress"
            if direction == "ingress" and not ingress:
                continue
            window = int(f.ts // window_s)
            key = (zone, direction, f.src, f.dst, f.sport, f.dport, f.protocol, window)
            groups.setdefault(key, []).append(f)
    records: list[tuple[object, ...]] = []
    for (zone, direction, src, dst, sport, dport, protocol, _), frames in sorted(groups.items()):
        records.append(
            (
                src,
                dst,
                sum(f.ip_bytes for f in frames),
                int(min(f.ts for f in frames)),
                int(max(f.ts for f in frames)),
                az_ids[zone],
                direction,
                sport,
                dport,
                protocol,
                len(frames),
                "ACCEPT",
                "OK",
                f"eni-{zone}",
            )
        )
    return records


def record_sum(records: Iterable[tuple[object, ...]], direction: str) -> tuple[int, int]:
    """(bytes, packets) of the records of one flow direction."""
    nbytes = packets = 0
    for r in records:
        if r[6] == direction:
            nbytes += int(r[2])  # type: ignore[call-overload]
            packets += int(r[10])  # type: ignore[call-overload]
    return nbytes, packets
