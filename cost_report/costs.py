"""The report's tables, computed in Spark from the hourly ledger table, and the period's
figures, priced on the driver from per-day aggregates (a row per day, never a ledger row)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cost_report import ledger_rows as lr
from cost_report.formulas import (
    FREE_S3_OPS,
    DailyCost,
    DailyUsage,
    inter_az_usd,
    price_day,
    stored_bytes_by_day,
)
from cost_report.prices import PriceSheet

__all__ = ["PeriodCosts", "billed_cross_zone", "daily_usage", "period_costs", "preferred_az"]


def preferred_az(hourly: DataFrame, prices: PriceSheet) -> str:
    """The shared file system's AZ for the "preferred-az" view: the price sheet's, else the
    first real zone (by name) that the ledgers name."""
    if prices.shared_fs_preferred_az:
        return prices.shared_fs_preferred_az
    zones = (
        hourly.select(F.col("from_zone").alias("z"))
        .union(hourly.select(F.col("to_zone").alias("z")))
        .where(~F.col("z").isin(*lr.PSEUDO_ZONES))
        .agg(F.min("z"))
        .first()
    )
    return str(zones[0]) if zones and zones[0] is not None else ""


def _node_side_zone() -> Column:
    # A WAL write goes from the node to the storage zone, a read comes from it.
    return F.when(F.col("channel") == "wal-write", F.col("from_zone")).otherwise(F.col("to_zone"))


def _outside_preferred(az: str) -> Column:
    zone = _node_side_zone()
    return (
        F.col("channel").isin(*lr.WAL_CHANNELS) & ~zone.isin(*lr.PSEUDO_ZONES) & (zone != F.lit(az))
    )


def billed_cross_zone(prices: PriceSheet, az: str) -> Column:
    """Bytes of a row that the price sheet's view bills as inter-AZ transfer."""
    wal = F.col("channel").isin(*lr.WAL_CHANNELS)
    if prices.shared_fs_billing == "preferred-az":
        billed = F.when(wal, _outside_preferred(az)).otherwise(F.col("cross_zone"))
    else:
        billed = ~wal & F.col("cross_zone")
    return F.when(billed, F.col("bytes")).otherwise(F.lit(0))


def _sum_if(cond: Column, value: str = "bytes") -> Column:
    return F.sum(F.when(cond, F.col(value)).otherwise(F.lit(0)))


def daily_usage(hourly: DataFrame, az: str) -> DataFrame:
    """One row per day with the DailyUsage fields."""
    channel, api = F.col("channel"), F.col("api")
    client = channel == "kafka-client"
    wal = channel.isin(*lr.WAL_CHANNELS)
    return hourly.groupBy("dt").agg(
        _sum_if(F.col("cross_zone")).alias("cross_zone_bytes"),
        _sum_if(F.col("cross_zone") & ~wal).alias("cross_zone_bytes_without_wal"),
        _sum_if(_outside_preferred(az)).alias("wal_bytes_outside_preferred_az"),
        _sum_if((channel == "s3-put") & ~api.isin(*FREE_S3_OPS), "requests").alias(
            "s3_put_requests"
        ),
        _sum_if(channel == "s3-get", "requests").alias("s3_get_requests"),
        _sum_if(client & (api == "Produce")).alias("produce_bytes"),
        _sum_if(client & (api == "Fetch")).alias("fetch_bytes"),
        _sum_if(client & ~api.isin("Produce", "Fetch")).alias("other_client_bytes"),
        _sum_if(channel == "wal-read").alias("wal_read_bytes"),
        _sum_if(channel == "wal-write").alias("wal_write_bytes"),
        F.sum("bytes").alias("total_bytes"),
        _sum_if(F.col("from_zone").isin("unknown") | F.col("to_zone").isin("unknown")).alias(
            "unknown_zone_bytes"
        ),
        _sum_if(client & api.isin("Produce", "Fetch")).alias("payload_bytes"),
        _sum_if(client & api.isin("Produce", "Fetch") & F.col("cross_zone")).alias(
            "cross_zone_payload_bytes"
        ),
        F.sum("rows").alias("rows"),
    )


@dataclass
class PeriodCosts:
    """Per-day usage and cost (the driver's share: one entry per day) and the period sums."""

    usage: list[DailyUsage]
    costs: list[DailyCost]
    extra: dict[str, dict[str, int]]  # dt -> total_bytes, unknown_zone_bytes, payload..., rows
    totals: dict[str, Any] = field(default_factory=dict)

    def daily_rows(self) -> list[dict[str, Any]]:
        rows = []
        for usage, cost in zip(self.usage, self.costs, strict=True):
            row: dict[str, Any] = {**asdict(usage), **asdict(cost)}
            row.update(self.extra[usage.dt])
            row["savings_usd"] = cost.savings_usd
            row["savings_fetch_from_follower_usd"] = cost.savings_ffr_usd
            row["savings_fraction"] = _fraction(cost.savings_usd, cost.kafka_rf3_usd)
            rows.append(row)
        return rows


