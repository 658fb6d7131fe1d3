"""Bad input gets an error code or a closed connection, and the broker keeps serving."""

from __future__ import annotations

import socket
import struct
import time
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kafka_wire.codec import build_request, encode_request
from kafka_wire.record_batch import build_batch
from tests.fleet_process import FleetProcess
from tests.raw_kafka import RawKafka
from tests.test_e2e_clients import create_topic


def _still_serving(bootstrap: str) -> None:
    conn = RawKafka(bootstrap)
    try:
        resp = conn.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert resp.error_code == ErrorCode.none
        assert any(k.api_key == 0 for k in resp.api_keys)
    finally:
        conn.close()


def test_unknown_api_key_closes_connection(fleet: FleetProcess) -> None:
    conn = RawKafka(fleet.bootstrap)
    body = struct.pack(">hhih", 9999, 0, 1, 1) + b"x"
    conn.send_frame(body)
    assert conn.is_closed()
    conn.close()
    _still_serving(fleet.bootstrap)


def test_unsupported_version_closes_and_api_versions_answers_v0(fleet: FleetProcess) -> None:
    conn = RawKafka(fleet.bootstrap)
    conn.send_frame(struct.pack(">hhih", 3, 99, 5, -1))  # Metadata v99
    assert conn.is_closed()
    conn.close()
    conn = RawKafka(fleet.bootstrap)
    # ApiVersions v99: a flexible header (v2), so it ends with an empty tagged-field section.
    conn.send_frame(struct.pack(">hhihb", 18, 99, 77, -1, 0))
    frame = conn.recv_frame()
    assert frame is not None
    cid, error = struct.unpack(">ih", frame[:6])
    assert cid == 77 and error == ErrorCode.unsupported_version
    (count,) = struct.unpack(">i", frame[6:10])
    keys = {struct.unpack(">hhh", frame[10 + 6 * i : 16 + 6 * i])[0] for i in range(count)}
    assert {0, 1, 3, 18} <= keys
    conn.close()


def test_oversize_frame_is_refused_before_allocation(fleet: FleetProcess) -> None:
    conn = RawKafka(fleet.bootstrap)
    conn.send_raw(struct.pack(">i", 2_000_000_000))
    assert conn.is_closed()
    conn.close()
    _still_serving(fleet.bootstrap)


def test_truncated_frame_then_eof(fleet: FleetProcess) -> None:
    sock = socket.create_connection(fleet.bootstrap.rsplit(":", 1))  # type: ignore[arg-type]
    sock.sendall(struct.pack(">i", 100) + b"short")
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(5)
    assert sock.recv(10) == b""
    sock.close()
    _still_serving(fleet.bootstrap)


def test_malformed_body_closes_connection(fleet: FleetProcess) -> None:
    conn = RawKafka(fleet.bootstrap)
    # Metadata v1 header followed by an array length that runs past the frame.
    conn.send_frame(struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 1000))
    assert conn.is_closed()
    conn.close()
    _still_serving(fleet.bootstrap)


def test_bad_crc_gets_corrupt_message(fleet: FleetProcess) -> None:
    topic = f"crc-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic, partitions=1)
    batch = bytearray(build_batch([(b"k", b"v" * 50)], timestamp_ms=int(time.time() * 1000)))
    batch[-1] ^= 0xFF
    conn = RawKafka(fleet.bootstrap)
    try:
        resp = conn.request(
            0,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout_ms": 5000,
                "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": bytes(batch)}]}
                ],
            },
        )
        part = resp.responses[0].partition_responses[0]
        assert part.error_code == ErrorCode.corrupt_message
        # Nothing was appended.
        assert conn.latest_offset(topic) == 0
    finally:
        conn.close()


def _valid_request_bodies() -> list[bytes]:
    meta = encode_request(
        3,
        9,
        1,
        "fuzz",
        build_request(
            3,
            9,
            {
                "topics": None,
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        ),
    )
    produce = encode_request(
        0,
        9,
        2,
        "fuzz",
        build_request(
            0,
            9,
            {
                "transactional_id": None,
                "acks": 1,
                "timeout_ms": 1000,
                "topic_data": [
                    {
                        "name": "fuzz",
                        "partition_data": [
                            {
                                "index": 0,
                                "records": build_batch(
                                    [(b"k", b"v")], timestamp_ms=int(time.time() * 1000)
                                ),
                            }
                        ],
                    }
                ],
            },
        ),
    )
    return [meta, produce]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_requests_never_take_the_broker_down(
    fleet: FleetProcess, data: st.DataObject
) -> None:
    base = data.draw(st.sampled_from(_valid_request_bodies()))
    mutated = bytearray(base)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(mutated) - 1))
        mutated[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(4, len(mutated)))
    body = bytes(mutated[:cut]) + data.draw(st.binary(max_size=16))
    conn = RawKafka(fleet.bootstrap, timeout=2)
    try:
        conn.send_frame(body)
        try:
            conn.recv_frame()  # an answer or a close are both fine; a hang is not
        except (ConnectionResetError, TimeoutError):
            pass
    finally:
        conn.close()
    _still_serving(fleet.bootstrap)
