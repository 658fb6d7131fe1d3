"""Internal RPC over loopback: handshake refusals, multiplexing, deadlines, reconnects and
subscriptions."""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio

from internal_rpc import (
    RpcAuthError,
    RpcClient,
    RpcPeer,
    RpcRemoteError,
    RpcServer,
    RpcTimeout,
    RpcUnavailable,
)
from internal_rpc import protocol as rpc
from internal_rpc.auth import answer_hello, hello_message, new_nonce, server_mac, verify_auth
from internal_rpc.frames import decode_body, encode_frame
from kafka_wire.codec import build_request, encode_request
from kafka_wire.framing import FrameReader

SECRET = b"k" * 32
WRONG = b"w" * 32
HOST = "127.0.0.1"


async def echo(peer: RpcPeer, params: dict[str, Any]) -> Any:
    return {"params": params, "peer": peer.node_id, "address": peer.address}


async def fail(peer: RpcPeer, params: dict[str, Any]) -> Any:
    raise KeyError(params.get("key"))


async def sleep_then(peer: RpcPeer, params: dict[str, Any]) -> Any:
    await trio.sleep(params["s"])
    return params["v"]


HANDLERS = {"echo": echo, "fail": fail, "sleep": sleep_then}


@asynccontextmanager
async def running(server: RpcServer, port: int = 0) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(server.serve, HOST, port)
        yield bound
        nursery.cancel_scope.cancel()


def server(**kw: Any) -> RpcServer:
    handlers = kw.pop("handlers", HANDLERS)
    return RpcServer(1, kw.pop("secret", SECRET), handlers, **kw)


async def raw_connect(port: int) -> tuple[trio.SocketStream, FrameReader, dict[str, Any]]:
    stream = await trio.open_tcp_stream(HOST, port)
    reader = FrameReader(stream)
    frame = await reader.read_frame()
    assert frame is not None
    return stream, reader, decode_body(frame)


async def closed_within(stream: trio.SocketStream, seconds: float) -> float:
    """Waits for the server to close; returns how long it took."""
    start = trio.current_time()
    with trio.fail_after(seconds):
        while True:
            try:
                if not await stream.receive_some(65536):
                    break
            except trio.BrokenResourceError:  # RST
                break
    return trio.current_time() - start


async def test_call_round_trip_and_accounting() -> None:
    server_bytes: list[tuple[str, str, int, int]] = []
    client_bytes: list[tuple[str, str, int, int]] = []
    srv = server(on_bytes=lambda *a: server_bytes.append(a))
    async with running(srv) as port:
        client = RpcClient(7, SECRET, HOST, port, on_bytes=lambda *a: client_bytes.append(a))
        result = await client.call("echo", {"x": [1, b"\x00"]})
        assert result["params"] == {"x": [1, b"\x00"]}
        assert result["peer"] == 7
        assert client.peer_node == 1
        await client.aclose()
        with pytest.raises(RpcUnavailable):
            await client.call("echo", {})
    sent = [n for d, m, n, peer in client_bytes if d == "out" and m == "echo"]
    received = [n for d, m, n, peer in server_bytes if d == "in" and m == "echo"]
    assert sent == received and sent[0] > 8
    assert {peer for *_, peer in client_bytes} == {1}
    assert {peer for *_, peer in server_bytes} == {7}
    assert any(m == "_handshake" for _, m, _, _ in server_bytes)


async def test_wrong_secret_is_refused_and_server_keeps_serving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(server()) as port:
        bad = RpcClient(7, WRONG, HOST, port)
        with pytest.raises(RpcAuthError):
            await bad.call("echo", {})
        assert any("refused connection from 127.0.0.1:" in r.getMessage() for r in caplog.records)
        good = RpcClient(8, SECRET, HOST, port)
        assert (await good.call("echo", {}))["peer"] == 8
        await good.aclose()


