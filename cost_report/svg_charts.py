"""Inline SVG charts for the HTML report, written as strings: no script, no font, no I/O.

Every chart is one ``<svg class="chart" data-chart="<name>">`` with a ``<title>``. Data marks
(bars, points, cells) carry ``class="mark"`` and a ``<title>`` child, which a browser shows as a
tooltip; a chart without data says "no data" instead of drawing empty axes. Every string that
came from data goes through `esc`. Text widths are estimated (there is no font metric here),
so long labels are clipped with an ellipsis and kept whole in the tooltip.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from cost_report.display import as_number

__all__ = [
    "HBarRow",
    "Series",
    "clip",
    "esc",
    "grouped_bars",
    "hbar_chart",
    "nice_ticks",
    "no_data_chart",
    "stacked_bars_with_lines",
    "svg_open",
]

WIDTH: Final = 1160
FONT: Final = 12
AXIS: Final = "#6b7280"
GRID: Final = "#e5e7eb"
INK: Final = "#111827"
MUTED: Final = "#6b7280"

Fmt = Callable[[float], str]


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def clip(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, with an ellipsis when cut."""
    return text if len(text) <= max_chars else text[: max(1, max_chars - 1)] + "\u2026"


def text_width(text: str, size: float = FONT) -> float:
    return len(text) * size * 0.56


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def num(value: object) -> float:
    """A drawable number: None and non-finite values count as 0."""
    n = as_number(value)
    return 0.0 if n is None else n


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    color: str
    dashed: bool = False


def svg_open(name: str, title: str, width: float, height: float) -> str:
    return (
        f'<svg class="chart" data-chart="{esc(name)}" viewBox="0 0 {_n(width)} {_n(height)}" '
        f'width="{_n(width)}" height="{_n(height)}" role="img" '
        f'aria-labelledby="chart-{esc(name)}-title">'
        f'<title id="chart-{esc(name)}-title">{esc(title)}</title>'
    )


def no_data_chart(name: str, title: str, message: str = "no data", height: float = 90) -> str:
    return (
        svg_open(name, title, WIDTH, height)
        + f'<rect x="0.5" y="0.5" width="{WIDTH - 1}" height="{_n(height - 1)}" fill="#f9fafb" '
        f'stroke="{GRID}" stroke-dasharray="4 4"/>'
        f'<text class="no-data" x="{WIDTH / 2}" y="{_n(height / 2 + 5)}" text-anchor="middle" '
        f'font-size="15" fill="{MUTED}">{esc(message)}</text></svg>'
    )


def nice_ticks(vmax: float, count: int = 5) -> list[float]:
    """Ticks from 0 up to a round number at or above `vmax` (1 when there is nothing)."""
    if not vmax > 0 or not math.isfinite(vmax):
        vmax = 1.0
    raw = vmax / count
    mag = 10 ** math.floor(math.log10(raw))
    step = mag * 10
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw * (1 - 1e-9):
            step = m * mag
            break
    n = math.ceil(vmax / step - 1e-9)
    return [i * step for i in range(n + 1)]


def text(x: float, y: float, label: str, **attrs: object) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in attrs.items())
    return f'<text x="{_n(x)}" y="{_n(y)}"{extra}>{esc(label)}</text>'


def legend(
    x: float, y: float, items: Sequence[tuple[str, str, str]], notes: Sequence[str] = ()
) -> str:
    """One row of keys: (label, color, kind) with kind "box", "line" or "dash"."""
    out = []
    for label, color, kind in items:
        if kind == "box":
            out.append(
                f'<rect x="{_n(x)}" y="{_n(y - 10)}" width="12" height="12" rx="2" fill="{color}"/>'
            )
        else:
            dash = ' stroke-dasharray="6 4"' if kind == "dash" else ""
            out.append(
                f'<line x1="{_n(x)}" y1="{_n(y - 4)}" x2="{_n(x + 18)}" y2="{_n(y - 4)}" '
                f'stroke="{color}" stroke-width="2.5"{dash}/>'
                f'<circle cx="{_n(x + 9)}" cy="{_n(y - 4)}" r="3" fill="{color}"/>'
            )
        x += 24 if kind == "box" else 26
        out.append(text(x - 4 if kind == "box" else x - 2, y, label, font_size=FONT, fill=INK))
        x += text_width(label) + 20
    for note in notes:
        out.append(text(x, y, note, font_size=FONT, fill=MUTED, font_style="italic"))
        x += text_width(note) + 20
    return "".join(out)


@dataclass(frozen=True)
class _Frame:
    """The plot area of a chart with days (or any bands) along x and a value along y."""

    left: float
    top: float
    width: float
    height: float
    ticks: list[float]
    bands: int

    @property
    def band(self) -> float:
        return self.width / max(1, self.bands)

    def y(self, value: float) -> float:
        top = self.ticks[-1] or 1.0
        return self.top + self.height * (1 - max(0.0, min(value, top)) / top)

    def cx(self, i: int) -> float:
        return self.left + self.band * (i + 0.5)


