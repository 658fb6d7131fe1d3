"""The main side of the proxy path: confirm a PREPARED payload, LINK it, serve and replay it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError
from kio.schema.errors import ErrorCode

from internal_rpc import RpcError
from internal_rpc.messages import BatchSummary, ConfirmParams, ConfirmPart
from kafka_wire.record_batch import build_batch, parse_batch_header
from main_broker.api.confirm import handle_confirm
from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from main_broker.state_stream import publish_state
from shared_wal import RecordType, WalConfig, WalWriter, open_wal_fs


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Polls `check` until it holds; fails with `what` after `timeout` seconds."""
    deadline = trio.current_time() + timeout
    while not check():
        assert trio.current_time() < deadline, what
        await trio.sleep(0.01)


def _config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(node_id=1, zone="az1", wal_url=f"osfs://{tmp_path / 'wal'}", port=0)


async def _prepare(url: str, batches: list[bytes]) -> list[Any]:
    """Act as proxy 'proxy-2': write PREPARED records to its own WAL directory."""
    wal = await WalWriter.open(open_wal_fs(url), "proxy-2", WalConfig())
    positions = []
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.run)
        for batch in batches:
            positions.append(await wal.append(RecordType.PREPARED, {"t": "x"}, batch))
        await wal.aclose()
        nursery.cancel_scope.cancel()
    return positions


def _consume(bootstrap: str, topic: str, n: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF and len(out) >= n:
                break
            continue
        out.append((msg.offset(), msg.value()))
    consumer.close()
    return out


def _batch(values: list[bytes], pid: int = -1, seq: int = -1) -> bytes:
    return build_batch(
        [(None, v) for v in values],
        timestamp_ms=int(time.time() * 1000),
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
    )


def _params(
    positions: list[Any], seq: int, session: str = "s1", batches: list[bytes] | None = None
) -> dict[str, Any]:
    """A confirm as a proxy of the previous release sent it (version 1: the main reads each
    payload back), or with `batches`, as a proxy sends it now (version 2: each part carries
    its batch's header summary)."""
    if batches is None:
        return {
            "sess": session,
            "seq": seq,
            "acks": -1,
            "tmo": 5000,
            "v": 9,
            "parts": [["t", 0, p.writer, p.segment, p.position, p.length] for p in positions],
        }
    parts = tuple(
        ConfirmPart(
            "t",
            0,
            p.writer,
            p.segment,
            p.position,
            p.length,
            BatchSummary.of(parse_batch_header(batch)),
        )
        for p, batch in zip(positions, batches, strict=True)
    )
    return ConfirmParams(9, 5000, parts, session, seq).to_wire()


class ReadCounter:
    """Counts the PREPARED payloads the main reads back."""

    def __init__(self, broker: MainBroker) -> None:
        self.reads = 0
        batches = broker.store.batches
        read = batches.read_prepared

        def counted(position: Any) -> bytearray:
            self.reads += 1
            return read(position)

        batches.read_prepared = counted  # type: ignore[method-assign]


@pytest.mark.parametrize("version", [1, 2])
async def test_confirmed_payload_is_linked_served_and_replayed(
    tmp_path: Path, version: int
) -> None:
    url = f"osfs://{tmp_path / 'wal'}"
    batches = [
        _batch([f"a{i}".encode() for i in range(3)], pid=5, seq=0),
        _batch([f"b{i}".encode() for i in range(2)], pid=5, seq=3),
    ]
    positions = await _prepare(url, batches)
    broker = MainBroker(_config(tmp_path))
    frames: list[dict[str, Any]] = []
    summaries = batches if version == 2 else None
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker.run)
        await broker.store.create_topic("t", 1, {})
        counter = ReadCounter(broker)

        async def send(frame: Any) -> None:
            frames.append(frame)

        nursery.start_soon(publish_state, broker.store, 1, send)
        # The second confirm arrives first: it must wait for seq 0.
        async with trio.open_nursery() as inner:
            second: list[dict[str, Any]] = []

            async def late() -> None:
                params = _params(positions[1:], 1, batches=summaries and summaries[1:])
                second.append(await handle_confirm(broker, params))

            inner.start_soon(late)
            await _until(lambda: broker.confirms.parked("s1") == 1, "seq 1 never waited")
            params = _params(positions[:1], 0, batches=summaries and summaries[:1])
            first = await handle_confirm(broker, params)
        assert first["parts"][0][:2] == [ErrorCode.none, 0]
        assert second[0]["parts"][0][:2] == [ErrorCode.none, 3]
        # A retried confirm of the same batch is a duplicate with the original offset.
        dup = await handle_confirm(
            broker, _params(positions[:1], 2, batches=summaries and summaries[:1])
        )
        assert dup["parts"][0][:2] == [ErrorCode.none, 0]
        assert broker.store.partition("t", 0).high_watermark == 5  # type: ignore[union-attr]
        # Version 1 reads each payload back before deciding; version 2 decides on the summary.
        assert counter.reads == (3 if version == 1 else 0)
        # The log holds each batch's own size, not its PREPARED record's (an upload's ranges
        # are sized from it).
        plog = broker.store.partition("t", 0)
        assert plog is not None
        assert [e.size for e in plog.entries] == [len(b) for b in batches]
        assert all(p.length > len(b) for p, b in zip(positions, batches, strict=True))
        if version == 2:
            # The bytes come into the main's cache afterwards, off the produce path.
            await _until(
                lambda: all(e.data is not None for e in plog.entries), "linked bytes never read"
            )
            assert broker.store.linked_payloads.read == 2
        # The main's own WAL holds LINK records, not the payload.
        records = list(broker.store.reader.iter_records())
        assert [r.type for r in records].count(RecordType.LINK) == 2
        assert RecordType.DATA not in [r.type for r in records]
        got = await trio.to_thread.run_sync(_consume, f"127.0.0.1:{port}", "t", 5)
        assert [v for _, v in got] == [b"a0", b"a1", b"a2", b"b0", b"b1"]

        def rows() -> list[Any]:
            return [p for f in frames for p in f.get("parts", ()) if p[0] == "t"]

        # State stream: full snapshot then deltas with the high watermark moving to 5.
        await _until(lambda: bool(rows()) and rows()[-1][3] == 5, f"no HW 5 in {frames}")
        assert frames[0]["full"] is True
        last = rows()[-1]
        assert last[3] == 5 and last[6] == 5
        nursery.cancel_scope.cancel()

    # Restart: LINK records are rebuilt from the proxy's PREPARED payloads.
    broker2 = MainBroker(_config(tmp_path))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(broker2.run)
        plog = broker2.store.partition("t", 0)
        assert plog is not None and plog.high_watermark == 5
        for entry in plog.entries:
            entry.data = None  # force the read through the link
        got = await trio.to_thread.run_sync(_consume, f"127.0.0.1:{port}", "t", 5)
        assert got == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"b0"), (4, b"b1")]
        nursery.cancel_scope.cancel()


