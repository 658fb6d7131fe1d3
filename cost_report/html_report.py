"""`render_html`: the report as one self-contained HTML page, rendered from a `ReportModel`.

The page fetches nothing: no script, no web font, no stylesheet or image URL. Charts are inline
SVG drawn here (svg_charts, svg_heatmap), styles are inline, and a Content-Security-Policy
forbids any fetch should a later change slip one in. Every string that came from data (topic
names, zones, file names, warnings) is escaped. Missing or odd figures print as "n/a" instead
of failing, so a report with no rows, one day or a zero bill still renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from cost_report.display import (
    as_number,
    fmt_bytes,
    fmt_bytes_short,
    fmt_count,
    fmt_day,
    fmt_pct,
    fmt_period,
    fmt_usd,
    fmt_usd_short,
)
from cost_report.html_sections import (
    daily_table,
    line_items_table,
    prices_table,
    rejected_table,
    shared_fs_table,
    sources_table,
    table,
)
from cost_report.html_style import CSP, CSS
from cost_report.model import ReportModel
from cost_report.svg_charts import (
    HBarRow,
    Series,
    esc,
    grouped_bars,
    hbar_chart,
    stacked_bars_with_lines,
)
from cost_report.svg_heatmap import ZoneCell, zone_heatmap

__all__ = ["CHART_NAMES", "TOP_ROWS", "render_html", "top_rows"]

CHART_NAMES: Final = ("daily_cost", "cost_by_channel", "top_topics", "zone_matrix", "sources")
DOT: Final = " \u00b7 "
TOP_ROWS: Final = 12  # bars in the topic and channel charts; the rest are summed as "other"
COST_PARTS: Final = (
    ("inter_az_usd", "inter-AZ transfer", "#ea580c"),
    ("s3_requests_usd", "S3 requests", "#2563eb"),
    ("s3_storage_usd", "S3 storage", "#14b8a6"),
    ("shared_fs_usd", "shared file system", "#a855f7"),
)
KAFKA_LINES: Final = (
    ("kafka_rf3_usd", "Kafka RF3", "#111827", False),
    ("kafka_rf3_fetch_from_follower_usd", "Kafka RF3 + fetch from follower", "#6b7280", True),
)
SOURCES: Final = (
    ("ledger_cross_zone_bytes", "ledger (zonefleet's accounting)", "#2563eb", "ledger"),
    ("flow_log_cross_zone_bytes", "VPC flow logs", "#14b8a6", "flow logs"),
    ("cur_billed_bytes", "CUR (AWS bill)", "#ea580c", "CUR"),
)


def render_html(model: ReportModel) -> str:
    days = [str(r.get("dt", "")) for r in model.daily]
    title = f"zonefleet cost report {model.period_from} to {model.period_to}"
    body = [
        _header(model),
        _warnings(model.warnings),
        _headline(model),
        _card(
            "Daily cost: zonefleet against classic Kafka",
            "Bars: zonefleet's cost per day, by component. Lines: what classic Kafka (three "
            "replicas across three AZs) would cost for the same client traffic, priced from "
            "the same price sheet.",
            _daily_chart(model, days) + daily_table(model.daily),
        ),
        _card(
            "Cost by channel",
            "Each channel's share of the bill (inter-AZ transfer and S3 requests) and its "
            "bytes; the orange part crossed an AZ boundary.",
            _bars_chart("cost_by_channel", "Cost by channel", model.by_channel, "channel")
            + _details("Channels as a table", _bars_table(model.by_channel, "channel")),
        ),
        _card(
            "Cost by topic",
            f"The topics that cost the most (up to {TOP_ROWS - 1}; the rest are summed as "
            "other). Names are cut short in the chart; the table has them whole.",
            _bars_chart("top_topics", "Cost by top topics", model.top_topics, "topic")
            + _details("Topics as a table", _bars_table(model.top_topics, "topic")),
        ),
        _card(
            "Zone-to-zone traffic",
            "Bytes sent from each zone (rows) to each zone (columns) over the period. Orange "
            "cells crossed an AZ boundary and are billed as inter-AZ transfer; blue stayed "
            "inside one zone; grey involves the regional file system or an unknown zone.",
            _zone_chart(model.zone_matrix),
        ),
        _card(
            "Cross-zone bytes by source",
            "zonefleet's own ledger against AWS's VPC flow logs and the Cost and Usage Report "
            "(CUR), per day. A source that was not given is left out.",
            _sources_chart(model.sources) + sources_table(model.sources),
        ),
        '<div class="cols">',
        _card(
            "The shared file system's bill, both ways",
            "NFS traffic between zones is free when the file system is regional, and billed "
            "as inter-AZ transfer for every node outside its preferred AZ otherwise.",
            shared_fs_table(model.shared_fs),
        ),
        _card("Line items", "zonefleet's cost for the period.", line_items_table(model.line_items)),
        "</div>",
        _card("Prices used", "Every rate this report multiplied by.", prices_table(model.prices)),
        _card(
            "Rejected input",
            "Ledger rows and files that were not counted, with the reason.",
            rejected_table(model.rejected),
        ),
        "<footer><p>Generated by <code>zonefleet cost-report</code>. On this page 1 GB is "
        "10<sup>9</sup> bytes and 1 TB is 10<sup>12</sup>; AWS bills by "
        "<code>bytes_per_gb</code> (see the prices). This file is self-contained: it loads "
        "nothing from the network.</p></footer>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _card(heading: str, lead: str, content: str) -> str:
    return (
        f'<section class="card"><h2>{esc(heading)}</h2>'
        f'<p class="lead">{esc(lead)}</p>{content}</section>'
    )


def _details(summary: str, content: str) -> str:
    if not content:
        return ""
    return f"<details><summary>{esc(summary)}</summary>{content}</details>"


def _period(model: ReportModel) -> tuple[str, str]:
    if not model.period_from and not model.period_to:
        return "no data", ""
    n = len(model.daily)
    days = f"{n} day{'' if n == 1 else 's'} with ledger rows"
    return fmt_period(model.period_from, model.period_to), days


def _header(model: ReportModel) -> str:
    period, days = _period(model)
    region = model.prices.get("region", "")
    fs = model.shared_fs
    fs_text = ""
    if fs.get("kind") or fs.get("billed_as"):
        fs_text = f"shared file system: {fs.get('kind', 'n/a')}, billed as {fs.get('billed_as')}"
    meta = "<br>".join(esc(x) for x in (f"region {region}" if region else "", fs_text) if x)
    return (
        '<header class="page"><div><h1>zonefleet cost report</h1>'
        f'<div class="sub">{esc(period)}{DOT + esc(days) if days else ""}</div></div>'
        f'<div class="meta">{meta}</div></header>'
    )


def _warnings(warnings: Sequence[str]) -> str:
    if not warnings:
        return '<p class="ok-note">No warnings.</p>'
    items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
    n = len(warnings)
    return (
        f'<section class="warnings" role="alert"><h2>\u26a0 {n} warning{"s" * (n != 1)}: '
        f"read these before the figures</h2><ul>{items}</ul></section>"
    )


def _tile(label: str, value: str, note: str = "", cls: str = "") -> str:
    return (
        f'<div class="tile {cls}"><div class="label">{esc(label)}</div>'
        f'<div class="value" title="{esc(value)}">{esc(value)}</div>'
        f'<div class="note">{note}</div></div>'
    )


def _savings_note(amount: Any, fraction: Any) -> str:
    a = as_number(amount)
    if a is None or (a == 0 and as_number(fraction) is None):
        return "n/a: nothing to compare"
    if a < 0:
        return f'<span class="bad">zonefleet costs {esc(fmt_usd(-a))} more</span>'
    return f'<span class="good">saves {esc(fmt_usd(a))} ({esc(fmt_pct(fraction))})</span>'


def _savings_detail(best: float | None, fraction: Any, against_ffr: Any) -> str:
    f = as_number(fraction)
    if best is None or f is None:
        return "n/a: nothing to compare"
    if best < 0:
        # A fixed cost (the file system) against little traffic: a ratio would say nothing.
        if -f > 10:
            return esc(f"zonefleet's bill is {1 - f:,.0f}x Kafka's at this traffic")
        return esc(f"zonefleet's bill is {fmt_pct(-f)} above Kafka's")
    return esc(f"{fmt_pct(f)} of Kafka's bill; {fmt_usd(against_ffr)} against fetch from follower")


def _headline(model: ReportModel) -> str:
    t = model.totals
    cf = t.get("counterfactual_usd") or {}
    sv = t.get("savings_usd") or {}
    fr = t.get("savings_fraction") or {}
    best = as_number(sv.get("kafka_rf3"))
    period, days = _period(model)
    rejected = t.get("rejected_rows")
    big = [
        _tile("zonefleet cost", fmt_usd(t.get("zonefleet_usd")), "for the period", "zonefleet"),
        _tile(
            "Kafka RF3 (counterfactual)",
            fmt_usd(cf.get("kafka_rf3")),
            _savings_note(sv.get("kafka_rf3"), fr.get("kafka_rf3")),
            "kafka",
        ),
        _tile(
            "Kafka RF3 + fetch from follower",
            fmt_usd(cf.get("kafka_rf3_fetch_from_follower")),
            _savings_note(
                sv.get("kafka_rf3_fetch_from_follower"), fr.get("kafka_rf3_fetch_from_follower")
            ),
            "kafka",
        ),
        _tile(
            "Savings against Kafka RF3",
            fmt_usd(best),
            _savings_detail(best, fr.get("kafka_rf3"), sv.get("kafka_rf3_fetch_from_follower")),
            "savings negative" if best is not None and best < 0 else "savings",
        ),
    ]
    small = [
        _tile("Period", period, esc(days), "small"),
        _tile(
            "Cross-zone bytes",
            fmt_bytes(t.get("cross_zone_bytes")),
            esc(f"of {fmt_bytes(t.get('total_bytes'))} booked in all"),
            "small",
        ),
        _tile(
            "Cross-zone share of payload",
            fmt_pct(t.get("cross_zone_share_of_payload"), 2),
            esc(f"cross-zone bytes / {fmt_bytes(t.get('payload_bytes'))} of client payload"),
            "small",
        ),
        _tile(
            "Rejected input rows",
            fmt_count(rejected) if rejected is not None else "n/a",
            "see the table at the end" if rejected else "",
            "small",
        ),
    ]
    return f'<div class="tiles">{"".join(big)}</div><div class="tiles">{"".join(small)}</div>'


def _daily_chart(model: ReportModel, days: list[str]) -> str:
    labels = [fmt_day(d) for d in days]
    stacks = [
        Series(name, [as_number(r.get(key)) for r in model.daily], color)
        for key, name, color in COST_PARTS
    ]
    lines = [
        Series(name, [as_number(r.get(key)) for r in model.daily], color, dashed)
        for key, name, color, dashed in KAFKA_LINES
    ]
    return stacked_bars_with_lines(
        "daily_cost",
        "Daily cost of zonefleet (stacked bars) against classic Kafka (lines)",
        labels,
        stacks,
        lines,
        fmt_usd_short,
        "US dollars per day",
        fmt_usd,
    )


def top_rows(rows: Sequence[dict[str, Any]], key: str, limit: int = TOP_ROWS) -> list[HBarRow]:
    """The first `limit - 1` rows as given, and every other row summed into one "other" row
    (rows the job already summed as "(other ...)" go there too)."""
    named = [r for r in rows if not str(r.get(key, "")).startswith("(other")]
    rest = [r for r in rows if str(r.get(key, "")).startswith("(other")]
    if len(named) > limit:
        named, rest = named[: limit - 1], named[limit - 1 :] + rest
    out = [
        HBarRow(
            str(r.get(key, "")), *(_num(r.get(k)) for k in ("usd", "bytes", "cross_zone_bytes"))
        )
        for r in named
    ]
    if rest:
        label = str(rest[0].get(key)) if len(rest) == 1 else f"(other: {len(rest)} rows)"
        sums = [sum(_num(r.get(k)) for r in rest) for k in ("usd", "bytes", "cross_zone_bytes")]
        out.append(HBarRow(label, *sums))
    return out


def _num(value: Any) -> float:
    n = as_number(value)
    return 0.0 if n is None else n


def _bars_chart(name: str, title: str, rows: Sequence[dict[str, Any]], key: str) -> str:
    return hbar_chart(name, title, top_rows(rows, key), fmt_usd, fmt_bytes)


def _bars_table(rows: Sequence[dict[str, Any]], key: str) -> str:
    if not rows:
        return ""
    body = [
        [
            r.get(key, ""),
            fmt_usd(r.get("usd")),
            fmt_bytes(r.get("bytes")),
            fmt_bytes(r.get("cross_zone_bytes")),
        ]
        for r in rows
    ]
    return table([key, "cost", "bytes", "cross-zone bytes"], body, numeric=(1, 2, 3))


def _zone_chart(rows: Sequence[dict[str, Any]]) -> str:
    cells = [
        ZoneCell(
            str(r.get("from_zone", "")),
            str(r.get("to_zone", "")),
            _num(r.get("bytes")),
            bool(r.get("cross_zone")),
        )
        for r in rows
    ]
    return zone_heatmap("zone_matrix", "Bytes from zone to zone", cells, fmt_bytes)


def _sources_chart(rows: Sequence[dict[str, Any]]) -> str:
    series, notes = [], []
    for key, name, color, short in SOURCES:
        values = [as_number(r.get(key)) for r in rows]
        if any(v is not None for v in values):
            series.append(Series(name, values, color))
        else:
            notes.append(f"{short}: not given")
    chart = grouped_bars(
        "sources",
        "Cross-zone bytes per day: ledger, flow logs and CUR",
        [fmt_day(r.get("dt", "")) for r in rows],
        series,
        fmt_bytes_short,
        "cross-zone bytes per day",
        fmt_bytes,
        notes,
    )
    return chart
