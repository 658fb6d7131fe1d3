"""`zonefleet inspect-object <url>`: an S3 data object's footer, index and Kafka batches.

Meant for operators: every number is labelled, offsets are shown as [start, end) ranges, and
each batch's CRC-32C is checked. The exit status is 0 when the whole object checks out, 1
when it is missing or anything in it is corrupt (the report says what).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlparse

from kafka_wire.control_batch import marker_type
from kafka_wire.record_batch import BatchInfo, InvalidBatch
from s3_commit import ObjectStoreError, open_object_store
from s3_commit.object_format import (
    FOOTER_SIZE,
    INDEX_ENTRY_SIZE,
    MAGIC,
    CorruptObject,
    IndexEntry,
    ObjectIndex,
    check_block,
    iter_block_batches,
    parse_footer,
    parse_index,
)

__all__ = ["add_inspect_parser", "inspect_object", "open_object_source", "run_inspect_command"]

# One ranged read of the tail usually covers footer and index (1,800 blocks, ~1.8 GiB object).
TAIL_GUESS = 64 << 10
_COMPRESSION = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class ObjectNotFound(Exception):
    pass


class ObjectSource(Protocol):
    size: int

    def read(self, start: int, length: int) -> bytes: ...


class _FileSource:
    def __init__(self, path: Path) -> None:
        try:
            self.size = path.stat().st_size
        except FileNotFoundError:
            raise ObjectNotFound(f"no such file: {path}") from None
        self._path = path

    def read(self, start: int, length: int) -> bytes:
        with open(self._path, "rb") as f:
            f.seek(start)
            return f.read(length)


class _SizedInfo(Protocol):
    @property
    def size(self) -> int: ...


class RangedStore(Protocol):
    """The part of `s3_commit.ObjectStore` this tool uses."""

    def head(self, key: str) -> _SizedInfo | None: ...

    def get_range(self, key: str, start: int, length: int) -> bytes | None: ...


class _StoreSource:
    """Ranged GETs: the tail for footer and index, then one GET per DataBlock shown."""

    def __init__(self, store: RangedStore, key: str, url: str) -> None:
        info = store.head(key)
        if info is None:
            raise ObjectNotFound(f"no such object: {url}")
        self.size = info.size
        self._store = store
        self._key = key
        self._url = url

    def read(self, start: int, length: int) -> bytes:
        data = self._store.get_range(self._key, start, length)
        if data is None:
            raise ObjectNotFound(f"object vanished while being read: {self._url}")
        return data


def open_object_source(url: str) -> ObjectSource:
    """The one place that fetches: `file:///path` (or a plain path) reads a local file;
    `s3://bucket/key[?endpoint=...&region=...]` goes through the object store of the bucket
    (the query takes the same options as the fleet's object store URL)."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return _FileSource(Path(unquote(parsed.path) if parsed.scheme else url))
    if parsed.scheme == "s3":
        key = unquote(parsed.path.lstrip("/"))
        if not parsed.netloc or not key:
            raise ValueError(f"expected s3://bucket/key, got {url!r}")
        query = f"?{parsed.query}" if parsed.query else ""
        store = cast(RangedStore, open_object_store(f"s3://{parsed.netloc}{query}"))
        return _StoreSource(store, key, url)
    raise ValueError(f"unsupported URL {url!r}: use file:///path or s3://bucket/key")


def read_index(source: ObjectSource) -> ObjectIndex:
    size = source.size
    tail_length = min(size, TAIL_GUESS)
    tail = source.read(size - tail_length, tail_length)
    if len(tail) != tail_length:
        raise CorruptObject(f"read {len(tail)} bytes of the tail, expected {tail_length}")
    footer = parse_footer(tail, size)
    if footer.index_length + FOOTER_SIZE <= len(tail):
        return ObjectIndex.from_tail(tail, size)
    index = source.read(footer.index_position, footer.index_length)
    return ObjectIndex(footer, parse_index(index, footer), size)


@dataclass
class BlockReport:
    block: int
    entry: IndexEntry
    batches: list[tuple[BatchInfo, bool]] = field(default_factory=list)
    error: str | None = None
    # A transaction marker's type (COMMIT or ABORT), by the control batch's base offset.
    markers: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def inspect_block(source: ObjectSource, number: int, entry: IndexEntry) -> BlockReport:
    report = BlockReport(number, entry)
    data = source.read(entry.position, entry.size)
    try:
        for item in iter_block_batches(data):
            report.batches.append((item.info, item.crc_ok))
            if item.info.is_control and item.crc_ok:
                try:
                    report.markers[item.info.base_offset] = marker_type(data, item.info).name
                except InvalidBatch as exc:
                    report.markers[item.info.base_offset] = f"unreadable ({exc.message})"
        bad = sum(1 for _, ok in report.batches if not ok)
        if bad:
            report.error = f"{bad} batch(es) fail the CRC-32C check"
        else:
            check_block(data, entry)
    except CorruptObject as exc:
        report.error = str(exc)
    return report


def inspect_object(
    source: ObjectSource, blocks: list[int] | None
) -> tuple[ObjectIndex, list[BlockReport]]:
    """Footer and index (CorruptObject if unreadable), then a report per chosen block."""
    index = read_index(source)
    chosen = range(len(index.entries)) if blocks is None else blocks
    for n in chosen:
        if not 0 <= n < len(index.entries):
            raise ValueError(f"no block {n}: the object has {len(index.entries)} blocks")
    return index, [inspect_block(source, n, index.entries[n]) for n in chosen]


# --- output -------------------------------------------------------------------------------


def _timestamp(ms: int) -> str:
    if ms < 0:
        return "-"
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return str(ms)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _flags(info: BatchInfo, marker: str | None = None) -> str:
    flags = [
        name
        for name, on in (
            ("transactional", info.is_transactional),
            (f"control:{marker}" if marker else "control", info.is_control),
            ("log-append-time", info.timestamp_type_log_append),
            # The log cleaner's KIP-534 mark: the base timestamp is the delete horizon.
            ("delete-horizon", bool(info.attributes & 0x40)),
        )
        if on
    ]
    return ",".join(flags) or "-"


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def format_text(url: str, index: ObjectIndex, reports: list[BlockReport], batches: bool) -> str:
    entries = index.entries
    footer = index.footer
    lines = [
        f"object  {url}",
        f"size    {index.size} bytes: {len(entries)} data blocks "
        f"({footer.index_position} bytes), index ({footer.index_length} bytes), "
        f"footer ({FOOTER_SIZE} bytes)",
        "",
        f"footer (last {FOOTER_SIZE} bytes)",
        f"  magic           {MAGIC.decode()} (ok)",
        f"  index position  {footer.index_position}",
        f"  index length    {footer.index_length} = {footer.entry_count} entries "
        f"x {INDEX_ENTRY_SIZE} bytes",
        "",
        f"index ({len(entries)} blocks, {len(index.stream_ids())} streams; "
        "offsets are [first, end) with end exclusive)",
    ]
    rows: list[tuple[str, ...]] = [("BLOCK", "STREAM ID", "OFFSETS", "RECORDS", "POSITION", "SIZE")]
    for n, e in enumerate(entries):
        rows.append(
            (
                str(n),
                f"{e.stream_id:#018x}",
                f"[{e.start_offset}, {e.end_offset})",
                str(e.record_count),
                str(e.position),
                str(e.size),
            )
        )
    lines += _table(rows) if entries else ["  (empty)"]
    if batches:
        for r in reports:
            e = r.entry
            lines += [
                "",
                f"block {r.block}: stream {e.stream_id:#018x}, offsets "
                f"[{e.start_offset}, {e.end_offset}), {_plural(e.record_count, 'record')}, "
                f"{e.size} bytes at {e.position}",
            ]
            batch_rows: list[tuple[str, ...]] = [
                (
                    "BASE OFFSET",
                    "LAST OFFSET",
                    "RECORDS",
                    "BYTES",
                    "PRODUCER ID",
                    "EPOCH",
                    "SEQUENCE",
                    "COMPRESSION",
                    "MAX TIMESTAMP",
                    "FLAGS",
                    "CRC",
                )
            ]
            for info, crc_ok in r.batches:
                batch_rows.append(
                    (
                        str(info.base_offset),
                        str(info.last_offset),
                        str(info.record_count),
                        str(info.size),
                        str(info.producer_id),
                        str(info.producer_epoch),
                        str(info.base_sequence),
                        _COMPRESSION.get(info.compression, str(info.compression)),
                        _timestamp(info.max_timestamp),
                        _flags(info, r.markers.get(info.base_offset)),
                        "OK" if crc_ok else "BAD",
                    )
                )
            if r.batches:
                lines += _table(batch_rows)
            lines.append(f"  check: {'OK' if r.ok else 'CORRUPT: ' + str(r.error)}")
    bad = [r for r in reports if not r.ok]
    lines.append("")
    if bad:
        lines.append(f"result: CORRUPT ({len(bad)} of {len(reports)} checked blocks)")
    else:
        checked = f"{len(reports)} blocks checked" if batches else "blocks not read"
        lines.append(f"result: OK (footer and index valid, {checked})")
    return "\n".join(lines)


def _batch_json(info: BatchInfo, crc_ok: bool, marker: str | None = None) -> dict[str, Any]:
    return {
        "base_offset": info.base_offset,
        "last_offset": info.last_offset,
        "record_count": info.record_count,
        "size": info.size,
        "producer_id": info.producer_id,
        "producer_epoch": info.producer_epoch,
        "base_sequence": info.base_sequence,
        "partition_leader_epoch": info.partition_leader_epoch,
        "compression": _COMPRESSION.get(info.compression, str(info.compression)),
        "transactional": info.is_transactional,
        "control": info.is_control,
        "marker": marker,
        "log_append_time": info.timestamp_type_log_append,
        "base_timestamp": info.base_timestamp,
        "max_timestamp": info.max_timestamp,
        "crc": f"{info.crc:08x}",
        "crc_ok": crc_ok,
    }


def format_json(url: str, index: ObjectIndex, reports: list[BlockReport]) -> dict[str, Any]:
    return {
        "url": url,
        "size": index.size,
        "ok": all(r.ok for r in reports),
        "error": None,
        "footer": {
            "index_position": index.footer.index_position,
            "index_length": index.footer.index_length,
            "entries": index.footer.entry_count,
            "magic": MAGIC.decode(),
        },
        "index": [
            {
                "block": n,
                "stream_id": e.stream_id,
                "stream_id_hex": f"{e.stream_id:016x}",
                "start_offset": e.start_offset,
                "end_offset": e.end_offset,
                "record_count": e.record_count,
                "position": e.position,
                "size": e.size,
            }
            for n, e in enumerate(index.entries)
        ],
        "blocks": [
            {
                "block": r.block,
                "ok": r.ok,
                "error": r.error,
                "batches": [
                    _batch_json(info, ok, r.markers.get(info.base_offset)) for info, ok in r.batches
                ],
            }
            for r in reports
        ],
    }


# --- command ------------------------------------------------------------------------------


def add_inspect_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect-object",
        help="decode an S3 data object: footer, index and Kafka batches",
        description="Print an object's footer, its index (one entry per DataBlock) and the "
        "Kafka batches of its DataBlocks with a CRC-32C check each. Exit status 1 when the "
        "object is missing or corrupt.",
    )
    p.add_argument("url", help="file:///path/to/object (or a path) or s3://bucket/key")
    p.add_argument(
        "--block", type=int, action="append", default=None, metavar="N", help="only block N"
    )
    p.add_argument(
        "--index-only", action="store_true", help="footer and index only, no DataBlock reads"
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"url": args.url, "ok": False, "error": message}, indent=2))
    print(f"zonefleet inspect-object: {message}", file=sys.stderr)
    return 1


def run_inspect_command(args: argparse.Namespace) -> int:
    try:
        source = open_object_source(args.url)
        blocks: list[int] | None = [] if args.index_only else args.block
        index, reports = inspect_object(source, blocks)
    except ObjectNotFound as exc:
        return _fail(args, str(exc))
    except CorruptObject as exc:
        return _fail(args, f"corrupt object {args.url}: {exc}")
    except (ValueError, OSError, ObjectStoreError) as exc:
        return _fail(args, str(exc))
    if args.json:
        print(json.dumps(format_json(args.url, index, reports), indent=2))
    else:
        print(format_text(args.url, index, reports, not args.index_only))
    return 0 if all(r.ok for r in reports) else 1
