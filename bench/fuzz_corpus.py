"""Builds the seed corpus of bench/fuzz.py in tests/fuzz_corpus/ (one JSON file per target).

    .venv/bin/python bench/fuzz_corpus.py                  # encoded frames only
    .venv/bin/python bench/fuzz_corpus.py --capture        # plus frames real clients send

Encoded: a request for every API key and version the main advertises (each array with one
element, so nested structures are on the wire), Produce requests of every hot-codec version
carrying a batch, RecordBatches in each compression plus transaction markers, and internal
RPC messages (calls, results, pushes, the handshake) built from the typed messages' `to_wire`.
`--capture` starts a lone main (`zonefleet up --zones 1`) whose frame reader records every
frame it reads (Kafka requests and internal RPC), runs kafka-python, aiokafka and
confluent-kafka producers (each compression), consumers and admin calls against it, and
keeps one frame per distinct (api key, version, client) and per RPC message type.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fuzz import CORPUS_DIR
from internal_rpc import auth, protocol
from internal_rpc import messages as m
from internal_rpc import state_frames as sf
from kafka_wire import codec, control_batch, record_batch
from kafka_wire.entities import FieldKind, FieldSpec, entity_spec
from main_broker.broker import advertised_versions

_TS = 1_700_000_000_000


def _batch(compression: int = 0, count: int = 2, **kw: Any) -> bytes:
    records: list[tuple[bytes | None, bytes | None]] = [
        (None if i % 2 else b"k%d" % i, b"value-%d" % i) for i in range(count)
    ]
    return record_batch.build_batch(records, timestamp_ms=_TS, compression=compression, **kw)


_SAMPLE: dict[str, Any] = {
    "int8": 1,
    "int16": 1,
    "int32": 1,
    "int64": 1,
    "uint8": 1,
    "uint16": 1,
    "uint32": 1,
    "uint64": 1,
    "float64": 1.5,
    "bool": True,
    "string": "topic-a",
    "bytes": b"\x01\x02",
    "uuid": uuid.UUID(int=7),
    "error_code": 0,
    "timedelta_i32": 1000,
    "timedelta_i64": 1000,
    "datetime_i64": _TS,
}


def _sample_value(spec: FieldSpec, depth: int) -> Any:
    if spec.kind is FieldKind.ENTITY:
        assert spec.entity is not None
        return _sample(spec.entity, depth + 1)
    if spec.kind is FieldKind.ENTITY_ARRAY:
        assert spec.entity is not None
        return [_sample(spec.entity, depth + 1)] if depth < 4 else []
    assert spec.kafka_type is not None
    value = _batch() if spec.kafka_type == "records" else _SAMPLE[spec.kafka_type]
    return [value] if spec.kind is FieldKind.PRIMITIVE_ARRAY else value


def _sample(cls: type, depth: int = 0) -> dict[str, Any]:
    """Every field set (arrays of one element), so the encoded request exercises its shape."""
    return {f.name: _sample_value(f, depth) for f in entity_spec(cls).fields}


def encoded_requests() -> Iterable[tuple[str, bytes]]:
    for key, (low, high) in sorted(advertised_versions().items()):
        for version in range(low, high + 1):
            for label, data in (("empty", {}), ("full", None)):
                try:
                    cls = type(codec.build_request(key, version, {}))
                    request = codec.build_request(
                        key, version, _sample(cls) if data is None else data
                    )
                    frame = codec.encode_request(key, version, 7, "fuzz", request)
                except Exception as exc:  # a sample value this schema does not take
                    print(f"skip api {key} v{version} {label}: {exc!r}", file=sys.stderr)
                    continue
                yield f"api {key} v{version} {label}", frame


def encoded_batches() -> Iterable[tuple[str, bytes]]:
    for compression in range(5):
        yield f"batch compression {compression}", _batch(compression, count=3)
    yield "idempotent batch", _batch(producer_id=5, producer_epoch=0, base_sequence=0)
    yield (
        "transactional batch",
        _batch(producer_id=5, producer_epoch=1, base_sequence=3, transactional=True),
    )
    commit = control_batch.build_marker(True, 5, 1, 0, _TS)
    yield "commit marker", commit
    yield "abort marker", control_batch.build_marker(False, 5, 1, 0, _TS)
    yield "two batches", _batch() + commit
    yield "snappy xerial", _xerial_batch()
    # Bodies inflating past the decompressor's first output buffer (64 KiB): it grows.
    zeros: list[tuple[bytes | None, bytes | None]] = [(b"k", bytes(200_000))]
    for compression in range(1, 5):
        yield (
            f"batch inflating to 200 kB, compression {compression}",
            record_batch.build_batch(zeros, timestamp_ms=_TS, compression=compression),
        )


def _xerial_batch() -> bytes:
    """A snappy batch in Java's xerial framing, as the Java producer writes it."""
    import cramjam

    raw = _batch()[record_batch.BATCH_HEADER_SIZE :]
    block = bytes(cramjam.snappy.compress_raw(raw))
    framed = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2 + len(block).to_bytes(4, "big") + block
    plain = _batch()
    header = bytearray(plain[: record_batch.BATCH_HEADER_SIZE])
    header[8:12] = (record_batch.BATCH_HEADER_SIZE - 12 + len(framed)).to_bytes(4, "big")
    header[22] = (header[22] & ~0x07) | 2
    import crc32c

    body = bytes(header) + framed
    crc = crc32c.crc32c(body[21:])
    return body[:17] + crc.to_bytes(4, "big") + body[21:]


