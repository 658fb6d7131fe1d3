"""How the HTML report writes numbers: bytes in decimal units, dollars with cents, percentages.

Pure functions. Every one accepts None (and NaN or infinity, which a bad input could produce)
and writes "n/a" rather than raising, so one odd figure never takes the whole page down.
Bytes are decimal (1 GB = 10^9 bytes), as on the job's stdout summary; AWS bills per
`bytes_per_gb` (2^30), which the price table shows.
"""

from __future__ import annotations

import math
from datetime import date
from typing import Any, Final

__all__ = [
    "NA",
    "as_number",
    "fmt_bytes",
    "fmt_bytes_short",
    "fmt_count",
    "fmt_day",
    "fmt_pct",
    "fmt_period",
    "fmt_usd",
    "fmt_usd_short",
]

NA: Final = "n/a"
_BYTE_UNITS: Final = ("B", "KB", "MB", "GB", "TB", "PB", "EB")


def as_number(value: Any) -> float | None:
    """A finite float, or None for None, NaN, infinity and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _scaled(n: float, units: tuple[str, ...]) -> tuple[float, str]:
    for unit in units[:-1]:
        if abs(n) < 1000:
            return n, unit
        n /= 1000
    return n, units[-1]


def fmt_bytes(value: Any) -> str:
    """'512 B', '1.50 GB', '12.3 TB': three significant figures past a kilobyte."""
    n = as_number(value)
    if n is None:
        return NA
    x, unit = _scaled(n, _BYTE_UNITS)
    if unit == "B":
        return f"{int(n):,} B"
    digits = 2 if abs(x) < 10 else 1 if abs(x) < 100 else 0
    return f"{x:,.{digits}f} {unit}"


def fmt_bytes_short(value: Any) -> str:
    """An axis tick: '0', '500 MB', '1.5 TB'."""
    n = as_number(value)
    if n is None:
        return NA
    if n == 0:
        return "0"
    x, unit = _scaled(n, _BYTE_UNITS)
    return f"{_trim(x)} {unit}"


def fmt_usd(value: Any) -> str:
    """'$1,234.56'; a non-zero amount under half a cent is '<$0.01', not '$0.00'."""
    n = as_number(value)
    if n is None:
        return NA
    sign = "-" if n < 0 else ""
    a = abs(n)
    if 0 < a < 0.005:
        return f"{sign}<$0.01"
    return f"{sign}${a:,.2f}"


def fmt_usd_short(value: Any) -> str:
    """An axis tick: '$0', '$250', '$1.5k', '$2M'."""
    n = as_number(value)
    if n is None:
        return NA
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a < 1000:
        return f"{sign}${_trim(a)}"
    x, unit = _scaled(a, ("", "k", "M", "B", "T"))
    return f"{sign}${_trim(x)}{unit}"


def _trim(x: float) -> str:
    """A tick value without needless zeros: 1.5, 2, 0.25, 1,200."""
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    text = f"{x:,.2f}".rstrip("0").rstrip(".")
    return text


def fmt_pct(value: Any, digits: int = 1) -> str:
    """'37.5%' of a fraction; None (a share of nothing) is 'n/a'."""
    n = as_number(value)
    if n is None:
        return NA
    return f"{n * 100:,.{digits}f}%"


def fmt_count(value: Any) -> str:
    """'1,234'; a float keeps up to two decimals ('12.35')."""
    n = as_number(value)
    if n is None:
        return NA
    if n == int(n) and abs(n) < 1e15:
        return f"{int(n):,}"
    return f"{n:,.2f}"


def fmt_day(dt: Any, with_year: bool = False) -> str:
    """'2026-11-22' as '22 Nov' (or '22 Nov 2026'); anything else as given."""
    text = str(dt)
    try:
        d = date.fromisoformat(text)
    except ValueError:
        return text
    return d.strftime("%d %b %Y" if with_year else "%d %b")


def fmt_period(first: Any, last: Any) -> str:
    """'1-30 Nov 2026', '28 Nov - 3 Dec 2026', '30 Dec 2026 - 2 Jan 2027', with en dashes."""
    try:
        a, b = date.fromisoformat(str(first)), date.fromisoformat(str(last))
    except ValueError:
        return f"{first} \u2013 {last}"
    if a == b:
        return f"{a.day} {a:%b %Y}"
    if (a.year, a.month) == (b.year, b.month):
        return f"{a.day}\u2013{b.day} {b:%b %Y}"
    if a.year == b.year:
        return f"{a.day} {a:%b} \u2013 {b.day} {b:%b %Y}"
    return f"{a.day} {a:%b %Y} \u2013 {b.day} {b:%b %Y}"
