"""Ledger files and their uploaded objects, for the ledger upload tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from s3_commit import ObjectStore
from telemetry import DailyJsonlTrafficSink, accounting_file
from telemetry.ledger_upload import parse_ledger_key

NODE = "main-1"


def rows(day: str, count: int, node: str = NODE, first_minute: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "minute": f"{day}T10:{first_minute + i:02d}:00Z",
            "node": node,
            "from_zone": "az1",
            "to_zone": "az2",
            "channel": "kafka-client",
            "api": "Produce",
            "bytes": 1000 + i,
            "requests": 1,
            "cross_zone": True,
        }
        for i in range(count)
    ]


def write(data_dir: Path, day: str, count: int, node: str = NODE, first_minute: int = 0) -> None:
    """Rows appended as a node's flush appends them."""
    DailyJsonlTrafficSink(data_dir, node).write(rows(day, count, node, first_minute))


def local(data_dir: Path, day: str, node: str = NODE) -> bytes:
    return accounting_file(data_dir, node, day).read_bytes()


def ledger_objects(store: ObjectStore) -> dict[str, bytes]:
    """Every object under accounting/, by key."""
    out: dict[str, bytes] = {}
    for info in store.list("accounting/"):
        found = store.get(info.key)
        assert found is not None
        out[info.key] = found[0]
    return out


def reassemble(objects: dict[str, bytes], day: str, node: str = NODE) -> bytes:
    """The node-day's objects in start order, which must tile the file: each starts where the
    one before ended, so no byte is in two of them."""
    parts = []
    for key, data in objects.items():
        parsed = parse_ledger_key(key)
        if parsed is not None and parsed[:2] == (day, node):
            parts.append((parsed[2], data))
    out = b""
    for start, data in sorted(parts):
        assert start == len(out), f"{node} {day}: object at {start} after {len(out)} bytes"
        out += data
    return out