async def test_confirm_of_unknown_or_corrupt_payload_fails_cleanly(tmp_path: Path) -> None:
    url = f"osfs://{tmp_path / 'wal'}"
    positions = await _prepare(url, [_batch([b"z"])])
    broker = MainBroker(_config(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await broker.store.create_topic("t", 1, {})
        p = positions[0]
        bad = dict(_params(positions, 0))
        bad["parts"] = [["t", 0, p.writer, p.segment, p.position + 1, p.length]]
        result = await handle_confirm(broker, bad)
        assert result["parts"][0][0] == ErrorCode.kafka_storage_error
        missing = _params(positions, 1)
        missing["parts"][0][0] = "no-such-topic"
        result = await handle_confirm(broker, missing)
        assert result["parts"][0][0] == ErrorCode.not_leader_or_follower
        assert broker.store.partition("t", 0).high_watermark == 0  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_internal_rpc_confirm_state_and_relay(tmp_path: Path) -> None:
    from internal_rpc import RpcClient
    from kafka_wire.codec import build_request, decode_response, encode_request

    url = f"osfs://{tmp_path / 'wal'}"
    positions = await _prepare(url, [_batch([b"r0", b"r1"])])
    secret = b"s" * 32
    config = _config(tmp_path)
    config.rpc_port, config.rpc_secret = 0, secret
    broker = MainBroker(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await broker.store.create_topic("t", 1, {})
        assert broker.rpc_port
        client = RpcClient(2, secret, "127.0.0.1", broker.rpc_port)
        async with client.subscribe("state", {}) as frames:
            first = await frames.__anext__()
            assert first["full"] and first["parts"] == [["t", 0, 0, 0, 0, 0, 0]]
            result = await client.call("confirm", _params(positions, 0), idempotent=False)
            assert result["parts"][0][:2] == [ErrorCode.none, 0]
            with trio.fail_after(5):
                async for frame in frames:
                    if any(p[:4] == ["t", 0, 0, 2] for p in frame.get("parts", ())):
                        break
        # A relayed ApiVersions comes back as the main's own response frame.
        request = encode_request(
            18,
            3,
            42,
            "relayed",
            build_request(18, 3, {"client_software_name": "t", "client_software_version": "1"}),
        )
        relayed = await client.call("relay", {"frame": request, "host": "10.0.0.1"})
        cid, response = decode_response(18, 3, relayed["frame"])
        assert cid == 42 and response.error_code == ErrorCode.none
        # A wrong secret is refused.
        intruder = RpcClient(3, b"x" * 32, "127.0.0.1", broker.rpc_port)
        with pytest.raises(RpcError):
            await intruder.call("confirm", _params(positions, 0), timeout=2, retries=0)
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_sequence_gap_through_a_proxy_is_answered_as_possibly_written(
    tmp_path: Path,
) -> None:
    """A batch that overtook an earlier one of its producer (both through a proxy) is not
    answered OUT_OF_ORDER_SEQUENCE_NUMBER, on which librdkafka bumps its epoch for every
    partition and resends unacknowledged batches as new (the failover bench read records
    twice), but REQUEST_TIMED_OUT: the client resends from its first unacknowledged batch,
    in order, and both land."""
    url = f"osfs://{tmp_path / 'wal'}"
    batches = [
        _batch([b"a0", b"a1"], pid=9, seq=0),
        _batch([b"b0"], pid=9, seq=2),
        _batch([b"c0"], pid=9, seq=3),
    ]
    positions = await _prepare(url, batches)
    broker = MainBroker(_config(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        await broker.store.create_topic("t", 1, {})
        first = await handle_confirm(broker, _params(positions[:1], 0, "s1", batches[:1]))
        assert first["parts"][0][:2] == [ErrorCode.none, 0]
        # seq 3 arrives on another session before seq 2 (which a failed call held).
        gap = await handle_confirm(broker, _params(positions[2:], 0, "s2", batches[2:]))
        code, _, _, _, message = gap["parts"][0][:5]
        assert code == ErrorCode.request_timed_out and "in order" in message
        for seq, i in ((1, 1), (2, 2)):
            again = await handle_confirm(
                broker, _params(positions[i : i + 1], seq, "s2", batches[i : i + 1])
            )
            assert again["parts"][0][:2] == [ErrorCode.none, i + 1]
        nursery.cancel_scope.cancel()
