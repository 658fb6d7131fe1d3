"""The hand-written hot codecs agree with kio, field by field, for every supported version."""

from __future__ import annotations

import datetime
import importlib
import io
import struct
import uuid
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from kafka_wire.hot_codecs import (
    FETCH_RESPONSE_VERSIONS,
    PRODUCE_RESPONSE_VERSIONS,
    PRODUCE_VERSIONS,
    FetchPartitionResult,
    ProducePartitionResult,
    decode_produce_request,
    encode_fetch_response,
    encode_produce_response,
    name_topics,
)
from kafka_wire.record_batch import build_batch

NODE_ENDPOINTS: list[tuple[int, str, int, str | None]] = [
    (1, "broker-a.example", 9092, "use1-az1"),
    (2, "broker-b.example", 19092, None),
]


def _schema(api: str, version: int, kind: str) -> ModuleType:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def _parse_response(api: str, version: int, data: bytes, flexible: bool) -> tuple[int, Any]:
    header: Any
    if flexible:
        header, used = entity_reader(ResponseHeaderV1)(data, 0)
    else:
        header, used = entity_reader(ResponseHeaderV0)(data, 0)
    mod = _schema(api, version, "response")
    cls = mod.ProduceResponse if api == "produce" else mod.FetchResponse
    body, body_used = entity_reader(cls)(data, used)
    assert used + body_used == len(data), "trailing or missing bytes"
    return header.correlation_id, body


def _kio_bytes(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


# --- Produce request ---------------------------------------------------------------------


def _topic_id(name: str) -> uuid.UUID:
    """The id a v13+ request names topic `name` by, in these tests."""
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


def _kio_produce_request(
    version: int,
    topics: list[tuple[str, list[tuple[int, bytes | None]]]],
    transactional_id: str | None,
) -> bytes:
    mod = _schema("produce", version, "request")
    req = mod.ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout=datetime.timedelta(milliseconds=30_000),
        topic_data=tuple(
            mod.TopicProduceData(
                **({"topic_id": _topic_id(name)} if version >= 13 else {"name": name}),
                partition_data=tuple(
                    mod.PartitionProduceData(index=i, records=r) for i, r in parts
                ),
            )
            for name, parts in topics
        ),
    )
    return _kio_bytes(req)


@pytest.mark.parametrize("version", PRODUCE_RESPONSE_VERSIONS)
@pytest.mark.parametrize("transactional_id", [None, "txn-é"])
def test_decode_produce_request_matches_kio(version: int, transactional_id: str | None) -> None:
    batch = build_batch([(b"k", b"v" * 50)], timestamp_ms=1_700_000_000_000)
    topics: list[tuple[str, list[tuple[int, bytes | None]]]] = [
        ("orders", [(0, batch), (3, None), (7, b"")]),
        ("päyments", [(1, batch + b"")]),
    ]
    body = _kio_produce_request(version, topics, transactional_id)
    prefix = b"\x99" * 11  # stands in for the request header
    frame = memoryview(bytearray(prefix + body))
    req = decode_produce_request(version, frame, len(prefix))
    assert req.transactional_id == transactional_id
    assert req.acks == -1
    assert req.timeout_ms == 30_000
    if version >= 13:
        assert [t.topic_id for t in req.topics] == [_topic_id(n).bytes for n, _ in topics]
        assert [t.name for t in req.topics] == ["", ""]
        known = {_topic_id("orders").bytes: "orders"}
        name_topics(req, known.get)
        assert [(t.name, t.unknown_id) for t in req.topics] == [("orders", False), ("", True)]
    else:
        assert [t.name for t in req.topics] == ["orders", "päyments"]
        assert not any(t.unknown_id for t in req.topics)
    got = [
        [(p.index, None if p.records is None else bytes(p.records)) for p in t.partitions]
        for t in req.topics
    ]
    assert got == [parts for _, parts in topics]


def test_decoded_records_are_writable_views_into_the_frame() -> None:
    batch = build_batch([(None, b"payload")], timestamp_ms=5)
    frame_bytes = bytearray(_kio_produce_request(9, [("t", [(0, batch)])], None))
    frame = memoryview(frame_bytes)
    records = decode_produce_request(9, frame, 0).topics[0].partitions[0].records
    assert records is not None and not records.readonly
    struct.pack_into(">q", records, 0, 424242)
    start = frame_bytes.find(batch[8:])  # the batch minus its (now patched) base offset
    assert struct.unpack_from(">q", frame_bytes, start - 8)[0] == 424242


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _compact(raw: bytes) -> bytes:
    return _uvarint(len(raw) + 1) + raw


def _unknown_tags() -> bytes:
    # two unknown tagged fields, one with a multi-byte tag number: must be skipped (KIP-482)
    return (
        _uvarint(2)
        + _uvarint(3)
        + _uvarint(2)
        + b"xy"
        + _uvarint(300)
        + _uvarint(4)
        + b"\x00\x01\x02\x03"
    )


