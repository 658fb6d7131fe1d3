"""One report run: plan the files, aggregate in Spark, price, and write the three outputs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cost_report.costs import cost_by, daily_usage, period_costs, preferred_az
from cost_report.inputs import list_files, local_or_staged
from cost_report.ledger_files import FilePlan, plan_files
from cost_report.model import ReportModel
from cost_report.prices import PriceSheet
from cost_report.spark_ledger import hourly_ledger, rejected_lines

__all__ = ["ReportInputs", "run_report"]

TOP_TOPICS = 10
UNKNOWN_WARN_FRACTION = 0.01
MAX_REJECTED_FILES_WITH_LINES = 50


@dataclass
class ReportInputs:
    accounting: str
    out: Path
    prices: PriceSheet
    date_from: str | None = None
    date_to: str | None = None
    flow_logs: str | None = None
    cur: str | None = None
    zones: str | None = None
    cur_resource_ids: tuple[str, ...] = ()
    cur_tag: str | None = None
    staging_dir: Path | None = None


def run_report(
    spark: SparkSession, inputs: ReportInputs, progress: Callable[[str], None]
) -> ReportModel:
    prices = inputs.prices
    location = local_or_staged(inputs.accounting, inputs.staging_dir or inputs.out / "_staged")
    entries = list_files(spark, location)
    plan = plan_files(entries, inputs.date_from, inputs.date_to)
    kept_bytes = sum(f.size for f in plan.kept)
    progress(
        f"reading {len(plan.kept)} ledger files ({kept_bytes / 1e6:,.1f} MB, "
        f"{len(plan.days)} days); {len(plan.duplicates)} duplicates skipped"
    )
    tables = hourly_ledger(spark, plan.kept)
    hourly = tables.hourly
    progress("aggregating rows to hours (the one pass over the ledgers)")
    rejected = [r.asDict() for r in tables.rejected.collect()]
    az = preferred_az(hourly, prices)
    progress("pricing days")
    costs = period_costs(daily_usage(hourly, az), prices)
    period_from = inputs.date_from or (costs.usage[0].dt if costs.usage else "")
    period_to = inputs.date_to or (costs.usage[-1].dt if costs.usage else "")

    out = inputs.out
    out.mkdir(parents=True, exist_ok=True)
    progress(f"writing Parquet tables to {out}")
    by_channel = cost_by(hourly, ["dt", "channel"], prices, az)
    by_topic = cost_by(hourly, ["dt", "topic"], prices, az)
    zone_matrix = hourly.groupBy("dt", "from_zone", "to_zone", "cross_zone").agg(
        F.sum("bytes").alias("bytes"), F.sum("requests").alias("requests")
    )
    traffic_daily = hourly.groupBy(
        "dt", "from_zone", "to_zone", "channel", "api", "topic", "cross_zone"
    ).agg(F.sum("bytes").alias("bytes"), F.sum("requests").alias("requests"))
    _write(hourly, out / "traffic_hourly")
    _write(traffic_daily, out / "traffic_daily")
    _write(by_channel, out / "cost_by_channel")
    _write(by_topic, out / "cost_by_topic")
    _write(zone_matrix, out / "zone_matrix")
    daily_rows = costs.daily_rows()
    _write_rows(spark, daily_rows, out / "cost_daily")

    rejected_rows = _rejected_rows(spark, plan, rejected)

    sources = [
        {
            "dt": u.dt,
            "ledger_cross_zone_bytes": u.cross_zone_bytes,
            "ledger_inter_az_usd": c.inter_az_usd,
            "flow_log_cross_zone_bytes": None,
            "cur_billed_bytes": None,
            "cur_billed_usd": None,
        }
        for u, c in zip(costs.usage, costs.costs, strict=True)
    ]
    warnings = _warnings(plan, costs.totals, daily_rows, period_from, period_to, hourly)
    if inputs.flow_logs or inputs.cur:
        progress("reading flow logs / CUR")
        from cost_report.comparisons import add_comparisons

        warnings += add_comparisons(spark, inputs, sources, rejected_rows)
    _write_rows(spark, sources, out / "sources_daily")
    _write_rows(
        spark, [{**r, "dt": r["dt"] or "unknown"} for r in rejected_rows], out / "rejected_rows"
    )

    progress("collecting the figures for the summary")
    channel_rows = _collect(
        by_channel.groupBy("channel")
        .agg(*(F.sum(c).alias(c) for c in ("bytes", "cross_zone_bytes", "usd")))
        .orderBy(F.desc("usd"), F.desc("bytes"))
    )
    topic_rows = _top_topics(by_topic)
    matrix_rows = _collect(
        zone_matrix.groupBy("from_zone", "to_zone", "cross_zone")
        .agg(F.sum("bytes").alias("bytes"))
        .orderBy("from_zone", "to_zone")
    )
    totals = dict(costs.totals)
    totals["rejected_rows"] = sum(r["rows"] for r in rejected_rows)
    model = ReportModel(
        period_from=period_from,
        period_to=period_to,
        prices=prices.as_dict(),
        totals=totals,
        daily=[_daily_view(r) for r in daily_rows],
        zone_matrix=matrix_rows,
        by_channel=channel_rows,
        top_topics=topic_rows,
        sources=sources,
        shared_fs={
            "regional_usd": totals["inter_az_regional_usd"],
            "preferred_az_usd": totals["inter_az_preferred_az_usd"],
            "preferred_az": az,
            "billed_as": prices.shared_fs_billing,
            "kind": prices.shared_fs,
            "fixed_usd": totals["shared_fs_usd"],
        },
        line_items=_line_items(totals, prices),
        warnings=warnings,
        rejected=rejected_rows,
    )
    _write_summary(out / "summary.json", model)
    progress("rendering report.html")
    try:
        from cost_report.html_report import render_html
    except ImportError:  # the renderer arrives separately; the data outputs stand alone
        pass
    else:
        (out / "report.html").write_text(render_html(model))
    progress("done")
    return model


def _write(df: DataFrame, path: Path) -> None:
    df.write.mode("overwrite").partitionBy("dt").parquet(str(path))


def _row_schema(rows: list[dict[str, Any]]) -> T.StructType:
    """Column types from the values (Spark cannot infer a column that is all None: those are
    doubles, as every optional figure is)."""
    kinds = {bool: T.BooleanType(), int: T.LongType(), float: T.DoubleType(), str: T.StringType()}
    fields = []
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] is not None]
        types = {type(v) for v in values}
        if types == {int, float}:
            types = {float}
        kind = kinds.get(types.pop(), T.StringType()) if len(types) == 1 else T.DoubleType()
        if not values:
            kind = T.DoubleType()
        fields.append(T.StructField(key, kind))
    return T.StructType(fields)


def _write_rows(spark: SparkSession, rows: list[dict[str, Any]], path: Path) -> None:
    if rows:
        schema = _row_schema(rows)
        data = [
            tuple(
                float(r[f.name])
                if isinstance(f.dataType, T.DoubleType) and r[f.name] is not None
                else r[f.name]
                for f in schema.fields
            )
            for r in rows
        ]
        _write(spark.createDataFrame(data, schema), path)
    elif path.exists():
        shutil.rmtree(path)


def _collect(df: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def _top_topics(by_topic: DataFrame) -> list[dict[str, Any]]:
    period = by_topic.groupBy("topic").agg(
        *(F.sum(c).alias(c) for c in ("bytes", "cross_zone_bytes", "usd"))
    )
    top = _collect(
        period.where(F.col("topic") != "")
        .orderBy(F.desc("usd"), F.desc("bytes"), "topic")
        .limit(TOP_TOPICS)
    )
    rest = (
        period.where(~F.col("topic").isin([t["topic"] for t in top] or [""]))
        .agg(*(F.sum(c).alias(c) for c in ("bytes", "cross_zone_bytes", "usd")))
        .first()
    )
    if rest is not None and rest["bytes"]:
        top.append({"topic": "(other topics and no topic)", **rest.asDict()})
    return top


def _daily_view(row: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "dt",
        "cross_zone_bytes",
        "inter_az_usd",
        "s3_requests_usd",
        "s3_storage_usd",
        "shared_fs_usd",
        "zonefleet_usd",
        "kafka_rf3_usd",
        "kafka_rf3_fetch_from_follower_usd",
        "savings_usd",
        "savings_fraction",
    )
    return {k: row[k] for k in keys}


def _line_items(totals: dict[str, Any], prices: PriceSheet) -> list[dict[str, Any]]:
    gb = prices.bytes_per_gb
    # The bytes the sheet's view of the shared file system bills as transfer.
    transfer_bytes = totals["cross_zone_bytes_without_wal"]
    if prices.shared_fs_billing == "preferred-az":
        transfer_bytes += totals["wal_bytes_outside_preferred_az"]
    return [
        {
            "item": "inter-AZ transfer (both sides)",
            "quantity": transfer_bytes / gb,
            "unit": "GB",
            "usd": totals["inter_az_usd"],
        },
        {
            "item": "S3 PUT-class requests",
            "quantity": totals["s3_put_requests"],
            "unit": "requests",
            "usd": totals["s3_put_requests"] * prices.s3_put_usd_per_1000 / 1000,
        },
        {
            "item": "S3 GET-class requests",
            "quantity": totals["s3_get_requests"],
            "unit": "requests",
            "usd": totals["s3_get_requests"] * prices.s3_get_usd_per_1000 / 1000,
        },
        {
            "item": "S3 storage",
            "quantity": None,
            "unit": "GB-month",
            "usd": totals["s3_storage_usd"],
        },
        {
            "item": f"shared file system ({prices.shared_fs})",
            "quantity": None,
            "unit": "",
            "usd": totals["shared_fs_usd"],
        },
    ]


def _rejected_rows(
    spark: SparkSession, plan: FilePlan, rejected: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    from cost_report.ledger_files import parse_ledger_path

    out: list[dict[str, Any]] = []
    for n, r in enumerate(sorted(rejected, key=lambda r: (r["file"], r["reason"]))):
        lines = (
            rejected_lines(spark, r["file"], r["samples"])
            if n < MAX_REJECTED_FILES_WITH_LINES
            else []
        )
        parsed = parse_ledger_path(r["file"], 0)
        out.append(
            {
                "source": r["file"],
                "dt": parsed.dt if parsed else None,
                "line": lines[0] if lines else None,
                "lines": ",".join(map(str, lines)),
                "reason": r["reason"],
                "rows": int(r["rows"]),
            }
        )
    for f, why in plan.rejected:
        rows = spark.read.text(f.path).count()  # rare: a person wants to know how much
        out.append(
            {"source": f.path, "dt": f.dt, "line": None, "lines": "", "reason": why, "rows": rows}
        )
    return out


def _warnings(
    plan: FilePlan,
    totals: dict[str, Any],
    daily: list[dict[str, Any]],
    period_from: str,
    period_to: str,
    hourly: DataFrame,
) -> list[str]:
    from cost_report.job import days_between

    out: list[str] = []
    total = totals["total_bytes"]
    unknown = totals["unknown_zone_bytes"]
    if total and unknown / total > UNKNOWN_WARN_FRACTION:
        out.append(
            f"{unknown / total:.1%} of the bytes have zone 'unknown' (not counted as cross-zone): "
            "map the clients' networks to zones ([cidrs] in the fleet TOML) or tag their "
            "client.id with zone=..."
        )
    if period_from and period_to:
        seen = {r["dt"] for r in daily}
        missing = [d for d in days_between(period_from, period_to) if d not in seen]
        if missing:
            out.append(f"no ledger rows for {len(missing)} day(s): {', '.join(missing[:10])}")
    node_days = _collect(hourly.select("dt", "node").distinct())
    by_node: dict[str, set[str]] = {}
    for r in node_days:
        by_node.setdefault(r["node"], set()).add(r["dt"])
    for node, days in sorted(by_node.items()):
        gaps = [d for d in days_between(min(days), max(days)) if d not in days]
        if gaps:
            out.append(f"node {node} has no ledger for {', '.join(gaps[:10])}")
    if plan.duplicates:
        out.append(
            f"{len(plan.duplicates)} ledger file(s) repeat bytes of another and were not counted "
            f"again (e.g. {plan.duplicates[0][1]})"
        )
    if plan.rejected:
        out.append(
            f"{len(plan.rejected)} ledger file(s) overlap another in part and were not counted"
        )
    for path, why in plan.ignored[:5]:
        out.append(f"ignored {path}: {why}")
    return out


def _write_summary(path: Path, model: ReportModel) -> None:
    t = model.totals
    doc = {
        "period": {"from": model.period_from, "to": model.period_to},
        "cross_zone_bytes": t["cross_zone_bytes"],
        "zonefleet_usd": t["zonefleet_usd"],
        "counterfactual_usd": t["counterfactual_usd"],
        "savings_usd": t["savings_usd"],
        "savings_fraction": t["savings_fraction"],
        "line_items": model.line_items,
        "prices": model.prices,
        "shared_fs": model.shared_fs,
        "totals": t,
        "daily": model.daily,
        "by_channel": model.by_channel,
        "top_topics": model.top_topics,
        "zone_matrix": model.zone_matrix,
        "sources": model.sources,
        "warnings": model.warnings,
        "rejected": model.rejected,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