def _axes(f: _Frame, labels: Sequence[str], y_fmt: Fmt, y_title: str) -> str:
    out = []
    for t in f.ticks:
        y = f.y(t)
        out.append(
            f'<line x1="{_n(f.left)}" y1="{_n(y)}" x2="{_n(f.left + f.width)}" y2="{_n(y)}" '
            f'stroke="{GRID}"/>'
        )
        out.append(text(f.left - 8, y + 4, y_fmt(t), font_size=11, fill=MUTED, text_anchor="end"))
    base = f.top + f.height
    out.append(
        f'<line x1="{_n(f.left)}" y1="{_n(base)}" x2="{_n(f.left + f.width)}" y2="{_n(base)}" '
        f'stroke="{AXIS}"/>'
    )
    every = max(1, math.ceil(58 / f.band))
    for i, label in enumerate(labels):
        if i % every == 0:
            out.append(
                f'<line x1="{_n(f.cx(i))}" y1="{_n(base)}" x2="{_n(f.cx(i))}" '
                f'y2="{_n(base + 4)}" stroke="{AXIS}"/>'
            )
            out.append(
                text(
                    f.cx(i),
                    base + 18,
                    clip(label, 12),
                    font_size=11,
                    fill=MUTED,
                    text_anchor="middle",
                )
            )
    mid = f.top + f.height / 2
    out.append(
        f'<text x="16" y="{_n(mid)}" transform="rotate(-90 16 {_n(mid)})" text-anchor="middle" '
        f'font-size="{FONT}" fill="{INK}">{esc(y_title)}</text>'
    )
    return "".join(out)


def stacked_bars_with_lines(
    name: str,
    title: str,
    labels: Sequence[str],
    stacks: Sequence[Series],
    lines: Sequence[Series],
    y_fmt: Fmt,
    y_title: str,
    tip_fmt: Fmt,
    height: float = 400,
) -> str:
    """One stacked bar per label (the `stacks`, bottom up) and the `lines` drawn across them."""
    if not labels:
        return no_data_chart(name, title)
    totals = [sum(num(s.values[i]) for s in stacks) for i in range(len(labels))]
    peak = max([*totals, *(num(v) for s in lines for v in s.values), 0.0])
    f = _Frame(78, 44, WIDTH - 100, height - 44 - 44, nice_ticks(peak), len(labels))
    out = [svg_open(name, title, WIDTH, height), _axes(f, labels, y_fmt, y_title)]
    keys = [(s.name, s.color, "box") for s in stacks]
    keys += [(s.name, s.color, "dash" if s.dashed else "line") for s in lines]
    out.append(legend(f.left, 20, keys))
    bar = max(1.0, min(f.band * 0.62, 48))
    for i, label in enumerate(labels):
        bottom = 0.0
        for s in stacks:
            v = num(s.values[i])
            if v <= 0:
                continue
            y0, y1 = f.y(bottom), f.y(bottom + v)
            out.append(
                f'<rect class="mark" x="{_n(f.cx(i) - bar / 2)}" y="{_n(y1)}" '
                f'width="{_n(bar)}" height="{_n(max(y0 - y1, 0.5))}" fill="{s.color}">'
                f"<title>{esc(label)}: {esc(s.name)} {esc(tip_fmt(v))}</title></rect>"
            )
            bottom += v
    for s in lines:
        pts = [(f.cx(i), f.y(num(v)), v) for i, v in enumerate(s.values) if v is not None]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        if len(pts) > 1:
            path = " ".join(f"{_n(x)},{_n(y)}" for x, y, _ in pts)
            out.append(
                f'<polyline class="mark" points="{path}" fill="none" stroke="{s.color}" '
                f'stroke-width="2.5" stroke-linejoin="round"{dash}/>'
            )
        r = 3.5 if f.band >= 12 else 2
        for (x, y, v), label in zip(pts, labels, strict=False):
            out.append(
                f'<circle class="mark" cx="{_n(x)}" cy="{_n(y)}" r="{r}" fill="{s.color}">'
                f"<title>{esc(label)}: {esc(s.name)} {esc(tip_fmt(num(v)))}</title></circle>"
            )
    out.append("</svg>")
    return "".join(out)


def grouped_bars(
    name: str,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    y_fmt: Fmt,
    y_title: str,
    tip_fmt: Fmt,
    notes: Sequence[str] = (),
    height: float = 340,
) -> str:
    """Side-by-side bars per label, one per series; a missing value leaves a gap."""
    if not labels or not series:
        return no_data_chart(name, title)
    peak = max([0.0, *(num(v) for s in series for v in s.values)])
    f = _Frame(78, 44, WIDTH - 100, height - 44 - 44, nice_ticks(peak), len(labels))
    out = [svg_open(name, title, WIDTH, height), _axes(f, labels, y_fmt, y_title)]
    out.append(legend(f.left, 20, [(s.name, s.color, "box") for s in series], notes))
    bar = max(0.5, min(f.band * 0.8 / len(series), 40.0))
    group = bar * len(series)
    for i, label in enumerate(labels):
        x0 = f.cx(i) - group / 2
        for k, s in enumerate(series):
            v = s.values[i]
            if v is None:
                continue
            y = f.y(num(v))
            out.append(
                f'<rect class="mark" x="{_n(x0 + k * bar)}" y="{_n(y)}" '
                f'width="{_n(max(bar - 1, 0.5))}" height="{_n(f.top + f.height - y)}" '
                f'fill="{s.color}"><title>{esc(label)}: {esc(s.name)} {esc(tip_fmt(num(v)))}'
                "</title></rect>"
            )
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class HBarRow:
    label: str
    usd: float
    bytes: float
    cross_zone_bytes: float


