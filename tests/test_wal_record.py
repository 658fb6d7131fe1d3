"""WAL record format: golden bytes and decoding failures."""

from __future__ import annotations

import struct

import crc32c
import pytest

from shared_wal import CorruptRecord, RecordType, WalPosition, encode_record
from shared_wal.record import decode_body, encode_prefix, pack_header


def reference_crc32c(data: bytes) -> int:
    """Bit-by-bit CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


# DATA record, header {"p": 0}, payload b"abc", laid out by hand from docs/formats.md:
#   0000000c  length: crc 4 + type 1 + header 4 + payload 3 = 12
#   db410534  crc32c over 01 81a17000 616263
#   01        type DATA
#   81a17000  msgpack fixmap(1) { fixstr(1) "p": positive fixint 0 }
#   616263    payload "abc"
GOLDEN_HEX = "0000000c" + "db410534" + "01" + "81a17000" + "616263"


def test_reference_crc_matches_the_standard_check_value() -> None:
    assert reference_crc32c(b"123456789") == 0xE3069283


def test_golden_data_record_bytes() -> None:
    golden = bytes.fromhex(GOLDEN_HEX)
    assert reference_crc32c(golden[8:]) == 0xDB410534
    assert encode_record(RecordType.DATA, {"p": 0}, b"abc") == golden


def test_golden_data_record_decodes() -> None:
    golden = bytes.fromhex(GOLDEN_HEX)
    pos = WalPosition("w1", 0, 0, len(golden))
    record = decode_body(memoryview(golden)[4:], pos)
    assert record.type is RecordType.DATA
    assert record.header == {"p": 0}
    assert bytes(record.payload) == b"abc"
    assert record.payload.readonly
    assert record.position == pos
    assert (pos.offset, pos.end_offset) == (0, 16)


def test_prefix_crc_is_incremental_over_header_and_payload() -> None:
    payload = memoryview(bytes(range(256)) * 300)
    header = pack_header({"topic": "t", "partition": 3, "base": 10**12})
    prefix = encode_prefix(RecordType.PREPARED, header, payload)
    length, crc, rtype = struct.unpack_from(">IIB", prefix)
    assert length == 5 + len(header) + payload.nbytes
    assert rtype == RecordType.PREPARED
    assert crc == crc32c.crc32c(bytes([rtype]) + header + payload.tobytes())
    assert prefix[9:] == header


def test_large_header_spanning_several_unpacker_chunks() -> None:
    header = {"k": "x" * 5000, "n": list(range(300))}
    data = encode_record(RecordType.CONTROL, header, b"tail")
    record = decode_body(memoryview(data)[4:], WalPosition("w", 0, 0, len(data)))
    assert record.header == header
    assert bytes(record.payload) == b"tail"


def test_empty_payload_and_payload_formats() -> None:
    data = encode_record(RecordType.TRIM, {})
    crc = struct.pack(">I", reference_crc32c(b"\x05\x80"))
    assert data == bytes.fromhex("00000006") + crc + b"\x05\x80"
    array_payload = memoryview(bytearray(b"\x01\x00\x02\x00")).cast("H")
    record_bytes = encode_record(RecordType.DATA, {}, array_payload)
    assert record_bytes.endswith(b"\x01\x00\x02\x00")


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b[:8] + bytes([b[8] ^ 0x40]) + b[9:], "CRC mismatch"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "CRC mismatch"),
        (lambda b: b[:4] + b"\0\0\0\0" + b[8:], "CRC mismatch"),
    ],
)
def test_decode_rejects_flipped_bits(mutate, reason: str) -> None:
    data = mutate(bytes.fromhex(GOLDEN_HEX))
    with pytest.raises(CorruptRecord, match=reason) as info:
        decode_body(memoryview(data)[4:], WalPosition("w1", 100, 40, len(data)))
    assert "w1/00000000000000000100.wal at byte 40" in str(info.value)
    assert info.value.position == 40


def _with_crc(body_after_crc: bytes) -> bytes:
    crc = crc32c.crc32c(body_after_crc)
    return struct.pack(">II", 4 + len(body_after_crc), crc) + body_after_crc


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x09\x80", "unknown record type 9"),
        (b"\x01\x92\x01\x02", "not a map"),
        (b"\x01\x83\xa1", "bad msgpack header"),
        (b"\x01\xc1", "bad msgpack header"),
    ],
)
def test_decode_rejects_bad_type_and_header_even_with_a_good_crc(body: bytes, reason: str) -> None:
    data = _with_crc(body)
    with pytest.raises(CorruptRecord, match=reason):
        decode_body(memoryview(data)[4:], WalPosition("w", 0, 0, len(data)))


def test_header_must_be_a_dict() -> None:
    with pytest.raises(TypeError):
        encode_record(RecordType.DATA, [1, 2])  # type: ignore[arg-type]
