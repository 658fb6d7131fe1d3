"""The log cleaner's core throughput and its offset map's memory (issue 13, "Performance").

    .venv/bin/python bench/cleaner.py                       # table on stderr, JSON on stdout
    .venv/bin/python bench/cleaner.py --value-bytes 100 --compression zstd

Builds a compacted partition in memory: `--records` updates over `--keys` keys (values of
`--value-bytes`, `--batch` records a batch, optionally compressed), laid out as objects of
about `--object-bytes` with the object format. Then it runs what one cleaning of the whole
partition does on the main, minus the GETs and PUTs (`main_broker/objects/cleaner.py`):
for each object, check its blocks and collect the stream's batches (`collect_stream_batches`)
and fill the offset map; then for each object again, collect, filter (`StreamCleaner`) and
encode the new object. MB/s is object bytes in over that time (one core; the main runs it in
a worker thread).

Memory: a fresh `OffsetMap` of `--map-bytes` is filled to its capacity with distinct keys, and
the process's resident size (VmRSS) is read before and after: the growth must stay within the
budget.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_wire.compression import GZIP, LZ4, SNAPPY, ZSTD
from kafka_wire.record_batch import COMPRESSION_NONE, build_batch
from s3_commit.cleaner import StreamCleaner, build_offset_map
from s3_commit.compaction import (
    CompactionJob,
    JobKind,
    SourceRange,
    collect_stream_batches,
)
from s3_commit.manifest import ObjectRange, StreamKey
from s3_commit.object_format import encode_object, stream_id_for
from s3_commit.offset_map import OffsetMap

CODECS = {"none": COMPRESSION_NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
TOPIC_ID = bytes(range(16))
STREAM = StreamKey(TOPIC_ID, 0)
STREAM_ID = stream_id_for(TOPIC_ID, 0)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build_objects(args: argparse.Namespace) -> list[tuple[bytes, ObjectRange]]:
    value = os.urandom(args.value_bytes)
    codec = CODECS[args.compression]
    objects: list[tuple[bytes, ObjectRange]] = []
    pending: list[bytes] = []
    size = 0
    start = 0
    now = int(time.time() * 1000)
    for base in range(0, args.records, args.batch):
        n = min(args.batch, args.records - base)
        records: list[tuple[bytes | None, bytes | None]] = [
            (b"key-%08d" % ((base + i) * 7919 % args.keys), value) for i in range(n)
        ]
        batch = build_batch(records, base_offset=base, timestamp_ms=now, compression=codec)
        pending.append(batch)
        size += len(batch)
        if size >= args.object_bytes or base + n >= args.records:
            data = encode_object({STREAM_ID: pending}).to_bytes()
            end = base + n
            objects.append(
                (
                    data,
                    ObjectRange(start, end, f"data/sso/{len(objects):032x}", len(data), now, size),
                )
            )
            pending, size, start = [], 0, end
    return objects


def clean_all(objects: list[tuple[bytes, ObjectRange]], map_bytes: int) -> dict[str, float]:
    offset_map = OffsetMap(map_bytes)
    end = objects[-1][1].end
    t0 = time.perf_counter()

    def batches(data: bytes, rng: ObjectRange) -> list[memoryview]:
        job = CompactionJob(JobKind.CLEAN, (rng.key,), (SourceRange(STREAM, "t", rng),))
        return collect_stream_batches(job, {rng.key: data})[STREAM_ID]

    map_end = end
    for data, rng in objects:
        result = build_offset_map(batches(data, rng), offset_map, rng.start, end)
        if result.full:
            map_end = result.end
            break
    t1 = time.perf_counter()
    cleaner = StreamCleaner(offset_map, map_end, int(time.time() * 1000), 86_400_000)
    out_bytes = 0
    for data, rng in objects:
        if rng.start >= map_end:
            break
        kept, _ = cleaner.clean_range(batches(data, rng))
        out_bytes += encode_object({STREAM_ID: kept}).size
    t2 = time.perf_counter()
    in_bytes = sum(len(d) for d, rng in objects if rng.start < map_end)  # what was cleaned
    return {
        "object_mb": in_bytes / 1e6,
        "out_mb": out_bytes / 1e6,
        "map_s": t1 - t0,
        "clean_s": t2 - t1,
        "mb_per_s": in_bytes / 1e6 / (t2 - t0),
        "records_per_s": cleaner.stats.records_read / (t2 - t0),
        "records_removed": cleaner.stats.records_removed,
        "map_end": map_end,
        "map_entries": len(offset_map),
    }


def map_memory(map_bytes: int) -> dict[str, float]:
    before = rss_bytes()
    offset_map = OffsetMap(map_bytes)
    i = 0
    while offset_map.put(b"key-%012d" % i, i):
        i += 1
    grown = rss_bytes() - before
    return {
        "map_budget_bytes": map_bytes,
        "map_entries": offset_map.entries,
        "map_rss_growth_bytes": grown,
        "within_budget": grown <= map_bytes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=512)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--compression", choices=sorted(CODECS), default="none")
    parser.add_argument("--object-bytes", type=int, default=8 << 20)
    parser.add_argument("--map-bytes", type=int, default=16 << 20)
    args = parser.parse_args()
    memory = map_memory(args.map_bytes)  # first: a fresh heap makes the RSS growth telling
    objects = build_objects(args)
    result = {**vars(args), **clean_all(objects, args.map_bytes), **memory}
    print(
        f"cleaned {result['object_mb']:.1f} MB of objects ({args.records} records over "
        f"{args.keys} keys, {args.value_bytes} B values, {args.compression}) into "
        f"{result['out_mb']:.2f} MB: map {result['map_s']:.2f} s + clean {result['clean_s']:.2f} s"
        f" = {result['mb_per_s']:.1f} MB/s ({result['records_per_s']:.0f} records/s); "
        f"offset map of {args.map_bytes} bytes holds "
        f"{memory['map_entries']} keys, RSS grew {memory['map_rss_growth_bytes']} bytes",
        file=sys.stderr,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