def _fraction(part: float, whole: float) -> float | None:
    return part / whole if whole else None


_USAGE_FIELDS = tuple(DailyUsage.__dataclass_fields__)
_EXTRA_FIELDS = (
    "total_bytes",
    "unknown_zone_bytes",
    "payload_bytes",
    "cross_zone_payload_bytes",
    "rows",
)


def period_costs(usage_df: DataFrame, prices: PriceSheet) -> PeriodCosts:
    """Price each day (collected: one row a day) and sum the period."""
    days = sorted((row.asDict() for row in usage_df.collect()), key=lambda r: r["dt"])
    usage = [
        DailyUsage(str(r["dt"]), *(int(r[k] or 0) for k in _USAGE_FIELDS if k != "dt"))
        for r in days
    ]
    extra = {r["dt"]: {k: int(r[k] or 0) for k in _EXTRA_FIELDS} for r in days}
    stored = stored_bytes_by_day({u.dt: u.produce_bytes for u in usage}, prices.retention_days)
    costs = [price_day(u, stored[u.dt], prices) for u in usage]
    result = PeriodCosts(usage, costs, extra)
    result.totals = _totals(result)
    return result


def _totals(p: PeriodCosts) -> dict[str, Any]:
    def total(name: str) -> float:
        return sum(getattr(c, name) for c in p.costs)

    def total_usage(name: str) -> int:
        return sum(getattr(u, name) for u in p.usage)

    def total_extra(name: str) -> int:
        return sum(e[name] for e in p.extra.values())

    zonefleet = total("zonefleet_usd")
    kafka = {
        "kafka_rf3": total("kafka_rf3_usd"),
        "kafka_rf3_fetch_from_follower": total("kafka_rf3_fetch_from_follower_usd"),
    }
    savings = {k: v - zonefleet for k, v in kafka.items()}
    out: dict[str, Any] = {
        "cross_zone_bytes": total_usage("cross_zone_bytes"),
        "zonefleet_usd": zonefleet,
        "counterfactual_usd": kafka,
        "savings_usd": savings,
        "savings_fraction": {k: _fraction(savings[k], kafka[k]) for k in kafka},
        "inter_az_usd": total("inter_az_usd"),
        "inter_az_regional_usd": total("inter_az_regional_usd"),
        "inter_az_preferred_az_usd": total("inter_az_preferred_az_usd"),
        "s3_requests_usd": total("s3_requests_usd"),
        "s3_storage_usd": total("s3_storage_usd"),
        "shared_fs_usd": total("shared_fs_usd"),
    }
    for name in _EXTRA_FIELDS:
        out[name] = total_extra(name)
    for name in (
        "produce_bytes",
        "fetch_bytes",
        "other_client_bytes",
        "s3_put_requests",
        "s3_get_requests",
        "wal_read_bytes",
        "wal_write_bytes",
        "cross_zone_bytes_without_wal",
        "wal_bytes_outside_preferred_az",
    ):
        out[name] = total_usage(name)
    payload = out["payload_bytes"]
    out["cross_zone_share_of_payload"] = _fraction(out["cross_zone_bytes"], payload)
    return out


def with_cost(df: DataFrame, prices: PriceSheet, az: str) -> DataFrame:
    """Add billed_cross_zone_bytes and inter_az_usd to a table of ledger rows."""
    billed = billed_cross_zone(prices, az)
    return df.withColumn("billed_cross_zone_bytes", billed).withColumn(
        "inter_az_usd", inter_az_usd(F.col("billed_cross_zone_bytes"), prices)
    )


def cost_by(hourly: DataFrame, keys: list[str], prices: PriceSheet, az: str) -> DataFrame:
    """bytes, cross_zone_bytes, billed_cross_zone_bytes, requests and usd by `keys`. S3 request
    charges belong to the s3 channels' rows, so a sum over any breakdown is the same."""
    priced = with_cost(hourly, prices, az)
    channel, api = F.col("channel"), F.col("api")
    s3_usd = F.when((channel == "s3-put") & ~api.isin(*FREE_S3_OPS), F.col("requests")).otherwise(
        F.lit(0)
    ) * (prices.s3_put_usd_per_1000 / 1000) + F.when(
        channel == "s3-get", F.col("requests")
    ).otherwise(F.lit(0)) * (prices.s3_get_usd_per_1000 / 1000)
    return priced.groupBy(*keys).agg(
        F.sum("bytes").alias("bytes"),
        _sum_if(F.col("cross_zone")).alias("cross_zone_bytes"),
        F.sum("billed_cross_zone_bytes").alias("billed_cross_zone_bytes"),
        F.sum("requests").alias("requests"),
        F.sum(F.col("inter_az_usd") + s3_usd).alias("usd"),
    )
