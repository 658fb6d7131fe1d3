"""Zones as Linux network namespaces, a fleet run inside them, and the clients that drive it.

Each zone gets a namespace `zf-<tag>-<zone>` holding `eth0` (address 10.<octet>.0.K/24) and
`lo`; the other end of each veth pair sits on a bridge in its own namespace `zf-<tag>-br`, so
the root namespace is left alone. A node talking to its own zone's address goes over `lo`: any
byte on a zone's `eth0` crossed a zone boundary.

Run as `python -m tests.netns COMMAND JSON-KWARGS` (inside a namespace, with `ip netns exec`)
this module is also the small client the test starts in each zone: HTTP probes and
confluent-kafka clients, each printing its result as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.config import FleetConfig, load_fleet_config, local_zones_fleet_toml

REPO = Path(__file__).resolve().parent.parent
ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))
ZONE_IFACE = "eth0"


class NetnsUnavailable(RuntimeError):
    """`ip netns add` does not work here (not root, no CAP_NET_ADMIN, no iproute2)."""


@dataclass(frozen=True)
class InterfaceCounters:
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket as `ss -tinH` shows it; byte counts are TCP payload only."""

    local: tuple[str, int]
    peer: tuple[str, int]
    bytes_acked: int
    bytes_received: int
    # What went on the wire, retransmissions included (0 where `ss` does not say).
    bytes_sent: int = 0


_SS_ADDR = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)")
_SS_FIELD = re.compile(r"\b(bytes_acked|bytes_received|bytes_sent):(\d+)")


def parse_ss(text: str) -> list[TcpSocket]:
    """Parse `ss -tinH`: a state line per socket, its info on the following indented line."""
    out: list[TcpSocket] = []
    addr: tuple[tuple[str, int], tuple[str, int]] | None = None
    fields: dict[str, int] = {}

    def close() -> None:
        if addr is not None:
            out.append(
                TcpSocket(
                    addr[0],
                    addr[1],
                    fields.get("bytes_acked", 0),
                    fields.get("bytes_received", 0),
                    fields.get("bytes_sent", 0),
                )
            )

    for line in text.splitlines():
        m = _SS_ADDR.match(line)
        if m:
            close()
            host, peer = m.group(1).strip("[]"), m.group(3).strip("[]")
            addr = ((host, int(m.group(2))), (peer, int(m.group(4))))
            fields = {}
        elif addr is not None:
            fields.update({k: int(v) for k, v in _SS_FIELD.findall(line)})
    close()
    return out


def _ip(args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args.split()], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {args} failed: {proc.stderr.strip()}")
    return proc


def _client_cmd(command: str, kwargs: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "tests.netns", command, json.dumps(kwargs)]


