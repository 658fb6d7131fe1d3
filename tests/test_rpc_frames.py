"""Internal RPC framing: golden bytes and refusal of anything that is not an RPC frame."""

from __future__ import annotations

import struct

import crc32c
import msgpack
import pytest

from internal_rpc.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    BadChecksum,
    BadMessage,
    FrameTooLarge,
    decode_body,
    encode_frame,
    frame_length,
)
from kafka_wire.codec import build_request, encode_request

# docs/formats.md "Internal RPC": {"t": "res", "id": 7, "r": "ok"}
GOLDEN = bytes.fromhex("00000014137b551b83a174a3726573a2696407a172a26f6b")


def test_golden_frame() -> None:
    frame = encode_frame({"t": "res", "id": 7, "r": "ok"})
    assert frame == GOLDEN
    length, crc = struct.unpack_from(">II", frame)
    assert length == len(frame) - 4
    assert crc == crc32c.crc32c(frame[8:])
    assert decode_body(frame[4:]) == {"t": "res", "id": 7, "r": "ok"}


def test_round_trip_keeps_bytes_and_ints() -> None:
    msg = {"t": "push", "id": 2**40, "d": {"blob": b"\x00\xff" * 10, "n": [-1, 0x1234ABCD]}}
    assert decode_body(memoryview(encode_frame(msg))[4:]) == msg


def test_bad_crc_is_refused() -> None:
    frame = bytearray(GOLDEN)
    frame[-1] ^= 1
    with pytest.raises(BadChecksum):
        decode_body(frame[4:])


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        msgpack.packb({"t": "res"}) + b"\x00",  # trailing bytes
        msgpack.packb([1, 2]),  # not a map
        msgpack.packb({"id": 1}),  # no type
        msgpack.packb({"t": 5}),  # type not a string
        msgpack.packb({1: 2, "t": "x"}),  # non-string key
        b"\x92\x01",  # truncated array
    ],
)
def test_undecodable_body_is_refused(body: bytes) -> None:
    with pytest.raises(BadMessage):
        decode_body(struct.pack(">I", crc32c.crc32c(body)) + body)


def test_short_frames_are_refused() -> None:
    with pytest.raises(BadMessage):
        decode_body(b"\x00\x00\x00\x00")
    with pytest.raises(BadMessage):
        frame_length(struct.pack(">I", 4))


def test_oversize_length_is_refused_before_reading() -> None:
    assert frame_length(struct.pack(">I", DEFAULT_MAX_FRAME_BYTES)) == DEFAULT_MAX_FRAME_BYTES
    for length in (DEFAULT_MAX_FRAME_BYTES + 1, 0xFFFFFFFF):
        with pytest.raises(FrameTooLarge):
            frame_length(struct.pack(">I", length))
    with pytest.raises(FrameTooLarge):
        frame_length(struct.pack(">I", 100), max_frame_bytes=99)


def test_encode_refuses_oversize_and_unencodable() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame({"t": "res", "r": b"x" * 100}, max_frame_bytes=100)
    with pytest.raises(TypeError):
        encode_frame({"t": "res", "r": object()})


def test_kafka_request_is_not_an_rpc_frame() -> None:
    req = build_request(18, 3, {"client_software_name": "x", "client_software_version": "1"})
    kafka = encode_request(18, 3, 1, "probe", req)
    frame = struct.pack(">i", len(kafka)) + kafka
    length = frame_length(frame[:4])
    assert length == len(frame) - 4
    with pytest.raises(BadChecksum):
        decode_body(frame[4:])


def test_golden_hello() -> None:
    hello = {"t": "hello", "v": 1, "nonce": bytes(range(32)), "node": 1}
    assert encode_frame(hello) == bytes.fromhex(
        "0000003e"
        "ff9104c1"
        "84"
        "a174a568656c6c6f"
        "a17601"
        "a56e6f6e6365c420" + bytes(range(32)).hex() + "a46e6f646501"
    )
