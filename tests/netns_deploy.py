"""The Terraform deployment on one machine: the layout rendered, zones as network namespaces
holding the layout's addresses, AWS's regional services in a namespace of their own, each node
configured by its own rendered user data and started as its systemd unit says.

- `render_layout` applies a provider-free root configuration that calls the layout module
  (terraform/modules/zonefleet/modules/layout) with given inputs, once for the fleet and once
  per node with that node's own host paths (each node is its own machine: its own
  /etc/zonefleet, /var/lib/zonefleet and /etc/systemd/system, all under a temp dir).
- `DeployNamespaces` is `tests.netns.ZoneNamespaces` with the layout's addresses: each zone's
  `eth0` holds the zone's bootstrap address (its NLB's in AWS) and its mains' fixed addresses,
  with the VPC's prefix so every zone is on-link through the bridge, plus a `regional`
  namespace on the same bridge for the AWS services (moto: S3 and SSM).
- `Host` is one node's machine: its rendered user data, run in its zone's namespace with a
  `systemctl` shim first in PATH, then the node started from the unit the shim was asked to
  enable (its ExecStart, its Environment), in the zone's namespace.

Run as `python -m tests.netns_deploy COMMAND JSON-KWARGS` (inside a namespace) it is also the
helper the test runs there: AWS set-up against moto, and Kafka clients.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import random
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tests.netns import (
    REPO,
    ZONE_IFACE,
    TcpLedger,
    TcpSocket,
    ZoneNamespaces,
    _ip,
    parse_ss,
)

MODULE = REPO / "terraform" / "modules" / "zonefleet"
LAYOUT_MODULE = MODULE / "modules" / "layout"
EXAMPLE = REPO / "terraform" / "examples" / "three-az"
ZONEFLEET = Path(sys.executable).with_name("zonefleet")  # this checkout's, the pinned release
REGIONAL = "regional"
UNIT_NAME = "zonefleet.service"
# The PATH cloud-init and systemd give a process on a stock Linux image.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# -- Terraform --------------------------------------------------------------------------------


def terraform_binary() -> str:
    found = shutil.which("terraform") or "/usr/local/bin/terraform"
    if not Path(found).exists():
        raise RuntimeError("no terraform CLI (the machines have /usr/local/bin/terraform)")
    return found


def _hcl_value(value: Any) -> Any:
    """python-hcl2 keeps HCL string literals quoted ('"us-east-1"'); plain Python values back."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return json.loads(value)
    if isinstance(value, list):
        return [_hcl_value(v) for v in value]
    if isinstance(value, dict):
        return {_hcl_value(k): _hcl_value(v) for k, v in value.items() if not k.startswith("__")}
    return value


def _hcl_load(path: Path) -> dict[str, Any]:
    import hcl2

    with open(path) as f:
        return dict(hcl2.load(f))