class ZoneNamespaces:
    """One network namespace per zone, wired to a bridge; `create()` then `destroy()`."""

    def __init__(
        self, zones: Sequence[str], *, tag: str | None = None, octet: int | None = None
    ) -> None:
        self.zones = list(zones)
        self.tag = tag or secrets.token_hex(3)
        # A random 10.x.0.0/24; each run has its own bridge, so even equal subnets never meet.
        self.octet = octet if octet is not None else random.randint(16, 250)
        self.namespaces = {zone: f"zf-{self.tag}-{zone}" for zone in self.zones}
        self.bridge_ns = f"zf-{self.tag}-br"
        self._created: list[str] = []

    def address(self, zone: str) -> str:
        return f"10.{self.octet}.0.{self.zones.index(zone) + 1}"

    def zone_of(self, address: str) -> str | None:
        for zone in self.zones:
            if self.address(zone) == address:
                return zone
        return None

    def create(self) -> ZoneNamespaces:
        for ns in [self.bridge_ns, *self.namespaces.values()]:
            try:
                proc = _ip(f"netns add {ns}", check=False)
            except FileNotFoundError:
                self.destroy()
                raise NetnsUnavailable("the ip command (iproute2) is not installed") from None
            if proc.returncode != 0:
                self.destroy()
                raise NetnsUnavailable(f"ip netns add {ns} failed: {proc.stderr.strip()}")
            self._created.append(ns)
        try:
            self._wire()
        except BaseException:
            self.destroy()
            raise
        return self

    def _wire(self) -> None:
        br = self.bridge_ns
        for ns in [br, *self.namespaces.values()]:
            # No IPv6 router solicitations or DAD on the veths: the counters carry only our traffic.
            self.run_in(ns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"])
            _ip(f"-n {ns} link set lo up")
        _ip(f"-n {br} link add br0 type bridge")
        _ip(f"-n {br} link set br0 up")
        for i, zone in enumerate(self.zones, 1):
            ns, port = self.namespaces[zone], f"vz{i}"
            # Both ends are created straight in their namespaces: nothing appears in the root.
            _ip(f"link add {ZONE_IFACE} netns {ns} type veth peer name {port} netns {br}")
            _ip(f"-n {br} link set {port} master br0 up")
            _ip(f"-n {ns} addr add {self.address(zone)}/24 dev {ZONE_IFACE}")
            _ip(f"-n {ns} link set {ZONE_IFACE} up")

    def destroy(self) -> None:
        """Delete every namespace this object created (their veths and the bridge go with them)."""
        errors = []
        while self._created:
            ns = self._created.pop()
            proc = _ip(f"netns del {ns}", check=False)
            if proc.returncode != 0:
                errors.append(f"{ns}: {proc.stderr.strip()}")
        if errors:
            raise RuntimeError("could not delete namespaces: " + "; ".join(errors))

    # -- cutting a zone off ----------------------------------------------------------------

    def _bridge_port(self, zone: str) -> str:
        return f"vz{self.zones.index(zone) + 1}"

    def cut(self, zone: str) -> None:
        """Cut the zone off from the others: its bridge port stops forwarding, so every frame
        to or from it is dropped in the network. Nothing answers, nothing resets, and both
        ends' links stay up, so their TCP stacks see silence, as across a real partition.
        Inside the zone (over `lo`) everything still flows."""
        self._port_state(zone, "disabled")

    def heal(self, zone: str) -> None:
        """Undo `cut`: the zone's bridge port forwards again (no STP here: at once)."""
        self._port_state(zone, "forwarding")

    def _port_state(self, zone: str, state: str) -> None:
        number = {"disabled": "0", "forwarding": "3"}[state]
        port = self._bridge_port(zone)
        self.run_in(self.bridge_ns, ["bridge", "link", "set", "dev", port, "state", number])
        shown = self.run_in(self.bridge_ns, ["bridge", "link", "show", "dev", port])
        if f"state {state}" not in shown:
            raise RuntimeError(f"{port} of {zone} is not {state}: {shown.strip()}")

    # -- running things inside a zone ------------------------------------------------------

    def argv(self, zone: str, cmd: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[zone], *cmd]

    def run_in(self, ns: str, cmd: Sequence[str], timeout: float = 30) -> str:
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,  # so `-m tests.netns` imports
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} in {ns} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def run(self, zone: str, cmd: Sequence[str], timeout: float = 30) -> str:
        return self.run_in(self.namespaces[zone], cmd, timeout)

    def client_argv(self, zone: str, command: str, /, **kwargs: Any) -> list[str]:
        return self.argv(zone, _client_cmd(command, kwargs))

    def client(self, zone: str, command: str, /, *, run_timeout: float = 120, **kwargs: Any) -> Any:
        """Run a client command of this module in the zone's namespace; returns its result."""
        return json.loads(self.run(zone, _client_cmd(command, kwargs), timeout=run_timeout))

    # -- kernel counters -------------------------------------------------------------------

    def interface_counters(self, zone: str) -> InterfaceCounters:
        base = f"/sys/class/net/{ZONE_IFACE}/statistics"
        names = ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets"]
        out = self.run(zone, ["cat", *(f"{base}/{n}" for n in names)])
        return InterfaceCounters(*(int(v) for v in out.split()))

    def is_cross_zone(self, zone: str, sock: TcpSocket) -> bool:
        own = self.address(zone)
        return (
            sock.local[0] == own and sock.peer[0] != own and self.zone_of(sock.peer[0]) is not None
        )

    def cross_zone_sockets(self, zone: str) -> list[TcpSocket]:
        """This zone's open TCP sockets whose peer is in another zone's namespace."""
        return [s for s in parse_ss(self.run(zone, ["ss", "-tinH"])) if self.is_cross_zone(zone, s)]


