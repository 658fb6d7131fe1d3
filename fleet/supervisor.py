"""`zonefleet up` with one OS process per node, as the fleet runs in production.

Nodes in one process share one event loop and one interpreter lock: a proxy's produce then
waits behind the other nodes' mirrors and fetches, which multiplied its latency. The supervisor
starts every main broker (`zonefleet main-broker`), waits for each to print `ready`, then the
proxies, and restarts a node that exits on its own (with backoff). On SIGINT or SIGTERM it stops
the proxies, then the mains: SIGTERM, and SIGKILL after a grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

log = logging.getLogger("zonefleet.fleet.supervisor")

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
RESTART_BACKOFF_S = (0.5, 30.0)
STABLE_AFTER_S = 30.0  # a node up this long is no longer crash-looping: reset the backoff

PARENT_PID_ENV = "ZONEFLEET_SUPERVISOR_PID"
PARENT_POLL_S = 1.0


def _own_process_group() -> None:
    """In the child, before exec: a Ctrl-C in the terminal reaches only the supervisor, which
    stops the nodes in order (proxies first) instead of seeing them exit and restarting them."""
    os.setpgid(0, 0)


async def exit_with_parent(parent_pid: int, stop: trio.CancelScope) -> None:
    """In a node the supervisor started: stop when the supervisor is gone, even if it was
    killed with SIGKILL, so no orphan keeps holding the fleet's ports. (PR_SET_PDEATHSIG does
    not fit: it fires when the forking thread exits, and trio forks from a worker thread.)"""
    while os.getppid() == parent_pid:
        await trio.sleep(PARENT_POLL_S)
    log.warning("supervisor %d is gone; stopping", parent_pid)
    stop.cancel()


class NodeFailed(Exception):
    pass


@dataclass
class NodeSpec:
    role: str  # "main-broker" or "proxy"
    node_id: int
    zone: str
    announce: bool  # print this node's bootstrap line once ready


@dataclass
class _Child:
    spec: NodeSpec
    process: trio.Process | None = None
    bootstrap: str = ""
    stopping: bool = False
    ready: trio.Event = field(default_factory=trio.Event)


class Supervisor:
    def __init__(self, config_path: Path, log_format: str | None) -> None:
        self.config_path = config_path
        self.log_format = log_format

    def command(self, spec: NodeSpec) -> list[str]:
        cmd = [sys.executable, "-m", "fleet.cli", spec.role, "--config", str(self.config_path)]
        cmd += ["--node-id", str(spec.node_id)]
        if self.log_format:
            cmd += ["--log-format", self.log_format]
        return cmd

    async def serve(self, mains: Sequence[NodeSpec], proxies: Sequence[NodeSpec]) -> None:
        """Run the nodes until SIGINT/SIGTERM; print each announced bootstrap, then `ready`."""
        children = [_Child(spec) for spec in (*mains, *proxies)]
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                # Mains first: a proxy syncs its mirror from the mains' internal RPC as it starts.
                for group in (children[: len(mains)], children[len(mains) :]):
                    for child in group:
                        nursery.start_soon(self._keep_running, child)
                    for child in group:
                        await self._wait_ready(child)
                for child in children:
                    if child.spec.announce:
                        print(f"zone={child.spec.zone} bootstrap={child.bootstrap}", flush=True)
                print("ready", flush=True)
                async for signum in signals:
                    log.info("received signal %d, stopping the fleet", signum)
                    break
                for group in (children[len(mains) :], children[: len(mains)]):
                    async with trio.open_nursery() as stoppers:
                        for child in group:
                            stoppers.start_soon(self._stop, child)
                nursery.cancel_scope.cancel()

    async def _wait_ready(self, child: _Child) -> None:
        with trio.move_on_after(READY_TIMEOUT_S):
            await child.ready.wait()
            return
        raise NodeFailed(
            f"{child.spec.role} {child.spec.node_id} printed no 'ready' in {READY_TIMEOUT_S:.0f} s"
        )

    async def _keep_running(self, child: _Child) -> None:
        backoff = RESTART_BACKOFF_S[0]
        while not child.stopping:
            started = trio.current_time()
            code = await self._run_once(child)
            if child.stopping:
                return
            if not child.ready.is_set():
                raise NodeFailed(
                    f"{child.spec.role} {child.spec.node_id} exited with {code} while starting"
                )
            if trio.current_time() - started > STABLE_AFTER_S:
                backoff = RESTART_BACKOFF_S[0]
            log.error(
                "%s %d exited with %s; restarting in %.1f s",
                child.spec.role,
                child.spec.node_id,
                code,
                backoff,
            )
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_S[1])

    async def _run_once(self, child: _Child) -> int:
        process = await trio.lowlevel.open_process(
            self.command(child.spec),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            preexec_fn=_own_process_group,
            env={**os.environ, PARENT_PID_ENV: str(os.getpid())},
        )
        child.process = process
        try:
            assert process.stdout is not None
            await self._read_announcements(child, process.stdout)
            return await process.wait()
        finally:
            if process.returncode is None:
                # Cancelled (the supervisor is going down): never leave the node behind.
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()

    async def _read_announcements(self, child: _Child, stdout: trio.abc.ReceiveStream) -> None:
        """Reads the node's stdout to its end: its bootstrap line, then `ready`."""
        pending = b""
        while chunk := await stdout.receive_some():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").strip()
                if line.startswith("zone=") and " bootstrap=" in line:
                    child.bootstrap = line.split(" bootstrap=", 1)[1]
                elif line == "ready":
                    child.ready.set()

    async def _stop(self, child: _Child) -> None:
        child.stopping = True
        process = child.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE_S):
            await process.wait()
            return
        log.warning(
            "%s %d ignored SIGTERM for %.0f s; killing it",
            child.spec.role,
            child.spec.node_id,
            STOP_GRACE_S,
        )
        process.kill()
        await process.wait()