def _hcl_blocks(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """The `kind` blocks (variable, module, ...) of a parsed .tf file: name -> attributes."""
    out: dict[str, dict[str, Any]] = {}
    for block in doc.get(kind, []):
        for name, body in block.items():
            out[_hcl_value(name)] = body
    return out


def _abbreviate_region(region: str) -> str:
    """us-east-1 -> use1, ap-northeast-1 -> apne1: the prefix of the region's AZ ids."""
    parts = region.split("-")
    directions = {"northeast": "ne", "southeast": "se", "northwest": "nw", "southwest": "sw"}
    middle = "".join(directions.get(p, p[0]) for p in parts[1:-1])
    return f"{parts[0]}{middle}{parts[-1]}"


# An account's AZ name -> AZ id mapping is its own (only ids are stable across accounts); the
# simulated account maps the i-th AZ name to az<ACCOUNT_AZ_NUMBERS[i]>.
ACCOUNT_AZ_NUMBERS = (4, 6, 1, 2, 3, 5)


@dataclass
class ExampleValues:
    """What terraform/examples/<name>/ gives the layout, as Terraform evaluates it."""

    variables: dict[str, Any]  # the example's variables' defaults
    subnets_expression: str  # the example's own private-subnet expression (AZ -> CIDR)
    mains_per_zone: int
    az_ids: dict[str, str]  # resource-derived (data.aws_subnet): the simulated account's


def example_values(example_dir: Path, module_dir: Path) -> ExampleValues:
    variables: dict[str, Any] = {}
    locals_: dict[str, Any] = {}
    modules: dict[str, dict[str, Any]] = {}
    for tf in sorted(example_dir.glob("*.tf")):
        doc = _hcl_load(tf)
        for name, body in _hcl_blocks(doc, "variable").items():
            if "default" in body:
                variables[name] = _hcl_value(body["default"])
        for block in doc.get("locals", []):
            locals_.update({k: v for k, v in block.items() if not k.startswith("__")})
        modules.update(_hcl_blocks(doc, "module"))
    module_defaults = {
        name: _hcl_value(body.get("default"))
        for tf in sorted(module_dir.glob("*.tf"))
        for name, body in _hcl_blocks(_hcl_load(tf), "variable").items()
    }
    fleet = next(iter(modules.values()))
    mains = fleet.get("mains_per_zone", module_defaults["mains_per_zone"])
    prefix = _abbreviate_region(variables["region"])
    az_ids = {
        az: f"{prefix}-az{ACCOUNT_AZ_NUMBERS[i % len(ACCOUNT_AZ_NUMBERS)]}"
        for i, az in enumerate(variables["azs"])
    }
    return ExampleValues(variables, str(locals_["private_subnets"]), int(mains), az_ids)


@dataclass
class RenderedLayout:
    outputs: dict[str, Any]  # the layout module's outputs, fleet-wide
    zones: dict[str, dict[str, str]]  # AZ name -> {az_id, subnet_cidr}, as the layout got it
    user_data: dict[str, str]  # node key -> its user data, rendered with its own host paths
    fleet_toml: dict[str, str]  # node key -> its fleet TOML, as in its user data

    @property
    def node_keys(self) -> list[str]:
        return list(self.outputs["node_keys"])


def render_layout(
    example: ExampleValues,
    resources: Mapping[str, Any],
    hosts_root: Path,
    install_dir: Path,
    work_dir: Path,
) -> RenderedLayout:
    """Apply a provider-free root configuration (JSON syntax) that evaluates the example's own
    subnet expression with the example's variables, and calls the layout module with them, with
    `resources` (what AWS resources would give: bucket URLs, the WAL URL, the SSM parameter
    name) and the simulation's host paths, per node under hosts_root/<node key>/. The
    repository is not touched: the configuration, its state and TF_DATA_DIR live in
    work_dir."""
    work_dir.mkdir(parents=True, exist_ok=True)
    v = example.variables
    inputs = {
        "cluster_id": v["cluster_id"],
        "region": v["region"],
        "zonefleet_version": v["zonefleet_version"],
        "mains_per_zone": example.mains_per_zone,
        "zones": "${local.zones}",
        **resources,
    }
    source = str(LAYOUT_MODULE)
    root = {
        "variable": {name: {"default": v[name]} for name in ("azs", "vpc_cidr", "region")},
        "locals": {
            "private_subnets": example.subnets_expression,
            "az_ids": example.az_ids,
            "zones": "${{for az, cidr in local.private_subnets : az => "
            "{az_id = local.az_ids[az], subnet_cidr = cidr}}}",
        },
        "module": {
            "fleet": {
                "source": source,
                **inputs,
                **host_paths(str(hosts_root / "_fleet"), str(install_dir)),
            },
            "host": {
                "source": source,
                "for_each": "${toset(module.fleet.node_keys)}",
                **inputs,
                **host_paths(f"{hosts_root}/${{each.key}}", str(install_dir)),
            },
        },
        "output": {
            "layout": {"value": "${module.fleet}"},
            "zones": {"value": "${local.zones}"},
            "user_data": {"value": "${{for k, m in module.host : k => m.user_data[k]}}"},
            "fleet_toml": {"value": "${{for k, m in module.host : k => m.fleet_toml[k]}}"},
        },
    }
    (work_dir / "main.tf.json").write_text(json.dumps(root, indent=2))
    env = {
        **os.environ,
        "TF_DATA_DIR": str(work_dir / ".terraform"),
        "TF_IN_AUTOMATION": "1",
        "TF_INPUT": "0",
        "CHECKPOINT_DISABLE": "1",
    }
    tf = terraform_binary()
    for args in (["init", "-no-color"], ["apply", "-auto-approve", "-no-color"]):
        proc = subprocess.run(
            [tf, *args], cwd=work_dir, env=env, capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise RuntimeError(f"terraform {args[0]} failed:\n{proc.stdout}\n{proc.stderr}")
    proc = subprocess.run(
        [tf, "output", "-json"], cwd=work_dir, env=env, capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise RuntimeError(f"terraform output failed:\n{proc.stderr}")
    out = {k: val["value"] for k, val in json.loads(proc.stdout).items()}
    return RenderedLayout(out["layout"], out["zones"], out["user_data"], out["fleet_toml"])


def host_paths(root: str, install_dir: str) -> dict[str, str]:
    return {
        "config_dir": f"{root}/etc/zonefleet",
        "data_dir": f"{root}/var/lib/zonefleet",
        "systemd_dir": f"{root}/etc/systemd/system",
        "install_dir": install_dir,
    }


# -- the network ------------------------------------------------------------------------------


def enclosing_network(cidrs: Sequence[str]) -> ipaddress.IPv4Network:
    """The smallest network holding every CIDR (the VPC's, when it is not given)."""
    nets = [ipaddress.IPv4Network(c) for c in cidrs]
    net = nets[0]
    while not all(n.subnet_of(net) for n in nets):
        net = net.supernet()
    return net


def regional_address(vpc: ipaddress.IPv4Network, subnets: Sequence[str]) -> str:
    """An address of the VPC in none of the zones' subnets: where the AWS services answer."""
    taken = [ipaddress.IPv4Network(s) for s in subnets]
    for addr in reversed(list(vpc.hosts())[-4096:]):
        if not any(addr in s for s in taken):
            return str(addr)
    raise ValueError(f"no address of {vpc} outside the zones' subnets {subnets}")


class DeployNamespaces(ZoneNamespaces):
    """Zones whose `eth0` holds the layout's addresses, and a `regional` namespace.

    An address of a zone's own is local (over `lo`); a byte on a zone's `eth0` went to another
    zone or to the regional services.
    """

    def __init__(
        self,
        addresses: Mapping[str, Sequence[str]],
        network: ipaddress.IPv4Network,
        regional: str,
        *,
        tag: str,
    ) -> None:
        super().__init__(list(addresses), tag=tag)
        self.addresses = {zone: list(a) for zone, a in addresses.items()}
        self.network = network
        self.regional = regional
        self.namespaces[REGIONAL] = f"zf-{tag}-{REGIONAL}"  # created and wired with the zones

    def address(self, zone: str) -> str:
        return self.regional if zone == REGIONAL else self.addresses[zone][0]

    def zone_of(self, address: str) -> str | None:
        for zone, addrs in self.addresses.items():
            if address in addrs:
                return zone
        return REGIONAL if address == self.regional else None

    def _wire(self) -> None:
        br = self.bridge_ns
        for ns in [br, *self.namespaces.values()]:
            self.run_in(ns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"])
            _ip(f"-n {ns} link set lo up")
        _ip(f"-n {br} link add br0 type bridge")
        _ip(f"-n {br} link set br0 up")
        plan = {**self.addresses, REGIONAL: [self.regional]}
        for i, (zone, addrs) in enumerate(plan.items(), 1):
            ns, port = self.namespaces[zone], f"vz{i}"
            _ip(f"link add {ZONE_IFACE} netns {ns} type veth peer name {port} netns {br}")
            _ip(f"-n {br} link set {port} master br0 up")
            for addr in addrs:
                _ip(f"-n {ns} addr add {addr}/{self.network.prefixlen} dev {ZONE_IFACE}")
            _ip(f"-n {ns} link set {ZONE_IFACE} up")

    def peer_kind(self, zone: str, sock: TcpSocket) -> str:
        """ "local" (the zone's own addresses or loopback), "cross-zone" or "regional"."""
        peer = self.zone_of(sock.peer[0])
        if peer is None or peer == zone:
            return "local"
        return REGIONAL if peer == REGIONAL else "cross-zone"

    def is_cross_zone(self, zone: str, sock: TcpSocket) -> bool:
        return self.peer_kind(zone, sock) == "cross-zone"


class DeployLedger(TcpLedger):
    """Every socket of each zone to another zone or to the regional services, open or closed."""

    def classified(self, zone: str) -> dict[str, list[TcpSocket]]:
        assert isinstance(self.ns, DeployNamespaces)
        ns = self.ns
        live = parse_ss(ns.run(zone, ["ss", "-tinH"]))
        by_tuple = {(s.local, s.peer): s for s in live if ns.peer_kind(zone, s) != "local"}
        _, path = self._monitors[zone]
        # The monitor reports a socket when it is destroyed; a destroyed socket is no longer
        # in the live list, so whatever closed before the live read is in the log by now or
        # arrives within the monitor's own latency: wait until the log stops growing.
        size = -1
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            now = path.stat().st_size
            if now == size:
                break
            size = now
            time.sleep(0.1)
        for s in parse_ss(path.read_text(errors="replace")):
            if ns.peer_kind(zone, s) != "local":
                by_tuple[(s.local, s.peer)] = s  # final counters win over a live snapshot
        out: dict[str, list[TcpSocket]] = {"cross-zone": [], REGIONAL: []}
        for s in by_tuple.values():
            out[ns.peer_kind(zone, s)].append(s)
        return out


# -- what crossed: full frames ----------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    src: tuple[str, int]
    dst: tuple[str, int]
    payload: bytes


def tcp_segments(path: Path) -> list[Segment]:
    """The TCP/IPv4 segments with a payload in a pcap file of Ethernet frames captured whole."""
    data = path.read_bytes()
    magics = {
        b"\xd4\xc3\xb2\xa1": "<",
        b"\xa1\xb2\xc3\xd4": ">",
        b"\x4d\x3c\xb2\xa1": "<",
        b"\xa1\xb2\x3c\x4d": ">",
    }
    endian = magics.get(data[:4])
    if endian is None or struct.unpack_from(endian + "I", data, 20)[0] & 0x0FFFFFFF != 1:
        raise ValueError(f"{path}: not a pcap file of Ethernet frames")
    out: list[Segment] = []
    pos = 24
    while pos + 16 <= len(data):
        _, _, caplen, length = struct.unpack_from(endian + "IIII", data, pos)
        frame = data[pos + 16 : pos + 16 + caplen]
        pos += 16 + caplen
        if caplen != length:
            raise ValueError(f"{path}: a frame of {length} B captured as {caplen} B")
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue  # not TCP over IPv4 (ARP)
        ip = frame[14:]
        ihl, total = (ip[0] & 0x0F) * 4, struct.unpack_from("!H", ip, 2)[0]
        tcp = ip[ihl:total]
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            sport, dport = struct.unpack_from("!HH", tcp, 0)
            src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
            out.append(Segment((src, sport), (dst, dport), payload))
    return out


class FrameCapture:
    """`tcpdump -s 0` on every zone's eth0: whole frames, payload included, for a window."""

    def __init__(self, ns: DeployNamespaces, out_dir: Path) -> None:
        self.ns = ns
        self.out_dir = out_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def path(self, zone: str) -> Path:
        return self.out_dir / f"{zone}.pcap"

    def start(self) -> FrameCapture:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for zone in self.ns.zones:
            cmd = ["tcpdump", "-i", ZONE_IFACE, "-n", "-s", "0", "-U", "-Z", "root"]
            cmd += ["-B", "16384", "-w", str(self.path(zone))]
            self.procs[zone] = subprocess.Popen(
                self.ns.argv(zone, cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        for zone, proc in self.procs.items():
            assert proc.stderr is not None
            line = proc.stderr.readline().decode(errors="replace")  # once it is attached
            if "listening on" not in line:
                self.stop()
                raise RuntimeError(f"tcpdump in {zone} did not start: {line}")
        return self

    def stop(self) -> dict[str, str]:
        """Stop the captures (SIGTERM flushes them); returns each one's closing statistics."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        stats = {}
        for zone, proc in self.procs.items():
            try:
                _, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            stats[zone] = err.decode(errors="replace")
        return stats


def payload_windows(pool: bytes, width: int) -> set[bytes]:
    """Every `width`-byte run of `pool`: any segment holding one carried produced payload."""
    return {pool[i : i + width] for i in range(len(pool) - width + 1)}


def find_payload(segment: bytes, windows: set[bytes], width: int) -> int:
    """Bytes of `segment` that lie in a run of produced payload (0: none of it)."""
    hits = [i for i in range(len(segment) - width + 1) if segment[i : i + width] in windows]
    covered: set[int] = set()
    for i in hits:
        covered.update(range(i, i + width))
    return len(covered)


def value_pool(seed: int, value_bytes: int) -> bytes:
    """The random values `produce` sends (64 of them, reused): the test knows them too."""
    return random.Random(seed).randbytes(value_bytes * 64)


# -- one node's machine -----------------------------------------------------------------------


@dataclass
class Unit:
    exec_start: list[str]
    environment: dict[str, str]
    working_directory: str | None
    text: str


def parse_unit(text: str) -> Unit:
    """ExecStart, Environment= and WorkingDirectory of a systemd service unit."""
    exec_start: list[str] = []
    env: dict[str, str] = {}
    workdir = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ExecStart="):
            exec_start = shlex.split(line[len("ExecStart=") :].lstrip("-@+!:"))
        elif line.startswith("Environment="):
            for assignment in shlex.split(line[len("Environment=") :]):
                name, _, value = assignment.partition("=")
                env[name] = value
        elif line.startswith("WorkingDirectory="):
            workdir = line[len("WorkingDirectory=") :].lstrip("-")
    if not exec_start:
        raise ValueError(f"no ExecStart in the unit:\n{text}")
    return Unit(exec_start, env, workdir, text)


SYSTEMCTL_SHIM = """#!/bin/sh
# systemctl of the simulation: records what the user data asks of systemd, starts nothing.
echo "$*" >> {log}
"""


class RunsInZones(Protocol):
    def argv(self, zone: str, cmd: Sequence[str]) -> list[str]: ...


@dataclass
class Host:
    """One node's machine: its user data, what it left behind, and the node it started."""

    key: str
    role: str  # "main" or "proxy"
    node_id: int
    zone: str
    root: Path  # its filesystem: etc/zonefleet, var/lib/zonefleet, etc/systemd/system
    user_data: str
    admin_url: str
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    runs: list[subprocess.CompletedProcess[str]] = field(default_factory=list)

    @property
    def config_dir(self) -> Path:
        return self.root / "etc" / "zonefleet"

    @property
    def systemd_dir(self) -> Path:
        return self.root / "etc" / "systemd" / "system"

    @property
    def journal(self) -> Path:
        """What systemd's journal would hold: the node's output, one file per start."""
        return self.root.parent / f"{self.key}.journal.{self.starts}.log"

    @property
    def systemctl_log(self) -> Path:
        return self.root.parent / f"{self.key}.systemctl.log"

    def wipe(self) -> None:
        """A new machine in the same place: nothing of the old one's disk is left."""
        if self.root.exists():
            shutil.rmtree(self.root)

    def run_user_data(self, ns: RunsInZones, env: Mapping[str, str]) -> str:
        """Run the rendered user data as cloud-init would (root, a plain environment), in the
        zone's namespace, with the systemctl shim first in PATH; returns the unit it enabled."""
        self.root.mkdir(parents=True, exist_ok=True)
        script = self.root.parent / f"{self.key}.user-data.sh"
        script.write_text(self.user_data)
        shim_dir = self.root.parent / f"{self.key}.shim"
        shim_dir.mkdir(exist_ok=True)
        shim = shim_dir / "systemctl"
        shim.write_text(SYSTEMCTL_SHIM.format(log=shlex.quote(str(self.systemctl_log))))
        shim.chmod(0o755)
        self.systemctl_log.unlink(missing_ok=True)
        run_env = {"PATH": f"{shim_dir}:{SYSTEM_PATH}", "HOME": "/root", "LANG": "C.UTF-8", **env}
        proc = subprocess.run(
            ns.argv(self.zone, ["/bin/bash", str(script)]),
            cwd="/",
            env=run_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.runs.append(proc)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{self.key}'s user data exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        calls = self.systemctl_log.read_text().splitlines()
        enabled = [c.split()[-1] for c in calls if c.startswith("enable --now ")]
        if calls[:1] != ["daemon-reload"] or len(enabled) != 1:
            raise RuntimeError(f"{self.key}'s user data asked systemctl for {calls}")
        return enabled[0]

    def unit(self, name: str) -> Unit:
        return parse_unit((self.systemd_dir / name).read_text())

    def start(self, ns: DeployNamespaces, unit: Unit, env: Mapping[str, str]) -> None:
        """Start the node as systemd would start the unit: its ExecStart, its Environment
        (plus `env`, the simulation's AWS endpoints and credentials), in the zone."""
        self.starts += 1
        base = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
        with open(self.journal, "wb") as out:
            self.proc = subprocess.Popen(
                ns.argv(self.zone, unit.exec_start),
                cwd=unit.working_directory or "/",
                env={**base, **unit.environment, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_healthy(self, ns: DeployNamespaces, timeout: float) -> None:
        """Until the node's /healthz answers 200, from inside its zone; fails at once when the
        node exits."""
        assert self.proc is not None
        waiter = subprocess.Popen(
            ns.client_argv(
                self.zone, "wait-http", url=f"{self.admin_url}/healthz", timeout=timeout
            ),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            while waiter.poll() is None and self.proc.poll() is None:
                time.sleep(0.05)
        finally:
            if waiter.poll() is None:
                waiter.kill()
            _, err = waiter.communicate()
        if waiter.returncode != 0 or self.proc.poll() is not None:
            raise RuntimeError(
                f"{self.key} did not become healthy (exit {self.proc.returncode}): "
                f"{err.decode(errors='replace').strip()}\n{self.log_tail()}"
            )

    def kill(self) -> None:
        """SIGKILL, as a machine that dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.journal.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {self.key} ({self.zone}), start {self.starts} ---\n" + "\n".join(text)


# -- helpers run inside a namespace ------------------------------------------------------------


def aws_setup(
    endpoint: str, region: str, bucket: str, parameter: str, secret: str
) -> dict[str, Any]:
    """What Terraform creates in AWS that the nodes read: the bucket, and the SSM SecureString."""
    import boto3

    kw: dict[str, Any] = {
        "endpoint_url": endpoint,
        "region_name": region,
        "aws_access_key_id": "terraform",
        "aws_secret_access_key": "terraform",
    }
    s3 = boto3.client("s3", **kw)
    if region == "us-east-1":
        s3.create_bucket(Bucket=bucket)
    else:
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    ssm = boto3.client("ssm", **kw)
    ssm.put_parameter(Name=parameter, Value=secret, Type="SecureString")
    return {"bucket": bucket, "parameter": parameter}


def _conf(bootstrap: str) -> dict[str, Any]:
    # No client.id zone tag: the zone comes from the listener the client reached.
    return {"bootstrap.servers": bootstrap, "client.id": "deploy-sim"}


def metadata(bootstrap: str, topic: str, partitions: int) -> dict[str, Any]:
    """Brokers and partition leaders as a client bootstrapping from `bootstrap` sees them."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_conf(bootstrap))
    deadline = time.monotonic() + 30
    while True:
        cluster = admin.list_topics(topic, timeout=10)
        meta = cluster.topics[topic]
        if meta.error is None and len(meta.partitions) == partitions:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{topic}: {meta.error}, {len(meta.partitions)} partitions")
        time.sleep(0.2)
    return {
        "brokers": {str(b.id): f"{b.host}:{b.port}" for b in cluster.brokers.values()},
        "leaders": {str(p): m.leader for p, m in meta.partitions.items()},
    }


def create_topic(bootstrap: str, topic: str, partitions: int) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(_conf(bootstrap))
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
    return metadata(bootstrap, topic, partitions)


def produce_stream(
    bootstrap: str, topic: str, partitions: int, progress: str, stop: str, value_bytes: int
) -> dict[str, Any]:
    """Produce (acks=all, idempotent) round-robin until the file `stop` exists; every
    acknowledged record is reported as (partition, offset the broker gave it, key, time sent,
    time acknowledged). `progress` holds the count of acknowledgements per partition,
    rewritten as they come."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **_conf(bootstrap),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120000,
            "reconnect.backoff.max.ms": 500,
        }
    )
    acked: list[tuple[int, int, str, float, float]] = []
    failed: list[tuple[str, str]] = []
    counts = dict.fromkeys(range(partitions), 0)
    sent_at: list[float] = []

    def delivered(err: Any, msg: Any) -> None:
        key = msg.key().decode()
        if err is not None:
            failed.append((key, str(err)))
            return
        sent = sent_at[int(key[1:])]
        acked.append((msg.partition(), msg.offset(), key, sent, time.time()))
        counts[msg.partition()] += 1

    def report() -> None:
        tmp = progress + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"acked": counts, "failed": len(failed)}, f)
        os.replace(tmp, progress)

    pad = os.urandom(value_bytes)
    i = 0
    last = 0.0
    while not os.path.exists(stop):
        key = f"k{i:08d}"
        value = key.encode() + pad
        try:
            producer.produce(topic, value, key=key, partition=i % partitions, on_delivery=delivered)
            sent_at.append(time.time())
            i += 1
        except BufferError:
            pass
        producer.poll(0.002)  # serve delivery reports; also paces the stream
        if time.monotonic() - last > 0.1:
            report()
            last = time.monotonic()
    left = producer.flush(150)
    report()
    return {"sent": i, "acked": acked, "failed": failed, "unflushed": left}


def consume_all(
    bootstrap: str, topic: str, partitions: int, timeout: float = 60.0
) -> dict[str, Any]:
    """Every record of every partition from offset 0 to the high watermark: offset -> key."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **_conf(bootstrap),
            "group.id": f"deploy-sim-{os.getpid()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        for p in range(partitions)
    }
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: dict[int, dict[int, str]] = {p: {} for p in range(partitions)}
    digests = {p: hashlib.sha256() for p in range(partitions)}
    deadline = time.monotonic() + timeout
    while any(len(records[p]) < ends[p] for p in ends) and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            p, offset = msg.partition(), msg.offset()
            if msg.error() or p is None or offset is None:
                continue
            if offset != len(records[p]):
                raise SystemExit(f"partition {p}: offset {offset} after {len(records[p])}")
            digests[p].update(msg.value() or b"")
            records[p][offset] = (msg.key() or b"").decode()
    consumer.close()
    return {
        "partitions": {
            str(p): {"count": len(records[p]), "sha256": digests[p].hexdigest()}
            for p in range(partitions)
        },
        "ends": {str(p): e for p, e in ends.items()},
        "records": {str(p): {str(o): k for o, k in r.items()} for p, r in records.items()},
    }


def produce(
    bootstrap: str, topic: str, partitions: int, messages: int, value_bytes: int, seed: int
) -> dict[str, Any]:
    """Produce `messages` values of `value_pool(seed)` round-robin (acks=all, idempotent, 64 KiB
    batches); report per partition the count and a digest of the values in offset order."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **_conf(bootstrap),
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "none",
            "batch.size": 64 * 1024,
            "linger.ms": 20,
        }
    )
    digests = {p: hashlib.sha256() for p in range(partitions)}
    counts = dict.fromkeys(range(partitions), 0)
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        digests[msg.partition()].update(msg.value())  # in offset order per partition
        counts[msg.partition()] += 1

    pool = value_pool(seed, value_bytes)  # random: nothing could compress it
    for i in range(messages):
        value = pool[(i % 64) * value_bytes : (i % 64 + 1) * value_bytes]
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(60)
    if left or errors:
        raise SystemExit(f"produce failed: {left} undelivered, errors {errors[:5]}")
    return {
        "payload_bytes": messages * value_bytes,
        "partitions": {
            str(p): {"count": counts[p], "sha256": digests[p].hexdigest()}
            for p in range(partitions)
        },
    }


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    "aws-setup": aws_setup,
    "create-topic": create_topic,
    "metadata": metadata,
    "produce": produce,
    "produce-stream": produce_stream,
    "consume-all": consume_all,
}


def helper_argv(command: str, kwargs: Mapping[str, Any]) -> list[str]:
    return [sys.executable, "-m", "tests.netns_deploy", command, json.dumps(dict(kwargs))]


def main(argv: list[str]) -> int:
    """`python -m tests.netns_deploy COMMAND JSON-KWARGS`: prints the result as JSON."""
    command, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    print(json.dumps(COMMANDS[command](**kwargs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