class TcpLedger:
    """Every cross-zone TCP socket of each zone: the open ones and those already destroyed.

    `ss -tinHE` in each namespace reports each socket as it is destroyed, with its final
    counters, so a connection that came and went (a client that closed) is counted too.
    Closed sockets include their FIN in the byte counts: at most a byte or two per socket.
    """

    def __init__(self, ns: ZoneNamespaces, log_dir: Path) -> None:
        self.ns = ns
        self.log_dir = log_dir
        self._monitors: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self) -> TcpLedger:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for zone in self.ns.zones:
            path = self.log_dir / f"ss-events-{zone}.txt"
            with open(path, "wb") as out:
                proc = subprocess.Popen(
                    self.ns.argv(zone, ["stdbuf", "-oL", "ss", "-tinHE"]),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self._monitors[zone] = (proc, path)
        time.sleep(0.2)  # let each ss subscribe before anything connects
        for zone, (proc, path) in self._monitors.items():
            if proc.poll() is not None:
                raise RuntimeError(f"ss -E in {zone} exited: {path.read_text(errors='replace')}")
        return self

    def stop(self) -> None:
        for proc, _ in self._monitors.values():
            if proc.poll() is None:
                # ss only looks at its stop flag between events: SIGTERM may not be enough.
                proc.terminate()
                try:
                    proc.wait(1)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def sockets(self, zone: str) -> list[TcpSocket]:
        """Cross-zone sockets of the zone, open or destroyed, one entry per connection."""
        by_tuple = {(s.local, s.peer): s for s in self.ns.cross_zone_sockets(zone)}
        time.sleep(0.2)  # events of sockets destroyed meanwhile reach the log
        _, path = self._monitors[zone]
        for s in parse_ss(path.read_text(errors="replace")):
            if self.ns.is_cross_zone(zone, s):
                by_tuple[(s.local, s.peer)] = s  # final counters win over a live snapshot
        return list(by_tuple.values())


def netns_fleet_toml(
    data_dir: Path,
    ns: ZoneNamespaces,
    base_port: int,
    secret: str,
    main_zones: Collection[str] | None = None,
) -> str:
    """`zonefleet up --zones N`'s fleet, with every node bound to its zone's namespace address;
    with `main_zones`, only the mains of those zones (the others hold a proxy only).

    Ports may stay as they are: each namespace has its own port space.
    """
    text = local_zones_fleet_toml(data_dir, base_port, len(ns.zones), secret)
    blocks = re.split(r"(?m)^(?=\[)", text)
    out = []
    for block in blocks:
        if block.startswith(("[[main_brokers]]", "[[proxies]]")):
            m = re.search(r'(?m)^zone\s*=\s*"([^"]+)"', block)
            if m is None or m.group(1) not in ns.zones:
                raise ValueError(f"fleet block without a known zone:\n{block}")
            if (
                block.startswith("[[main_brokers]]")
                and main_zones is not None
                and m.group(1) not in main_zones
            ):
                continue
            addr = ns.address(m.group(1))
            block = re.sub(r'(?m)^((?:admin_)?host\s*=\s*)"[^"]*"', rf'\1"{addr}"', block)
        out.append(block)
    return "".join(out)


@dataclass
class NodeProcess:
    role: str  # "main" or "proxy"
    node_id: int
    zone: str
    admin_url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def label(self) -> str:
        return f"{self.role}-{self.node_id}"


class NamespacedFleet:
    """Each main broker and proxy of the fleet TOML as its own process in its zone's namespace."""

    def __init__(
        self,
        ns: ZoneNamespaces,
        data_dir: Path,
        base_port: int = 19092,
        main_zones: Collection[str] | None = None,
    ) -> None:
        self.ns = ns
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = data_dir / "fleet.toml"
        self.config_path.write_text(
            netns_fleet_toml(data_dir, ns, base_port, secrets.token_hex(32), main_zones)
        )
        self.config_path.chmod(0o600)
        self.config: FleetConfig = load_fleet_config(self.config_path, discover=None)
        self.nodes: list[NodeProcess] = []

    def bootstrap(self, zone: str) -> str:
        for p in self.config.proxies:
            if p.proxy.zone == zone:
                return f"{p.proxy.host}:{p.proxy.port}"
        raise KeyError(f"no proxy in zone {zone}")

    def start(self, timeout: float = 60.0) -> NamespacedFleet:
        # Mains first: a proxy syncs its mirror from the mains' internal RPC as it starts.
        mains = [
            ("main", m.broker.node_id, m.broker.zone, m.admin_host, m.admin_port)
            for m in self.config.mains
        ]
        proxies = [
            ("proxy", p.proxy.node_id, p.proxy.zone, p.admin_host, p.admin_port)
            for p in self.config.proxies
        ]
        for group in (mains, proxies):
            started = [self._spawn(*spec) for spec in group]
            for node in started:
                self._wait_healthy(node, timeout)
        return self

    def restart(self, node: NodeProcess, timeout: float = 60.0) -> NodeProcess:
        """Start an exited node again, as its supervisor would (its log goes on)."""
        assert node.proc.poll() is not None, f"{node.label} is still running"
        host, port = node.admin_url.removeprefix("http://").rsplit(":", 1)
        self.nodes.remove(node)
        again = self._spawn(node.role, node.node_id, node.zone, host, int(port), mode="ab")
        self._wait_healthy(again, timeout)
        return again

    def _spawn(
        self, role: str, node_id: int, zone: str, host: str, port: int, mode: str = "wb"
    ) -> NodeProcess:
        log = self.data_dir / f"{role}-{node_id}.log"
        cmd = ["main-broker" if role == "main" else "proxy", "--config", str(self.config_path)]
        with open(log, mode) as out:
            proc = subprocess.Popen(
                self.ns.argv(zone, [ZONEFLEET, *cmd, "--node-id", str(node_id)]),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        node = NodeProcess(role, node_id, zone, f"http://{host}:{port}", proc, log)
        self.nodes.append(node)
        return node

    def _wait_healthy(self, node: NodeProcess, timeout: float) -> None:
        url = f"{node.admin_url}/healthz"
        waiter = subprocess.Popen(
            self.ns.client_argv(node.zone, "wait-http", url=url, timeout=timeout),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            # Poll both, so a node that dies at start fails the wait at once.
            while waiter.poll() is None and node.proc.poll() is None:
                time.sleep(0.05)
        finally:
            if waiter.poll() is None:
                waiter.kill()
            _, err = waiter.communicate()
        if waiter.returncode != 0 or node.proc.poll() is not None:
            raise RuntimeError(
                f"{node.label} did not become healthy (exit {node.proc.returncode}): "
                f"{err.decode(errors='replace').strip()}\n{self.log_tail(node)}"
            )

    def metrics(self, node: NodeProcess) -> str:
        """The node's Prometheus text, fetched from inside its own namespace (over lo)."""
        return str(self.ns.client(node.zone, "http-get", url=f"{node.admin_url}/metrics")["body"])

    def log_tail(self, node: NodeProcess, lines: int = 40) -> str:
        try:
            text = node.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {node.role} {node.node_id} ({node.zone}) ---\n" + "\n".join(text)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every node (a clean shutdown flushes the accounting), SIGKILL stragglers."""
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()


# -- the client side, run inside a namespace ------------------------------------------------


def wait_http(url: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return {"status": resp.status}
        except Exception as exc:  # not up yet, or 503 while starting
            last = repr(exc)
        time.sleep(0.1)
    raise SystemExit(f"{url} not healthy after {timeout}s: {last}")


def http_get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return {"status": resp.status, "body": resp.read().decode()}


def _client_conf(bootstrap: str, zone: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "client.id": f"zone={zone}"}


def _digests(partitions: dict[int, Any], counts: dict[int, int]) -> dict[str, Any]:
    return {str(p): {"count": counts[p], "sha256": d.hexdigest()} for p, d in partitions.items()}


def create_topic(bootstrap: str, zone: str, topic: str, partitions: int) -> dict[str, Any]:
    """Create the topic; report its leaders and brokers as a client of this zone sees them."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(_client_conf(bootstrap, zone))
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cluster = admin.list_topics(topic, timeout=10)
        meta = cluster.topics[topic]
        if meta.error is None and len(meta.partitions) == partitions:
            break
        time.sleep(0.2)
    return {
        "leaders": {str(p): m.leader for p, m in meta.partitions.items()},
        "brokers": {str(b.id): f"{b.host}:{b.port}" for b in cluster.brokers.values()},
    }


def leaders(bootstrap: str, zone: str, topic: str) -> dict[str, int]:
    """Partition -> leader id, as a client of the zone bootstrapping there sees them."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient(_client_conf(bootstrap, zone)).list_topics(topic, timeout=30)
    return {str(p): m.leader for p, m in meta.topics[topic].partitions.items()}


def produce(
    bootstrap: str,
    zone: str,
    topic: str,
    partitions: list[int],
    messages: int,
    value_bytes: int,
    batch_bytes: int,
) -> dict[str, Any]:
    """Produce round-robin over `partitions`; report per partition a digest of the values."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **_client_conf(bootstrap, zone),
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "none",
            "batch.size": batch_bytes,
            "linger.ms": 50,
        }
    )
    digests = {p: hashlib.sha256() for p in partitions}
    counts = dict.fromkeys(partitions, 0)
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        # Delivery reports arrive in offset order per partition.
        digests[msg.partition()].update(msg.value())
        counts[msg.partition()] += 1

    pool = os.urandom(value_bytes * 64)  # random: no codec could shrink it
    payload = 0
    for i in range(messages):
        value = pool[(i % 64) * value_bytes : (i % 64 + 1) * value_bytes]
        part = partitions[i % len(partitions)]
        while True:
            try:
                producer.produce(topic, value, partition=part, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        payload += len(value)
    left = producer.flush(60)
    if left or errors:
        raise SystemExit(f"produce failed: {left} undelivered, errors {errors[:5]}")
    return {"payload_bytes": payload, "partitions": _digests(digests, counts)}


def consume(
    bootstrap: str, zone: str, topic: str, expect: dict[str, int], timeout: float = 60.0
) -> dict[str, Any]:
    """Read `expect[partition]` records of each partition from offset 0, checking the order."""
    from confluent_kafka import Consumer, TopicPartition

    want = {int(p): n for p, n in expect.items()}
    consumer = Consumer(
        {
            **_client_conf(bootstrap, zone),
            "group.id": f"netns-{zone}-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in want])
    digests = {p: hashlib.sha256() for p in want}
    counts = dict.fromkeys(want, 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(counts[p] < want[p] for p in want):
        for msg in consumer.consume(500, 0.5):
            p, value = msg.partition(), msg.value()
            if msg.error() or p is None or value is None:
                continue
            if msg.offset() != counts[p]:
                raise SystemExit(f"partition {p}: offset {msg.offset()}, expected {counts[p]}")
            digests[p].update(value)
            counts[p] += 1
    consumer.close()
    return {"partitions": _digests(digests, counts)}


def _write_progress(path: str, progress: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(progress, f)
    os.replace(tmp, path)


def _error_entry(err: Any) -> dict[str, Any]:
    return {
        "name": err.name(),
        "str": err.str(),
        "retriable": bool(err.retriable()),
        "fatal": bool(err.fatal()),
        "t": time.time(),
    }


def produce_stream(
    bootstrap: str,
    zone: str,
    topic: str,
    partitions: int,
    progress: str,
    stop: str,
    message_timeout_ms: int = 120000,
    rate: float = 200.0,
) -> dict[str, Any]:
    """Produce (acks=all, idempotent) `<zone>-<n>` round-robin at about `rate` a second until
    the file `stop` exists, then flush. Reports each acknowledged record as (partition, offset,
    key, time acknowledged), each failed one as (key, error), and the client's own errors;
    `progress` holds the counts so far, per partition too, rewritten as they change."""
    from confluent_kafka import Producer

    client_errors: list[dict[str, Any]] = []
    # librdkafka's own counters, summed over brokers: requests retried, failed, timed out.
    stats = {"txretries": 0, "txerrs": 0, "req_timeouts": 0}

    def on_stats(text: str) -> None:
        brokers = json.loads(text).get("brokers", {}).values()
        for name in stats:
            stats[name] = sum(int(b.get(name, 0)) for b in brokers)

    producer = Producer(
        {
            **_client_conf(bootstrap, zone),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": message_timeout_ms,
            "reconnect.backoff.max.ms": 1000,
            "statistics.interval.ms": 200,
            "stats_cb": on_stats,
            "error_cb": lambda err: client_errors.append(_error_entry(err)),
            # The idempotence log (epoch bumps, sequence gaps) on stderr, for a post-mortem.
            "debug": "eos",
        }
    )
    acked: list[tuple[int, int, str, float]] = []
    failed: list[tuple[str, dict[str, Any]]] = []
    by_partition = dict.fromkeys(range(partitions), 0)

    def delivered(err: Any, msg: Any) -> None:
        key = msg.key().decode()
        if err is not None:
            failed.append((key, _error_entry(err)))
            return
        acked.append((msg.partition(), msg.offset(), key, time.time()))
        by_partition[msg.partition()] += 1

    def report() -> None:
        _write_progress(
            progress,
            {
                "sent": sent,
                "acked": len(acked),
                "failed": len(failed),
                "client_errors": len(client_errors),
                "by_partition": by_partition,
                "last_ack": acked[-1][3] if acked else None,
                **stats,
            },
        )

    sent = 0
    last = 0.0
    start = time.monotonic()
    while not os.path.exists(stop):
        if sent < (time.monotonic() - start) * rate:
            key = f"{zone}-{sent}"
            try:
                producer.produce(
                    topic, key.encode(), key=key, partition=sent % partitions, on_delivery=delivered
                )
                sent += 1
            except BufferError:
                pass
        producer.poll(0.002)
        if time.monotonic() - last > 0.1:
            report()
            last = time.monotonic()
    left = producer.flush(message_timeout_ms / 1000 + 30)
    report()
    return {
        "sent": sent,
        "acked": acked,
        "failed": failed,
        "client_errors": client_errors,
        "unflushed": left,
        "stats": stats,
    }


def probe(bootstrap: str, zone: str, topic: str, timeout_s: float) -> dict[str, Any]:
    """What a client sees of partition 0 within `timeout_s`: one record produced (idempotent,
    acks=all, that delivery timeout) and the partition's offsets asked for; each step's error
    name (None: it worked) and how long it took."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    out: dict[str, Any] = {}
    producer = Producer(
        {
            **_client_conf(bootstrap, zone),
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": int(timeout_s * 1000),
        }
    )
    errors: list[Any] = []
    t0 = time.monotonic()
    producer.produce(topic, b"probe", partition=0, on_delivery=lambda err, _m: errors.append(err))
    producer.flush(timeout_s + 10)
    err = errors[0] if errors else None
    out["produce"] = {
        "error": None if err is None else err.name(),
        "retriable": None if err is None else bool(err.retriable()),
        "seconds": round(time.monotonic() - t0, 2),
    }
    consumer = Consumer({**_client_conf(bootstrap, zone), "group.id": "probe"})
    t0 = time.monotonic()
    try:
        consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s)
        name, retriable = None, None
    except KafkaException as exc:
        name, retriable = exc.args[0].name(), bool(exc.args[0].retriable())
    out["offsets"] = {
        "error": name,
        "retriable": retriable,
        "seconds": round(time.monotonic() - t0, 2),
    }
    consumer.close()
    return out


def tail(
    bootstrap: str, zone: str, topic: str, partitions: int, progress: str, stop: str
) -> dict[str, Any]:
    """Read every partition from offset 0 as records arrive until the file `stop` exists, then
    up to the high watermarks of that moment; reports (partition, offset, key) of each record
    in the order read, and the client's errors. `progress` holds the count read so far."""
    from confluent_kafka import Consumer, TopicPartition

    client_errors: list[dict[str, Any]] = []
    consumer = Consumer(
        {
            **_client_conf(bootstrap, zone),
            "group.id": f"netns-tail-{zone}-{secrets.token_hex(4)}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "reconnect.backoff.max.ms": 1000,
            "error_cb": lambda err: client_errors.append(_error_entry(err)),
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[tuple[int, int, str]] = []
    message_errors: list[dict[str, Any]] = []
    next_offset = dict.fromkeys(range(partitions), 0)
    latest: dict[str, int] = {}  # the highest `<zone>-<n>` read of each producer
    ends: dict[int, int] | None = None
    last = 0.0
    while ends is None or any(next_offset[p] < ends[p] for p in ends):
        for msg in consumer.consume(500, 0.1):
            err = msg.error()
            if err is not None:
                message_errors.append(_error_entry(err))
                continue
            p, offset = msg.partition(), msg.offset()
            assert p is not None and offset is not None
            key = (msg.key() or b"").decode()
            records.append((p, offset, key))
            next_offset[p] = offset + 1
            writer, _, n = key.rpartition("-")
            if n.isdigit():
                latest[writer] = max(latest.get(writer, -1), int(n))
        if time.monotonic() - last > 0.1:
            _write_progress(
                progress,
                {"read": len(records), "client_errors": len(client_errors), "latest": latest},
            )
            last = time.monotonic()
        if ends is None and os.path.exists(stop):
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)
            }
    consumer.close()
    _write_progress(progress, {"read": len(records), "client_errors": len(client_errors)})
    return {"records": records, "client_errors": client_errors, "message_errors": message_errors}


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    "wait-http": wait_http,
    "http-get": http_get,
    "create-topic": create_topic,
    "produce": produce,
    "consume": consume,
    "leaders": leaders,
    "probe": probe,
    "produce-stream": produce_stream,
    "tail": tail,
}


def main(argv: list[str]) -> int:
    """`python -m tests.netns COMMAND JSON-KWARGS`: prints the command's result as JSON."""
    command, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    print(json.dumps(COMMANDS[command](**kwargs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
