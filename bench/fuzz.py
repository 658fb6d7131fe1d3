"""Coverage-guided fuzzing of the decoders that read bytes from peers (issue 14, "Bad input
and resource limits"): the Kafka frame reader, the request header, request bodies (kio's
schemas and the hand-written Produce codec), RecordBatches (framing, validation, records,
decompression, transaction markers) and the internal RPC (frames, the session protocol, the
handshake, every typed message and the state stream's frames).

    .venv/bin/python bench/fuzz.py --target all --inputs 200000 --seed 1 --crashes /tmp/crashes
    .venv/bin/python bench/fuzz.py --target rpc --inputs 5000 --seed 7

A seeded mutation fuzzer (bit flips, byte inserts and deletes, length-field and varint tweaks,
interesting integers, splices of corpus entries) over the corpus in tests/fuzz_corpus/ (real
frames captured from kafka-python, aiokafka and confluent-kafka, and frames encoded for every
API version the main advertises; `bench/fuzz_corpus.py` rebuilds it). Coverage comes from
`sys.settrace` on the decoder modules only: an input that takes a new (line, next line) edge
joins the queue of inputs to mutate. Each target runs its decoders the way the brokers do and
catches only the errors each one declares; anything else escaping (IndexError, struct.error,
a ValueError nobody declared, RecursionError, MemoryError) or an input running longer than
`--timeout` is a crash: printed, and saved under `--crashes` with its traceback. The input
being run is kept in `<crashes>/<target>.inflight` so that one which kills the process (a
native abort) is not lost; the file is removed when the target ends.

Prints, per target, inputs, inputs/s, the lines and edges reached, the queue size and the
crashes; `--json` prints the same as JSON on stdout. Exit status 1 when anything crashed.
tests/test_fuzz_decoders.py runs a short fuzz of every target in `make test`; the figures of
a long run are in docs/reliability.md, "Fuzzing".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import random
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, cast

import crc32c
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from internal_rpc import auth, frames, messages, protocol, state_frames
from kafka_wire import (
    codec,
    compression,
    control_batch,
    entities,
    framing,
    hot_codecs,
    record_batch,
    server_loop,
    varint,
)

ROOT: Final = Path(__file__).resolve().parent.parent
CORPUS_DIR: Final = ROOT / "tests" / "fuzz_corpus"
TARGET_NAMES: Final = ("frame", "header", "request", "batch", "rpc")
DEFAULT_MAX_LEN: Final = 8192

# --- the targets: each runs a family of decoders and catches only their declared errors ----


Declared = tuple[type[BaseException], ...]
Buffer = bytes | bytearray | memoryview


def _expect(declared: Declared, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, or None when it raises one of its declared errors."""
    try:
        return fn(*args)
    except declared:
        return None


