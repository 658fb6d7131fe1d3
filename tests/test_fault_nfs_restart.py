"""The NFS server restarts during produce (issue 14): the zone fleet keeps its WAL on real NFS
(nfs-ganesha, `[wal] url = "nfs://..."`), an idempotent acks=all producer in az2 produces
without pause, and ganesha is stopped and started again on the same port and export. Every
node's nfs:// file system reconnects (shared_wal/nfs_fs.py: a new nfs-rs client, open files
reopened, the interrupted positional write repeated), so no node restarts: the producer sees
at most retriable errors, and every acknowledged record is read exactly once, in order, in
every zone (proxies and mirrors read the WALs over NFS too).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from shared_wal import RecordType, WalConfig, WalReader, WalWriter, open_wal_fs
from tests.fault_helpers import ContinuousProducer, strip, until, wait_until
from tests.fleet_process import FleetProcess
from tests.nfs_server import GANESHA, GaneshaServer, GaneshaUnavailable, _accepting
from tests.wal_helpers import running
from tests.zone_fleet import (
    ZoneFleet,
    check_exactly_once_in_order,
    consume_confluent,
    create_topic,
    write_zones_toml,
    zone_client_id,
)

PARTITIONS = 4


class RestartableGanesha(GaneshaServer):
    """A GaneshaServer that can be stopped and started again on the same port and export."""

    def restart(self, *, crash: bool, timeout: float = 20.0) -> float:
        """Stop ganesha (SIGTERM, or SIGKILL for a `crash`) and start it again with the same
        config; returns how long the server was not serving (seconds)."""
        stopped = time.monotonic()
        self.stop_serving(crash=crash)
        self.serve_again(timeout)
        return time.monotonic() - stopped

    def stop_serving(self, *, crash: bool = False) -> None:
        """Stop the server process, keeping its export, config and port."""
        if crash and self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
        self._terminate()

    def serve_again(self, timeout: float = 20.0) -> None:
        """Start ganesha again on the same port and export, and wait until it serves."""
        conf = self.tmp / "ganesha.conf"
        self.log_path.write_bytes(b"")
        self._proc = subprocess.Popen(
            [
                f"/usr/bin/{GANESHA}",
                "-F",
                "-f",
                str(conf),
                "-L",
                str(self.log_path),
                "-p",
                str(self.tmp / "ganesha.pid"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            lambda: _accepting(self.port) and b"NFS SERVER INITIALIZED" in self._log_bytes(),
            f"ganesha serving again on port {self.port}",
            timeout,
        )


@pytest.fixture
def ganesha() -> Iterator[RestartableGanesha]:
    try:
        server = RestartableGanesha().start()
    except GaneshaUnavailable as exc:
        pytest.skip(f"NFS-Ganesha cannot start here: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nfs_fleet(
    tmp_path: Path, ganesha: RestartableGanesha
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    wal_dir = f"fleet-{uuid.uuid4().hex[:8]}"
    path, config = write_zones_toml(tmp_path / "fleet", wal_url=f"{ganesha.url}/{wal_dir}")
    proc = FleetProcess(tmp_path / "fleet", None, ["--config", str(path)])
    try:
        # A loaded CI machine (other fleets beside this one) can take a minute to start it.
        proc.start(timeout=180)
        yield proc, ZoneFleet(config)
    finally:
        proc.stop()


def healthy_nodes(fleet: ZoneFleet) -> list[str]:
    """Every main and proxy whose admin /healthz does not answer 200."""
    admins = [(m.admin_host, m.admin_port) for m in fleet.config.mains] + [
        (p.admin_host, p.admin_port) for p in fleet.config.proxies
    ]
    bad = []
    for host, port in admins:
        try:
            response = httpx.get(f"http://{host}:{port}/healthz", timeout=5.0)
        except httpx.HTTPError as exc:
            bad.append(f"{host}:{port}: {exc!r}")
            continue
        if response.status_code != 200:
            bad.append(f"{host}:{port}: {response.status_code} {response.text}")
    return bad


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
def test_ganesha_restart_during_produce(
    nfs_fleet: tuple[FleetProcess, ZoneFleet], ganesha: RestartableGanesha, crash: bool
) -> None:
    proc, fleet = nfs_fleet
    topic = f"nfs-restart-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az2", topic, PARTITIONS)
    producer = ContinuousProducer(
        fleet.bootstrap("az2"), topic, "nr", 200, **{"client.id": zone_client_id("az2")}
    ).start()
    try:
        wait_until(lambda: producer.acked >= 1000, "acknowledged before the restart", 60)
        acked_before = producer.acked
        gap_before = producer.longest_gap
        outage_s = ganesha.restart(crash=crash)
        restarted_at = time.monotonic()
        resumed_s = wait_until(
            lambda: producer.acked >= acked_before + 2000, "produce goes on after the restart", 180
        )
    finally:
        producer.stop()
    assert producer.flushed == 0 and producer.errors == [], producer.errors[:5]
    assert producer.acked == producer.sent
    assert proc.proc is not None and proc.proc.poll() is None, "the fleet process exited"
    assert healthy_nodes(fleet) == []
    for zone in fleet.zones:
        records = consume_confluent(
            fleet.bootstrap(zone), zone, topic, PARTITIONS, producer.sent, timeout=120
        )
        check_exactly_once_in_order(strip(records), producer.sent, "nr")
    output = "".join(proc.output)
    assert "writer is now failed" not in output, output[-5000:]
    assert "Traceback" not in output, output[-5000:]
    reconnects = output.count("reconnected in")
    assert reconnects >= 1, output[-5000:]
    how = "SIGKILL" if crash else "SIGTERM"
    print(f"ganesha restart ({how}): not serving for {outage_s:.2f} s;")
    print(f"  {acked_before} acknowledged before, 2000 more {resumed_s:.1f} s after it served;")
    print(f"  longest gap between acks {producer.longest_gap:.1f} s ({gap_before:.1f} s before);")
    print(f"  {reconnects} reconnect lines; {producer.sent} records read back in every zone;")
    print(f"  {time.monotonic() - restarted_at:.0f} s from the restart to the end")


# -- the WAL writer and a reader on one nfs:// file system ------------------------------------


async def test_writer_and_reader_carry_on_across_a_restart(ganesha: RestartableGanesha) -> None:
    fs = open_wal_fs(f"{ganesha.url}/w-{uuid.uuid4().hex[:8]}")
    wal = await WalWriter.open(fs, "w1", WalConfig(retention_ms=None, segment_bytes=64 * 1024))
    reader = WalReader(fs, "w1")
    try:
        async with running(wal):
            positions = [await wal.append(RecordType.DATA, {"i": i}, b"a" * 500) for i in range(50)]
            before = await trio.to_thread.run_sync(
                lambda: [r.header["i"] for r in reader.iter_records(0, wal.end_offset)]
            )
            await trio.to_thread.run_sync(lambda: ganesha.restart(crash=True))
            positions += [
                await wal.append(RecordType.DATA, {"i": i}, b"b" * 500) for i in range(50, 300)
            ]
            assert wal.failed is None and wal.stalled is None
            got = await trio.to_thread.run_sync(
                lambda: list(reader.iter_records(0, wal.end_offset))
            )
    finally:
        reader.close()
        fs.close()
    assert before == list(range(50))
    assert [r.header["i"] for r in got] == list(range(300))
    assert [r.position for r in got] == positions
    assert len(wal.segments()) > 1  # segments were created after the restart too


async def test_writer_holds_its_group_while_the_server_is_down(
    ganesha: RestartableGanesha,
) -> None:
    """Past the reconnect attempts the write fails with ENOTCONN: the writer holds the group,
    and writes it (from its start) once the server is back."""
    url = f"{ganesha.url}/w-{uuid.uuid4().hex[:8]}?operation_timeout=1&reconnect_timeout=1"
    fs = open_wal_fs(url)
    wal = await WalWriter.open(fs, "w1", WalConfig(retention_ms=None))
    try:
        async with running(wal):
            first = await wal.append(RecordType.DATA, {"i": 0}, b"a" * 500)
            ganesha.stop_serving()
            ticket = wal.submit(RecordType.DATA, {"i": 1}, b"b" * 500)
            await until(lambda: wal.stalled is not None, "the writer holds its group", 120)
            assert not ticket.done and wal.failed is None and wal.full
            await trio.to_thread.run_sync(ganesha.serve_again)
            with trio.fail_after(60):
                second = await ticket.wait()
            assert wal.stalled is None and wal.failed is None
        with WalReader(fs, "w1") as reader:
            got = list(reader.iter_records(0, wal.end_offset))
    finally:
        fs.close()
    assert [r.position for r in got] == [first, second]
