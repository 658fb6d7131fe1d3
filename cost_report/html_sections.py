"""The report page's tables: daily figures, sources, the shared file system, line items, prices
and rejected input. Each returns an HTML fragment; every cell from data is escaped."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from cost_report.display import as_number, fmt_bytes, fmt_count, fmt_day, fmt_pct, fmt_usd
from cost_report.svg_charts import esc

__all__ = [
    "Raw",
    "daily_table",
    "line_items_table",
    "prices_table",
    "rejected_table",
    "shared_fs_table",
    "sources_table",
    "table",
]


class Raw(str):
    """A cell that is already HTML (built here from escaped parts)."""


def _cell(value: object) -> str:
    return value if isinstance(value, Raw) else esc(value)


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    numeric: Iterable[int] = (),
    total: Sequence[object] | None = None,
    cls_name: str = "",
) -> str:
    nums = set(numeric)

    def cls(i: int) -> str:
        return "num" if i in nums else "text"

    head = "".join(f'<th class="{cls(i)}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = [
        "<tr>" + "".join(f'<td class="{cls(i)}">{_cell(v)}</td>' for i, v in enumerate(r)) + "</tr>"
        for r in rows
    ]
    if total is not None:
        body.append(
            '<tr class="total">'
            + "".join(f'<td class="{cls(i)}">{_cell(v)}</td>' for i, v in enumerate(total))
            + "</tr>"
        )
    attr = f' class="{cls_name}"' if cls_name else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _empty(text: str) -> str:
    return f'<p class="note missing">{esc(text)}</p>'


def _sum(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [as_number(r.get(key)) for r in rows]
    given = [v for v in values if v is not None]
    return sum(given) if given else None


def _share(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


DAILY_COLUMNS = (
    ("cross_zone_bytes", "cross-zone bytes", fmt_bytes),
    ("inter_az_usd", "inter-AZ", fmt_usd),
    ("s3_requests_usd", "S3 requests", fmt_usd),
    ("s3_storage_usd", "S3 storage", fmt_usd),
    ("shared_fs_usd", "shared FS", fmt_usd),
    ("zonefleet_usd", "zonefleet", fmt_usd),
    ("kafka_rf3_usd", "Kafka RF3", fmt_usd),
    ("kafka_rf3_fetch_from_follower_usd", "RF3 + fetch from follower", fmt_usd),
    ("savings_usd", "savings vs RF3", fmt_usd),
)


def daily_table(daily: Sequence[dict[str, Any]]) -> str:
    if not daily:
        return ""
    headers = ["day", *(h for _, h, _ in DAILY_COLUMNS), "savings %"]
    rows = [
        [fmt_day(r.get("dt", ""), with_year=True)]
        + [f(r.get(k)) for k, _, f in DAILY_COLUMNS]
        + [fmt_pct(r.get("savings_fraction"))]
        for r in daily
    ]
    sums = {k: _sum(daily, k) for k, _, _ in DAILY_COLUMNS}
    total = ["total"] + [f(sums[k]) for k, _, f in DAILY_COLUMNS]
    total.append(fmt_pct(_share(sums["savings_usd"], sums["kafka_rf3_usd"])))
    n = len(headers)
    return (
        "<details><summary>Daily figures as a table</summary>"
        f"{table(headers, rows, range(1, n), total)}</details>"
    )


SOURCE_COLUMNS = (
    ("ledger_cross_zone_bytes", "ledger cross-zone bytes", fmt_bytes),
    ("flow_log_cross_zone_bytes", "flow-log cross-zone bytes", fmt_bytes),
    ("cur_billed_bytes", "CUR billed bytes", fmt_bytes),
    ("ledger_inter_az_usd", "ledger inter-AZ cost", fmt_usd),
    ("cur_billed_usd", "CUR billed cost", fmt_usd),
)


def sources_table(sources: Sequence[dict[str, Any]]) -> str:
    if not sources:
        return ""
    cols = [c for c in SOURCE_COLUMNS if any(as_number(r.get(c[0])) is not None for r in sources)]
    with_cur = any(k == "cur_billed_usd" for k, _, _ in cols)
    headers = ["day", *(h for _, h, _ in cols)] + (["CUR \u2212 ledger"] if with_cur else [])

    def diff(cur: Any, ledger: Any) -> str:
        c, lg = as_number(cur), as_number(ledger)
        return fmt_usd(c - lg) if c is not None and lg is not None else "n/a"

    rows = []
    for r in sources:
        row = [fmt_day(r.get("dt", ""), with_year=True)] + [f(r.get(k)) for k, _, f in cols]
        if with_cur:
            row.append(diff(r.get("cur_billed_usd"), r.get("ledger_inter_az_usd")))
        rows.append(row)
    sums = {k: _sum(sources, k) for k, _, _ in cols}
    total = ["total"] + [f(sums[k]) for k, _, f in cols]
    if with_cur:
        total.append(diff(sums["cur_billed_usd"], sums.get("ledger_inter_az_usd")))
    return (
        "<details><summary>Per day as a table</summary>"
        f"{table(headers, rows, range(1, len(headers)), total)}</details>"
    )


def shared_fs_table(fs: dict[str, Any]) -> str:
    if not fs:
        return _empty("no data")
    billed_as = fs.get("billed_as")
    used = Raw('<span class="badge">used in the totals</span>')
    az = fs.get("preferred_az") or "its preferred AZ"
    rows: list[list[object]] = [
        [
            "regional (NFS traffic between zones not billed)",
            fmt_usd(fs.get("regional_usd")),
            used if billed_as == "regional" else "",
        ],
        [
            f"preferred AZ {az} (NFS traffic of nodes in other zones billed)",
            fmt_usd(fs.get("preferred_az_usd")),
            used if billed_as == "preferred-az" else "",
        ],
    ]
    reg, pref = as_number(fs.get("regional_usd")), as_number(fs.get("preferred_az_usd"))
    if reg is not None and pref is not None:
        rows.append(["difference (preferred AZ \u2212 regional)", fmt_usd(pref - reg), ""])
    out = table(["inter-AZ transfer if the file system is billed as", "cost", ""], rows, (1,))
    if "fixed_usd" in fs:
        kind = fs.get("kind") or "shared file system"
        out += (
            f'<p class="note">The file system itself ({esc(kind)}) costs '
            f"{esc(fmt_usd(fs.get('fixed_usd')))} for the period either way.</p>"
        )
    return out


def line_items_table(items: Sequence[dict[str, Any]]) -> str:
    if not items:
        return _empty("no data")
    rows = [
        [
            r.get("item", ""),
            "\u2014" if r.get("quantity") is None else fmt_count(r.get("quantity")),
            r.get("unit") or "",
            fmt_usd(r.get("usd")),
        ]
        for r in items
    ]
    total = ["total", "", "", fmt_usd(_sum(items, "usd"))]
    return table(["item", "quantity", "unit", "cost"], rows, (1, 3), total)


_UNITS = (
    ("_usd_per_1000", "US$ per 1,000 requests"),
    ("_usd_per_gb_month", "US$ per GB-month"),
    ("_usd_per_mbps_month", "US$ per MB/s-month"),
    ("_usd_per_gb_each_side", "US$ per GB, each side"),
    ("_usd_per_gb", "US$ per GB"),
    ("_days", "days"),
    ("_per_month", "per month"),
    ("_per_gb", "bytes"),
    ("_capacity_gb", "GB"),
    ("_wal_gb", "GB"),
    ("_mbps", "MB/s"),
)


def _unit(name: str) -> str:
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), "")


def _price_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.10g}"
    if isinstance(value, str):
        return value or "(empty)"
    return json.dumps(value, default=str)


def prices_table(prices: dict[str, Any]) -> str:
    if not prices:
        return _empty("no prices given")
    rows = [
        [Raw(f"<code>{esc(k)}</code>"), _price_value(v), _unit(str(k))] for k, v in prices.items()
    ]
    return table(["price", "value", "unit"], rows, (1,), cls_name="narrow")


def rejected_table(rejected: Sequence[dict[str, Any]]) -> str:
    if not rejected:
        return _empty("No input was rejected.")
    rows = []
    for r in rejected:
        lines = r.get("lines") or ("" if r.get("line") is None else str(r.get("line")))
        n = as_number(r.get("rows"))
        count = "whole file" if n is not None and n < 0 else fmt_count(n)
        rows.append(
            [
                r.get("source", ""),
                fmt_day(r.get("dt"), with_year=True) if r.get("dt") else "\u2014",
                lines or "\u2014",
                r.get("reason", ""),
                count,
            ]
        )
    return table(["file", "day", "line(s)", "reason", "rows"], rows, (4,))
