"""Traffic by topic (issue 10): how a Produce or Fetch frame is split among its topics (exact
sums, largest-remainder rounding, the request on the first topic, frames without topics), the
topic entries of requests and responses measured against kio's own encoding of each entry,
and the Kafka meter booking both directions into the ledger and Prometheus."""

from __future__ import annotations

import datetime
import io
import uuid
from functools import partial
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from kio.serial import entity_writer

from kafka_wire.codec import build_request, decode_response, encode_request, parse_request_header
from kafka_wire.framing import FrameReader, send_frame
from kafka_wire.hot_codecs import (
    FetchPartitionResult,
    ProducePartitionResult,
    decode_produce_request,
    encode_fetch_response,
    encode_produce_response,
    produce_response_parts,
)
from kafka_wire.record_batch import build_batch
from kafka_wire.server_loop import (
    Buffer,
    CloseConnection,
    ConnectionInfo,
    Finish,
    KafkaTrafficMeter,
    serve_connection,
)
from kafka_wire.topic_bytes import (
    NO_TOPIC,
    TopicFinish,
    TopicParts,
    fetch_request_entries,
    split_frame,
)
from telemetry import MetricsRegistry, TrafficAccounting, TrafficKey
from tests.ports import free_port

T0 = 1_795_343_400.0  # 2026-11-22T10:30:00Z
BATCH = build_batch([(b"k", b"v" * 300)], timestamp_ms=1_700_000_000_000)
ORDERS_ID = uuid.UUID("6f0c2a1e-8c43-4b6e-9d36-6c1b1d9f0a01")
CLICKS_ID = uuid.UUID("0b8a9c4e-25a4-4f55-8f0d-3f7c2f1a9e02")
NAMES = {ORDERS_ID.bytes: "orders", CLICKS_ID.bytes: "clicks"}


