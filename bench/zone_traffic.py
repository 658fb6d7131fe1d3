"""Fleet-wide traffic accounting read from every node's Prometheus ``/metrics``."""

from __future__ import annotations

import re
import urllib.request
from collections import defaultdict
from collections.abc import Sequence

_SAMPLE = re.compile(r"^(zonefleet_traffic_(?:bytes|requests)_total)\{(.*)\}\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

TrafficTotals = dict[tuple[str, str, str, str], tuple[float, float]]  # key -> (bytes, requests)


def scrape_traffic(urls: Sequence[str], timeout: float = 5.0) -> TrafficTotals:
    """Sum of every node's traffic counters, by (from_zone, to_zone, channel, api).

    Each byte is booked by exactly one node (docs/formats.md), so the fleet total is the sum.
    """
    totals: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for url in urls:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match is None:
                continue
            labels = dict(_LABEL.findall(match[2]))
            key = (labels["from_zone"], labels["to_zone"], labels["channel"], labels["api"])
            totals[key][0 if match[1].endswith("bytes_total") else 1] += float(match[3])
    return {key: (b, r) for key, (b, r) in totals.items()}


def traffic_delta(before: TrafficTotals, after: TrafficTotals) -> TrafficTotals:
    out: TrafficTotals = {}
    for key, (b, r) in after.items():
        b0, r0 = before.get(key, (0.0, 0.0))
        if b - b0 or r - r0:
            out[key] = (b - b0, r - r0)
    return out