def encoded_produce() -> Iterable[tuple[str, bytes]]:
    batch = _batch(count=3)
    for version in range(3, 14):
        topic: dict[str, Any] = {"name": "topic-a", "partition_data": [
            {"index": 0, "records": batch}, {"index": 1, "records": None}]}  # fmt: skip
        if version >= 13:
            topic = {**topic, "topic_id": uuid.UUID(int=9)}
        data = {"transactional_id": "tx" if version % 2 else None, "acks": -1,
                "timeout_ms": 30000, "topic_data": [topic]}  # fmt: skip
        try:
            request = codec.build_request(0, version, data)
        except Exception as exc:
            print(f"skip produce v{version}: {exc!r}", file=sys.stderr)
            continue
        yield f"produce v{version}", codec.encode_request(0, version, 3, "fuzz", request)


def rpc_messages() -> Iterable[tuple[str, dict[str, Any]]]:
    summary = m.BatchSummary(120, 0, 2, _TS, _TS, 5, 0, 0)
    part2 = m.ConfirmPart("topic-a", 0, "w1", 3, 4096, 180, summary)
    part1 = m.ConfirmPart("topic-a", 1, "w1", 3, 8192, 180)
    confirm = m.ConfirmParams(9, 30000, (part2,), "sess-1", 4)
    yield "confirm v3", protocol.ClientSession.request(1, "confirm", confirm.to_wire(), 30.0)
    yield "confirm v2", protocol.ClientSession.request(3, "confirm", confirm.to_wire(2), 30.0)
    v1 = m.ConfirmParams(9, 30000, (part1,)).to_wire()
    yield "confirm v1", protocol.ClientSession.request(2, "confirm", v1, 5.0)
    outcome = m.PartitionOutcome(0, 10, -1, 0, None, ((1, "bad"),))
    result = m.ConfirmResult((outcome, m.PartitionOutcome(3))).to_wire()
    yield "confirm result", protocol.result_message(1, result)
    relay = m.RelayParams(b"\x00\x12\x00\x03\x00\x00\x00\x01\xff\xff\x00", "10.0.0.1")
    yield "relay", protocol.ClientSession.request(3, "relay", relay.to_wire(), 1.0)
    yield "relay result", protocol.result_message(3, m.RelayResult(b"\x00\x00\x00\x01").to_wire())
    yield "meta_changed", protocol.ClientSession.request(4, "meta_changed", {"mv": 1}, 1.0)
    marker = m.TxnMarker(5, 1, True, 2, (("topic-a", 0),), ("group-a",))
    yield (
        "markers",
        protocol.ClientSession.request(
            5, "write_txn_markers", m.WriteTxnMarkers((marker,)).to_wire(), 1.0
        ),
    )
    marker_result = m.TxnMarkerResult((("topic-a", 0, 0),), (("group-a", 0),))
    yield (
        "markers result",
        protocol.result_message(5, m.WriteTxnMarkersResult((marker_result,)).to_wire()),
    )
    if hasattr(m, "AllowTxn"):  # a message newer than this builder
        allow = m.AllowTxn(5, 1, (("topic-a", 0),), ("group-a",)).to_wire()
        yield "allow_txn", protocol.ClientSession.request(6, "allow_txn", allow, 1.0)
        result = m.AllowTxnResult(marker_result).to_wire()
        yield "allow_txn result", protocol.result_message(6, result)
    full = sf.StateFrame(
        wal_end=100,
        full=True,
        node=1,
        writer="w1",
        topics=(sf.TopicRow("topic-a", bytes(16), 2, {"cleanup.policy": "delete"}, (1, 1)),),
        deleted=("old",),
        parts=(sf.PartitionRow("topic-a", 0, 1, 10, 10, 0, 10),),
        objects=(
            sf.ObjectStreamRow(
                bytes(16), 0, (sf.ObjectRangeRow(0, 10, "obj/1", 100, _TS, 90),), ("obj/0",), 0
            ),
        ),
        links={"w2": 40},
        txns=(sf.AbortedRow("topic-a", 0, ((5, 2, 4),)),),
    )
    yield "state full", protocol.push_message(7, full.to_wire(1))
    delta = sf.StateFrame(wal_end=101, parts=(sf.PartitionRow("topic-a", 1, 1, 3, 3, 0, 3),))
    yield "state delta", protocol.push_message(7, delta.to_wire(1))
    yield "state full v2", protocol.push_message(7, full.to_wire(2))
    txn_row = sf.PartitionRow("topic-a", 0, 1, 10, 8, 0, 12)
    delta2 = sf.StateFrame(wal_end=102, parts=(*delta.parts, txn_row))
    yield "state delta v2", protocol.push_message(7, delta2.to_wire(2))
    subscription = sf.StateSubscription().to_wire()
    yield "subscribe v2", protocol.ClientSession.subscription(9, "state", subscription)
    yield "subscribe", protocol.ClientSession.subscription(7, "state", {"node": 2})
    yield "cancel", protocol.ClientSession.cancel(7)
    yield "error", protocol.error_message(8, "UnknownMethod", "nope")
    yield "end", protocol.end_message(7, "Gone", "bye")
    yield "hello", auth.hello_message(1, bytes(32))
    auth_msg, _, _ = auth.answer_hello(b"x" * 16, 2, auth.hello_message(1, bytes(32)), bytes(32))
    yield "auth", auth_msg
    yield "ok", {"t": "ok", "mac": bytes(32)}


