"""Node registrations and the controller lease in the object store (issue 4, "Cluster
metadata"): the pure parts, races on file:// and SeaweedFS, and a `zonefleet up --zones 3`
whose controller sees a frozen main die and whose lease moves when the controller freezes.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from fleet.config import local_zones_fleet_toml
from main_broker.cluster.controller import membership
from main_broker.cluster.doc import ClusterDoc
from main_broker.cluster.sync import ClusterMetadata
from s3_commit import AsyncObjectStore, FileObjectStore, ObjectStore
from s3_commit.lease import Lease, LeaseFormatError, LeaseKeeper, next_lease
from s3_commit.node_registry import (
    NodeDisplaced,
    NodeRegistrar,
    NodeRegistration,
    RegistrationFormatError,
    read_registrations,
)
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.s3_servers import SeaweedServer, seaweedfs

__all__ = ["seaweedfs"]  # the fixture, imported so pytest finds it

# -- pure parts -------------------------------------------------------------------------------

REGISTRATION_GOLDEN = (
    b'{"format":1,"role":"proxy","node_id":102,"zone":"az2","host":"10.0.1.7","port":9092,'
    b'"rpc_port":null,"incarnation":"0123456789abcdef0123456789abcdef","started_ms":1000,'
    b'"heartbeat_ms":4000,"state":"running"}'
)
LEASE_GOLDEN = b'{"format":1,"holder":2,"epoch":7,"acquired_ms":1000,"expires_ms":16000}'


def test_registration_and_lease_golden_bytes() -> None:
    reg = NodeRegistration(
        "proxy", 102, "az2", "10.0.1.7", 9092, None, "0123456789abcdef" * 2, 1000, 4000
    )
    assert reg.to_bytes() == REGISTRATION_GOLDEN
    assert NodeRegistration.from_bytes(REGISTRATION_GOLDEN) == reg
    assert reg.key == "cluster/nodes/proxy-102.json"
    assert Lease(2, 7, 1000, 16000).to_bytes() == LEASE_GOLDEN
    assert Lease.from_bytes(LEASE_GOLDEN) == Lease(2, 7, 1000, 16000)
    for bad in (b"{", b'{"format":2}', REGISTRATION_GOLDEN.replace(b'"proxy"', b'"boss"')):
        with pytest.raises(RegistrationFormatError):
            NodeRegistration.from_bytes(bad)
    with pytest.raises(LeaseFormatError, match="epoch"):
        Lease.from_bytes(LEASE_GOLDEN.replace(b'"epoch":7', b'"epoch":"7"'))


def test_next_lease_renews_takes_over_expired_and_waits_otherwise() -> None:
    assert next_lease(None, 1, 100, 50) == Lease(1, 1, 100, 150)
    mine = Lease(1, 3, 0, 150)
    assert next_lease(mine, 1, 100, 50) == Lease(1, 3, 0, 150)  # renewal keeps the epoch
    assert next_lease(mine, 1, 120, 50) == Lease(1, 3, 0, 170)
    assert next_lease(mine, 2, 120, 50) is None  # still valid: wait
    assert next_lease(mine, 2, 150, 50) == Lease(2, 4, 150, 200)  # expired: epoch + 1
    assert next_lease(mine, 1, 150, 50) == Lease(1, 4, 150, 200)  # own, but lapsed


def test_membership_tells_alive_dead_and_stopped_apart() -> None:
    def reg(node: int, beat: int, state: str = "running") -> NodeRegistration:
        return NodeRegistration("main", node, "az1", "h", 1, 2, "i" * 32, 0, beat, state)

    found = membership([reg(3, 9_000), reg(1, 1_000), reg(2, 1_000, "stopped")], 10_000, 5_000)
    assert [r.node_id for r in found.alive] == [3]
    assert [r.node_id for r in found.dead] == [1]
    assert [r.node_id for r in found.stopped] == [2]


# -- against a store --------------------------------------------------------------------------


@pytest.fixture(params=["file", "seaweedfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path, seaweedfs: SeaweedServer) -> ObjectStore:
    if request.param == "file":
        return FileObjectStore(str(tmp_path / "objects"))
    return seaweedfs.store()


def test_two_writers_racing_on_the_metadata_document_lose_no_update(store: ObjectStore) -> None:
    """Two mains (two ClusterMetadata copies) create 12 topics each at once, by CAS."""

    async def main() -> ClusterDoc:
        async def ignore(doc: ClusterDoc) -> None:
            pass

        writers = [ClusterMetadata(store, "race", ignore) for _ in range(2)]

        async def create(w: int) -> None:
            for i in range(12):
                name = f"w{w}-t{i}"
                await writers[w].update(
                    lambda doc, name=name: doc.with_topic(name, uuid.uuid4().bytes, 1, {}, [1, 2])
                )

        async with trio.open_nursery() as nursery:
            for w in range(2):
                nursery.start_soon(create, w)
        await writers[0].refresh()
        return writers[0].doc

    doc = trio.run(main)
    assert sorted(doc.topics) == sorted(f"w{w}-t{i}" for w in range(2) for i in range(12))
    assert doc.version == 24


def test_one_lease_holder_and_takeover_when_it_stops(store: ObjectStore) -> None:
    async def main() -> None:
        astore = AsyncObjectStore(store, max_threads=4)
        keepers = [LeaseKeeper(astore, n, "cluster/test-lease.json", 1.5, 0.3) for n in (1, 2)]
        scopes = [trio.CancelScope() for _ in keepers]

        async def run(i: int) -> None:
            with scopes[i]:
                await keepers[i].run()

        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(run, i)
            with trio.fail_after(30):
                while not any(k.holding for k in keepers):
                    await trio.sleep(0.05)
            first = next(i for i, k in enumerate(keepers) if k.holding)
            other = 1 - first
            # Through several renewals there is exactly one holder.
            end = trio.current_time() + 2.5
            while trio.current_time() < end:
                assert keepers[first].holding and not keepers[other].holding
                await trio.sleep(0.05)
            epoch = keepers[first].lease.epoch  # type: ignore[union-attr]
            scopes[first].cancel()  # the holder dies without a word
            with trio.fail_after(30):
                while not keepers[other].holding:
                    await trio.sleep(0.05)
            assert keepers[other].lease is not None
            assert keepers[other].lease.epoch == epoch + 1
            assert keepers[other].lease.holder == other + 1
            # A clean release hands it on without waiting for the expiry.
            restarted = LeaseKeeper(astore, 9, "cluster/test-lease.json", 1.5, 0.3)
            await keepers[other].release()
            scopes[other].cancel()
            with trio.fail_after(5):
                while not restarted.holding:
                    await restarted.step()
            assert restarted.lease is not None and restarted.lease.epoch == epoch + 2

    trio.run(main)


def test_registrations_heartbeat_take_over_a_dead_predecessor_and_refuse_a_twin(
    store: ObjectStore,
) -> None:
    async def main() -> None:
        astore = AsyncObjectStore(store, max_threads=4)

        def me() -> NodeRegistration:
            return NodeRegistration.new("main", 1, "az1", "127.0.0.1", 9092, 9094)

        first = NodeRegistrar(astore, me(), interval_s=0.2, session_timeout_s=5)
        await first.register()
        await first.heartbeat()
        (seen,) = await read_registrations(astore)
        assert seen.incarnation == first.me.incarnation and seen.state == "running"
        assert seen.heartbeat_ms >= seen.started_ms

        # A restart at the same endpoint (the old process is gone: it held the port).
        second = NodeRegistrar(astore, me(), interval_s=0.2, session_timeout_s=5)
        await second.register()
        with pytest.raises(NodeDisplaced):
            await first.heartbeat()
        # A second live process with the same id elsewhere may not start.
        twin = NodeRegistration.new("main", 1, "az1", "127.0.0.2", 9092, 9094)
        with pytest.raises(NodeDisplaced, match="unique"):
            await NodeRegistrar(astore, twin, session_timeout_s=5).register()
        await second.stop()
        (seen,) = await read_registrations(astore)
        assert seen.state == "stopped" and seen.incarnation == second.me.incarnation
        # Once stopped, the twin may take the id.
        await NodeRegistrar(astore, twin, session_timeout_s=5).register()

    trio.run(main)


def test_an_abandoned_registration_is_left_running_to_go_stale(store: ObjectStore) -> None:
    """A main whose WAL was fenced stops as if it died: its registration must not say
    "stopped" (which keeps a main's partitions waiting for its restart)."""

    async def main() -> None:
        astore = AsyncObjectStore(store, max_threads=4)
        for abandon, state in ((False, "stopped"), (True, "running")):
            me = NodeRegistration.new("main", 1, "az1", "127.0.0.1", 9092, 9094)
            registrar = NodeRegistrar(astore, me, interval_s=0.2, session_timeout_s=5)
            async with trio.open_nursery() as nursery:
                await nursery.start(registrar.run)
                if abandon:
                    registrar.abandon()
                nursery.cancel_scope.cancel()
            (seen,) = await read_registrations(astore)
            assert (seen.incarnation, seen.state) == (registrar.me.incarnation, state)

    trio.run(main)


# -- a fleet ------------------------------------------------------------------------------------


def _status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1) as resp:
        return dict(json.load(resp))


