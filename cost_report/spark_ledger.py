"""Ledger rows into Spark: parse, check and aggregate to hours in one pass over the files.

The JSON is parsed by Spark itself (`from_json`), never row by row in Python, and the only
thing that leaves the executors is aggregates: the hourly table (one row per hour, node, zone
pair, channel, api and topic) and the rejected rows grouped by file and reason. Everything the
report shows is computed from the hourly table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cost_report import ledger_rows as lr
from cost_report.ledger_files import LedgerFile

__all__ = ["LedgerTables", "hourly_ledger", "rejected_lines"]

_STRING_FIELDS = ("minute", "node", "from_zone", "to_zone", "channel", "api", "topic")
_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in _STRING_FIELDS]
    + [
        T.StructField("bytes", T.LongType()),
        T.StructField("requests", T.LongType()),
        T.StructField("cross_zone", T.BooleanType()),
        T.StructField("_corrupt", T.StringType()),
    ]
)
_FILE_PATTERN = r"dt=(\d{4}-\d{2}-\d{2})/([A-Za-z0-9_-]+)(?:\.\d{12})?\.jsonl$"
HOURLY_KEYS = ("dt", "hour", "node", "from_zone", "to_zone", "channel", "api", "topic")
SAMPLES_PER_REASON = 5


@dataclass
class LedgerTables:
    """`hourly`: dt, hour, node, from_zone, to_zone, channel, api, topic, cross_zone, bytes,
    requests, rows. `rejected`: file, reason, rows, samples (up to 5 raw lines)."""

    hourly: DataFrame
    rejected: DataFrame


def _cross_zone(from_zone: Column, to_zone: Column) -> Column:
    return (
        (from_zone != to_zone) & ~from_zone.isin(*lr.PSEUDO_ZONES) & ~to_zone.isin(*lr.PSEUDO_ZONES)
    )


def _reason(j: Column, value: Column, file_dt: Column, file_node: Column) -> Column:
    """Null for a good row, else the first problem, in the order of `ledger_rows.row_problem`.
    The good case is tested first, so a good row costs only its own checks."""
    present = [j[name].isNotNull() for name in (*_STRING_FIELDS[:-1], "bytes", "requests")]
    good = j["_corrupt"].isNull()
    for cond in present:
        good = good & cond
    good = (
        good
        & j["minute"].rlike(lr.MINUTE_PATTERN)
        & (F.substring(j["minute"], 1, 10) == file_dt)
        & (j["node"] == file_node)
        & j["channel"].isin(*lr.KNOWN_CHANNELS)
        & (j["bytes"] >= 0)
        & (j["requests"] >= 0)
    )
    keys = F.json_object_keys(value)
    reason = F.when(good, F.lit(None).cast("string")).when(keys.isNull(), F.lit(lr.NOT_JSON))
    for name in (*_STRING_FIELDS[:-1], "bytes", "requests"):
        raw = F.get_json_object(value, f"$.{name}")
        reason = reason.when(raw.isNull(), F.lit(lr.missing(name)))
    return (
        reason.when(j["_corrupt"].isNotNull(), F.lit(lr.BAD_TYPE))
        .when(~j["minute"].rlike(lr.MINUTE_PATTERN), F.lit(lr.BAD_MINUTE))
        .when(F.substring(j["minute"], 1, 10) != file_dt, F.lit(lr.WRONG_DAY))
        .when(j["node"] != file_node, F.lit(lr.WRONG_NODE))
        .when(~j["channel"].isin(*lr.KNOWN_CHANNELS), F.lit(lr.UNKNOWN_CHANNEL))
        .otherwise(F.lit(lr.NEGATIVE))
    )


def hourly_ledger(spark: SparkSession, files: Sequence[LedgerFile]) -> LedgerTables:
    """Read `files` (the plan's kept files) and aggregate them; nothing runs until an action."""
    if not files:
        return _empty(spark)
    text = spark.read.text([f.path for f in files])
    file = F.input_file_name()
    lines = text.select(file.alias("file"), "value").where(F.trim("value") != "")
    lines = lines.select(
        "file",
        "value",
        F.regexp_extract("file", _FILE_PATTERN, 1).alias("file_dt"),
        F.regexp_extract("file", _FILE_PATTERN, 2).alias("file_node"),
        F.from_json(
            "value", _SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
        ).alias("j"),
    )
    j = F.col("j")
    reason = _reason(j, F.col("value"), F.col("file_dt"), F.col("file_node"))
    checked = lines.select(
        reason.alias("reason"),
        F.col("file"),
        F.col("value"),
        F.col("file_dt").alias("dt"),
        F.substring(j["minute"], 12, 2).cast("int").alias("hour"),
        j["node"].alias("node"),
        j["from_zone"].alias("from_zone"),
        j["to_zone"].alias("to_zone"),
        j["channel"].alias("channel"),
        j["api"].alias("api"),
        F.coalesce(j["topic"], F.lit("")).alias("topic"),
        F.coalesce(j["cross_zone"], _cross_zone(j["from_zone"], j["to_zone"])).alias("cross_zone"),
        j["bytes"].alias("bytes"),
        j["requests"].alias("requests"),
    )
    # One aggregation for both outcomes, so the files are read once: good rows group by their
    # hour and key, rejected rows by file and reason (their other keys are nulled).
    bad = F.col("reason").isNotNull()

    def good_only(name: str) -> Column:
        return F.when(bad, F.lit(None)).otherwise(F.col(name)).alias(name)

    grouped = checked.select(
        "reason",
        F.when(bad, F.col("file")).alias("file"),
        F.when(bad, F.col("value")).alias("value"),
        *(good_only(k) for k in (*HOURLY_KEYS, "cross_zone", "bytes", "requests")),
    ).groupBy("reason", "file", *HOURLY_KEYS, "cross_zone")
    both = grouped.agg(
        F.sum("bytes").alias("bytes"),
        F.sum("requests").alias("requests"),
        F.count(F.lit(1)).alias("rows"),
        F.slice(F.collect_list("value"), 1, SAMPLES_PER_REASON).alias("samples"),
    ).persist()
    hourly = both.where(F.col("reason").isNull()).select(
        *HOURLY_KEYS, "cross_zone", "bytes", "requests", "rows"
    )
    rejected = both.where(F.col("reason").isNotNull()).select("file", "reason", "rows", "samples")
    return LedgerTables(hourly, rejected)


def _empty(spark: SparkSession) -> LedgerTables:
    hourly_schema = T.StructType(
        [T.StructField(k, T.IntegerType() if k == "hour" else T.StringType()) for k in HOURLY_KEYS]
        + [
            T.StructField("cross_zone", T.BooleanType()),
            T.StructField("bytes", T.LongType()),
            T.StructField("requests", T.LongType()),
            T.StructField("rows", T.LongType()),
        ]
    )
    rejected_schema = T.StructType(
        [
            T.StructField("file", T.StringType()),
            T.StructField("reason", T.StringType()),
            T.StructField("rows", T.LongType()),
            T.StructField("samples", T.ArrayType(T.StringType())),
        ]
    )
    return LedgerTables(
        spark.createDataFrame([], hourly_schema), spark.createDataFrame([], rejected_schema)
    )


def rejected_lines(
    spark: SparkSession, file: str, samples: Sequence[str], limit: int = SAMPLES_PER_REASON
) -> list[int]:
    """The 1-based line numbers in `file` of the rejected lines `samples` (a few per file, so
    a person can find them). Reads the file as Spark's text reader does; rejected input is
    rare, so this runs only for files that have some."""
    wanted = set(samples)
    rdd: Any = spark.sparkContext.textFile(file).zipWithIndex()
    found = rdd.filter(lambda pair: pair[0] in wanted).map(lambda pair: pair[1] + 1).take(limit)
    return sorted(int(n) for n in found)
