"""What internal RPC over TLS (`[security] rpc_tls`, internal_rpc/tls.py) costs on the confirm
path, against plain TCP, over loopback in one process.

A server with one `confirm`-sized method (params of `--size` bytes, about what a one-partition
confirm carries; the answer about 40 bytes) and one client, each side with and without TLS, the
order alternating between `--rounds` rounds:

- `serial`: one call at a time (a proxy with one confirm outstanding), p50 and p99 in µs;
- `pipelined`: `--in-flight` calls outstanding (`confirm_max_in_flight`, 4 by default), calls/s;
- `connect`: a new connection, TCP + TLS + HMAC handshakes, p50 in ms;
- `bytes`: TCP payload bytes on the wire per call and per handshake, counted at the server,
  beside the frame bytes the traffic accounting books.

Both ends share one process and one core here; between two hosts, the network's round trip
is added to both sides alike. Prints one JSON line per round and phase, then a summary.

    .venv/bin/python bench/rpc_tls_bench.py --rounds 4 --calls 20000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from fleet.certs import write_internal_pki
from internal_rpc import RpcClient, RpcPeer, RpcServer, RpcTlsSettings

SECRET = b"b" * 32
HOST = "127.0.0.1"


class Counting(trio.abc.Stream):
    """The server's socket stream, counting TCP payload bytes both ways (only while bytes are
    counted: the plain server reads a `trio.SocketStream` by a faster path)."""

    sent = 0
    received = 0

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.socket = stream.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        Counting.sent += len(data)
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.stream.receive_some(max_bytes)
        Counting.received += len(data)
        return data

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def confirm(peer: RpcPeer, params: dict[str, Any]) -> Any:
    return {"v": 1, "p": [[0, 0, 12345, -1, 1700000000000]]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(tls: RpcTlsSettings | None, args: argparse.Namespace) -> dict[str, Any]:
    frames = [0]

    def on_bytes(direction: str, method: str, nbytes: int, peer: int) -> None:
        frames[0] += nbytes

    server = RpcServer(1, SECRET, {"confirm": confirm}, tls=tls, on_bytes=on_bytes)

    counting = [True]

    async def handle(stream: trio.SocketStream) -> None:
        await server._handle(Counting(stream) if counting[0] else stream)  # type: ignore[arg-type]

    params = {"v": 1, "s": 7, "q": 42, "p": [[b"x" * args.size]]}
    out: dict[str, Any] = {"tls": tls is not None}
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host=HOST))
        port = listeners[0].socket.getsockname()[1]

        # Handshakes: a new client each time.
        connects: list[float] = []
        Counting.sent = Counting.received = 0
        frames[0] = 0
        for _ in range(args.connects):
            client = RpcClient(2, SECRET, HOST, port, tls=tls)
            start = time.perf_counter()
            await client._connection()
            connects.append(time.perf_counter() - start)
            await client.aclose()
        await trio.sleep(0.05)
        out["connect_ms_p50"] = round(statistics.median(connects) * 1e3, 3)
        out["handshake_wire_bytes"] = (Counting.sent + Counting.received) // args.connects
        out["handshake_frame_bytes"] = frames[0] // args.connects

        client = RpcClient(2, SECRET, HOST, port, tls=tls)
        await client.call("confirm", params)
        Counting.sent = Counting.received = 0
        frames[0] = 0
        for _ in range(1000):
            await client.call("confirm", params)
        out["call_wire_bytes"] = round((Counting.sent + Counting.received) / 1000, 1)
        out["call_frame_bytes"] = round(frames[0] / 1000, 1)
        await client.aclose()

        counting[0] = False
        client = RpcClient(2, SECRET, HOST, port, tls=tls)
        await client.call("confirm", params)
        latencies: list[float] = []
        for _ in range(args.calls):
            start = time.perf_counter()
            await client.call("confirm", params)
            latencies.append(time.perf_counter() - start)
        out["serial_us_p50"] = round(percentile(latencies, 0.5) * 1e6, 1)
        out["serial_us_p99"] = round(percentile(latencies, 0.99) * 1e6, 1)

        async def worker(n: int) -> None:
            for _ in range(n):
                await client.call("confirm", params)

        per = args.calls // args.in_flight
        start = time.perf_counter()
        async with trio.open_nursery() as workers:
            for _ in range(args.in_flight):
                workers.start_soon(worker, per)
        out["pipelined_calls_s"] = round(per * args.in_flight / (time.perf_counter() - start))
        await client.aclose()
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--connects", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--size", type=int, default=80, help="opaque bytes in each call's params")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rpc-tls-bench-") as tmp:
        pki = write_internal_pki(Path(tmp))
        tls = RpcTlsSettings(pki.server.cert, pki.server.key, pki.ca_cert)
        results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for r in range(args.rounds):
            for side in (None, tls) if r % 2 == 0 else (tls, None):
                result = trio.run(measure, side, args)
                print(json.dumps({"round": r, **result}), flush=True)
                results[side is not None].append(result)

    def med(on: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[on])

    summary = {
        key: {"plain": med(False, key), "tls": med(True, key), "tls/plain": 0.0}
        for key in results[True][0]
        if key != "tls"
    }
    for values in summary.values():
        values["tls/plain"] = round(values["tls"] / values["plain"], 3) if values["plain"] else 0
    print(json.dumps({"summary": summary}, indent=1))


if __name__ == "__main__":
    main()