def _node_pid(config: Path, role: str, node_id: int) -> int:
    wanted = ["fleet.cli", role, "--config", str(config), "--node-id", str(node_id)]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if all(w in argv for w in wanted):
            return int(entry)
    raise AssertionError(f"no process for {role} {node_id}")


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetProcess, Path]]:
    data = tmp_path_factory.mktemp("membership")
    base = free_port_block(35)
    config = data / "fleet.toml"
    text = local_zones_fleet_toml(data, base, 3, "ab" * 32)
    fast = (
        "registration_interval_s = 0.5\nsession_timeout_s = 2.5\ncontroller_lease_s = 3.0\n"
        "poll_interval_s = 0.5\n"
    )
    config.write_text(text.replace("[metadata]\n", "[metadata]\n" + fast, 1))
    proc = FleetProcess(data, base, extra=["--config", str(config)]).start()
    try:
        yield proc, config
    finally:
        proc.stop()


def _admin(fleet: FleetProcess, main: int) -> int:
    return fleet.base_port + 10 * main + 3


def _controller(fleet: FleetProcess) -> dict[str, Any] | None:
    for k in (1, 2, 3):
        try:
            cluster = _status(_admin(fleet, k))["cluster"]
        except OSError:
            continue
        if cluster["controller"]["active"] and "alive" in cluster["controller"]:
            return {"node": k, **cluster["controller"]}
    return None


