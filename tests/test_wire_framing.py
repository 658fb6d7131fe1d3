"""kafka_wire.framing: frame reading/writing over memory streams and real sockets."""

from __future__ import annotations

import array
import os
import ssl
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kafka_wire.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameError,
    FrameReader,
    FrameTooLarge,
    TruncatedFrame,
    send_frame,
)


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def test_frames_split_across_tiny_sends() -> None:
    send, receive = trio.testing.lockstep_stream_pair()
    bodies = [b"a", b"", os.urandom(300), os.urandom(5000)]
    wire = b"".join(framed(b) for b in bodies)

    async def trickle() -> None:
        for i in range(0, len(wire), 3):
            await send.send_all(wire[i : i + 3])
        await send.aclose()

    reader = FrameReader(receive, read_buffer_bytes=64)
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        while (frame := await reader.read_frame()) is not None:
            got.append(bytes(frame))
    assert got == bodies


async def test_pipelined_frames_in_one_send() -> None:
    send, receive = trio.testing.memory_stream_pair()
    bodies = [os.urandom(n) for n in (0, 1, 17, 200, 4096, 70_000, 3, 9)]
    await send.send_all(b"".join(framed(b) for b in bodies))
    await send.aclose()
    reader = FrameReader(receive, read_buffer_bytes=1024)
    got = []
    while (frame := await reader.read_frame()) is not None:
        assert isinstance(frame, bytearray)  # writable: brokers patch batches in place
        got.append(bytes(frame))
    assert got == bodies


async def test_oversize_refused_before_allocating() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(struct.pack(">i", 2**31 - 1) + b"xx")
    reader = FrameReader(receive)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(FrameTooLarge):
            await reader.read_frame()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 1.0
    assert peak < 1 << 20


async def test_custom_limit_is_inclusive() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(framed(b"x" * 100) + framed(b"y" * 101))
    reader = FrameReader(receive, max_frame_bytes=100)
    assert await reader.read_frame() == b"x" * 100
    with pytest.raises(FrameTooLarge):
        await reader.read_frame()
    assert DEFAULT_MAX_FRAME_BYTES == 100 * 1024 * 1024


async def test_negative_size() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(struct.pack(">i", -1))
    with pytest.raises(FrameError, match="negative"):
        await FrameReader(receive).read_frame()


@pytest.mark.parametrize("wire", [framed(b"abcdef")[:-2], b"\x00\x00"])
async def test_truncated_frame(wire: bytes) -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(framed(b"ok") + wire)
    await send.aclose()
    reader = FrameReader(receive)
    assert await reader.read_frame() == b"ok"
    with pytest.raises(TruncatedFrame):
        await reader.read_frame()


async def test_clean_eof_returns_none() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.aclose()
    assert await FrameReader(receive).read_frame() is None


async def test_cancelled_read_resumes_without_losing_bytes() -> None:
    send, receive = trio.testing.memory_stream_pair()
    body = os.urandom(10_000)
    wire = framed(body) + framed(b"next")
    reader = FrameReader(receive, read_buffer_bytes=256)
    await send.send_all(wire[:2])
    with trio.move_on_after(0.05):
        await reader.read_frame()
    await send.send_all(wire[2:5000])
    with trio.move_on_after(0.05):
        await reader.read_frame()
    await send.send_all(wire[5000:])
    assert await reader.read_frame() == body
    assert await reader.read_frame() == b"next"


async def test_send_frame_parts() -> None:
    send, receive = trio.testing.memory_stream_pair()
    big = os.urandom(100_000)
    words = array.array("I", [1, 2, 3])
    parts: list[Any] = [b"head", bytearray(b"-mid-"), memoryview(big), words, b"", b"tail"]
    await send_frame(send, parts)
    await send.aclose()
    expected = b"head-mid-" + big + words.tobytes() + b"tail"
    assert await FrameReader(receive).read_frame() == expected


async def test_real_socket_recv_into_and_sendmsg() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    # Large frames go straight into the body; small pipelined ones through the buffer.
    payloads = [[b"x" * 10], [b"h" * 20, os.urandom(3 << 20), b"t" * 5], [b""]]
    payloads += [[os.urandom(n)] for n in range(1, 60)]
    payloads.append([os.urandom(64 * 1024), os.urandom(200_000), b"z"])
    received: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream)
        assert reader._sock is not None  # the recv_into fast path
        while (frame := await reader.read_frame()) is not None:
            received.append(bytes(frame))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        for parts in payloads:
            await send_frame(client, parts)
        await client.aclose()
        with trio.fail_after(10):
            while len(received) < len(payloads):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert received == [b"".join(p) for p in payloads]


async def test_real_socket_truncation_and_close() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    outcome: list[BaseException | bytearray | None] = []

    async def serve(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream)
        try:
            outcome.append(await reader.read_frame())
            outcome.append(await reader.read_frame())
        except FrameError as exc:
            outcome.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(framed(b"whole") + struct.pack(">i", 1_000_000) + b"part")
        await client.aclose()
        with trio.fail_after(5):
            while len(outcome) < 2:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert outcome[0] == b"whole"
    assert isinstance(outcome[1], TruncatedFrame)


async def test_closed_socket_reader() -> None:
    a, b = trio.socket.socketpair()
    stream = trio.SocketStream(a)
    reader = FrameReader(stream)
    await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await reader.read_frame()
    b.close()


async def test_frames_over_tls_take_every_record_received_in_one_read(tmp_path: Path) -> None:
    """Over trio's SSLStream a 1 MiB frame (64 TLS records) arrives whole, with the frames
    around it, in far fewer receive_some calls than records: the reader takes what the SSL
    object has already received without going through trio for each record."""
    from fleet.certs import write_internal_pki

    pki = write_internal_pki(tmp_path / "pki")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki.server.cert, pki.server.key)
    client_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client = trio.SSLStream(client_raw, client_ctx, server_hostname="localhost")
    server = trio.SSLStream(server_raw, server_ctx, server_side=True)
    calls = 0
    receive_some = server.receive_some

    async def counted(max_bytes: int | None = None) -> bytes | bytearray:
        nonlocal calls
        calls += 1
        return await receive_some(max_bytes)

    server.receive_some = counted  # type: ignore[method-assign]
    big = os.urandom(1 << 20)
    frames = [b"first", big, b"last"]
    reader = FrameReader(server, max_frame_bytes=2 << 20)
    received: list[bytes] = []

    async def write() -> None:
        for frame in frames:
            await send_frame(client, [frame])

    async def read() -> None:
        for _ in frames:
            frame = await reader.read_frame()
            assert frame is not None
            received.append(bytes(frame))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        nursery.start_soon(read)
    assert received == frames
    assert calls < 64 // 2, f"{calls} receive_some calls for 64+ records"