async def test_client_refuses_a_server_with_the_wrong_secret() -> None:
    async def impostor(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream)
        nonce = new_nonce()
        await stream.send_all(encode_frame(hello_message(1, nonce)))
        frame = await reader.read_frame()
        assert frame is not None
        auth = decode_body(frame)
        # It cannot check the client, and its own proof uses the wrong key.
        mac = server_mac(WRONG, nonce, auth["nonce"], 1, auth["node"])
        await stream.send_all(encode_frame({"t": "ok", "mac": mac}))
        await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, impostor, 0, host=HOST))
        port = listeners[0].socket.getsockname()[1]
        client = RpcClient(7, SECRET, HOST, port)
        with pytest.raises(RpcAuthError, match="server MAC"):
            await client.call("echo", {})
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # length parses as 0x47455420: oversize
        struct.pack(">I", 0xFFFFFFFF) + b"x" * 8,  # oversize u32
        struct.pack(">I", 20) + b"\x00" * 20,  # bad CRC
        encode_frame({"t": "hello", "v": 1}),  # valid frame, wrong message
        encode_frame({"t": "auth", "node": 5, "nonce": b"n" * 32, "mac": b"m" * 32}),
        struct.pack(">I", 2) + b"ab",  # too short for a CRC
    ],
)
async def test_garbage_is_refused_quickly(payload: bytes) -> None:
    async with running(server()) as port:
        stream, _, hello = await raw_connect(port)
        assert hello["t"] == "hello" and len(hello["nonce"]) == 32 and hello["node"] == 1
        await stream.send_all(payload)
        assert await closed_within(stream, 1.0) < 0.5
        await stream.aclose()
        client = RpcClient(7, SECRET, HOST, port)
        assert (await client.call("echo", {"n": 1}))["params"] == {"n": 1}


async def test_truncated_and_silent_peers_time_out_after_two_seconds() -> None:
    async with running(server()) as port:
        truncated, _, _ = await raw_connect(port)
        await truncated.send_all(struct.pack(">I", 100) + b"x" * 10)
        silent, _, _ = await raw_connect(port)
        async with trio.open_nursery() as nursery:
            for stream in (truncated, silent):

                async def check(stream: trio.SocketStream = stream) -> None:
                    waited = await closed_within(stream, 3.0)
                    assert 1.5 < waited < 2.5

                nursery.start_soon(check)


async def test_kafka_api_versions_request_is_refused() -> None:
    req = build_request(18, 3, {"client_software_name": "probe", "client_software_version": "1"})
    kafka = encode_request(18, 3, 1, "probe", req)
    async with running(server()) as port:
        stream = await trio.open_tcp_stream(HOST, port)
        # A Kafka client speaks first, without waiting for the hello.
        await stream.send_all(struct.pack(">i", len(kafka)) + kafka)
        data = bytearray()
        start = trio.current_time()
        with trio.fail_after(1.0):
            while chunk := await stream.receive_some(65536):
                data += chunk
        assert trio.current_time() - start < 0.5
        # All it ever saw is the hello: no error text, nothing about the request.
        assert decode_body(data[4:])["t"] == "hello"


def _kafka_admin(port: int) -> Exception:
    from kafka import KafkaAdminClient

    started = time.monotonic()
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=f"{HOST}:{port}",
            request_timeout_ms=3000,
            bootstrap_timeout_ms=2000,
            reconnect_backoff_max_ms=200,
        )
    except Exception as exc:
        assert time.monotonic() - started < 10
        return exc
    admin.close()
    raise AssertionError("KafkaAdminClient connected to the RPC port")


async def test_kafka_python_admin_client_cannot_connect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "zonefleet.rpc")
    async with running(server()) as port:
        error = await trio.to_thread.run_sync(_kafka_admin, port)
        assert type(error).__name__ in (
            "NoBrokersAvailable",
            "KafkaConnectionError",
            "KafkaTimeoutError",
        ), error
        # It really connected and was refused, not stopped by its own configuration.
        assert any("refused connection from 127.0.0.1:" in r.getMessage() for r in caplog.records)
        client = RpcClient(7, SECRET, HOST, port)
        assert (await client.call("echo", {}))["peer"] == 7


async def test_concurrent_calls_complete_out_of_order() -> None:
    done: list[int] = []
    results: dict[int, Any] = {}
    async with running(server()) as port:
        client = RpcClient(7, SECRET, HOST, port)

        async def one(i: int) -> None:
            results[i] = await client.call("sleep", {"s": 0.05 * (4 - i), "v": i * 10})
            done.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        await client.aclose()
    assert done == [3, 2, 1, 0]
    assert results == {i: i * 10 for i in range(4)}