def _kio_bytes(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


# --- the split -----------------------------------------------------------------------------


def test_split_shares_the_rest_by_largest_remainder() -> None:
    # 50 bytes outside the entries: 35.18 and 14.82, so the byte left over goes to clicks.
    assert split_frame(10_000, [("orders", 7_000), ("clicks", 2_950)]) == [
        ("orders", 7_035),
        ("clicks", 2_965),
    ]
    # Equal remainders: the earlier entry gets the byte.
    assert split_frame(101, [("a", 50), ("b", 50)]) == [("a", 51), ("b", 50)]
    assert split_frame(12, [("a", 3), ("b", 3), ("c", 3)]) == [("a", 4), ("b", 4), ("c", 4)]
    # Nothing outside the entries: each topic gets exactly its entry.
    assert split_frame(30, [("a", 10), ("b", 20)]) == [("a", 10), ("b", 20)]
    # The same topic twice stays two shares (the ledger adds them into one row).
    assert split_frame(40, [("a", 10), ("a", 10)]) == [("a", 20), ("a", 20)]


def test_split_of_one_topic_and_of_none() -> None:
    assert split_frame(1234, [("orders", 1000)]) == (("orders", 1234),)
    assert split_frame(1234, []) == ((NO_TOPIC, 1234),)
    # Entries of no bytes (never from a real frame) share the rest evenly.
    assert split_frame(5, [("a", 0), ("b", 0)]) == [("a", 3), ("b", 2)]


def test_split_refuses_entries_larger_than_the_frame() -> None:
    with pytest.raises(ValueError):
        split_frame(10, [("a", 8), ("b", 8)])
    with pytest.raises(ValueError):
        split_frame(10, [("a", -1), ("b", 8)])


@given(
    st.lists(st.integers(0, 2**31), min_size=1, max_size=40),
    st.integers(0, 2**20),
)
def test_split_sums_exactly_and_stays_within_a_byte_of_proportional(
    sizes: list[int], rest: int
) -> None:
    entries = [(f"t{i}", size) for i, size in enumerate(sizes)]
    total = sum(sizes) + rest
    split = split_frame(total, entries)
    assert sum(nbytes for _, nbytes in split) == total
    assert [topic for topic, _ in split] == [topic for topic, _ in entries]
    covered = sum(sizes)
    if covered and len(sizes) > 1:
        for (_, size), (_, share) in zip(entries, split, strict=True):
            exact = size + rest * size / covered
            assert share >= size
            assert exact - 1 < share < exact + 1


# --- the ledger ----------------------------------------------------------------------------


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_record_topics_puts_the_request_on_the_first_topic() -> None:
    registry = MetricsRegistry()
    ta = TrafficAccounting(registry, "main-1", clock=Clock(T0 + 1))
    ta.record_topics("az1", "az1", "kafka-client", "Produce", [("orders", 700), ("clicks", 300)])
    ta.record_topics("az1", "az1", "kafka-client", "Produce", [("clicks", 90), ("orders", 10)])
    ta.record_topics("az1", "az1", "kafka-client", "Fetch", [])  # a frame with no topics at all
    ta.record("az1", "az1", "kafka-client", "Metadata", 60)
    key = TrafficKey("az1", "az1", "kafka-client", "Produce")
    # Prometheus keeps one series per key: the topics of a frame add into it.
    assert ta.totals()[key] == (1100, 2)
    rows = ta.flush(now_s=T0 + 60)
    got = [(r["api"], r["topic"], r["bytes"], r["requests"]) for r in rows]
    assert got == [
        ("Fetch", "", 0, 1),
        ("Metadata", "", 60, 1),
        ("Produce", "clicks", 390, 1),
        ("Produce", "orders", 710, 1),
    ]
    # The next minute: a topic with bytes but no request still gets its row.
    ta.record_topics("az1", "az1", "kafka-client", "Produce", [("orders", 5), ("clicks", 7)])
    rows = ta.flush(now_s=T0 + 200)
    assert [(r["topic"], r["bytes"], r["requests"]) for r in rows] == [
        ("clicks", 7, 0),
        ("orders", 5, 1),
    ]
    exposition = registry.render()
    assert "topic" not in exposition
    labels = 'from_zone="az1",to_zone="az1",channel="kafka-client",api="Produce"'
    assert f"zonefleet_traffic_bytes_total{{{labels}}} 1112" in exposition
    assert f"zonefleet_traffic_requests_total{{{labels}}} 3" in exposition


def test_record_topics_refuses_negative_counts_before_counting() -> None:
    ta = TrafficAccounting(MetricsRegistry(), "n", clock=Clock(T0))
    with pytest.raises(ValueError):
        ta.record_topics("a", "b", "kafka-client", "Produce", [("x", 5), ("y", -1)])
    assert ta.totals() == {}
    assert ta.flush(include_open=True) == []


# --- requests: the entry of each topic, as kio encodes it ------------------------------------


def _produce_request(version: int) -> Any:
    return build_request(
        0,
        version,
        {
            "transactional_id": "txn-1",
            "acks": -1,
            "timeout": datetime.timedelta(milliseconds=30_000),
            "topic_data": [
                {
                    "name": "orders",
                    "partition_data": [
                        {"index": 0, "records": BATCH},
                        {"index": 1, "records": None},
                        {"index": 2, "records": BATCH + BATCH},
                    ],
                },
                {"name": "clicks", "partition_data": [{"index": 0, "records": BATCH}]},
            ],
        },
    )


@pytest.mark.parametrize("version", range(3, 12))
def test_the_produce_decoder_measures_kio_topic_entries(version: int) -> None:
    request = _produce_request(version)
    frame = bytearray(encode_request(0, version, 7, "zone=az1", request))
    header = parse_request_header(frame)
    decoded = decode_produce_request(version, memoryview(frame), header.size)
    entries = [(t.name, t.nbytes) for t in decoded.topics]
    assert entries == [(t.name, len(_kio_bytes(t))) for t in request.topic_data]


def _fetch_request(version: int) -> Any:
    def topic(name: str, topic_id: uuid.UUID, partitions: int) -> dict[str, Any]:
        parts = [
            {"partition": p, "fetch_offset": 100 * p, "partition_max_bytes": 1 << 20}
            for p in range(partitions)
        ]
        key: dict[str, Any] = {"topic_id": topic_id} if version >= 13 else {"topic": name}
        return {**key, "partitions": parts}

    unknown = uuid.UUID(int=12345)
    return build_request(
        1,
        version,
        {
            "replica_id": -1,
            "max_wait": datetime.timedelta(milliseconds=500),
            "min_bytes": 1,
            "max_bytes": 1 << 24,
            "topics": [
                topic("orders", ORDERS_ID, 3),
                topic("clicks", CLICKS_ID, 1),
                topic("gone", unknown, 2),
            ],
            # Outside every topic entry: shared out with the rest of the frame.
            "forgotten_topics_data": [
                {"topic": "old", "topic_id": unknown, "partitions": [1, 2]},
            ],
            "rack_id": "use1-az1",
        },
    )


@pytest.mark.parametrize("version", range(4, 17))
def test_fetch_request_entries_are_kio_topic_entries(version: int) -> None:
    request = _fetch_request(version)
    frame = bytearray(encode_request(1, version, 7, "zone=az1", request))
    header = parse_request_header(frame)
    entries = fetch_request_entries(version, frame, header.size, NAMES.get)
    # v13+ name topics by id: an id the node does not know books to the empty topic.
    names = ["orders", "clicks", "" if version >= 13 else "gone"]
    assert entries == [(n, len(_kio_bytes(t))) for n, t in zip(names, request.topics, strict=True)]
    assert sum(size for _, size in entries) < len(frame)


# --- responses: the encoders measure each topic entry -----------------------------------------


@pytest.mark.parametrize("version", range(3, 12))
def test_produce_response_parts_measure_each_topic(version: int) -> None:
    topics = [
        ("orders", [ProducePartitionResult(0, base_offset=5), ProducePartitionResult(1)]),
        ("clicks", [ProducePartitionResult(0, error_code=6, error_message="not leader")]),
    ]
    parts = produce_response_parts(version, 9, topics)
    assert isinstance(parts, TopicParts)
    (body,) = parts
    assert body == encode_produce_response(version, 9, topics)
    _, entity = decode_response(0, version, body)
    assert parts.topic_bytes == [(t.name, len(_kio_bytes(t))) for t in entity.responses]


@pytest.mark.parametrize("version", range(4, 17))
def test_fetch_response_measures_each_topic_with_its_records(version: int) -> None:
    topics = [
        (
            "orders",
            ORDERS_ID.bytes,
            [
                FetchPartitionResult(0, high_watermark=10, records=[BATCH, BATCH]),
                FetchPartitionResult(1, aborted_transactions=[(7, 3)]),
                FetchPartitionResult(2, records=[memoryview(BATCH)]),
            ],
        ),
        ("clicks", CLICKS_ID.bytes, [FetchPartitionResult(0, records=[BATCH])]),
    ]
    pieces = encode_fetch_response(version, 9, topics)
    assert isinstance(pieces, TopicParts)
    body = b"".join(bytes(p) for p in pieces)
    _, entity = decode_response(1, version, body)
    assert pieces.topic_bytes == [
        (name, len(_kio_bytes(t))) for (name, _, _), t in zip(topics, entity.responses, strict=True)
    ]
    empty = encode_fetch_response(version, 9, [])
    assert isinstance(empty, TopicParts) and empty.topic_bytes == []


# --- the meter -----------------------------------------------------------------------------


CONN = ConnectionInfo("10.3.0.9", 40000, 9092)


def _meter(ta: TrafficAccounting, names: dict[bytes, str]) -> tuple[KafkaTrafficMeter, list[bytes]]:
    """A meter of a node in az2 whose clients are in az3."""
    asked: list[bytes] = []

    def topic_name(topic_id: bytes) -> str | None:
        asked.append(topic_id)
        return names.get(topic_id)

    meter = KafkaTrafficMeter(
        ta.record, ta.record_topics, "az2", lambda header, conn: "az3", topic_name
    )
    return meter, asked


def _rows(ta: TrafficAccounting) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(from_zone, api, topic) -> (bytes, requests) of every row so far."""
    out: dict[tuple[str, str, str], tuple[int, int]] = {}
    for r in ta.flush(include_open=True):
        key = (r["from_zone"], r["api"], r["topic"])
        nbytes, requests = out.get(key, (0, 0))
        out[key] = (nbytes + r["bytes"], requests + r["requests"])
    return out


async def _no_response() -> None:
    return None


def _started(frame: bytearray) -> TopicFinish:
    """What a broker's Produce processor hands back: its Finish, with the sizes it measured."""
    header = parse_request_header(frame)
    decoded = decode_produce_request(header.api_version, memoryview(frame), header.size)
    return TopicFinish(_no_response, [(t.name, t.nbytes) for t in decoded.topics])


def test_meter_splits_produce_both_ways() -> None:
    ta = TrafficAccounting(MetricsRegistry(), "proxy-102")
    meter, _ = _meter(ta, {})
    frame = bytearray(encode_request(0, 9, 7, "zone=az3", _produce_request(9)))
    header = parse_request_header(frame)
    started = _started(frame)
    token = meter.request_in(header, frame, CONN, started)
    response = produce_response_parts(
        9,
        7,
        [
            ("orders", [ProducePartitionResult(p) for p in range(3)]),
            ("clicks", [ProducePartitionResult(0)]),
        ],
    )
    meter.response_out(token, response)
    plain = [encode_produce_response(9, 8, [])]
    meter.response_out(token, plain)  # parts without topic sizes: the empty topic
    request = dict(split_frame(4 + len(frame), started.request_topics))
    answer = dict(split_frame(4 + len(response[0]), response.topic_bytes))
    assert _rows(ta) == {
        ("az3", "Produce", "orders"): (request["orders"], 1),
        ("az3", "Produce", "clicks"): (request["clicks"], 0),
        ("az2", "Produce", "orders"): (answer["orders"], 1),
        ("az2", "Produce", "clicks"): (answer["clicks"], 0),
        ("az2", "Produce", ""): (4 + len(plain[0]), 1),
    }
    assert request["orders"] > 3 * len(BATCH) and request["clicks"] > len(BATCH)
    # Prometheus: the frames' sizes, whatever the split.
    totals = ta.totals()
    assert totals[TrafficKey("az3", "az2", "kafka-client", "Produce")] == (4 + len(frame), 1)
    assert totals[TrafficKey("az2", "az3", "kafka-client", "Produce")] == (
        4 + len(response[0]) + 4 + len(plain[0]),
        2,
    )


@pytest.mark.parametrize("version", [11, 13, 16])
def test_meter_names_fetch_topics_by_id_once(version: int) -> None:
    ta = TrafficAccounting(MetricsRegistry(), "main-1")
    meter, asked = _meter(ta, NAMES)
    frame = bytearray(encode_request(1, version, 7, "c", _fetch_request(version)))
    header = parse_request_header(frame)
    for finish in (None, _no_response, _no_response):  # Fetch is walked, whatever the Finish
        meter.request_in(header, frame, CONN, finish)
    rows = _rows(ta)
    third = "" if version >= 13 else "gone"
    assert set(rows) == {("az3", "Fetch", t) for t in ("orders", "clicks", third)}
    assert sum(nbytes for nbytes, _ in rows.values()) == 3 * (4 + len(frame))
    assert rows[("az3", "Fetch", "orders")][1] == 3  # the first topic has the requests
    assert sum(requests for _, requests in rows.values()) == 3
    if version >= 13:
        # Names found are cached; an unknown id is asked again (it may be created later).
        assert asked.count(ORDERS_ID.bytes) == 1 and asked.count(CLICKS_ID.bytes) == 1
        assert len(asked) == 2 + 3
    else:
        assert asked == []


def test_meter_books_refused_and_other_requests_to_no_topic() -> None:
    ta = TrafficAccounting(MetricsRegistry(), "main-1")
    meter, _ = _meter(ta, {})
    # A Produce its processor refused (no Finish), or started without measuring it.
    torn = bytearray(encode_request(0, 9, 7, "c", _produce_request(9)))[:60]
    meter.request_in(parse_request_header(torn), torn, CONN, None)
    whole = bytearray(encode_request(0, 9, 8, "c", _produce_request(9)))
    meter.request_in(parse_request_header(whole), whole, CONN, _no_response)
    torn_fetch = bytearray(encode_request(1, 12, 9, "c", _fetch_request(12)))[:40]
    meter.request_in(parse_request_header(torn_fetch), torn_fetch, CONN, None)
    metadata = bytearray(encode_request(3, 12, 8, "c", build_request(3, 12, {"topics": None})))
    meter.request_in(parse_request_header(metadata), metadata, CONN, _no_response)
    assert _rows(ta) == {
        ("az3", "Produce", ""): (4 + len(torn) + 4 + len(whole), 2),
        ("az3", "Fetch", ""): (4 + len(torn_fetch), 1),
        ("az3", "Metadata", ""): (4 + len(metadata), 1),
    }


class _Processor:
    """Answers Metadata with a fixed frame and refuses Produce (closes the connection)."""

    def begin(self, header: Any, frame: bytearray, conn: ConnectionInfo) -> Finish:
        if header.api_key == 0:
            raise CloseConnection("refused")

        async def answer() -> list[Buffer]:
            return [header.correlation_id.to_bytes(4, "big"), b"\x00" * 20]

        return answer


async def test_the_loop_books_every_request_even_one_it_refuses() -> None:
    ta = TrafficAccounting(MetricsRegistry(), "main-1")
    meter, _ = _meter(ta, {})
    metadata = encode_request(3, 12, 8, "c", build_request(3, 12, {"topics": None}))
    produce = encode_request(0, 9, 9, "c", _produce_request(9))
    handler = partial(
        serve_connection, processor=_Processor(), max_frame_bytes=1 << 20, meter=meter
    )
    async with trio.open_nursery() as nursery:
        port = free_port()
        await nursery.start(partial(trio.serve_tcp, handler, port, host="127.0.0.1"))
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await send_frame(client, [metadata])
        answer = await FrameReader(client, 1 << 20).read_frame()
        assert answer is not None and len(answer) == 24
        await send_frame(client, [produce])
        assert await FrameReader(client, 1 << 20).read_frame() is None  # closed
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert _rows(ta) == {
        ("az3", "Metadata", ""): (4 + len(metadata), 1),
        ("az2", "Metadata", ""): (4 + 24, 1),
        ("az3", "Produce", ""): (4 + len(produce), 1),
    }
