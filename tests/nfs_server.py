"""Start and stop a private NFS-Ganesha (VFS export, NFSv4 only) on a free loopback port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.ports import free_port

GANESHA = "ganesha.nfsd"
_CONFIG = """\
NFS_CORE_PARAM {{
    NFS_Port = {port};
    Bind_addr = 127.0.0.1;
    Protocols = 4;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Enable_UDP = false;
}}
NFSV4 {{
    Graceless = true;
    RecoveryBackend = fs;
    RecoveryRoot = {recovery};
}}
EXPORT {{
    Export_Id = 1;
    Path = {export};
    Pseudo = /export;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = 4;
    Transports = TCP;
    FSAL {{
        Name = VFS;
    }}
}}
"""


class GaneshaUnavailable(RuntimeError):
    """ganesha.nfsd is missing or would not start; the message carries the log tail."""


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class GaneshaServer:
    """One ganesha.nfsd exporting a temp directory as ``/export``; use as a context manager.

    ``url`` is ``nfs://127.0.0.1:PORT/export/<subdir>`` (ganesha cannot list an export root).
    """

    def __init__(self, subdir: str = "wal-root", *, start_timeout: float = 20.0) -> None:
        self.subdir = subdir
        self.start_timeout = start_timeout
        self.tmp = Path(tempfile.mkdtemp(prefix="ganesha-"))
        self.export_dir = self.tmp / "export"
        self.log_path = self.tmp / "ganesha.log"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nfs://127.0.0.1:{self.port}/export/{self.subdir}"

    @property
    def local_subdir(self) -> Path:
        """The exported subdirectory as seen on the server's own disk."""
        return self.export_dir / self.subdir

    def start(self) -> GaneshaServer:
        binary = shutil.which(GANESHA) or ("/usr/bin/" + GANESHA)
        if not os.path.exists(binary):
            raise GaneshaUnavailable(
                f"{GANESHA} is not installed (make apt-deps installs nfs-ganesha)"
            )
        self.export_dir.mkdir(parents=True, exist_ok=True)
        (self.tmp / "recovery").mkdir(exist_ok=True)
        self.local_subdir.mkdir(exist_ok=True)
        last_error = ""
        for _ in range(3):  # the free port may be taken between probing and binding
            self.port = free_port()
            conf = self.tmp / "ganesha.conf"
            conf.write_text(
                _CONFIG.format(
                    port=self.port, export=self.export_dir, recovery=self.tmp / "recovery"
                )
            )
            self.log_path.write_bytes(b"")
            self._proc = subprocess.Popen(
                [
                    binary,
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
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break
                if _accepting(self.port) and b"NFS SERVER INITIALIZED" in self._log_bytes():
                    return self
                time.sleep(0.05)
            last_error = (
                f"exited with status {self._proc.returncode}"
                if self._proc.poll() is not None
                else f"not serving on port {self.port} after {self.start_timeout:.0f} s"
            )
            self._terminate()
        tail = self.log_tail()
        self.cleanup()
        raise GaneshaUnavailable(f"ganesha.nfsd did not start ({last_error}); log tail:\n{tail}")

    def _log_bytes(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except OSError:
            return b""

    def log_tail(self, lines: int = 30) -> str:
        text = self._log_bytes().decode("utf-8", "replace").splitlines()
        return "\n".join(text[-lines:])

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()  # ganesha's orderly shutdown can stall on idle worker threads
            proc.wait(timeout=5)

    def stop(self) -> None:
        self._terminate()
        self.cleanup()

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> GaneshaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_ganesha(subdir: str = "wal-root") -> GaneshaServer:
    """Start ganesha (raising GaneshaUnavailable with the log tail if it cannot start)."""
    return GaneshaServer(subdir).start()
