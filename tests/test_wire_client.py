"""kafka_wire.client against a tiny in-test trio server."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from kafka_wire.client import KafkaClient, KafkaConnectionError, UnsupportedVersion
from kafka_wire.codec import (
    KIO_VERSION_RANGES,
    RequestHeader,
    api_versions_unsupported,
    build_response,
    decode_request,
    encode_response,
    parse_request_header,
)
from kafka_wire.errors import ErrorCode
from kafka_wire.framing import FrameReader, send_frame

BROKER_RANGES = {18: (0, 3), 3: (0, 9), 0: (3, 20)}

Handler = Callable[[RequestHeader, Any], Any]


class TinyBroker:
    """Answers requests strictly in order, as a Kafka broker does on one connection."""

    def __init__(self, *, reject_api_versions_above: int | None = None) -> None:
        self.reject_api_versions_above = reject_api_versions_above
        self.seen: list[RequestHeader] = []
        self.delays: dict[str, float] = {}
        self.close_on: str | None = None

    async def serve(self, stream: trio.SocketStream) -> None:
        reader = FrameReader(stream)
        async with stream:
            while (frame := await reader.read_frame()) is not None:
                header = parse_request_header(frame)
                self.seen.append(header)
                reply = await self.answer(header, frame)
                if reply is None:
                    return
                await send_frame(stream, [reply])

    async def answer(self, header: RequestHeader, frame: bytearray) -> bytes | None:
        if header.api_key == 18:
            limit = self.reject_api_versions_above
            ranges = BROKER_RANGES if limit is None else BROKER_RANGES | {18: (0, limit)}
            if limit is not None and header.api_version > limit:
                return api_versions_unsupported(header.correlation_id, ranges)
            request = decode_request(header, frame)
            body = build_response(
                18,
                header.api_version,
                {
                    "api_keys": [
                        {"api_key": k, "min_version": lo, "max_version": hi}
                        for k, (lo, hi) in ranges.items()
                    ]
                },
            )
            assert request is not None
            return encode_response(header, body)
        assert header.api_key == 3
        request = decode_request(header, frame)
        name = request.topics[0].name
        if name == self.close_on:
            return None
        await trio.sleep(self.delays.get(name, 0))
        body = build_response(
            3,
            header.api_version,
            {"topics": [{"name": name, "partitions": [{"partition_index": 0, "leader_id": 1}]}]},
        )
        return encode_response(header, body)


@asynccontextmanager
async def running(broker: TinyBroker) -> AsyncIterator[int]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, broker.serve, listeners)
        yield port
        nursery.cancel_scope.cancel()


async def test_api_versions_and_pick_version() -> None:
    broker = TinyBroker()
    async with running(broker) as port:
        client = await KafkaClient.connect("127.0.0.1", port, client_id="zone=use1-az1")
        async with client:
            assert client.versions == BROKER_RANGES
            assert await client.api_versions() == BROKER_RANGES
            assert client.pick_version(3, 12) == 9
            assert client.pick_version(3, 4) == 4
            assert client.pick_version(0, 99) == min(20, KIO_VERSION_RANGES[0][1])
            with pytest.raises(UnsupportedVersion):
                client.pick_version(0, 2)
            with pytest.raises(UnsupportedVersion):
                client.pick_version(1, 12)  # the broker does not offer Fetch
    assert broker.seen[0].api_version == 3
    assert broker.seen[0].client_id == "zone=use1-az1"


async def test_api_versions_falls_back_to_v0() -> None:
    broker = TinyBroker(reject_api_versions_above=0)
    async with running(broker) as port:
        async with await KafkaClient.connect("127.0.0.1", port) as client:
            assert client.versions == BROKER_RANGES | {18: (0, 0)}
    assert [h.api_version for h in broker.seen] == [3, 0]


async def test_concurrent_requests_matched_by_correlation_id() -> None:
    broker = TinyBroker()
    names = [f"topic-{i}" for i in range(40)]
    rng = random.Random(5)
    broker.delays = {name: rng.random() * 0.01 for name in names}
    results: dict[str, Any] = {}
    async with running(broker) as port:
        async with await KafkaClient.connect("127.0.0.1", port) as client:

            async def one(name: str, version: int) -> None:
                await trio.sleep(rng.random() * 0.005)
                results[name] = (
                    version,
                    await client.request(3, version, {"topics": [{"name": name}]}),
                )

            async with trio.open_nursery() as nursery:
                for i, name in enumerate(names):
                    nursery.start_soon(one, name, (1, 9)[i % 2])
                nursery.start_soon(client.api_versions)
    assert set(results) == set(names)
    for name, (version, response) in results.items():
        assert type(response).__version__ == version
        assert response.topics[0].name == name
    ids = [h.correlation_id for h in broker.seen]
    assert len(set(ids)) == len(ids)


async def test_timeout_drops_late_response_and_connection_stays_usable() -> None:
    broker = TinyBroker()
    broker.delays = {"slow": 0.3}
    async with running(broker) as port:
        async with await KafkaClient.connect("127.0.0.1", port) as client:
            with pytest.raises(trio.TooSlowError):
                await client.request(3, 9, {"topics": [{"name": "slow"}]}, timeout=0.05)
            response = await client.request(3, 9, {"topics": [{"name": "fast"}]})
            assert response.topics[0].name == "fast"


async def test_request_accepts_entities() -> None:
    from kafka_wire.codec import build_request

    broker = TinyBroker()
    async with running(broker) as port:
        async with await KafkaClient.connect("127.0.0.1", port, negotiate=False) as client:
            assert client.versions == {}
            entity = build_request(3, 4, {"topics": [{"name": "e"}]})
            response = await client.request(3, 4, entity)
            assert response.topics[0].name == "e"
            assert response.topics[0].error_code is ErrorCode.none
            with pytest.raises(ValueError):
                await client.request(3, 5, entity)


async def test_broken_connection_fails_pending_and_later_requests() -> None:
    broker = TinyBroker()
    broker.close_on = "boom"
    broker.delays = {"waiting": 0.05}
    errors: list[BaseException] = []
    async with running(broker) as port:
        async with await KafkaClient.connect("127.0.0.1", port) as client:

            async def expect_failure(name: str) -> None:
                try:
                    await client.request(3, 9, {"topics": [{"name": name}]})
                except KafkaConnectionError as exc:
                    errors.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(expect_failure, "boom")
                await trio.sleep(0.01)
                nursery.start_soon(expect_failure, "after")
            assert len(errors) == 2
            with pytest.raises(KafkaConnectionError):
                await client.request(3, 9, {"topics": [{"name": "later"}]})
