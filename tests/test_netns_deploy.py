"""Issue 11, section 4: the Terraform deployment simulated on one machine.

The layout module (terraform/modules/zonefleet/modules/layout) is applied with the values of
the example terraform/examples/three-az (its region, AZs, VPC CIDR and its own subnet
expression, the module's mains_per_zone), and with what only AWS resources would give made up
here: the bucket's URLs (moto's S3), the SSM parameter's name, the AZ ids of a simulated
account, and the WAL URL. **The WAL is a shared local directory (osfs://)** in place of FSx for
ONTAP: this kernel has no NFS client, so WAL traffic never shows on the network here (in AWS
it is NFS to the file system, which docs/deploy.md discusses).

Each zone is a network namespace whose eth0 holds the layout's addresses of that zone (its
bootstrap address, which is its NLB's in AWS, and its mains' fixed addresses) in the VPC's
prefix, all on one bridge; a `regional` namespace on the same bridge runs moto's server for S3
(object store, cluster metadata, ledgers) and SSM (the internal secret, a SecureString the test
creates as Terraform would). In each zone namespace a fake IMDSv2 (tests/fake_imds.py) answers
on a loopback address, reached through AWS_EC2_METADATA_SERVICE_ENDPOINT.

Every node's own rendered user data runs in its zone's namespace as cloud-init would run it
(root, a plain environment plus the simulation's AWS endpoints and credentials), with a
`systemctl` shim first in PATH that records the unit it is asked to enable; then the node is
started exactly as that unit's ExecStart says, with the unit's Environment, in the namespace.

What it proves: the module's user data configures every node of the example's fleet; each node
finds its zone through IMDSv2 (not from a flag); each zone's clients, bootstrapping from their
zone's address, see only their zone's brokers and produce and consume with no payload crossing
zones (kernel socket counters, with every byte on each zone's eth0 accounted for, and every
frame on the zones' eth0 searched for the bytes produced); and a proxy killed with SIGKILL and
replaced as the Auto Scaling group would (a fresh disk, the user data again, the unit started
again) loses nothing acknowledged.

What it cannot: the AWS resources themselves (NLB, ASG, IAM, security groups, FSx: checked
statically), cloud-init and systemd proper (the unit's sandboxing, restart on failure), the
install step of the user data (the pinned version is already in place, so it is skipped), and
NFS traffic; the NLB is the zone's bootstrap address held by the zone itself, and a replaced
proxy comes back at the same machine address, where AWS would give it a new one behind the NLB.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fake_imds import read_log
from tests.netns import REPO, InterfaceCounters, NetnsUnavailable, TcpSocket
from tests.netns_deploy import (
    EXAMPLE,
    MODULE,
    REGIONAL,
    ZONEFLEET,
    DeployLedger,
    DeployNamespaces,
    FrameCapture,
    Host,
    RenderedLayout,
    example_values,
    find_payload,
    helper_argv,
    payload_windows,
    regional_address,
    render_layout,
    tcp_segments,
    value_pool,
)
from tests.ports import free_port
from tests.s3_servers import ACCESS_KEY, SECRET_KEY, stop_process, venv_binary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

IMDS_HOST = "127.0.169.254"  # a loopback address inside each zone's namespace
PARTITIONS = 6
VALUE_BYTES = 1024
MESSAGES = 4096  # 4 MiB per zone
MAX_CROSS_ZONE_RATIO = 0.01
MAX_HEADER_BYTES = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps
START_TIMEOUT_S = 60.0


@dataclass
class Deployment:
    ns: DeployNamespaces
    layout: RenderedLayout
    hosts: dict[str, Host]
    ledger: DeployLedger
    imds: dict[str, tuple[str, Path]]  # zone -> (endpoint, request log)
    aws_env: dict[str, dict[str, str]]  # zone -> the simulation's AWS environment there
    moto: str  # its address:port in the regional namespace
    region: str
    base: Path
    clients: list[subprocess.Popen[str]] = field(default_factory=list)

    def bootstrap(self, zone: str) -> str:
        return str(self.layout.outputs["bootstrap"][zone])

    def zone_hosts(self, zone: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.zone == zone]

    def helper(self, zone: str, command: str, timeout: float = 120, **kwargs: Any) -> Any:
        out = self.ns.run(zone, helper_argv(command, kwargs), timeout=timeout)
        return json.loads(out)

    def boot(self, host: Host) -> None:
        """What a new instance does: its user data, then systemd starts the unit."""
        unit = host.run_user_data(self.ns, self.aws_env[host.zone])
        host.start(self.ns, host.unit(unit), self.aws_env[host.zone])


def _zone_addresses(layout: RenderedLayout) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for zone, proxy in sorted(layout.outputs["proxies"].items()):
        out[zone] = [proxy["bootstrap_host"]]
    for main in layout.outputs["mains"].values():
        out[main["zone"]].append(main["host"])
    return out


def _hosts(layout: RenderedLayout, root: Path) -> dict[str, Host]:
    out = {}
    for key, main in layout.outputs["mains"].items():
        admin = f"http://{main['host']}:{main['admin_port']}"
        out[key] = Host(
            key, "main", main["node_id"], main["zone"], root / key, layout.user_data[key], admin
        )
    for zone, proxy in layout.outputs["proxies"].items():
        key = proxy["node_key"]
        admin = f"http://127.0.0.1:{proxy['admin_port']}"  # it binds 0.0.0.0
        out[key] = Host(
            key, "proxy", proxy["node_id"], zone, root / key, layout.user_data[key], admin
        )
    return out


def _start_imds(
    stack: ExitStack, ns: DeployNamespaces, zone: str, info: dict[str, str], region: str, d: Path
) -> tuple[str, Path]:
    port, log = free_port(), d / f"imds-{zone}.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "tests.fake_imds",
        "--host",
        IMDS_HOST,
        "--port",
        str(port),
        "--zone",
        zone,
        "--az-id",
        info["az_id"],
        "--region",
        region,
        "--log",
        str(log),
    ]
    proc = subprocess.Popen(ns.argv(zone, cmd), cwd=REPO, stdout=subprocess.PIPE)
    stack.callback(stop_process, proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()  # printed once it listens
    if not line.startswith("listening on "):
        raise RuntimeError(f"fake IMDS in {zone} did not start: {line!r}")
    return line.split()[-1], log


def _start_moto(stack: ExitStack, ns: DeployNamespaces, d: Path) -> str:
    port = free_port()
    log = open(d / "moto.log", "wb")  # closed by the stack
    stack.callback(log.close)
    cmd = [venv_binary("moto_server"), "-H", ns.regional, "-p", str(port)]
    proc = subprocess.Popen(ns.argv(REGIONAL, cmd), stdout=log, stderr=subprocess.STDOUT)
    stack.callback(stop_process, proc)
    url = f"http://{ns.regional}:{port}/moto-api/"
    ns.client(REGIONAL, "wait-http", url=url, timeout=30)
    return f"{ns.regional}:{port}"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    base = tmp_path_factory.mktemp("deploy")
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f} s] {what}", file=sys.stderr)

    example = example_values(EXAMPLE, MODULE)
    cluster, region = example.variables["cluster_id"], example.variables["region"]
    installed = subprocess.run(
        [str(ZONEFLEET), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    pinned = f"zonefleet {example.variables['zonefleet_version']}"
    # The machine image of the simulation has the pinned zonefleet (this checkout) installed.
    assert installed == pinned, f"the example pins {pinned}, this checkout is {installed}"
    install_dir = base / "opt" / "zonefleet"
    (install_dir / "bin").mkdir(parents=True)
    (install_dir / "bin" / "zonefleet").symlink_to(ZONEFLEET)
    (base / "wal").mkdir()

    # What the AWS resources would give (docs/deploy.md: bucket, prefix, the secret's name).
    bucket = f"{cluster}-123456789012-{region}"
    parameter = f"/zonefleet/{cluster}/internal-secret"
    resources = {
        "object_store_url": f"s3://{bucket}/{cluster}/objects?region={region}",
        "metadata_url": f"s3://{bucket}/{cluster}/metadata?region={region}",
        "wal_url": f"osfs://{base / 'wal'}",
        "secret_ssm_parameter": parameter,
    }
    layout = render_layout(example, resources, base / "hosts", install_dir, base / "terraform")
    phase("layout rendered (terraform init + apply)")
    vpc = ipaddress.IPv4Network(example.variables["vpc_cidr"])
    subnets = [z["subnet_cidr"] for z in layout.zones.values()]
    hosts = _hosts(layout, base / "hosts")
    ns = DeployNamespaces(
        _zone_addresses(layout),
        vpc,
        regional_address(vpc, subnets),
        tag=f"dep{secrets.token_hex(2)}",
    )
    try:
        ns.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    phase("namespaces up")
    with ExitStack() as stack:
        stack.callback(ns.destroy)
        ledger = DeployLedger(ns, base / "ss")
        stack.callback(ledger.stop)
        ledger.start()
        moto = _start_moto(stack, ns, base)
        creds = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        out = ns.run(
            REGIONAL,
            helper_argv(
                "aws-setup",
                {
                    "endpoint": f"http://{moto}",
                    "region": region,
                    "bucket": bucket,
                    "parameter": parameter,
                    "secret": secrets.token_hex(32),
                },
            ),
        )
        assert json.loads(out)["bucket"] == bucket
        phase("moto serving S3 and SSM; bucket and SecureString created")
        imds = {
            zone: _start_imds(stack, ns, zone, info, region, base)
            for zone, info in layout.zones.items()
        }
        aws_env = {
            zone: {
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds[zone][0],
                "AWS_ENDPOINT_URL": f"http://{moto}",
                **creds,
            }
            for zone in layout.zones
        }
        dep = Deployment(ns, layout, hosts, ledger, imds, aws_env, moto, region, base)

        def stop_all() -> None:
            for client in dep.clients:  # a failed test's clients
                if client.poll() is None:
                    client.kill()
                    client.communicate()
            for host in hosts.values():
                host.stop()
            for host in hosts.values():
                print(host.log_tail(12), file=sys.stderr)

        stack.callback(stop_all)
        phase("fake IMDSv2 in every zone")
        # Every machine boots at once; the mains serve first (a proxy syncs from them).
        with ThreadPoolExecutor(len(hosts)) as pool:
            list(pool.map(lambda h: h.run_user_data(ns, aws_env[h.zone]), hosts.values()))
        phase("every node's user data ran")
        for role in ("main", "proxy"):
            group = [h for h in hosts.values() if h.role == role]
            for host in group:
                host.start(ns, host.unit("zonefleet.service"), aws_env[host.zone])
            for host in group:
                host.wait_healthy(ns, START_TIMEOUT_S)
            phase(f"{role} nodes healthy")
        yield dep


# -- 1. configured by its own user data, zone through IMDSv2 ----------------------------------


def test_every_node_found_its_zone_through_imdsv2(deployment: Deployment) -> None:
    dep = deployment
    for key, host in dep.hosts.items():
        zone, az_id = host.zone, dep.layout.zones[host.zone]["az_id"]
        endpoint, _ = dep.imds[zone]
        # Its own entry in its fleet TOML says auto, and its unit passes no zone.
        toml = (host.config_dir / "fleet.toml").read_text()
        assert toml == dep.layout.fleet_toml[key] or toml == dep.layout.fleet_toml[key] + "\n"
        section = "[[proxies]]" if host.role == "proxy" else "[[main_brokers]]"
        assert f'{section}\nnode_id = {host.node_id}\nzone = "auto"\n' in toml, key
        unit = host.unit("zonefleet.service")
        command = "proxy" if host.role == "proxy" else "main-broker"
        assert unit.exec_start[1:] == [
            command,
            "--config",
            str(host.config_dir / "fleet.toml"),
            "--node-id",
            str(host.node_id),
        ]
        assert "Restart=on-failure" in unit.text
        # The user data logged to the console (captured here) and to its file.
        logged = (host.root / "var" / "lib" / "zonefleet" / "user-data.log").read_text()
        assert f"handed {key} over to systemd (zonefleet.service)" in logged, logged
        assert logged.endswith(host.runs[-1].stdout), (logged, host.runs[-1].stdout)
        # node-config, run by the user data, said where it found the zone ...
        said = host.runs[-1].stdout
        assert f"in zone {zone} (AZ id {az_id})" in said, said
        assert f"found through IMDSv2 at {endpoint}" in said, said
        assert f"region {dep.region}" in said, said
        # ... the secret it fetched from SSM is the node's, owner-only ...
        secret = host.config_dir / "internal.secret"
        assert oct(secret.stat().st_mode & 0o777) == "0o600"
        # ... and the node itself logged it as it started.
        line = f"found zone {zone} (AZ id {az_id}) through IMDSv2 at {endpoint}"
        assert line in host.journal.read_text(), host.log_tail()
    # Each zone's IMDS handed out a token to node-config and to the node, per node of the zone.
    for zone, (_, log) in dep.imds.items():
        tokens = [r for r in read_log(log) if r.method == "PUT" and r.status == 200]
        assert len(tokens) >= 2 * len(dep.zone_hosts(zone)), (zone, read_log(log))


# -- 2. clients stay in their zone, payload never crosses -------------------------------------


@dataclass
class KernelView:
    sockets: dict[str, dict[str, list[TcpSocket]]]  # zone -> kind -> sockets
    interfaces: dict[str, InterfaceCounters]  # read after the zone's sockets
    # Read just before them: the nodes keep talking to the regional services (heartbeats,
    # ledger uploads) while the sockets are read, so the sockets' counts lie between the two.
    interfaces_before: dict[str, InterfaceCounters]

    def received(self, kind: str) -> int:
        return sum(s.bytes_received for z in self.sockets.values() for s in z[kind])

    def sent_to(self, kind: str) -> int:
        return sum(max(0, s.bytes_acked - 1) for z in self.sockets.values() for s in z[kind])

    def sent(self, zone: str) -> int:
        """TCP payload the zone put on the wire to other zones and the regional services,
        retransmissions included (the interface carried them too; on a loaded machine they
        are a few KB), else what was acknowledged (SYNs less)."""
        return sum(
            max(s.bytes_sent, s.bytes_acked - 1)
            for socks in self.sockets[zone].values()
            for s in socks
        )


def _kernel(dep: Deployment) -> KernelView:
    sockets, before, after = {}, {}, {}
    for z in dep.ns.zones:
        before[z] = dep.ns.interface_counters(z)
        sockets[z] = dep.ledger.classified(z)
        after[z] = dep.ns.interface_counters(z)
    return KernelView(sockets, after, before)


def test_zone_clients_see_their_zone_and_payload_stays_in_it(deployment: Deployment) -> None:
    dep = deployment
    zones = list(dep.layout.zones)
    topics = {zone: f"deploy-{i}-{secrets.token_hex(3)}" for i, zone in enumerate(zones)}
    for zone, topic in topics.items():
        dep.helper(
            zone, "create-topic", bootstrap=dep.bootstrap(zone), topic=topic, partitions=PARTITIONS
        )
    # Metadata: a client of each zone sees its zone's brokers only, at the zone's addresses,
    # and every partition led by one of them.
    for zone in zones:
        meta = dep.helper(
            zone,
            "metadata",
            bootstrap=dep.bootstrap(zone),
            topic=topics[zones[0]],
            partitions=PARTITIONS,
        )
        own = {str(h.node_id) for h in dep.zone_hosts(zone)}
        assert set(meta["brokers"]) <= own, (zone, meta)
        assert all(a.split(":")[0] in dep.ns.addresses[zone] for a in meta["brokers"].values())
        assert {str(v) for v in meta["leaders"].values()} <= own, (zone, meta)

    seeds = {zone: secrets.randbits(32) for zone in zones}
    capture = FrameCapture(dep.ns, dep.base / "pcap") if shutil.which("tcpdump") else None
    before = _kernel(dep)
    if capture is not None:
        capture.start()
    # Zone K produces its topic; zone K+1 reads it back through its own proxy.
    producers = {
        zone: _spawn(
            dep,
            zone,
            "produce",
            bootstrap=dep.bootstrap(zone),
            topic=topics[zone],
            partitions=PARTITIONS,
            messages=MESSAGES,
            value_bytes=VALUE_BYTES,
            seed=seeds[zone],
        )
        for zone in zones
    }
    produced = {zone: _result(proc) for zone, proc in producers.items()}
    consumers = {}
    for i, zone in enumerate(zones):
        reader = zones[(i + 1) % len(zones)]
        consumers[zone] = _spawn(
            dep,
            reader,
            "consume-all",
            bootstrap=dep.bootstrap(reader),
            topic=topics[zone],
            partitions=PARTITIONS,
        )
    for zone, proc in consumers.items():
        consumed = _result(proc)
        assert consumed["partitions"] == produced[zone]["partitions"], zone
    if capture is not None:
        capture.stop()
    after = _kernel(dep)

    payload = sum(p["payload_bytes"] for p in produced.values())
    cross = after.received("cross-zone") - before.received("cross-zone")
    regional = after.received(REGIONAL) - before.received(REGIONAL)
    regional_sent = after.sent_to(REGIONAL) - before.sent_to(REGIONAL)
    print(
        f"\npayload {payload} B produced in {len(zones)} zones and read in the next; kernel, "
        f"during the workload: cross-zone {cross} B ({cross / payload:.3%}), "
        f"to/from the regional services (moto: S3, SSM) {regional_sent} B / {regional} B"
    )
    _print_sockets(after)
    assert cross <= MAX_CROSS_ZONE_RATIO * payload, (
        f"{cross} B crossed zones, {cross / payload:.2%} of the payload"
    )
    # Not one run of produced payload in a frame between zones: every frame on every zone's
    # eth0 during the workload, searched for any 16 bytes of the values produced.
    if capture is None:
        print("tcpdump is not installed: frames not searched for payload (make apt-deps)")
    else:
        _search_frames(dep, capture, seeds)
    # Every regional socket is storage: the nodes' object store and metadata, at moto.
    moto_host, moto_port = dep.moto.split(":")
    for zone in zones:
        for s in after.sockets[zone][REGIONAL]:
            assert s.peer == (moto_host, int(moto_port)), s
    # And the ledger is whole: each zone's eth0 sent the payload of these sockets, plus at
    # most a set of headers per packet, and nothing else.
    for zone in zones:
        c, sent = after.interfaces[zone], after.sent(zone)
        b = after.interfaces_before[zone]
        assert sent <= c.tx_bytes and b.tx_bytes <= sent + MAX_HEADER_BYTES * b.tx_packets + 4096, (
            f"{zone}: eth0 tx {b.tx_bytes} B / {b.tx_packets} packets before the sockets were "
            f"read and {c.tx_bytes} B after, vs {sent} B on the sockets to other zones and the "
            "regional services"
        )


def _search_frames(dep: Deployment, capture: FrameCapture, seeds: dict[str, int]) -> None:
    width = 16
    windows: set[bytes] = set()
    for seed in seeds.values():
        windows |= payload_windows(value_pool(seed, VALUE_BYTES), width)
    probe = value_pool(next(iter(seeds.values())), VALUE_BYTES)[100:140]
    assert find_payload(b"header" + probe, windows, width) == len(probe)  # the search works
    seen = {"cross-zone": [0, 0], REGIONAL: [0, 0]}  # kind -> [TCP payload bytes, of it payload]
    for zone in dep.ns.zones:
        for seg in tcp_segments(capture.path(zone)):
            if dep.ns.zone_of(seg.src[0]) != zone:
                continue  # each byte once: where it left
            peer = dep.ns.zone_of(seg.dst[0])
            kind = REGIONAL if peer == REGIONAL else "cross-zone"
            seen[kind][0] += len(seg.payload)
            seen[kind][1] += find_payload(seg.payload, windows, width)
    print(
        f"frames on the zones' eth0 during the workload: cross-zone TCP payload "
        f"{seen['cross-zone'][0]} B, of which produced payload {seen['cross-zone'][1]} B; to the "
        f"regional services {seen[REGIONAL][0]} B, of which produced payload {seen[REGIONAL][1]} "
        "B (that would be object uploads to S3)"
    )
    assert seen["cross-zone"][0] > 0, "the capture saw no cross-zone traffic at all"
    assert seen["cross-zone"][1] == 0, f"{seen['cross-zone'][1]} B of payload crossed zones"


def _spawn(dep: Deployment, zone: str, command: str, **kwargs: Any) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        dep.ns.argv(zone, helper_argv(command, kwargs)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    dep.clients.append(proc)
    return proc


def _result(proc: subprocess.Popen[str], timeout: float = 180) -> Any:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{proc.args!r} exited {proc.returncode}: {err[-3000:]}")
    return json.loads(out)


def _print_sockets(view: KernelView) -> None:
    for zone, kinds in view.sockets.items():
        c = view.interfaces[zone]
        print(f"  {zone}: eth0 tx {c.tx_bytes} B / {c.tx_packets} pkts, rx {c.rx_bytes} B")
        for kind, socks in kinds.items():
            out = sum(s.bytes_acked for s in socks)
            inn = sum(s.bytes_received for s in socks)
            print(f"    {kind}: {len(socks)} sockets, out {out} B, in {inn} B")


# -- 3. a proxy killed and replaced loses nothing acknowledged --------------------------------


def test_a_proxy_killed_and_replaced_loses_nothing_acknowledged(deployment: Deployment) -> None:
    dep = deployment
    zones = list(dep.layout.zones)
    zone = zones[1]
    proxy = next(h for h in dep.zone_hosts(zone) if h.role == "proxy")
    boot = dep.bootstrap(zone)
    topic = f"deploy-kill-{secrets.token_hex(3)}"
    meta = dep.helper(zone, "create-topic", bootstrap=boot, topic=topic, partitions=PARTITIONS)
    through_proxy = sorted(
        int(p) for p, leader in meta["leaders"].items() if leader == proxy.node_id
    )
    assert through_proxy, f"no partition of {topic} has its main outside {zone}: {meta}"

    progress, stop = dep.base / f"{topic}.progress", dep.base / f"{topic}.stop"
    producer = _spawn(
        dep,
        zone,
        "produce-stream",
        bootstrap=boot,
        topic=topic,
        partitions=PARTITIONS,
        progress=str(progress),
        stop=str(stop),
        value_bytes=256,
    )
    try:
        _wait_acked(progress, producer, lambda a: all(n >= 50 for n in a.values()))
        killed_at = time.time()
        proxy.kill()  # the machine dies
        assert proxy.proc is not None and proxy.proc.returncode == -9
        # The Auto Scaling group's new instance: a fresh disk, the same user data, the unit.
        proxy.wipe()
        dep.boot(proxy)
        proxy.wait_healthy(dep.ns, START_TIMEOUT_S)
        healthy_at = time.time()
        # Acknowledgements resume on every partition, those served by the new proxy included.
        restarted = _read_progress(progress)
        _wait_acked(progress, producer, lambda a: all(a[p] >= restarted[p] + 50 for p in a))
    finally:
        stop.touch()
    result = _result(producer)
    assert result["failed"] == [] and result["unflushed"] == 0, result["failed"][:5]
    # Before, during and after: records sent to the dead proxy's partitions while it was down
    # were acknowledged once its replacement served; the zone's own main kept acknowledging.
    outage = [r for r in result["acked"] if killed_at <= r[3] < healthy_at]
    waited = [r for r in outage if r[0] in through_proxy]
    direct = [r for r in outage if r[0] not in through_proxy and r[4] < healthy_at]
    print(
        f"\nproduced {result['sent']}, acknowledged {len(result['acked'])}; proxy down for "
        f"{healthy_at - killed_at:.1f} s (replacement booted and healthy): {len(waited)} records "
        f"sent to its partitions then, acknowledged after; {len(direct)} acknowledged meanwhile "
        f"by the zone's own main"
    )
    assert waited and all(r[4] >= killed_at for r in waited)
    if len(through_proxy) < PARTITIONS:
        assert direct, "the zone's own main stopped acknowledging while the proxy was down"

    # The replacement found its zone through IMDSv2 too.
    endpoint, _ = dep.imds[zone]
    assert (
        f"found zone {zone} (AZ id {dep.layout.zones[zone]['az_id']}) through IMDSv2 at "
        f"{endpoint}" in proxy.journal.read_text()
    )
    # Everything acknowledged is there, at the offset it was acknowledged with, read through the
    # new proxy and through another zone's.
    for reader in (zone, zones[0]):
        consumed = dep.helper(
            reader,
            "consume-all",
            bootstrap=dep.bootstrap(reader),
            topic=topic,
            partitions=PARTITIONS,
        )
        records = consumed["records"]
        missing = [r for r in result["acked"] if records[str(r[0])].get(str(r[1])) != r[2]]
        assert not missing, (
            f"{len(missing)} acknowledged records missing in {reader}: {missing[:5]}"
        )
        keys = [k for r in records.values() for k in r.values()]
        assert len(keys) == len(set(keys)), "a record was written twice"


def _read_progress(path: Path) -> dict[int, int]:
    try:
        return {int(p): n for p, n in json.loads(path.read_text())["acked"].items()}
    except (OSError, ValueError):
        return {}


def _wait_acked(
    path: Path, producer: subprocess.Popen[str], done: Any, timeout: float = 90
) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        acked = _read_progress(path)
        if acked and done(acked):
            return acked
        if producer.poll() is not None:
            raise AssertionError(f"the producer exited: {producer.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"acknowledgements stalled at {acked}")
        time.sleep(0.05)
