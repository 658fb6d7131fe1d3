"""Start `zonefleet up` as a user would (a subprocess) and stop or kill it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.ports import free_port_block

ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))
LONE_MAIN = ["--zones", "1"]  # `zonefleet up` starts three zones unless told otherwise


class FleetProcess:
    def __init__(
        self, data_dir: Path, base_port: int | None = None, extra: list[str] | None = None
    ):
        self.data_dir = data_dir
        self.base_port = base_port or free_port_block()
        self.extra = LONE_MAIN if extra is None else extra
        self.proc: subprocess.Popen[str] | None = None
        self.bootstrap = ""
        self.zones: dict[str, str] = {}
        self.output: list[str] = []

    def start(self, timeout: float = 60.0) -> FleetProcess:
        cmd = [
            ZONEFLEET,
            "up",
            "--data-dir",
            str(self.data_dir),
            "--base-port",
            str(self.base_port),
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            m = re.match(r"zone=(\S+) bootstrap=(\S+)", line)
            if m:
                self.zones[m.group(1)] = m.group(2)
                self.bootstrap = self.bootstrap or m.group(2)
            if line.strip() == "ready":
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        self.kill()
        raise RuntimeError("zonefleet up did not become ready:\n" + "".join(self.output))

    def _drain(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            self.output.append(line)

    @property
    def admin_port(self) -> int:
        return self.base_port + 1

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