def _entry(note: str, data: bytes) -> dict[str, str]:
    return {"note": note, "hex": data.hex()}


def _size_prefixed(frame: bytes) -> bytes:
    return len(frame).to_bytes(4, "big") + frame


# --- capture from real clients ------------------------------------------------------------

_SITECUSTOMIZE = textwrap.dedent(
    """
    import os
    from kafka_wire import framing

    _read = framing.FrameReader.read_frame
    _out = os.environ["ZF_FUZZ_CAPTURE"]

    async def read_frame(self):
        body = await _read(self)
        if body is not None:
            try:
                port = self._sock.getsockname()[1] if self._sock is not None else 0
            except OSError:
                port = 0
            with open(_out, "a") as f:
                f.write(f"{port} {bytes(body).hex()}\\n")
        return body

    framing.FrameReader.read_frame = read_frame
    """
)

_CLIENTS = textwrap.dedent(
    """
    import asyncio, sys
    bootstrap = sys.argv[1]
    topic = "fuzz-capture"

    def kafka_python():
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
        from kafka.admin import NewTopic
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics([NewTopic(topic, 2, 1)])
        except Exception as exc:
            print("create", exc)
        admin.close()
        for codec in (None, "gzip", "snappy", "lz4", "zstd"):
            try:
                p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
                for i in range(3):
                    p.send(topic, key=b"k%d" % i, value=b"v" * 50)
                p.flush(10)
                p.close()
            except Exception as exc:
                print("kafka-python", codec, exc)
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="fz-kp",
                          auto_offset_reset="earliest", consumer_timeout_ms=4000)
        for _ in c:
            pass
        c.commit()
        c.close()

    async def aiokafka_run():
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        for codec in (None, "gzip", "lz4", "zstd"):
            try:
                p = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec,
                                     enable_idempotence=True)
                await p.start()
                await p.send_and_wait(topic, b"v" * 40, key=b"k")
                await p.stop()
            except Exception as exc:
                print("aiokafka", codec, exc)
        try:
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="fz-tx")
            await p.start()
            async with p.transaction():
                await p.send_and_wait(topic, b"tx", key=b"k")
            await p.stop()
        except Exception as exc:
            print("aiokafka tx", exc)
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="fz-aio",
                             auto_offset_reset="earliest")
        await c.start()
        try:
            await c.getmany(timeout_ms=3000)
            await c.commit()
        finally:
            await c.stop()

    def confluent():
        from confluent_kafka import Consumer, Producer
        from confluent_kafka.admin import AdminClient
        for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
            p = Producer({"bootstrap.servers": bootstrap, "compression.codec": codec,
                          "enable.idempotence": True})
            for i in range(3):
                p.produce(topic, key=b"k%d" % i, value=b"c" * 60)
            p.flush(10)
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "fz-ctx"})
        try:
            p.init_transactions(10)
            p.begin_transaction()
            p.produce(topic, key=b"k", value=b"t")
            p.commit_transaction(10)
        except Exception as exc:
            print("confluent tx", exc)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.list_topics(timeout=5)
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fz-ck",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        c.subscribe([topic])
        deadline = __import__("time").time() + 5
        while __import__("time").time() < deadline:
            c.poll(0.5)
        c.commit(asynchronous=False) if c.assignment() else None
        c.close()

    for step in (kafka_python, lambda: asyncio.run(aiokafka_run()), confluent):
        try:
            step()
        except Exception as exc:
            print("step failed", exc)
    """
)