@pytest.mark.parametrize("version", [v for v in PRODUCE_VERSIONS if v >= 9])
def test_decode_produce_request_skips_unknown_tagged_fields(version: int) -> None:
    batch = build_batch([(b"a", b"b")], timestamp_ms=1)
    tags = _unknown_tags()
    body = (
        _compact(b"tx")
        + struct.pack(">hi", 1, 1500)
        + _uvarint(2)  # one topic
        + (_topic_id("topic").bytes if version >= 13 else _compact(b"topic"))
        + _uvarint(3)  # two partitions
        + struct.pack(">i", 4)
        + _compact(batch)
        + tags
        + struct.pack(">i", 5)
        + b"\x00"
        + tags  # null records
        + tags  # topic tags
        + tags  # request tags
    )
    req = decode_produce_request(version, memoryview(bytearray(body)), 0)
    assert (req.transactional_id, req.acks, req.timeout_ms) == ("tx", 1, 1500)
    [topic] = req.topics
    if version >= 13:
        name_topics(req, {_topic_id("topic").bytes: "topic"}.get)
    assert topic.name == "topic"
    assert [(p.index, p.records and bytes(p.records)) for p in topic.partitions] == [
        (4, batch),
        (5, None),
    ]


@pytest.mark.parametrize("version", [3, 8, 9, 11, 13])
def test_decode_produce_request_truncated_raises_value_error(version: int) -> None:
    body = _kio_produce_request(version, [("t", [(0, b"x" * 100)])], "id")
    for cut in range(len(body)):
        frame = memoryview(bytearray(body[:cut]))
        with pytest.raises(ValueError):
            decode_produce_request(version, frame, 0)


def test_decode_produce_request_rejects_unsupported_version() -> None:
    with pytest.raises(ValueError, match="version"):
        decode_produce_request(2, memoryview(bytearray(10)), 0)


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(PRODUCE_VERSIONS.start, PRODUCE_VERSIONS.stop - 1),
    data=st.binary(max_size=200),
)
def test_decode_produce_request_fuzz_only_value_error(version: int, data: bytes) -> None:
    try:
        decode_produce_request(version, memoryview(bytearray(data)), 0)
    except ValueError:
        pass


