"""`zonefleet up --zones N` runs every node as its own process under a supervisor: a node that
dies is restarted and its zone's clients recover; stopping or killing `up` leaves no node."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.fleet_process import FleetProcess
from tests.ports import free_port_block

ZONES = 3
PORTS = 10 * ZONES + 5


def children(pid: int) -> dict[int, list[str]]:
    """Direct child processes of `pid`: pid -> argv."""
    out: dict[int, list[str]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            try:
                argv = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            out[kid] = [a.decode() for a in argv if a]
    return out


def node_pids(pid: int) -> dict[str, int]:
    """'main-broker 1' / 'proxy 102' -> pid of that node's process."""
    out = {}
    for kid, argv in children(pid).items():
        if "fleet.cli" in argv:
            role = argv[argv.index("fleet.cli") + 1]
            out[f"{role} {argv[argv.index('--node-id') + 1]}"] = kid
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[FleetProcess]:
    proc = FleetProcess(tmp_path / "fleet", free_port_block(PORTS), extra=["--zones", str(ZONES)])
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def round_trip(bootstrap: str, zone: str, topic: str, n: int) -> list[bytes]:
    conf = {"bootstrap.servers": bootstrap, "client.id": f"zone={zone}"}
    producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
    for i in range(n):
        producer.produce(topic, f"{zone}-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4()}", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(values) < n:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None and msg.value() is not None:
            values.append(msg.value())  # type: ignore[arg-type]
    consumer.close()
    return values


def test_every_node_is_its_own_process_and_a_killed_one_is_restarted(
    fleet: FleetProcess,
) -> None:
    assert fleet.proc is not None
    pids = node_pids(fleet.proc.pid)
    assert sorted(pids) == [
        "main-broker 1",
        "main-broker 2",
        "main-broker 3",
        "proxy 101",
        "proxy 102",
        "proxy 103",
    ]
    topic = f"sup-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": fleet.zones["az2"], "client.id": "zone=az2"})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    before = round_trip(fleet.zones["az2"], "az2", topic, 20)
    assert len(before) == 20

    old = pids["proxy 102"]
    os.kill(old, signal.SIGKILL)
    supervisor = fleet.proc.pid
    wait_for(
        lambda: node_pids(supervisor).get("proxy 102", old) != old,
        30,
        "the supervisor to restart proxy 102",
    )
    wait_for(lambda: healthy(fleet.base_port + 21), 30, "proxy 102 healthy again")
    # The zone's clients work again through the restarted proxy, and nothing was lost.
    after = round_trip(fleet.zones["az2"], "az2", topic, 40)
    assert after[:20] == before and len(after) == 40
    assert fleet.proc.poll() is None
    assert any("proxy 102 exited with -9; restarting" in line for line in fleet.output)

    nodes = list(node_pids(supervisor).values())
    assert fleet.stop() == 0  # SIGTERM: proxies, then mains, stop cleanly
    assert not [pid for pid in nodes if alive(pid)]


def test_a_killed_supervisor_leaves_no_node_behind(fleet: FleetProcess) -> None:
    assert fleet.proc is not None
    nodes = list(node_pids(fleet.proc.pid).values())
    assert len(nodes) == 2 * ZONES
    fleet.kill()  # SIGKILL: the supervisor runs no shutdown code
    wait_for(lambda: not [pid for pid in nodes if alive(pid)], 15, "the nodes to stop")


def test_single_process_runs_every_node_in_one_process(tmp_path: Path) -> None:
    proc = FleetProcess(
        tmp_path / "fleet",
        free_port_block(PORTS),
        extra=["--zones", str(ZONES), "--single-process"],
    )
    proc.start()
    try:
        assert proc.proc is not None
        assert node_pids(proc.proc.pid) == {}
        assert sorted(proc.zones) == ["az1", "az2", "az3"]
        assert all(healthy(proc.base_port + 10 * k + 1) for k in range(1, ZONES + 1))
    finally:
        assert proc.stop() == 0