def test_controller_sees_every_node_and_a_frozen_main_die(
    fleet: tuple[FleetProcess, Path],
) -> None:
    proc, config = fleet
    everyone = {f"main-{k}@az{k}" for k in (1, 2, 3)} | {
        f"proxy-{100 + k}@az{k}" for k in (1, 2, 3)
    }
    ctl = _wait_for(
        lambda: (c := _controller(proc)) and set(c["alive"]) == everyone and c, 30, "all alive"
    )
    url = f"http://127.0.0.1:{_admin(proc, ctl['node'])}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        metrics = resp.read().decode()
    assert "zonefleet_controller_active 1" in metrics
    assert "zonefleet_cluster_nodes_alive 6" in metrics
    victim = 3 if ctl["node"] != 3 else 2
    pid = _node_pid(config, "main-broker", victim)
    os.kill(pid, signal.SIGSTOP)
    try:
        dead = _wait_for(
            lambda: (c := _controller(proc)) and f"main-{victim}@az{victim}" in c["dead"] and c,
            30,
            f"main {victim} reported dead",
        )
        assert f"main-{victim}@az{victim}" not in dead["alive"]
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait_for(
        lambda: (c := _controller(proc)) and set(c["alive"]) == everyone, 30, "main back alive"
    )


def test_the_lease_moves_when_the_controller_freezes(fleet: tuple[FleetProcess, Path]) -> None:
    proc, config = fleet
    ctl = _wait_for(lambda: _controller(proc), 30, "a controller")
    pid = _node_pid(config, "main-broker", ctl["node"])
    os.kill(pid, signal.SIGSTOP)
    try:
        new = _wait_for(
            lambda: (c := _controller(proc)) and c["node"] != ctl["node"] and c, 30, "takeover"
        )
        assert new["epoch"] > ctl["epoch"]
        assert f"main-{ctl['node']}@az{ctl['node']}" in _wait_for(
            lambda: (c := _controller(proc)) and c["dead"], 30, "old controller seen dead"
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    # The frozen holder, thawed, finds its lease gone and does not act as controller.
    time.sleep(1.0)
    holders = [k for k in (1, 2, 3) if _status(_admin(proc, k))["cluster"]["controller"]["active"]]
    assert holders == [new["node"]]