def capture(zones: int, seconds: float = 120.0) -> list[tuple[int, bytes]]:
    """(local port, frame) of every frame the fleet's nodes read while the clients run: a
    lone main, or with `zones` > 1 mains and zone proxies, whose internal RPC is captured."""
    from tests.fleet_process import FleetProcess

    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        out = Path(tmp) / "frames.txt"
        os.environ["ZF_FUZZ_CAPTURE"] = str(out)
        os.environ["PYTHONPATH"] = f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        extra = ["--zones", str(zones)]
        fleet = FleetProcess(Path(tmp) / "data", extra=extra).start()
        try:
            subprocess.run(
                [sys.executable, "-c", _CLIENTS, fleet.bootstrap], timeout=seconds, check=False
            )
            time.sleep(1)
        finally:
            fleet.stop()
        frames = []
        for line in out.read_text().splitlines() if out.exists() else []:
            port, hexed = line.split()
            frames.append((int(port), bytes.fromhex(hexed)))
        return frames


def _captured_entries(frames: list[tuple[int, bytes]]) -> tuple[list[Any], list[Any], list[Any]]:
    """(request frames, record batches, rpc bodies), one per distinct kind."""
    requests: dict[tuple[int, int, str], bytes] = {}
    batches: dict[tuple[int, int], bytes] = {}
    rpc: dict[str, bytes] = {}
    for _port, frame in frames:
        try:
            msg = msgpack.unpackb(frame[4:], raw=False)
        except Exception:
            msg = None
        if isinstance(msg, dict) and isinstance(msg.get("t"), str):
            payload = msg.get("p", msg.get("r", msg.get("d")))
            shape = sorted(map(str, payload)) if isinstance(payload, dict) else type(payload)
            kind = f"{msg['t']} {msg.get('m', '')} {shape}"
            rpc.setdefault(kind, bytes(frame[4:]))
            continue
        try:
            header = codec.parse_request_header(frame)
        except codec.MalformedRequest:
            continue
        key = (header.api_key, header.api_version, header.client_id or "")
        requests.setdefault(key, bytes(frame))
        if header.api_key == 0:
            from kafka_wire.hot_codecs import decode_produce_request

            try:
                req = decode_produce_request(header.api_version, memoryview(frame), header.size)
            except ValueError:
                continue
            for topic in req.topics:
                for part in topic.partitions:
                    if part.records is not None and len(part.records) > 22:
                        attrs = part.records[22]
                        batches.setdefault((attrs & 0x07, attrs & 0x30), bytes(part.records))
    return (
        [_entry(f"captured api {k} v{v} {c}", f) for (k, v, c), f in sorted(requests.items())],
        [_entry(f"captured batch codec {c} attrs {a:#x}", b) for (c, a), b in batches.items()],
        [_entry(f"captured rpc {kind}", b) for kind, b in sorted(rpc.items())],
    )


