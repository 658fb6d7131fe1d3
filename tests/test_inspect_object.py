"""`zonefleet inspect-object`: an operator's view of an S3 data object, and its errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from fleet import cli
from fleet.inspect_cli import TAIL_GUESS, inspect_object, open_object_source
from kafka_wire.record_batch import build_batch
from s3_commit import open_object_store
from s3_commit.object_format import INDEX_ENTRY_SIZE, encode_object
from s3_commit.object_plan import sso_key
from tests.test_object_format import GOLDEN_OBJECT, STREAM_A, STREAM_B, TS


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(["inspect-object", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def index_rows(out: str) -> list[list[str]]:
    return [r for r in map(str.split, out.splitlines()) if len(r) == 7 and r[1][:2] == "0x"]


def batch_rows(out: str) -> list[list[str]]:
    """Rows of the batch tables: base offset first, CRC verdict last."""
    return [r for r in map(str.split, out.splitlines()) if r and r[0].isdigit() and len(r) == 11]


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    path = tmp_path / "golden.obj"
    path.write_bytes(bytes.fromhex(GOLDEN_OBJECT))
    return path


def test_text_report_of_the_golden_object(golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, f"file://{golden}")
    assert rc == 0, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"object  file://{golden}"
    assert "266 bytes: 2 data blocks (146 bytes), index (72 bytes), footer (48 bytes)" in lines[1]
    assert "  magic           ZFLTOBJ1 (ok)" in lines
    assert "  index position  146" in lines
    assert "  index length    72 = 2 entries x 36 bytes" in lines
    assert "  BLOCK  STREAM ID           OFFSETS   RECORDS  POSITION  SIZE" in lines
    assert index_rows(out) == [
        ["0", "0x0001020304050000", "[0,", "1)", "1", "0", "69"],
        ["1", "0x0001020304050001", "[10,", "12)", "2", "69", "77"],
    ]
    assert "block 0: stream 0x0001020304050000, offsets [0, 1), 1 record, 69 bytes at 0" in lines
    batch_a, batch_b = batch_rows(out)
    # base, last, records, bytes, producer, epoch, sequence, compression, time, flags, crc
    assert batch_a == [
        "0",
        "0",
        "1",
        "69",
        "1000",
        "0",
        "0",
        "none",
        "2023-11-14T22:13:20.000Z",
        "-",
        "OK",
    ]
    assert batch_b[:7] == ["10", "11", "2", "77", "-1", "-1", "-1"]
    assert batch_b[-1] == "OK"
    assert lines.count("  check: OK") == 2
    assert lines[-1] == "result: OK (footer and index valid, 2 blocks checked)"


def test_json_report(golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(golden), "--json")
    assert rc == 0
    doc: dict[str, Any] = json.loads(out)
    assert doc["ok"] is True and doc["error"] is None and doc["size"] == 266
    assert doc["footer"] == {
        "index_position": 146,
        "index_length": 72,
        "entries": 2,
        "magic": "ZFLTOBJ1",
    }
    assert [
        (e["stream_id"], e["start_offset"], e["end_offset"], e["record_count"])
        for e in doc["index"]
    ] == [(STREAM_A, 0, 1, 1), (STREAM_B, 10, 12, 2)]
    assert doc["index"][1]["stream_id_hex"] == "0001020304050001"
    first = doc["blocks"][0]["batches"][0]
    assert first["producer_id"] == 1000 and first["base_sequence"] == 0
    assert first["crc_ok"] is True and first["crc"] == "c63634c5"
    assert first["max_timestamp"] == TS
    assert [b["record_count"] for b in doc["blocks"][1]["batches"]] == [2]


def test_one_block_or_the_index_only(golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(golden), "--block", "1", "--json")
    assert rc == 0
    assert [b["block"] for b in json.loads(out)["blocks"]] == [1]
    rc, out, _ = run(capsys, str(golden), "--index-only")
    assert rc == 0
    assert "block 0:" not in out and "[10, 12)" in out
    assert out.splitlines()[-1] == "result: OK (footer and index valid, blocks not read)"
    rc, _, err = run(capsys, str(golden), "--block", "2")
    assert rc == 1
    assert err.strip() == "zonefleet inspect-object: no block 2: the object has 2 blocks"


def test_bad_magic_is_a_clear_error_not_a_traceback(
    golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytearray(golden.read_bytes())
    data[-1:] = b"9"
    golden.write_bytes(bytes(data))
    rc, out, err = run(capsys, f"file://{golden}")
    assert rc == 1
    assert out == ""
    assert err.strip() == (
        f"zonefleet inspect-object: corrupt object file://{golden}: "
        "bad magic b'ZFLTOBJ9', expected b'ZFLTOBJ1'"
    )
    rc, out, err = run(capsys, f"file://{golden}", "--json")
    assert rc == 1
    assert json.loads(out)["ok"] is False
    assert "bad magic" in json.loads(out)["error"]


def test_truncated_object(golden: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golden.write_bytes(golden.read_bytes()[:100])
    rc, _, err = run(capsys, str(golden))
    assert rc == 1
    assert "corrupt object" in err and "Traceback" not in err


def test_bad_crc_in_a_block_is_shown_per_batch(
    golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = bytearray(golden.read_bytes())
    data[69 + 70] ^= 0x01  # inside stream B's batch
    golden.write_bytes(bytes(data))
    rc, out, _ = run(capsys, str(golden))
    assert rc == 1
    lines = out.splitlines()
    assert [(row[0], row[-1]) for row in batch_rows(out)] == [("0", "OK"), ("10", "BAD")]
    assert "  check: CORRUPT: 1 batch(es) fail the CRC-32C check" in lines
    assert lines[-1] == "result: CORRUPT (1 of 2 checked blocks)"
    rc, out, _ = run(capsys, str(golden), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["ok"] is False
    assert [b["ok"] for b in doc["blocks"]] == [True, False]


def test_missing_object_and_bad_urls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, f"file://{tmp_path}/nope")
    assert rc == 1 and err.strip() == f"zonefleet inspect-object: no such file: {tmp_path}/nope"
    rc, _, err = run(capsys, "http://example.com/x")
    assert rc == 1 and "unsupported URL" in err
    rc, _, err = run(capsys, "s3://bucket-only")
    assert rc == 1 and "expected s3://bucket/key" in err


def test_an_index_larger_than_the_tail_guess_is_read_separately(tmp_path: Path) -> None:
    blocks = TAIL_GUESS // INDEX_ENTRY_SIZE + 100
    batches = [build_batch([(None, b"v")], base_offset=i, timestamp_ms=TS) for i in range(blocks)]
    path = tmp_path / "big.obj"
    path.write_bytes(encode_object({3: batches}, block_size=1).to_bytes())
    source = open_object_source(str(path))
    reads: list[tuple[int, int]] = []
    real_read = source.read

    def counting_read(start: int, length: int) -> bytes:
        reads.append((start, length))
        return real_read(start, length)

    source.read = counting_read  # type: ignore[method-assign]
    index, reports = inspect_object(source, [blocks - 1])
    assert len(index.entries) == blocks
    assert index.footer.index_length > TAIL_GUESS
    assert reports[0].ok and reports[0].batches[0][0].base_offset == blocks - 1
    # tail, then the index, then the one block asked for
    assert [length for _, length in reads] == [
        TAIL_GUESS,
        index.footer.index_length,
        index.entries[-1].size,
    ]


@pytest.fixture
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port, with a bucket `objects`."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).create_bucket(Bucket="objects")
    yield endpoint
    server.stop()


def test_s3_url_reads_footer_index_and_blocks_with_ranged_gets(
    moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    query = f"endpoint={moto_endpoint}&region=us-east-1&access_key_id=test&secret_access_key=test"
    store = open_object_store(f"s3://objects?{query}")
    key = sso_key("5" * 32)
    store.put(key, bytes.fromhex(GOLDEN_OBJECT))
    rc, out, err = run(capsys, f"s3://objects/{key}?{query}", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["ok"] is True and doc["size"] == 266
    assert [len(b["batches"]) for b in doc["blocks"]] == [1, 1]
    source = open_object_source(f"s3://objects/{key}?{query}")
    assert source.size == 266
    assert source.read(146, 36) == bytes.fromhex(GOLDEN_OBJECT)[146:182]
    rc, _, err = run(capsys, f"s3://objects/data/sso/{'6' * 32}?{query}")
    assert rc == 1
    assert err.strip() == (
        f"zonefleet inspect-object: no such object: s3://objects/data/sso/{'6' * 32}?{query}"
    )


def test_transaction_markers_are_shown_with_their_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kafka_wire.control_batch import build_marker
    from kafka_wire.record_batch import parse_batch_header

    data = build_batch(
        [(None, b"v")], timestamp_ms=TS, producer_id=9, producer_epoch=2, base_sequence=0,
        transactional=True,
    )  # fmt: skip
    commit = bytearray(build_marker(True, 9, 2, 0, TS))
    abort = bytearray(build_marker(False, 9, 2, 0, TS))
    for offset, buf in ((1, commit), (2, abort)):
        buf[:8] = offset.to_bytes(8, "big")  # the base offset lies outside the CRC
        assert parse_batch_header(buf).base_offset == offset
    path = tmp_path / "txn.obj"
    path.write_bytes(encode_object({3: [data, bytes(commit), bytes(abort)]}).to_bytes())
    rc, out, _ = run(capsys, str(path))
    assert rc == 0
    flags = {row[0]: row[9] for row in batch_rows(out)}
    assert flags == {"0": "transactional", "1": "transactional,control:COMMIT",
                     "2": "transactional,control:ABORT"}  # fmt: skip
    rc, out, _ = run(capsys, str(path), "--json")
    assert rc == 0
    batches = json.loads(out)["blocks"][0]["batches"]
    assert [b["marker"] for b in batches] == [None, "COMMIT", "ABORT"]
