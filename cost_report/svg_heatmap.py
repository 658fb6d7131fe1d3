"""The zone-to-zone matrix as an inline SVG heatmap: sending zone rows, receiving zone columns.

Three colour ramps keep the kinds of traffic apart at a glance: cross-zone cells (the billed
ones) in orange, traffic within one zone in blue, and traffic with a pseudo zone (`regional`,
`unknown`) in grey. Shade is bytes on a log scale between the smallest and the largest cell,
because one zone's own traffic is often a thousand times its cross-zone traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cost_report.svg_charts import (
    FONT,
    GRID,
    INK,
    MUTED,
    WIDTH,
    Fmt,
    clip,
    esc,
    no_data_chart,
    num,
    svg_open,
    text,
)

__all__ = ["PSEUDO_ZONES", "ZoneCell", "zone_heatmap", "zone_order"]

PSEUDO_ZONES: Final = ("regional", "unknown")
RAMPS: Final = {
    "cross": ("#fff1e6", "#c2410c"),
    "same": ("#eff6ff", "#1d4ed8"),
    "pseudo": ("#f3f4f6", "#4b5563"),
}
KIND_LABELS: Final = {
    "cross": "cross-zone (billed)",
    "same": "within one zone",
    "pseudo": "regional / unknown zone",
}


@dataclass(frozen=True)
class ZoneCell:
    from_zone: str
    to_zone: str
    bytes: float
    cross_zone: bool


def zone_order(cells: Sequence[ZoneCell]) -> list[str]:
    """Real zones by name, then the pseudo zones in a fixed order."""
    names = {c.from_zone for c in cells} | {c.to_zone for c in cells}
    real = sorted(n for n in names if n not in PSEUDO_ZONES)
    return real + [p for p in PSEUDO_ZONES if p in names]


def _kind(c: ZoneCell) -> str:
    if c.cross_zone:
        return "cross"
    if c.from_zone == c.to_zone and c.from_zone not in PSEUDO_ZONES:
        return "same"
    return "pseudo"


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i : i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def _shade(value: float, lo: float, hi: float) -> float:
    """0.18 .. 1 on a log scale between the smallest and the largest non-zero cell."""
    if value <= 0:
        return 0.0
    if hi <= lo:
        return 0.7
    return 0.18 + 0.82 * (math.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))


def zone_heatmap(name: str, title: str, cells: Sequence[ZoneCell], bytes_fmt: Fmt) -> str:
    merged: dict[tuple[str, str], ZoneCell] = {}
    for cell in cells:
        old = merged.get((cell.from_zone, cell.to_zone))
        if old is not None:
            total = num(old.bytes) + num(cell.bytes)
            cell = ZoneCell(cell.from_zone, cell.to_zone, total, cell.cross_zone)
        merged[(cell.from_zone, cell.to_zone)] = cell
    if not merged:
        return no_data_chart(name, title)
    zones = zone_order(list(merged.values()))
    n = len(zones)
    left, top, legend_w = 170.0, 78.0, 300.0
    cell_w = max(28.0, min(130.0, (WIDTH - left - legend_w - 20) / n))
    cell_h = 46.0 if n <= 8 else max(20.0, min(46.0, 560 / n))
    height = max(top + cell_h * n + 24, 250.0)
    positive = [num(c.bytes) for c in merged.values() if num(c.bytes) > 0]
    lo, hi = (min(positive), max(positive)) if positive else (0.0, 0.0)
    out = [svg_open(name, title, WIDTH, height)]
    grid_w = cell_w * n
    out.append(
        text(
            left + grid_w / 2,
            34,
            "to zone (receiving) \u2192",
            font_size=FONT,
            font_weight="600",
            fill=INK,
            text_anchor="middle",
        )
    )
    out.append(
        text(
            left - 10,
            top - 10,
            "from zone (sending) \u2193",
            font_size=FONT,
            font_weight="600",
            fill=INK,
            text_anchor="end",
        )
    )
    label_chars = int((left - 14) / (FONT * 0.62))
    col_chars = max(3, int((cell_w - 6) / (11 * 0.62)))
    for j, z in enumerate(zones):
        style = "italic" if z in PSEUDO_ZONES else "normal"
        out.append(
            f'<text x="{left + cell_w * (j + 0.5):.1f}" y="{top - 10:.1f}" text-anchor="middle" '
            f'font-size="11" font-style="{style}" fill="{INK}"><title>{esc(z)}</title>'
            f"{esc(clip(z, col_chars))}</text>"
        )
    for i, z in enumerate(zones):
        style = "italic" if z in PSEUDO_ZONES else "normal"
        y = top + cell_h * i
        out.append(
            f'<text x="{left - 10:.1f}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end" '
            f'font-size="{FONT}" font-style="{style}" fill="{INK}"><title>{esc(z)}</title>'
            f"{esc(clip(z, label_chars))}</text>"
        )
        for j, to in enumerate(zones):
            x = left + cell_w * j
            c = merged.get((z, to))
            geom = f'x="{x + 1:.1f}" y="{y + 1:.1f}" width="{cell_w - 2:.1f}" '
            geom += f'height="{cell_h - 2:.1f}"'
            if c is None:
                out.append(f'<rect {geom} fill="#ffffff" stroke="{GRID}" stroke-dasharray="3 3"/>')
                continue
            kind = _kind(c)
            b = num(c.bytes)
            t = _shade(b, lo, hi)
            light, dark = RAMPS[kind]
            tip = f"{z} \u2192 {to}: {bytes_fmt(b)} ({KIND_LABELS[kind]})"
            stroke = ' stroke="#9a3412" stroke-width="1.5"' if kind == "cross" else ""
            out.append(
                f'<rect class="mark" data-kind="{kind}" {geom} rx="3" '
                f'fill="{_mix(light, dark, t)}"{stroke}><title>{esc(tip)}</title></rect>'
            )
            if cell_w >= 60 and cell_h >= 24:
                ink = "#ffffff" if t > 0.55 else INK
                out.append(
                    text(
                        x + cell_w / 2,
                        y + cell_h / 2 + 4,
                        bytes_fmt(b),
                        font_size=11,
                        fill=ink,
                        text_anchor="middle",
                    )
                )
    out.append(_legend(left + grid_w + 40, top, lo, hi, bytes_fmt))
    out.append("</svg>")
    return "".join(out)


def _legend(x: float, y: float, lo: float, hi: float, bytes_fmt: Fmt) -> str:
    out = []
    for kind, label in KIND_LABELS.items():
        light, dark = RAMPS[kind]
        for k in range(5):
            stroke = ' stroke="#9a3412"' if kind == "cross" else ""
            out.append(
                f'<rect x="{x + k * 16:.1f}" y="{y - 10:.1f}" width="14" height="14" rx="2" '
                f'fill="{_mix(light, dark, 0.18 + 0.82 * k / 4)}"{stroke}/>'
            )
        out.append(text(x + 90, y + 1, label, font_size=FONT, fill=INK))
        y += 24
    out.append(
        f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="14" height="14" fill="#ffffff" '
        f'stroke="{GRID}" stroke-dasharray="3 3"/>'
    )
    out.append(text(x + 90, y + 1, "no traffic", font_size=FONT, fill=INK))
    y += 30
    out.append(text(x, y, "darker = more bytes (log scale)", font_size=11, fill=MUTED))
    if hi > 0:
        out.append(text(x, y + 16, f"{bytes_fmt(lo)} .. {bytes_fmt(hi)}", font_size=11, fill=MUTED))
    return "".join(out)
