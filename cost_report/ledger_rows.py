"""The ledger rows' contract, shared by the Spark job and the plain-Python reference sum.

docs/formats.md, "Traffic accounting", is the reference. A row the report cannot use is not
dropped: it is counted, with its file, line and this module's reason, in the rejected rows.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = [
    "KNOWN_CHANNELS",
    "PSEUDO_ZONES",
    "WAL_CHANNELS",
    "is_cross_zone",
    "row_problem",
]

KNOWN_CHANNELS: Final = (
    "kafka-client",
    "confirm-rpc",
    "state-stream",
    "relay",
    "rpc",
    "wal-write",
    "wal-read",
    "s3-put",
    "s3-get",
)
WAL_CHANNELS: Final = ("wal-write", "wal-read")
PSEUDO_ZONES: Final = ("regional", "unknown")
MINUTE_PATTERN: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:00Z$"
_MINUTE: Final = re.compile(MINUTE_PATTERN)
_STRINGS: Final = ("minute", "node", "from_zone", "to_zone", "channel", "api")
_COUNTS: Final = ("bytes", "requests")

# Reasons, worded once for both implementations.
NOT_JSON: Final = "not a JSON object (torn or corrupt line)"
BAD_TYPE: Final = "a field has the wrong type"
BAD_MINUTE: Final = "minute is not YYYY-MM-DDTHH:MM:00Z"
WRONG_DAY: Final = "minute is not in the file's dt= day"
WRONG_NODE: Final = "row names another node than its file"
UNKNOWN_CHANNEL: Final = "unknown channel"
NEGATIVE: Final = "negative bytes or requests"


def missing(field_name: str) -> str:
    return f"missing {field_name}"


def is_cross_zone(from_zone: str, to_zone: str) -> bool:
    """Both ends are real zones and differ (docs/formats.md: pseudo-zones never cross)."""
    return from_zone != to_zone and from_zone not in PSEUDO_ZONES and to_zone not in PSEUDO_ZONES


def row_problem(row: Any, file_dt: str, file_node: str) -> str | None:
    """Why `row` (a decoded JSON value) cannot be counted, or None when it can."""
    if not isinstance(row, dict):
        return NOT_JSON
    for name in _STRINGS:
        if row.get(name) is None:
            return missing(name)
    for name in _COUNTS:
        if row.get(name) is None:
            return missing(name)
    for name in (*_STRINGS, "topic"):
        if name in row and row[name] is not None and not isinstance(row[name], str):
            return BAD_TYPE
    for name in _COUNTS:
        if not isinstance(row[name], int) or isinstance(row[name], bool):
            return BAD_TYPE
        if not -(1 << 63) <= row[name] < (1 << 63):
            return BAD_TYPE
    if "cross_zone" in row and row["cross_zone"] is not None:
        if not isinstance(row["cross_zone"], bool):
            return BAD_TYPE
    if not _MINUTE.match(row["minute"]):
        return BAD_MINUTE
    if row["minute"][:10] != file_dt:
        return WRONG_DAY
    if row["node"] != file_node:
        return WRONG_NODE
    if row["channel"] not in KNOWN_CHANNELS:
        return UNKNOWN_CHANNEL
    if row["bytes"] < 0 or row["requests"] < 0:
        return NEGATIVE
    return None