class _BytesStream:
    """A receive stream over a byte string, `chunk` bytes per receive, that never blocks:
    `FrameReader.read_frame` then completes in one `send(None)`, without an event loop."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self._data = data
        self._pos = 0
        self._chunk = chunk

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        n = self._chunk if max_bytes is None else min(self._chunk, max_bytes)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("the coroutine suspended on a stream that never blocks")


_MAX_FUZZ_FRAME: Final = 1 << 16


def run_frame(data: bytes) -> None:
    """The Kafka frame reader (also the internal RPC's) over a stream delivering `data` in
    chunks of 1..64 bytes (the first byte says), with a small read buffer so bodies straddle
    it; then the RPC length prefix check on the first 4 bytes."""
    if not data:
        return
    chunk = 1 + data[0] % 64
    stream = _BytesStream(data[1:], chunk)
    reader = framing.FrameReader(
        cast(trio.abc.ReceiveStream, stream),
        _MAX_FUZZ_FRAME,
        read_buffer_bytes=16 + data[0] % 48,
    )
    for _ in range(64):
        try:
            frame = _run_sync(reader.read_frame())
        except framing.FrameError:
            break
        if frame is None:
            break
    if len(data) >= 5:
        _expect((frames.RpcFrameError, framing.FrameTooLarge), frames.frame_length, data[1:5])


def run_header(data: bytes) -> None:
    """A request header, as the brokers parse every frame first."""
    header = _expect((codec.MalformedRequest,), codec.parse_request_header, bytearray(data))
    if header is not None:
        codec.request_is_flexible(header.api_key, header.api_version)


_LIMITS: Final = record_batch.ProduceLimits(
    now_ms=1_700_000_000_000,
    log_append_time=False,
    timestamp_before_max_ms=2**62,
    timestamp_after_max_ms=2**62,
    max_message_bytes=1 << 20,
    api_version=None,
)
_BATCH_ERRORS: Final[Declared] = (record_batch.InvalidBatch,)


def _validate_records(records: Buffer, limits: record_batch.ProduceLimits = _LIMITS) -> None:
    """What a main does with one partition's records: validate, then (compacted topics) find
    the records without a key."""
    batch = _expect(_BATCH_ERRORS, record_batch.validate_batch, records, limits)
    if batch is not None:
        _expect(_BATCH_ERRORS, record_batch.null_key_indexes, records, batch)


def run_request(data: bytes) -> None:
    """A whole request frame as a main or a proxy reads it: the header, then a Produce body
    through the hand-written codec (and each partition's records through validation) or any
    other body through kio's schemas."""
    frame = bytearray(data)
    header = _expect((codec.MalformedRequest,), codec.parse_request_header, frame)
    if header is None:
        return
    if header.api_key == 0:
        req = _expect(
            (server_loop.CloseConnection,), server_loop.decode_produce_or_close, header, frame
        )
        if req is None:
            return
        hot_codecs.name_topics(req, lambda topic_id: None)
        # The request's version (zstd needs v7) and a small max.message.bytes.
        limits = _LIMITS._replace(api_version=header.api_version, max_message_bytes=4096)
        for topic in req.topics:
            for part in topic.partitions:
                if part.records is not None:
                    _validate_records(part.records, limits)
        return
    _expect((codec.MalformedRequest,), codec.decode_request, header, frame)


def _with_crc(buf: bytes) -> bytes:
    """`buf` with its batch header's CRC-32C made right, so mutations get past the check."""
    if len(buf) < record_batch.BATCH_HEADER_SIZE:
        return buf
    size = record_batch.LOG_OVERHEAD + struct.unpack_from(">i", buf, 8)[0]
    if not record_batch.BATCH_HEADER_SIZE <= size <= len(buf):
        size = len(buf)
    crc = crc32c.crc32c(buf[21:size])
    return buf[:17] + struct.pack(">I", crc) + buf[21:]


def run_batch(data: bytes) -> None:
    """RecordBatch bytes: walked as a fetched records blob (each batch's records read, markers
    typed), validated as one partition's produce records (as sent, and with the CRC made
    right), and the body after the header decompressed with the codec its attributes name."""
    batches = _expect(_BATCH_ERRORS, lambda: list(record_batch.iter_batches(data))) or []
    for batch in batches:
        _expect(_BATCH_ERRORS, record_batch.null_key_indexes, data, batch)
        if batch.is_control:
            _expect(_BATCH_ERRORS, control_batch.marker_type, data, batch)
    _expect(_BATCH_ERRORS, record_batch.decode_records_for_tools, data)
    _validate_records(data)
    fixed = _with_crc(data)
    if fixed != data:
        _validate_records(fixed)
    if len(data) > record_batch.BATCH_HEADER_SIZE:
        codec_id = data[22] & 0x07
        _expect(
            (compression.DecompressionError,),
            compression.decompress,
            codec_id,
            memoryview(data)[record_batch.BATCH_HEADER_SIZE :],
            1 << 20,
        )


_SECRET: Final = b"fuzz-secret-0123456789abcdef"
_NONCE: Final = bytes(range(32))
_MESSAGE_ERRORS: Final[Declared] = (messages.MalformedMessage,)
# Every typed decoder of a call's params or result, a stream's items, and their rows.
_FROM_WIRE: Final[Sequence[Callable[[Any], Any]]] = (
    messages.ConfirmParams.from_wire,
    messages.ConfirmResult.from_wire,
    lambda m: messages.ConfirmResult.from_wire(m, 1),
    messages.RelayParams.from_wire,
    messages.RelayResult.from_wire,
    messages.MetaChanged.from_wire,
    messages.WriteTxnMarkers.from_wire,
    messages.WriteTxnMarkersResult.from_wire,
    state_frames.StateFrame.from_wire,
    state_frames.StateSubscription.from_wire,
    messages.BatchSummary.from_wire,
    lambda row: messages.BatchSummary.from_wire(row, "batch", 2),
    lambda row: messages.ConfirmPart.from_wire(row, "part", 1),
    messages.ConfirmPart.from_wire,
    messages.PartitionOutcome.from_wire,
    messages.TxnMarker.from_wire,
    messages.TxnMarkerResult.from_wire,
    lambda entry: state_frames.TopicRow.from_wire("t", entry),
    state_frames.PartitionRow.from_wire,
    lambda row: state_frames.PartitionRow.from_wire(row, "part", 1),
    state_frames.ObjectRangeRow.from_wire,
    state_frames.ObjectStreamRow.from_wire,
    state_frames.AbortedRow.from_wire,
    # Messages newer than this runner, when the tree has them.
    *(
        getattr(messages, name).from_wire
        for name in ("AllowTxn", "AllowTxnResult")
        if hasattr(messages, name)
    ),
)


def run_rpc(data: bytes) -> None:
    """An internal RPC frame body: `data` is the msgpack part, checked as sent (CRC and all:
    mostly refused) and behind its right CRC-32C; the message then goes through the server's
    and the client's session, the handshake checks, and every typed decoder (on the message,
    and on its params, result or pushed item)."""
    frame_errors = (frames.RpcFrameError,)
    _expect(frame_errors, frames.decode_body, data)
    msg = _expect(frame_errors, frames.decode_body, struct.pack(">I", crc32c.crc32c(data)) + data)
    if msg is None:
        return
    server = protocol.ServerSession({"confirm", "relay"}, {"state"}, max_in_flight=2)
    for k in (0, 0, 1, 2):  # a duplicate id, then more calls than it takes at once
        rid = msg.get("id")
        again = {**msg, "id": rid + k} if type(rid) is int else msg
        _expect((protocol.ProtocolViolation,), server.receive, again)
    client = protocol.ClientSession(max_buffered_pushes=1)
    for _ in range(3):
        client.open("confirm")
    for _ in range(3):
        client.receive(msg)
    auth_errors = (auth.AuthError,)
    _expect(auth_errors, auth.answer_hello, _SECRET, 1, msg, _NONCE)
    _expect(auth_errors, auth.verify_auth, _SECRET, 2, _NONCE, msg)
    _expect(auth_errors, auth.verify_ok, bytes(32), msg)
    for value in (msg, msg.get("p"), msg.get("r"), msg.get("d")):
        for decode in _FROM_WIRE:
            _expect(_MESSAGE_ERRORS, decode, value)


def _files(*modules: Any) -> frozenset[str]:
    return frozenset(str(Path(m.__file__).resolve()) for m in modules)


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    files: frozenset[str]  # the modules whose lines count as coverage


TARGETS: Final[dict[str, Target]] = {
    "frame": Target("frame", run_frame, _files(framing, frames)),
    "header": Target("header", run_header, _files(codec, entities, varint)),
    "request": Target(
        "request",
        run_request,
        _files(codec, entities, varint, hot_codecs, server_loop, record_batch, compression),
    ),
    "batch": Target("batch", run_batch, _files(record_batch, compression, control_batch)),
    "rpc": Target("rpc", run_rpc, _files(frames, protocol, auth, messages, state_frames)),
}


# --- the corpus ---------------------------------------------------------------------------


def load_corpus(target: str, directory: Path = CORPUS_DIR) -> list[bytes]:
    """The seed inputs of `target`: `<directory>/<target>.json`, {"inputs": [{"hex": ...}]}."""
    path = directory / f"{target}.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    return [bytes.fromhex(entry["hex"]) for entry in doc["inputs"]]


# --- mutation ----------------------------------------------------------------------------

_INTERESTING: Final = (
    0, 1, 2, 7, 8, 15, 16, 32, 61, 64, 100, 127, 128, 255, 256, 1000, 1024, 4096, 32767, 32768,
    65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1, -1, -2, -128, -129,
    -32768, -(2**31),
)  # fmt: skip
_WIDTHS: Final = (1, 2, 4, 8)


def _pack(value: int, width: int) -> bytes:
    return (value % (1 << (8 * width))).to_bytes(width, "big")


def _uvarint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def mutate(data: bytes, rng: random.Random, pool: Sequence[bytes], max_len: int) -> bytes:
    """One to eight stacked mutations of `data`, no longer than `max_len`."""
    buf = bytearray(data)
    for _ in range(1 << rng.randrange(4)):
        op = rng.randrange(12)
        n = len(buf)
        pos = rng.randrange(n) if n else 0
        if op == 0 and n:  # flip a bit
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # a random byte
            buf[pos] = rng.randrange(256)
        elif op == 2 and n:  # an interesting integer over what is there
            width = rng.choice(_WIDTHS)
            buf[pos : pos + width] = _pack(rng.choice(_INTERESTING), width)
        elif op == 3 and n:  # a length field a little off, or exactly the bytes left
            width = rng.choice((1, 2, 4))
            if pos + width <= n:
                old = int.from_bytes(buf[pos : pos + width], "big")
                new = old + rng.randint(-8, 8) if rng.randrange(3) else n - pos - width
                buf[pos : pos + width] = _pack(new, width)
        elif op == 4:  # insert random bytes
            buf[pos:pos] = rng.randbytes(1 + rng.randrange(16))
        elif op == 5 and n:  # delete a range
            del buf[pos : pos + 1 + rng.randrange(min(n - pos, 64))]
        elif op == 6 and n:  # duplicate a range elsewhere
            end = pos + 1 + rng.randrange(min(n - pos, 64))
            at = rng.randrange(n + 1)
            buf[at:at] = buf[pos:end]
        elif op == 7 and pool:  # splice: our head, another input's tail
            other = rng.choice(pool)
            cut = rng.randrange(len(other) + 1)
            buf = buf[:pos] + other[cut:]
        elif op == 8 and n:  # truncate
            del buf[pos:]
        elif op == 9:  # a varint of an interesting value
            width = 1 + rng.randrange(min(3, n)) if n else 0
            buf[pos : pos + width] = _uvarint(rng.choice(_INTERESTING))
        elif op == 10:  # insert an interesting integer
            buf[pos:pos] = _pack(rng.choice(_INTERESTING), rng.choice(_WIDTHS))
        elif op == 11 and pool:  # overwrite with a piece of another input
            other = rng.choice(pool)
            if other:
                start = rng.randrange(len(other))
                piece = other[start : start + 1 + rng.randrange(64)]
                buf[pos : pos + len(piece)] = piece
    return bytes(buf[:max_len])


# --- coverage -----------------------------------------------------------------------------

Edge = tuple[str, int, int]


class EdgeTracer:
    """Records the (file, previous line, line) edges taken inside `files` while active."""

    def __init__(self, files: frozenset[str]) -> None:
        self.files = files
        self.hits: set[Edge] = set()
        # Code objects' file names resolved once (co_filename may be relative).
        self._verdict: dict[str, bool] = {}

    def _wanted(self, filename: str) -> bool:
        verdict = self._verdict.get(filename)
        if verdict is None:
            verdict = self._verdict[filename] = str(Path(filename).resolve()) in self.files
        return verdict

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if not self._wanted(filename):
            return None
        hits = self.hits
        prev = -1

        def line(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal prev
            if event == "line":
                lineno = frame.f_lineno
                hits.add((filename, prev, lineno))
                prev = lineno
            return line

        return line

    def __enter__(self) -> EdgeTracer:
        self.hits = set()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


# --- the engine ---------------------------------------------------------------------------


class FuzzTimeout(BaseException):
    """An input ran past the time limit (a hang)."""


@dataclass
class Crash:
    target: str
    kind: str  # the exception's type, or "timeout"
    where: str  # file:line of the innermost frame
    message: str
    data: bytes
    trace: str

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.where

    def name(self) -> str:
        return f"{self.target}-{hashlib.sha1(self.data).hexdigest()[:12]}"


@dataclass
class Stats:
    target: str
    inputs: int = 0
    seconds: float = 0.0
    lines: int = 0
    edges: int = 0
    queue: int = 0
    seeds: int = 0
    crashes: list[Crash] = field(default_factory=list)
    covered: set[tuple[str, int]] = field(default_factory=set)  # (file, line) reached

    @property
    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "inputs": self.inputs,
            "seconds": round(self.seconds, 1),
            "inputs_per_s": round(self.rate),
            "lines": self.lines,
            "edges": self.edges,
            "seeds": self.seeds,
            "queue": self.queue,
            "crashes": [
                {"kind": c.kind, "where": c.where, "message": c.message[:200], "input": c.name()}
                for c in self.crashes
            ],
        }


def _crash(target: str, exc: BaseException, data: bytes) -> Crash:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
    kind = "timeout" if isinstance(exc, FuzzTimeout) else type(exc).__name__
    trace = "".join(traceback.format_exception(exc))
    return Crash(target, kind, where, str(exc), data, trace)


class _Inflight:
    """The input being run, in a file mapped into memory: cheap to write per input, and left
    behind when a native abort kills the process."""

    def __init__(self, path: Path, max_len: int) -> None:
        self.path = path
        with open(path, "wb") as f:
            f.truncate(4 + max_len)
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), 4 + max_len)

    def set(self, data: bytes) -> None:
        self._map[:4] = len(data).to_bytes(4, "big")
        self._map[4 : 4 + len(data)] = data

    def close(self) -> None:
        self._map.close()
        self._file.close()
        self.path.unlink(missing_ok=True)