async def test_slow_call_does_not_block_a_fast_one() -> None:
    release = trio.Event()
    started = trio.Event()

    async def slow(peer: RpcPeer, params: dict[str, Any]) -> Any:
        started.set()
        await release.wait()
        return "slow"

    async with running(server(handlers={**HANDLERS, "slow": slow})) as port:
        client = RpcClient(7, SECRET, HOST, port)
        async with trio.open_nursery() as nursery:
            slow_result: list[Any] = []

            async def call_slow() -> None:
                slow_result.append(await client.call("slow", {}, timeout=10))

            nursery.start_soon(call_slow)
            await started.wait()
            with trio.fail_after(1):
                for i in range(20):
                    assert (await client.call("echo", {"i": i}))["params"] == {"i": i}
            assert slow_result == []
            release.set()
        assert slow_result == ["slow"]


async def test_deadline_raises_timeout_and_cancels_the_handler() -> None:
    cancelled = trio.Event()
    seen_deadline: list[float] = []

    async def hang(peer: RpcPeer, params: dict[str, Any]) -> Any:
        seen_deadline.append(trio.current_effective_deadline() - trio.current_time())
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with running(server(handlers={**HANDLERS, "hang": hang})) as port:
        client = RpcClient(7, SECRET, HOST, port)
        assert (await client.call("echo", {}))["peer"] == 7
        start = trio.current_time()
        with pytest.raises(RpcTimeout):
            await client.call("hang", {}, timeout=0.2)
        assert 0.15 < trio.current_time() - start < 0.5
        with trio.fail_after(1):
            await cancelled.wait()
        assert 0 < seen_deadline[0] <= 0.2
        assert (await client.call("echo", {"after": 1}))["params"] == {"after": 1}


async def test_server_side_deadline_applies_without_the_client() -> None:
    async with running(server()) as port:
        stream, reader, hello = await raw_connect(port)
        nonce = new_nonce()
        auth, _, _ = answer_hello(SECRET, 9, hello, nonce)
        await stream.send_all(encode_frame(auth))
        assert await reader.read_frame() is not None
        req = {"t": "req", "id": 5, "m": "sleep", "p": {"s": 5, "v": 1}, "dl": 100}
        await stream.send_all(encode_frame(req))
        with trio.fail_after(1):
            frame = await reader.read_frame()
        assert frame is not None
        assert decode_body(frame) == {
            "t": "err",
            "id": 5,
            "code": "DeadlineExceeded",
            "msg": "sleep",
        }
        await stream.aclose()


async def test_handler_exception_keeps_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    async with running(server()) as port:
        client = RpcClient(7, SECRET, HOST, port)
        first = (await client.call("echo", {}))["address"]
        with pytest.raises(RpcRemoteError) as info:
            await client.call("fail", {"key": "nope"})
        assert info.value.code == "KeyError" and "nope" in info.value.msg
        assert any("fail from 127.0.0.1" in r.getMessage() for r in caplog.records)
        with pytest.raises(RpcRemoteError) as unknown:
            await client.call("missing", {})
        assert unknown.value.code == "UnknownMethod"
        # Same connection: the server sees the same client port.
        assert (await client.call("echo", {}))["address"] == first


async def test_unencodable_result_becomes_an_error() -> None:
    async def bad(peer: RpcPeer, params: dict[str, Any]) -> Any:
        return object()

    async with running(server(handlers={**HANDLERS, "bad": bad})) as port:
        client = RpcClient(7, SECRET, HOST, port)
        with pytest.raises(RpcRemoteError) as info:
            await client.call("bad", {})
        assert info.value.code == "TypeError"
        assert (await client.call("echo", {}))["peer"] == 7


async def test_a_timed_out_non_idempotent_call_resets_its_connection() -> None:
    # A confirm that timed out must never land later (the proxy has answered its client):
    # its connection is reset, not left to deliver it when a network partition heals.
    started, release = trio.Event(), trio.Event()

    async def hang(peer: RpcPeer, params: dict[str, Any]) -> Any:
        started.set()
        # Past its deadline too: no DEADLINE_EXCEEDED reply may beat the client's own.
        with trio.CancelScope(shield=True):
            await release.wait()

    async with running(server(handlers={**HANDLERS, "hang": hang})) as port:
        try:
            client = RpcClient(7, SECRET, HOST, port)
            first = (await client.call("echo", {}))["address"]
            other: list[BaseException] = []

            async def another_call() -> None:
                try:
                    await client.call("hang", {}, timeout=5, idempotent=False)
                except RpcUnavailable as exc:
                    other.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(another_call)
                await started.wait()
                with pytest.raises(RpcTimeout):
                    await client.call("hang", {}, timeout=0.2, idempotent=False)
            assert len(other) == 1  # the connection's other confirm failed with it, at once
            assert (await client.call("echo", {}))["address"] != first  # a new connection
            await client.aclose()
        finally:
            release.set()