def build(with_capture: bool, zones: int = 1) -> dict[str, list[dict[str, str]]]:
    requests = [_entry(n, f) for n, f in encoded_requests()]
    requests += [_entry(n, f) for n, f in encoded_produce()]
    batches = [_entry(n, b) for n, b in encoded_batches()]
    rpc_bodies = [_entry(n, msgpack.packb(msg, use_bin_type=True)) for n, msg in rpc_messages()]
    if with_capture:
        cap_requests, cap_batches, cap_rpc = _captured_entries(capture(zones))
        print(
            f"captured {len(cap_requests)} requests, {len(cap_batches)} batches, "
            f"{len(cap_rpc)} rpc messages",
            file=sys.stderr,
        )
        requests += cap_requests
        batches += cap_batches
        rpc_bodies += cap_rpc
    # Headers: each distinct header of the requests (the body cut off at a few bytes).
    headers: dict[str, dict[str, str]] = {}
    for entry in requests:
        frame = bytes.fromhex(entry["hex"])
        header = codec.parse_request_header(frame)
        key = f"{header.api_key} {header.api_version} {header.client_id}"
        headers.setdefault(key, _entry(entry["note"], frame[: header.size + 4]))
    # Frames: a few requests and RPC frames, size-prefixed, back to back.
    produce = [bytes.fromhex(e["hex"]) for e in requests if "produce v9" in e["note"]][:1]
    small = [bytes.fromhex(e["hex"]) for e in requests[:3]]
    captured = [bytes.fromhex(e["hex"]) for e in requests if "captured" in e["note"]][:6]
    rpc_frames = [bytes.fromhex(e["hex"]) for e in rpc_bodies[:2]]
    frame_inputs = [
        _entry("one request, 8-byte chunks", b"\x07" + _size_prefixed(small[0])),
        _entry("three requests, 1-byte chunks", b"\x00" + b"".join(map(_size_prefixed, small))),
        _entry("a produce, 64-byte chunks", b"\x3f" + b"".join(map(_size_prefixed, produce))),
        _entry(
            "rpc frames", b"\x10" + b"".join(_size_prefixed(b"\0\0\0\0" + f) for f in rpc_frames)
        ),
        _entry("empty stream", b"\x05"),
    ]
    if captured:
        stream = b"".join(map(_size_prefixed, captured))
        frame_inputs.append(_entry("captured requests, 13-byte chunks", b"\x0c" + stream))
    return {
        "frame": frame_inputs,
        "header": list(headers.values()),
        "request": requests,
        "batch": batches,
        "rpc": rpc_bodies,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capture", action="store_true", help="also run real clients")
    parser.add_argument("--zones", type=int, default=1, help="fleet zones when capturing")
    parser.add_argument("--out", type=Path, default=CORPUS_DIR)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for target, inputs in build(args.capture, args.zones).items():
        path = args.out / f"{target}.json"
        doc = {"target": target, "built_by": "bench/fuzz_corpus.py", "inputs": inputs}
        path.write_text(json.dumps(doc, indent=0) + "\n")
        print(f"{path}: {len(inputs)} inputs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
