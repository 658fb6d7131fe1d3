"""A short coverage-guided fuzz of every decoder target (bench/fuzz.py), seeded so that it is
the same run every time, and the inputs the long runs found pinned as regression tests.

Each target catches only its decoders' declared errors (kafka_wire's MalformedRequest,
CloseConnection, InvalidBatch, DecompressionError, FrameError; internal_rpc's RpcFrameError,
ProtocolViolation, AuthError, MalformedMessage): anything else escaping is a crash.
docs/reliability.md, "Fuzzing", has the long runs and the command.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from bench.fuzz import TARGETS, fuzz, load_corpus, run_batch
from kafka_wire import control_batch, record_batch
from kafka_wire.errors import ErrorCode
from kafka_wire.record_batch import InvalidBatch

INPUTS_PER_TARGET = 2500


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_short_fuzz_finds_no_undeclared_exception(name: str) -> None:
    seeds = load_corpus(name)
    assert seeds, f"tests/fuzz_corpus/{name}.json is missing"
    stats = fuzz(TARGETS[name], seeds, INPUTS_PER_TARGET, seed=14, timeout_s=10.0)
    crashes = [f"{c.kind} at {c.where}: {c.message}\n{c.trace}" for c in stats.crashes]
    assert not crashes, "\n".join(crashes)
    assert stats.inputs == INPUTS_PER_TARGET
    assert stats.edges > 0  # the coverage tracer saw the decoders run


def _batch_with_body(body: bytes, record_count: int) -> bytes:
    """A v2 batch header (right length and CRC) over arbitrary records bytes."""
    header = bytearray(record_batch.build_batch([(b"k", b"v")], timestamp_ms=0)[:61])
    struct.pack_into(">i", header, 8, 61 - 12 + len(body))
    struct.pack_into(">i", header, 23, record_count - 1)
    struct.pack_into(">i", header, 57, record_count)
    crc = crc32c.crc32c(bytes(header[21:]) + body)
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + body


# Found by `bench/fuzz.py --target batch`: a control batch whose record length is negative
# moved the reader back before the start (IndexError from the memoryview).
NEGATIVE_RECORD_LENGTH = bytes.fromhex(
    "0000451a6b3387db00000058696e1d704b4b802b2077385addc6de0000000000"
    "004fffffffff0222764b6800100010010000018bcfe568000000018bcfe56840"
    "000000000000d7000300000002 1e00000004 6b300e76616c75652d30001a0080080e7661".replace(" ", "")
)


def test_a_negative_record_length_is_a_corrupt_batch() -> None:
    buf = NEGATIVE_RECORD_LENGTH
    batch = record_batch.parse_batch_header(buf)
    with pytest.raises(InvalidBatch) as caught:
        control_batch.marker_type(buf, batch)
    assert caught.value.error_code is ErrorCode.corrupt_message
    with pytest.raises(InvalidBatch):
        record_batch.decode_records_for_tools(buf)
    run_batch(buf)  # the fuzz target raises nothing undeclared


def test_a_record_read_back_over_and_over_is_refused_not_a_hang() -> None:
    # Length -1 sends the reader back to the same record: with a count of 2**31-1 the tool
    # decoder looped (growing its output) until the fuzzer's time limit.
    buf = _batch_with_body(b"\x01\x00\x00\x00\x00\x00", 2**31 - 1)
    with pytest.raises(InvalidBatch):
        record_batch.decode_records_for_tools(buf)
    with pytest.raises(InvalidBatch):
        record_batch.null_key_indexes(buf, record_batch.parse_batch_header(buf))


def test_records_shorter_than_their_fields_are_corrupt() -> None:
    # Zero-length records, one byte each: their fields lie in the records after them. Kafka
    # refuses such a record (its size does not cover what it reads); a compacted topic's
    # null-key check read each as a valid record, and a 64 MiB body as 64M of them.
    buf = _batch_with_body(bytes(64), 64)
    batch = record_batch.parse_batch_header(buf)
    with pytest.raises(InvalidBatch) as caught:
        record_batch.null_key_indexes(buf, batch)
    assert caught.value.error_code is ErrorCode.corrupt_message
    with pytest.raises(InvalidBatch):
        record_batch.decode_records_for_tools(buf)


def test_valid_batches_still_decode() -> None:
    records = [(b"k", b"v"), (None, b"w"), (b"", None)]
    for compression in range(5):
        buf = record_batch.build_batch(records, timestamp_ms=5, compression=compression)
        batch = record_batch.parse_batch_header(buf)
        assert record_batch.null_key_indexes(buf, batch) == [1]
        got = [(k, v) for _, _, k, v in record_batch.decode_records_for_tools(buf)]
        assert got == records