async def test_a_subscription_to_a_peer_that_never_answers_is_unavailable() -> None:
    # A peer across a network partition: the connection never completes its handshake. The
    # subscriber gets RpcUnavailable (and resubscribes), never a bare TooSlowError.
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host=HOST))
        port = listeners[0].socket.getsockname()[1]
        client = RpcClient(7, SECRET, HOST, port, connect_timeout=0.2)
        with pytest.raises(RpcUnavailable):
            async with client.subscribe("state", {}):
                pass
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_server_restart_client_reconnects_on_next_call() -> None:
    srv = server()
    async with running(srv) as port:
        client = RpcClient(7, SECRET, HOST, port)
        first = (await client.call("echo", {}))["address"]
    with pytest.raises(RpcUnavailable):
        await client.call("echo", {}, retries=1)
    async with running(server(), port):
        # The idle connection's EOF is noticed before sending: even a non-idempotent call
        # goes through on a fresh connection.
        second = await client.call("echo", {"n": 2}, idempotent=False)
        assert second["params"] == {"n": 2} and second["address"] != first
    await client.aclose()


@asynccontextmanager
async def flaky_server(drop: Callable[[], bool]) -> AsyncIterator[tuple[int, list[int]]]:
    """Authenticates, then closes the connection after reading a request when `drop()`."""
    requests: list[int] = []

    async def handle(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream)
        nonce = new_nonce()
        await stream.send_all(encode_frame(hello_message(1, nonce)))
        frame = await reader.read_frame()
        assert frame is not None
        _, ok = verify_auth(SECRET, 1, nonce, decode_body(frame))
        await stream.send_all(encode_frame(ok))
        while (frame := await reader.read_frame()) is not None:
            req = decode_body(frame)
            requests.append(req["id"])
            if drop():
                await stream.aclose()
                return
            await stream.send_all(encode_frame({"t": "res", "id": req["id"], "r": "ok"}))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host=HOST))
        yield listeners[0].socket.getsockname()[1], requests
        nursery.cancel_scope.cancel()


async def test_retries_only_idempotent_calls_after_a_drop() -> None:
    async with flaky_server(lambda: True) as (port, requests):
        client = RpcClient(7, SECRET, HOST, port)
        with pytest.raises(RpcUnavailable) as dropped:
            await client.call("x", {}, idempotent=False)
        assert len(requests) == 1
        assert dropped.value.request_sent  # the peer may have acted on it
        with pytest.raises(RpcUnavailable):
            await client.call("x", {}, retries=2)
        assert len(requests) == 1 + 3
    drops = iter([True, False])
    async with flaky_server(lambda: next(drops)) as (port, requests):
        client = RpcClient(7, SECRET, HOST, port)
        assert await client.call("x", {}) == "ok"
        assert len(requests) == 2


async def test_unreachable_peer_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        client = RpcClient(7, SECRET, HOST, port)
        start = trio.current_time()
        with pytest.raises(RpcUnavailable) as refused:
            await client.call("echo", {}, retries=2)
        assert trio.current_time() - start < 1.5
        assert not refused.value.request_sent  # surely not done


def _stream_server() -> tuple[RpcServer, dict[str, Any]]:
    state: dict[str, Any] = {
        "changes": trio.open_memory_channel[int](100),
        "cancelled": 0,
        "value": 0,
    }

    async def deltas(
        peer: RpcPeer, params: dict[str, Any], push: Callable[[Any], Awaitable[None]]
    ) -> None:
        try:
            await push({"snapshot": state["value"], "since": params["since"]})
            async for v in state["changes"][1]:
                state["value"] = v
                await push({"delta": v})
                if v < 0:
                    return
        finally:
            state["cancelled"] += 1

    async def broken(
        peer: RpcPeer, params: dict[str, Any], push: Callable[[Any], Awaitable[None]]
    ) -> None:
        await push(1)
        raise RuntimeError("stream broke")

    return server(streams={"deltas": deltas, "broken": broken}), state