def fuzz(
    target: Target,
    seeds: Iterable[bytes],
    inputs: int,
    seed: int,
    *,
    max_len: int = DEFAULT_MAX_LEN,
    timeout_s: float | None = 5.0,
    crashes_dir: Path | None = None,
    guided: bool = True,
    progress: Callable[[Stats], None] | None = None,
) -> Stats:
    """Runs `target` on its seeds, then on mutations of the queue until `inputs` inputs ran.

    An input that reaches a new edge joins the queue. Every distinct crash (exception type and
    innermost line) is kept with the first input that caused it, and saved in `crashes_dir`.
    """
    rng = random.Random(seed)
    queue: list[bytes] = list(dict.fromkeys(s[:max_len] for s in seeds)) or [b""]
    stats = Stats(target.name, seeds=len(queue))
    tracer = EdgeTracer(target.files)
    covered: set[Edge] = set()
    seen_crashes: set[tuple[str, str]] = set()
    alarm = timeout_s is not None and threading.current_thread() is threading.main_thread()
    previous_handler: Any = None
    if alarm:

        def on_alarm(signum: int, frame: FrameType | None) -> None:
            raise FuzzTimeout(f"input ran past {timeout_s} s")

        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    inflight = None
    if crashes_dir is not None:
        crashes_dir.mkdir(parents=True, exist_ok=True)
        inflight = _Inflight(crashes_dir / f"{target.name}.inflight", max_len)
    pending = list(queue)
    started = time.perf_counter()
    last_report = started
    try:
        for i in range(inputs):
            data = pending.pop() if pending else mutate(rng.choice(queue), rng, queue, max_len)
            if inflight is not None:
                inflight.set(data)
            error: BaseException | None = None
            if alarm:
                signal.setitimer(signal.ITIMER_REAL, cast(float, timeout_s))
            try:
                if guided:
                    with tracer:
                        target.run(data)
                else:
                    target.run(data)
            except (Exception, FuzzTimeout, RecursionError, MemoryError) as exc:
                error = exc
            finally:
                if alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            stats.inputs = i + 1
            if error is not None:
                crash = _crash(target.name, error, data)
                if crash.key not in seen_crashes:
                    seen_crashes.add(crash.key)
                    stats.crashes.append(crash)
                    if crashes_dir is not None:
                        (crashes_dir / f"{crash.name()}.bin").write_bytes(data)
                        (crashes_dir / f"{crash.name()}.txt").write_text(crash.trace)
            if guided and not tracer.hits <= covered:
                covered |= tracer.hits
                if error is None and data not in queue:
                    queue.append(data)
            if progress is not None and time.perf_counter() - last_report > 10:
                last_report = time.perf_counter()
                stats.seconds = last_report - started
                stats.edges, stats.queue = len(covered), len(queue)
                stats.lines = len({(f, ln) for f, _, ln in covered})
                progress(stats)
    finally:
        if alarm:
            signal.signal(signal.SIGALRM, previous_handler)
        if inflight is not None:
            inflight.close()
    stats.seconds = time.perf_counter() - started
    stats.edges = len(covered)
    stats.covered = {(f, ln) for f, _, ln in covered}
    stats.lines = len(stats.covered)
    stats.queue = len(queue)
    return stats