@settings(max_examples=200, deadline=None)
@given(version=st.integers(PRODUCE_VERSIONS.start, PRODUCE_VERSIONS.stop - 1), data=st.data())
def test_decode_produce_request_fuzz_mutated_valid_frames(version: int, data: Any) -> None:
    body = bytearray(_kio_produce_request(version, [("t", [(0, b"r" * 30), (1, None)])], "x"))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(body) - 1))
        body[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    try:
        decode_produce_request(version, memoryview(body[:cut]), 0)
    except ValueError:
        pass


# --- Produce response --------------------------------------------------------------------


@pytest.mark.parametrize("version", PRODUCE_RESPONSE_VERSIONS)
def test_encode_produce_response_matches_kio(version: int) -> None:
    parts = [
        ProducePartitionResult(
            index=0,
            error_code=6,
            base_offset=1234,
            log_append_time_ms=1_700_000_000_123,
            log_start_offset=17,
            record_errors=[(0, "bad record"), (3, None)],
            error_message="not the leader",
            current_leader=(42, 7),
        ),
        ProducePartitionResult(index=5),
    ]
    topics = [("orders", parts), ("empty", [])]
    ids = [_topic_id(name).bytes for name, _ in topics]
    data = encode_produce_response(version, 99, topics, 250, NODE_ENDPOINTS, ids)
    corr, resp = _parse_response("produce", version, data, flexible=version >= 9)
    assert corr == 99
    assert resp.throttle_time == datetime.timedelta(milliseconds=250)
    if version >= 13:
        assert [t.topic_id for t in resp.responses] == [_topic_id(n) for n, _ in topics]
    else:
        assert [t.name for t in resp.responses] == ["orders", "empty"]
    p0, p5 = resp.responses[0].partition_responses
    assert resp.responses[1].partition_responses == ()
    assert (p0.index, p0.error_code, p0.base_offset) == (0, 6, 1234)
    assert p0.log_append_time == datetime.datetime.fromtimestamp(1_700_000_000.123, tz=datetime.UTC)
    assert (p5.index, p5.error_code, p5.base_offset, p5.log_append_time) == (5, 0, -1, None)
    if version >= 5:
        assert (p0.log_start_offset, p5.log_start_offset) == (17, -1)
    if version >= 8:
        assert [(e.batch_index, e.batch_index_error_message) for e in p0.record_errors] == [
            (0, "bad record"),
            (3, None),
        ]
        assert (p0.error_message, p5.error_message) == ("not the leader", None)
        assert p5.record_errors == ()
    if version >= 10:
        assert (p0.current_leader.leader_id, p0.current_leader.leader_epoch) == (42, 7)
        assert (p5.current_leader.leader_id, p5.current_leader.leader_epoch) == (-1, -1)
        assert [(n.node_id, n.host, n.port, n.rack) for n in resp.node_endpoints] == (
            NODE_ENDPOINTS
        )


def test_produce_response_without_hints_has_no_tagged_fields() -> None:
    data = encode_produce_response(11, 1, [("t", [ProducePartitionResult(0, base_offset=5)])])
    _, resp = _parse_response("produce", 11, data, flexible=True)
    assert resp.node_endpoints == ()
    # header(5) + topics(1) + name(2) + parts(1) + 4+2+8+8+8 + errors(1) + msg(1) + tags(1)
    # + topic tags(1) + throttle(4) + tags(1)
    assert len(data) == 5 + 1 + 2 + 1 + 30 + 1 + 1 + 1 + 1 + 4 + 1


# --- Fetch response ----------------------------------------------------------------------


@pytest.mark.parametrize("version", FETCH_RESPONSE_VERSIONS)
def test_encode_fetch_response_matches_kio(version: int) -> None:
    b1 = build_batch([(b"k1", b"v1")], base_offset=100, timestamp_ms=1)
    b2 = build_batch([(None, b"v2"), (b"k3", None)], base_offset=101, timestamp_ms=2)
    partial = b2[:30]  # a trailing partial batch is legal in a fetch response
    tid = uuid.uuid4()
    parts = [
        FetchPartitionResult(
            index=3,
            high_watermark=103,
            last_stable_offset=101,
            log_start_offset=50,
            aborted_transactions=[(7, 90), (8, 95)],
            preferred_read_replica=2,
            records=[b1, memoryview(bytearray(b2)), bytearray(partial)],
            current_leader=(4, 11),
        ),
        FetchPartitionResult(index=4, error_code=6, aborted_transactions=[]),
    ]
    other = [FetchPartitionResult(index=0, high_watermark=0, records=[])]
    pieces = encode_fetch_response(
        version,
        55,
        [("orders", tid.bytes, parts), ("other", uuid.UUID(int=1).bytes, other)],
        throttle_time_ms=9,
        error_code=0,
        session_id=1234,
        node_endpoints=NODE_ENDPOINTS,
    )
    assert any(piece is b1 for piece in pieces), "record buffers must not be copied"
    data = b"".join(pieces)
    corr, resp = _parse_response("fetch", version, data, flexible=version >= 12)
    assert corr == 55
    assert resp.throttle_time == datetime.timedelta(milliseconds=9)
    if version >= 7:
        assert (resp.error_code, resp.session_id) == (0, 1234)
    t0, t1 = resp.responses
    if version >= 13:
        assert (t0.topic_id, t1.topic_id) == (tid, uuid.UUID(int=1))
    else:
        assert (t0.topic, t1.topic) == ("orders", "other")
    p3, p4 = t0.partitions
    assert (p3.partition_index, p3.error_code, p3.high_watermark, p3.last_stable_offset) == (
        3,
        0,
        103,
        101,
    )
    assert [(a.producer_id, a.first_offset) for a in p3.aborted_transactions] == [
        (7, 90),
        (8, 95),
    ]
    assert p3.records == b1 + b2 + partial
    assert (p4.error_code, p4.aborted_transactions, p4.records) == (6, (), b"")
    [p0] = t1.partitions
    assert (p0.partition_index, p0.aborted_transactions, p0.records) == (0, None, b"")
    if version >= 5:
        assert (p3.log_start_offset, p4.log_start_offset) == (50, -1)
    if version >= 11:
        assert (p3.preferred_read_replica, p4.preferred_read_replica) == (2, -1)
    if version >= 12:
        assert (p3.current_leader.leader_id, p3.current_leader.leader_epoch) == (4, 11)
        assert p4.current_leader.leader_id == -1
    if version >= 16:
        assert [(n.node_id, n.host, n.port, n.rack) for n in resp.node_endpoints] == (
            NODE_ENDPOINTS
        )


def test_fetch_response_rejects_bad_topic_id_and_version() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_fetch_response(13, 1, [("t", b"short", [])])
    with pytest.raises(ValueError, match="version"):
        encode_fetch_response(FETCH_RESPONSE_VERSIONS.stop, 1, [])
    with pytest.raises(ValueError, match="version"):
        encode_produce_response(2, 1, [])
    with pytest.raises(ValueError, match="by id"):
        encode_produce_response(13, 1, [("t", [])])  # v13 needs each topic's id
    with pytest.raises(ValueError, match="16 bytes"):
        encode_produce_response(13, 1, [("t", [])], topic_ids=[b"short"])