def hbar_chart(
    name: str,
    title: str,
    rows: Sequence[HBarRow],
    usd_fmt: Fmt,
    bytes_fmt: Fmt,
    colors: tuple[str, str, str] = ("#2563eb", "#cbd5e1", "#ea580c"),
) -> str:
    """Two panels per row: its cost, and its bytes with the cross-zone part drawn over them."""
    if not rows:
        return no_data_chart(name, title)
    row_h, top, label_w = 28.0, 56.0, 250.0
    height = top + row_h * len(rows) + 16
    cost_x, cost_w = label_w + 10, 300.0
    bytes_x = cost_x + cost_w + 110
    bytes_w = WIDTH - bytes_x - 200
    usd_max = max([0.0, *(num(r.usd) for r in rows)]) or 1.0
    bytes_max = max([0.0, *(num(r.bytes) for r in rows)]) or 1.0
    cost_c, bytes_c, cross_c = colors
    out = [svg_open(name, title, WIDTH, height)]
    out.append(text(cost_x, 18, "Cost (US dollars)", font_size=FONT, font_weight="600", fill=INK))
    out.append(text(bytes_x, 18, "Bytes", font_size=FONT, font_weight="600", fill=INK))
    out.append(
        legend(bytes_x + 50, 18, [("all bytes", bytes_c, "box"), ("cross-zone", cross_c, "box")])
    )
    for x in (cost_x, bytes_x):
        out.append(
            f'<line x1="{_n(x)}" y1="{_n(top - 10)}" x2="{_n(x)}" '
            f'y2="{_n(height - 12)}" stroke="{AXIS}"/>'
        )
    max_chars = int((label_w - 10) / (FONT * 0.62))
    for i, r in enumerate(rows):
        y = top + i * row_h
        mid = y + row_h / 2
        label = r.label or "(none)"
        out.append(
            f'<text x="{_n(label_w)}" y="{_n(mid + 4)}" text-anchor="end" font-size="{FONT}" '
            f'fill="{INK}"><title>{esc(label)}</title>{esc(clip(label, max_chars))}</text>'
        )
        usd, total, cross = num(r.usd), num(r.bytes), num(r.cross_zone_bytes)
        w = cost_w * max(usd, 0) / usd_max
        out.append(
            f'<rect class="mark" x="{_n(cost_x)}" y="{_n(y + 5)}" width="{_n(w)}" '
            f'height="{_n(row_h - 10)}" rx="2" fill="{cost_c}">'
            f"<title>{esc(label)}: {esc(usd_fmt(usd))}</title></rect>"
        )
        out.append(_bar_value(cost_x, w, cost_w + 100, mid + 4, usd_fmt(usd), "#ffffff"))
        wb = bytes_w * max(total, 0) / bytes_max
        wc = bytes_w * min(max(cross, 0), max(total, 0)) / bytes_max
        tip = f"{label}: {bytes_fmt(total)}, of which cross-zone {bytes_fmt(cross)}"
        out.append(
            f'<rect class="mark" x="{_n(bytes_x)}" y="{_n(y + 5)}" width="{_n(wb)}" '
            f'height="{_n(row_h - 10)}" rx="2" fill="{bytes_c}"><title>{esc(tip)}</title></rect>'
        )
        if wc > 0:
            out.append(
                f'<rect class="mark" x="{_n(bytes_x)}" y="{_n(y + 5)}" width="{_n(max(wc, 1))}" '
                f'height="{_n(row_h - 10)}" rx="2" fill="{cross_c}"><title>{esc(tip)}</title>'
                "</rect>"
            )
        value = bytes_fmt(total) + (f" ({bytes_fmt(cross)} cross-zone)" if cross > 0 else "")
        out.append(_bar_value(bytes_x, wb, WIDTH - bytes_x, mid + 4, value, INK))
    out.append("</svg>")
    return "".join(out)


def _bar_value(x: float, w: float, room: float, y: float, label: str, inside: str) -> str:
    """A bar's value right of its end, or inside it (in colour `inside`) when it would run out
    of `room`."""
    tw = text_width(label)
    if w + 6 + tw > room and w > tw + 12:
        return text(x + w - 6, y, label, font_size=FONT, fill=inside, text_anchor="end")
    return text(x + w + 6, y, label, font_size=FONT, fill=INK)
