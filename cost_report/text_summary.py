"""The few lines the report prints on stdout when it is done."""

from __future__ import annotations

from pathlib import Path

from cost_report.display import fmt_bytes
from cost_report.model import ReportModel

__all__ = ["text_summary"]


def text_summary(model: ReportModel, out: Path) -> str:
    t = model.totals
    cf = t["counterfactual_usd"]
    sv = t["savings_usd"]
    frac = t["savings_fraction"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    share = t.get("cross_zone_share_of_payload")

    def versus(key: str) -> str:
        if sv[key] >= 0:
            return f"savings ${sv[key]:,.2f}, {pct(frac[key])}"
        return f"zonefleet costs ${-sv[key]:,.2f} more"

    lines = [
        f"zonefleet cost report {model.period_from} .. {model.period_to}",
        f"  cross-zone bytes     {fmt_bytes(t['cross_zone_bytes'])}"
        f" ({pct(share)} of client payload bytes {fmt_bytes(t['payload_bytes'])})",
        f"  zonefleet            ${t['zonefleet_usd']:,.2f}"
        f"  (of which the shared file system ${t['shared_fs_usd']:,.2f})",
        f"  Kafka RF3            ${cf['kafka_rf3']:,.2f}  ({versus('kafka_rf3')})",
        f"  Kafka RF3 + KIP-392  ${cf['kafka_rf3_fetch_from_follower']:,.2f}"
        f"  ({versus('kafka_rf3_fetch_from_follower')})",
    ]
    if t.get("rejected_rows"):
        lines.append(f"  rejected rows        {t['rejected_rows']:,} (see report.html)")
    for w in model.warnings:
        lines.append(f"  warning: {w}")
    lines.append(f"  wrote {out / 'summary.json'}, {out / 'report.html'} and Parquet tables")
    return "\n".join(lines)
