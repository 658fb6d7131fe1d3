"""A small fake of the EC2 instance metadata service, IMDSv2 only.

`PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: 1..21600` hands out a
token (400 without a valid TTL, 403 with `X-Forwarded-For`, as EC2 does); a GET without a live
token gets 401. It serves `/latest/meta-data/placement/availability-zone`,
`placement/availability-zone-id`, `placement/region` and `local-ipv4`; anything else is 404.

In a test: `with FakeImds(zone=..., ...) as imds: imds.url`. In a network namespace:
`python -m tests.fake_imds --host 127.0.0.1 --port P --zone Z --az-id I --region R
[--local-ipv4 A] [--log FILE]` prints `listening on http://HOST:PORT` once it serves, and
appends each request to FILE as a JSON line (method, path, whether its token was valid).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

TOKEN_PATH = "/latest/api/token"
META = "/latest/meta-data/"
MAX_TTL_S = 21600


@dataclass
class ImdsRequest:
    method: str
    path: str
    status: int


@dataclass
class FakeImds:
    zone: str = "us-east-1a"
    az_id: str | None = "use1-az1"
    region: str = "us-east-1"
    local_ipv4: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    requests: list[ImdsRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                fake._put(self)

            def do_GET(self) -> None:
                fake._get(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))
        self._thread.daemon = True

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def values(self) -> dict[str, str | None]:
        return {
            "placement/availability-zone": self.zone,
            "placement/availability-zone-id": self.az_id,
            "placement/region": self.region,
            "local-ipv4": self.local_ipv4,
        }

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def tokens_issued(self) -> int:
        return sum(1 for r in self.requests if r.method == "PUT" and r.status == 200)

    # -- the handlers ---------------------------------------------------------------------

    def _put(self, h: BaseHTTPRequestHandler) -> None:
        ttl = h.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if h.path != TOKEN_PATH:
            self._reply(h, 404, "")
        elif h.headers.get("X-Forwarded-For") is not None:
            self._reply(h, 403, "")  # EC2 refuses tokens to requests that came through a proxy
        elif not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL_S:
            self._reply(h, 400, "")
        else:
            token = secrets.token_urlsafe(24)
            with self._lock:
                self._tokens[token] = time.monotonic() + int(ttl)
            self._reply(h, 200, token)

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        token = h.headers.get("X-aws-ec2-metadata-token", "")
        with self._lock:
            expiry = self._tokens.get(token)
        if expiry is None or expiry < time.monotonic():
            self._reply(h, 401, "")
            return
        value = self.values().get(h.path[len(META) :]) if h.path.startswith(META) else None
        if value is None:
            self._reply(h, 404, "")
        else:
            self._reply(h, 200, value)

    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: str) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        record = ImdsRequest(h.command, h.path, status)
        with self._lock:
            self.requests.append(record)
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(vars(record)) + "\n")


def read_log(path: Path) -> list[ImdsRequest]:
    """The requests a `python -m tests.fake_imds --log` server served, in order."""
    if not path.exists():
        return []
    return [ImdsRequest(**json.loads(line)) for line in path.read_text().splitlines() if line]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_imds", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--zone", required=True)
    p.add_argument("--az-id", default=None)
    p.add_argument("--region", required=True)
    p.add_argument("--local-ipv4", default=None)
    p.add_argument("--log", type=Path, default=None, help="append each request here (JSONL)")
    args = p.parse_args(argv)
    imds = FakeImds(
        args.zone, args.az_id, args.region, args.local_ipv4, args.host, args.port, args.log
    )
    print(f"listening on {imds.url}", flush=True)
    try:
        imds._server.serve_forever(0.05)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
