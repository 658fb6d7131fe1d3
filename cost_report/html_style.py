"""The report page's stylesheet, inlined into its <head>: system fonts only, print-friendly."""

from __future__ import annotations

from typing import Final

__all__ = ["CSP", "CSS"]

# Nothing may be fetched: no script at all, styles only inline, images only as data: URLs.
CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

CSS: Final = """
:root { --ink: #111827; --muted: #6b7280; --line: #e5e7eb; --bg: #f3f4f6; --card: #ffffff;
  --accent: #1d4ed8; --good: #047857; --bad: #b91c1c; --warn-bg: #fffbeb; --warn: #b45309; }
* { box-sizing: border-box; }
html { background: var(--bg); }
body { margin: 0; color: var(--ink); font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
  Roboto, "Helvetica Neue", Arial, "Liberation Sans", "DejaVu Sans", sans-serif;
  -webkit-print-color-adjust: exact; print-color-adjust: exact; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 20px 40px; }
header.page { display: flex; justify-content: space-between; align-items: flex-end;
  gap: 16px; border-bottom: 3px solid var(--accent); padding-bottom: 12px; margin-bottom: 18px; }
h1 { font-size: 26px; margin: 0; letter-spacing: -0.01em; }
header.page .sub { color: var(--muted); margin-top: 4px; }
header.page .meta { text-align: right; color: var(--muted); font-size: 13px; }
h2 { font-size: 18px; margin: 0 0 4px; }
section.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 18px 20px; margin: 0 0 18px; break-inside: avoid; }
section.card > p.lead { color: var(--muted); margin: 0 0 12px; max-width: 980px; }
.warnings { background: var(--warn-bg); border: 1px solid #f59e0b; border-left: 6px solid
  var(--warn); border-radius: 10px; padding: 14px 20px; margin: 0 0 18px; }
.warnings h2 { color: var(--warn); }
.warnings ul { margin: 6px 0 0; padding-left: 20px; }
.warnings li { margin: 3px 0; overflow-wrap: anywhere; }
.ok-note { color: var(--good); margin: 0 0 18px; font-size: 13px; }
.tiles { display: grid; grid-template-columns: repeat(4, 1fr); gap: 12px; margin: 0 0 12px; }
.tile { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 12px 16px; min-width: 0; }
.tile .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: 0.04em; }
.tile .value { font-size: 26px; font-weight: 650; margin: 2px 0; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; font-variant-numeric: tabular-nums; }
.tile.small .value { font-size: 19px; }
.tile .note { color: var(--muted); font-size: 12.5px; }
.tile.zonefleet { border-top: 4px solid var(--accent); }
.tile.kafka { border-top: 4px solid #9ca3af; }
.tile.savings { border-top: 4px solid var(--good); }
.tile.savings .value { color: var(--good); }
.tile.savings.negative { border-top-color: var(--bad); }
.tile.savings.negative .value { color: var(--bad); }
.good { color: var(--good); } .bad { color: var(--bad); }
svg.chart { display: block; max-width: 100%; height: auto; margin: 6px 0 4px; }
svg.chart text { font-family: inherit; }
table { border-collapse: collapse; width: 100%; font-size: 13px; margin: 8px 0 4px;
  font-variant-numeric: tabular-nums; }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: top; }
th { background: #f9fafb; font-weight: 600; color: #374151; font-size: 12px;
  text-transform: uppercase; letter-spacing: 0.03em; }
td.num, th.num { text-align: right; white-space: nowrap; }
td.text { overflow-wrap: anywhere; word-break: break-word; max-width: 520px; }
tr.total td { font-weight: 650; border-top: 2px solid #9ca3af; }
code { font-family: "DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace;
  font-size: 12.5px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 11.5px;
  background: #dbeafe; color: #1e3a8a; font-weight: 600; white-space: nowrap; }
table.narrow { width: auto; min-width: 60%; }
.note { color: var(--muted); font-size: 12.5px; }
.note.missing { font-style: italic; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; }
.cols > section.card { margin: 0 0 18px; }
details { margin-top: 8px; }
details > summary { cursor: pointer; color: var(--accent); font-size: 13px; }
footer { color: var(--muted); font-size: 12px; margin-top: 24px; }
@media (max-width: 900px) { .tiles { grid-template-columns: repeat(2, 1fr); }
  .cols { grid-template-columns: 1fr; } }
@media print { html { background: #fff; } main { max-width: none; padding: 0; }
  section.card, .tile { border-color: #d1d5db; } details { display: block; } }
"""
