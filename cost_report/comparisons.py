"""What AWS recorded, next to the ledgers: VPC Flow Logs and the Cost and Usage Report.

Each optional input adds its daily figures to the report's `sources` rows (a day that only the
flow logs or CUR know gets a row of its own, with the ledger at 0), its rejected input to the
rejected table, and its warnings to the page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

if TYPE_CHECKING:
    from cost_report.report import ReportInputs

__all__ = ["add_comparisons"]


def _source_row(sources: list[dict[str, Any]], dt: str) -> dict[str, Any]:
    for row in sources:
        if row["dt"] == dt:
            return row
    row = {
        "dt": dt,
        "ledger_cross_zone_bytes": 0,
        "ledger_inter_az_usd": 0.0,
        "flow_log_cross_zone_bytes": None,
        "cur_billed_bytes": None,
        "cur_billed_usd": None,
    }
    sources.append(row)
    return row


def _daily(df: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def add_comparisons(
    spark: SparkSession,
    inputs: ReportInputs,
    sources: list[dict[str, Any]],
    rejected_rows: list[dict[str, Any]],
) -> list[str]:
    """Read the flow logs and CUR that `inputs` names; returns warnings."""
    warnings: list[str] = []
    if inputs.flow_logs:
        from cost_report.flow_logs import read_flow_logs
        from cost_report.flow_logs import rejected_rows as flow_rejected
        from cost_report.zones import load_zone_map

        if not inputs.zones:
            raise ValueError("--flow-logs needs --zones (a fleet TOML or az1=10.0.0.0/20,...)")
        zone_map = load_zone_map(inputs.zones)
        daily, rejected = read_flow_logs(
            spark,
            inputs.flow_logs,
            zone_map,
            date_from=inputs.date_from,
            date_to=inputs.date_to,
        )
        for r in _daily(daily):
            row = _source_row(sources, r["dt"])
            row["flow_log_cross_zone_bytes"] = int(r["cross_zone_bytes"])
            row["flow_log_total_bytes"] = int(r["total_bytes"])
            row["flow_log_unknown_zone_bytes"] = int(r["unknown_zone_bytes"])
            row["flow_log_double_captured_bytes"] = int(r["double_captured_bytes"])
        rejected_rows.extend(flow_rejected(spark, rejected))
        for row in sources:
            if row["flow_log_cross_zone_bytes"] is None:
                row["flow_log_cross_zone_bytes"] = 0
    if inputs.cur:
        from cost_report.cur import CurFilter, read_cur

        flt = CurFilter.from_cli(inputs.cur_resource_ids, inputs.cur_tag)
        daily, checks = read_cur(
            spark, inputs.cur, flt, date_from=inputs.date_from, date_to=inputs.date_to
        )
        for r in _daily(daily):
            row = _source_row(sources, r["dt"])
            # AWS meters a crossing on both sides: half the usage is what crossed once, the
            # figure the ledger's cross-zone bytes compare with.
            row["cur_usage_bytes"] = int(r["billed_bytes"])
            row["cur_billed_bytes"] = int(r["billed_bytes"]) // 2
            row["cur_billed_usd"] = float(r["billed_usd"])
        for bad in checks.rejected.collect():
            rejected_rows.append(
                {
                    "source": bad["source"],
                    "dt": None,
                    "line": None,
                    "lines": "",
                    "reason": bad["reason"],
                    "rows": int(bad["rows"]),
                }
            )
        warnings.extend(checks.warnings)
        for row in sources:
            if row["cur_billed_bytes"] is None:
                row["cur_billed_bytes"] = 0
                row["cur_billed_usd"] = 0.0
    sources.sort(key=lambda r: r["dt"])
    # Every row carries the same keys, so the Parquet table has one schema.
    keys = dict.fromkeys(k for row in sources for k in row)
    for row in sources:
        for k in keys:
            row.setdefault(k, None)
    return warnings