async def test_subscription_pushes_end_and_cancel() -> None:
    srv, state = _stream_server()
    async with running(srv) as port:
        client = RpcClient(7, SECRET, HOST, port)
        async with client.subscribe("deltas", {"since": 3}) as items:
            assert await items.__anext__() == {"snapshot": 0, "since": 3}
            for v in (1, 2, 3):
                await state["changes"][0].send(v)
                assert await items.__anext__() == {"delta": v}
            # Calls share the connection with the subscription.
            assert (await client.call("echo", {}))["peer"] == 7
        with trio.fail_after(1):
            while state["cancelled"] < 1:
                await trio.sleep(0.01)
        # A stream that returns ends the iteration.
        async with client.subscribe("deltas", {"since": 0}) as items:
            await state["changes"][0].send(-1)
            assert [item async for item in items] == [{"snapshot": 3, "since": 0}, {"delta": -1}]
        async with client.subscribe("broken", {}) as items:
            assert await items.__anext__() == 1
            with pytest.raises(RpcRemoteError, match="stream broke"):
                await items.__anext__()
        async with client.subscribe("nope", {}) as items:
            with pytest.raises(RpcRemoteError, match="UnknownStream"):
                await items.__anext__()
        assert (await client.call("echo", {}))["peer"] == 7


@asynccontextmanager
async def stoppable(srv: RpcServer) -> AsyncIterator[tuple[int, trio.CancelScope]]:
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[int]) -> None:
        with scope:
            await srv.serve(HOST, 0, task_status=task_status)

    async with trio.open_nursery() as nursery:
        yield await nursery.start(run), scope
        scope.cancel()


async def test_dropped_subscription_raises_then_resubscribe_gets_snapshot() -> None:
    srv, state = _stream_server()
    async with stoppable(srv) as (port, stop):
        client = RpcClient(7, SECRET, HOST, port)
        async with client.subscribe("deltas", {"since": 0}) as items:
            assert await items.__anext__() == {"snapshot": 0, "since": 0}
            await state["changes"][0].send(5)
            assert await items.__anext__() == {"delta": 5}
            stop.cancel()  # the server goes away while the subscriber waits
            with trio.fail_after(1), pytest.raises(RpcUnavailable):
                await items.__anext__()
    srv2, state2 = _stream_server()
    state2["value"] = 5
    async with running(srv2, port):
        async with client.subscribe("deltas", {"since": 5}) as items:
            assert await items.__anext__() == {"snapshot": 5, "since": 5}
    await client.aclose()


async def test_many_concurrent_calls_with_timeouts_share_one_connection() -> None:
    # Callers that time out while reading for everyone must hand the reader role on.
    async with running(server()) as port:
        client = RpcClient(7, SECRET, HOST, port)
        outcomes: dict[int, Any] = {}

        async def one(i: int) -> None:
            delay = (i * 7919 % 100) / 1000
            try:
                outcomes[i] = await client.call(
                    "sleep", {"s": delay, "v": i}, timeout=0.03 if i % 5 == 0 else 2
                )
            except RpcTimeout:
                outcomes[i] = "timeout"

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, i)
        for i, outcome in outcomes.items():
            delay = (i * 7919 % 100) / 1000
            if i % 5:
                assert outcome == i
            elif delay > 0.05:
                assert outcome == "timeout"
        assert len(outcomes) == 200
        assert (await client.call("echo", {}))["peer"] == 7


async def test_subscriber_that_falls_behind_must_resubscribe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc, "MAX_BUFFERED_PUSHES", 3)

    async def burst(
        peer: RpcPeer, params: dict[str, Any], push: Callable[[Any], Awaitable[None]]
    ) -> None:
        for i in range(10):
            await push(i)
        await trio.sleep_forever()

    async with running(server(streams={"burst": burst})) as port:
        client = RpcClient(7, SECRET, HOST, port)
        async with client.subscribe("burst", {}) as items:
            # The subscriber is busy; a call reads (and buffers) every push meanwhile.
            await trio.sleep(0.1)
            assert (await client.call("echo", {}))["peer"] == 7
            assert [await items.__anext__() for _ in range(3)] == [0, 1, 2]
            with pytest.raises(RpcUnavailable, match="behind"):
                await items.__anext__()
