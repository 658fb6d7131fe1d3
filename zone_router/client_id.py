"""Zone markers in a Kafka ``client.id``, in the spellings other diskless brokers use.

- Bufstream: ``zone=<zone>``;
- AutoMQ: ``automq_az=<az>``, URI-query style with ``&`` between keys;
- WarpStream: ``warpstream_az=<az>`` or ``ws_az=<az>``, with ``,`` between features;
- Aiven Inkless: ``diskless_az=<rack>``.

Every marker is accepted with any of the separators ``,``, ``&``, ``;`` or whitespace, and keys
compare case-insensitively. A marker must be a whole key: ``myapp_zone=x`` is not one.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

__all__ = ["ZONE_MARKERS", "parse_client_id_markers", "parse_client_id_zone"]

ZONE_MARKERS: Final = frozenset({"zone", "automq_az", "warpstream_az", "ws_az", "diskless_az"})
_SEPARATORS: Final = re.compile(r"[,&;\s]+")
# client.id is an int16-length string; a marker value longer than this is no zone name.
_MAX_VALUE: Final = 128


def parse_client_id_markers(client_id: str | None) -> list[tuple[str, str]]:
    """Every (marker, raw value) in ``client_id``, in the order they appear."""
    if not client_id or "=" not in client_id:
        return []
    found: list[tuple[str, str]] = []
    for token in _SEPARATORS.split(client_id):
        key, eq, value = token.partition("=")
        if not eq:
            continue
        key = key.strip().casefold()
        if key not in ZONE_MARKERS:
            continue
        # AutoMQ's ids are URI queries, so a value may be percent-encoded.
        value = (unquote(value) if "%" in value else value).strip()
        if value and len(value) <= _MAX_VALUE:
            found.append((key, value))
    return found


def parse_client_id_zone(client_id: str | None) -> str | None:
    """The raw value of the first zone marker in ``client_id``, or None."""
    markers = parse_client_id_markers(client_id)
    return markers[0][1] if markers else None
