"""The table ``produce_consume.py --zones`` prints from its JSON record."""

from __future__ import annotations

from typing import Any

from zone_targets import (
    TARGET_CROSS_ZONE_PCT,
    TARGET_E2E_P99_MS,
    TARGET_PRODUCE_P99_MS,
    TARGET_THROUGHPUT_RATIO,
)


def ratio(num: float, den: float) -> float | None:
    return round(num / den, 3) if den > 0 else None


def _fmt(value: Any, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}{suffix}"
    return f"{value}{suffix}"


def format_table(rec: dict[str, Any]) -> str:
    tp, lat, e2e, cz = rec["throughput"], rec["latency"], rec["e2e"], rec["cross_zone"]
    px, dr = lat["proxy"], lat["direct"]
    rate = f"{lat['rate']:.0f} msg/s"
    rows: list[tuple[str, ...]] = [
        ("metric", "proxy", "direct", "proxy/direct", "target", "met"),
        ("produce throughput MB/s", _fmt(tp["proxy_mb_s"]), _fmt(tp["direct_mb_s"]),
         _fmt(tp["ratio"]), f">= {TARGET_THROUGHPUT_RATIO}x", _yes(tp["met"])),
        (f"produce p50 ms @ {rate}", _fmt(px["p50_ms"]), _fmt(dr["p50_ms"]),
         _fmt(ratio(px["p50_ms"], dr["p50_ms"])), "", ""),
        (f"produce p99 ms @ {rate}", _fmt(px["p99_ms"]), _fmt(dr["p99_ms"]),
         _fmt(lat["p99_ratio"]), f"<= {TARGET_PRODUCE_P99_MS:g} ms", _yes(lat["met"])),
        (f"produce p99.9 ms @ {rate}", _fmt(px["p999_ms"]), _fmt(dr["p999_ms"]), "", "", ""),
        (f"end-to-end p50 ms {e2e['producer_zone']}->{e2e['consumer_zone']}", _fmt(e2e["p50_ms"]),
         "", "", "", ""),
        (f"end-to-end p99 ms {e2e['producer_zone']}->{e2e['consumer_zone']}", _fmt(e2e["p99_ms"]),
         "", "", f"<= {TARGET_E2E_P99_MS:g} ms", _yes(e2e["met"])),
        ("cross-zone bytes / payload", _fmt(cz["fraction_pct"], " %"), "", "",
         f"<= {TARGET_CROSS_ZONE_PCT:g} %", _yes(cz["met"])),
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        f"zonefleet {len(rec['zones'])} zones; topic {rec['topic']} partitions "
        f"{rec['partitions']} led by main {rec['remote_main']} ({rec['remote_zone']}); "
        f"proxy path: client in {rec['client_zone']} via its proxy; direct path: client in "
        f"{rec['remote_zone']} to the main; {rec['message_bytes']} B messages, acks={rec['acks']}",
    ]
    for i, row in enumerate(rows):
        cells = [
            c.ljust(w) if j == 0 else c.rjust(w)
            for j, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    channels = ", ".join(f"{c} {b}" for c, b in cz["by_channel"].items()) or "none"
    lines.append(
        f"cross-zone bytes {cz['cross_zone_bytes']} of {cz['payload_bytes']} payload bytes "
        f"(by channel: {channels}); {cz['payload_bytes_per_confirm']} payload B and "
        f"{cz['confirm_bytes_per_partition']} confirm B per confirmed partition"
    )
    for problem in rec["problems"]:
        lines.append(f"PROBLEM: {problem}")
    return "\n".join(lines)


def _yes(met: bool) -> str:
    return "yes" if met else "NO"