def _print_stats(stats: Stats, out: Any = sys.stderr) -> None:
    print(
        f"{stats.target:8s} {stats.inputs:>9d} inputs {stats.seconds:7.1f} s "
        f"{stats.rate:8.0f}/s  lines {stats.lines:5d}  edges {stats.edges:6d}  "
        f"queue {stats.queue:5d} (seeds {stats.seeds})  crashes {len(stats.crashes)}",
        file=out,
        flush=True,
    )
    for crash in stats.crashes:
        print(f"  CRASH {crash.kind} at {crash.where}: {crash.message[:160]}", file=out)


def run_atheris(args: argparse.Namespace, name: str) -> int:
    """`--engine atheris`: libFuzzer's engine over the same target and corpus (atheris from
    PyPI, when it installs). It never returns: libFuzzer exits when its runs are done, with
    its own statistics on stderr (`cov:` counts instrumented edges, not lines), and stops at
    the first crash, writing the input to `<crashes>/crash-<sha1>`."""
    import atheris

    target = TARGETS[name]
    seeds = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    for i, data in enumerate(load_corpus(name, args.corpus)):
        (seeds / f"seed-{i:04d}").write_bytes(data)
    args.crashes.mkdir(parents=True, exist_ok=True)
    atheris.instrument_all()
    libfuzzer_args = [
        sys.argv[0],
        f"-runs={args.inputs}",
        f"-seed={args.seed}",
        f"-max_len={args.max_len}",
        f"-timeout={int(args.timeout)}",
        f"-artifact_prefix={args.crashes}/",
        "-print_final_stats=1",
        str(seeds),
    ]
    atheris.Setup(libfuzzer_args, target.run)
    atheris.Fuzz()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=(*TARGET_NAMES, "all"), default="all")
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per target")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--crashes", type=Path, default=Path(tempfile.gettempdir()) / "zonefleet-fuzz-crashes"
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    parser.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per input")
    parser.add_argument("--no-coverage", action="store_true", help="blind mutation (faster)")
    parser.add_argument(
        "--memory-mb", type=int, default=4096, help="address-space limit (RLIMIT_AS), 0: none"
    )
    parser.add_argument("--json", action="store_true", help="a JSON summary on stdout")
    parser.add_argument(
        "--engine",
        choices=("builtin", "atheris"),
        default="builtin",
        help="atheris: libFuzzer (one target, not all; stops at the first crash)",
    )
    args = parser.parse_args(argv)
    if args.engine == "atheris":
        if args.target == "all":
            parser.error("--engine atheris runs one target at a time")
        return run_atheris(args, args.target)
    if args.memory_mb:
        import resource

        limit = args.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    names = TARGET_NAMES if args.target == "all" else (args.target,)
    results = []
    for offset, name in enumerate(names):
        stats = fuzz(
            TARGETS[name],
            load_corpus(name, args.corpus),
            args.inputs,
            args.seed + offset,
            max_len=args.max_len,
            timeout_s=args.timeout,
            crashes_dir=args.crashes,
            guided=not args.no_coverage,
            progress=lambda s: _print_stats(s),
        )
        _print_stats(stats)
        results.append(stats)
    total = sum(s.inputs for s in results)
    seconds = sum(s.seconds for s in results)
    crashed = sum(len(s.crashes) for s in results)
    print(f"total    {total:>9d} inputs {seconds:7.1f} s  crashes {crashed}", file=sys.stderr)
    if crashed:
        print(f"crashing inputs saved in {args.crashes}/", file=sys.stderr)
    if args.json:
        print(json.dumps([s.summary() for s in results], indent=1))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
