"""AWS Cost and Usage Report 2.0 in, the fleet's billed regional data transfer per day out.

**Input.** A CUR 2.0 data export in Parquet: a file, or a directory read recursively for
``*.parquet`` files (AWS writes ``<export>/data/BILLING_PERIOD=YYYY-MM/*.parquet`` next to
``metadata/`` JSON, which is skipped). Columns used: ``line_item_usage_type``,
``line_item_usage_amount``, ``line_item_unblended_cost``, ``line_item_resource_id``,
``line_item_usage_start_date`` and, for a tag filter, ``resource_tags`` (a map). A missing
column is an error that names the path and the columns.

**What is kept.** Line items whose usage type ends with ``DataTransfer-Regional-Bytes``
(``USE1-DataTransfer-Regional-Bytes``; in us-east-1 often with no prefix): transfer between
AZs of one region (and over public or Elastic IPs within the region). Of those, the fleet's
resources, by `CurFilter`: a list of resource ids (an EC2 instance id, or an ARN ending in it)
and/or a resource tag; a line item matching either is kept. With no filter every such line item
is kept and a warning says so: the figures are then the whole account's, not the fleet's.

**Units.** ``line_item_usage_amount`` of these usage types is in GB (2^30 bytes, AWS's billing
gigabyte); ``billed_bytes`` is that times 2^30. AWS meters each crossing on both sides (an
``InterZone-Out`` line item at the sender and an ``InterZone-In`` one at the receiver, each at
the per-side rate), so when both ends are the fleet's, ``billed_bytes`` is twice the bytes that
crossed: compare ``billed_usd`` with the ledger's inter-AZ dollars, and ``billed_bytes / 2``
with its cross-zone bytes. Credits and refunds of this usage type are line items too, and count.

**Days** are the UTC day of ``line_item_usage_start_date`` (CUR line items are hourly or daily).
A kept line item with no start date, usage amount or cost is not counted: it is a row of the
rejected table, by file and reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

__all__ = [
    "DAILY_COLUMNS",
    "REQUIRED_COLUMNS",
    "CurChecks",
    "CurFilter",
    "CurSchemaError",
    "read_cur",
]

USAGE_TYPE_SUFFIX: Final = "DataTransfer-Regional-Bytes"
REQUIRED_COLUMNS: Final = (
    "line_item_usage_type",
    "line_item_usage_amount",
    "line_item_unblended_cost",
    "line_item_resource_id",
    "line_item_usage_start_date",
)
TAGS_COLUMN: Final = "resource_tags"
DAILY_COLUMNS: Final = ("dt", "billed_gb", "billed_bytes", "billed_usd", "line_items")
BYTES_PER_GB: Final = 1 << 30
SAMPLES_PER_REASON: Final = 5

NO_START: Final = "line_item_usage_start_date is missing or not a time"
NO_AMOUNT: Final = "line_item_usage_amount is missing or not a number"
NO_COST: Final = "line_item_unblended_cost is missing or not a number"
NO_FILTER: Final = (
    "CUR: no resource filter (--cur-resource-ids / --cur-tag): the billed regional transfer "
    "shown is every line item of the export, not only the fleet's"
)


class CurSchemaError(ValueError):
    """The Parquet at a path is not a CUR 2.0 export the report can read."""


@dataclass(frozen=True)
class CurFilter:
    """Which line items are the fleet's: any of `resource_ids`, or resources carrying the
    tag `tag` = (key, value). Empty: no filter."""

    resource_ids: tuple[str, ...] = ()
    tag: tuple[str, str] | None = None

    @classmethod
    def from_cli(
        cls, resource_ids: str | Sequence[str] | None = None, tag: str | None = None
    ) -> CurFilter:
        """From ``--cur-resource-ids i-0abc,i-0def`` and ``--cur-tag key=value``."""
        if isinstance(resource_ids, str):
            resource_ids = resource_ids.split(",")
        ids = tuple(r.strip() for r in (resource_ids or ()) if r.strip())
        parsed = None
        if tag:
            key, sep, value = tag.partition("=")
            if not sep or not key.strip():
                raise ValueError(
                    f"--cur-tag {tag!r}: expected KEY=VALUE, e.g. zonefleet:fleet=prod "
                    "(or the CUR 2.0 key, user_zonefleet_fleet=prod)"
                )
            parsed = (key.strip(), value.strip())
        return cls(ids, parsed)

    @property
    def empty(self) -> bool:
        return not self.resource_ids and self.tag is None

    def tag_keys(self) -> tuple[str, ...]:
        """The keys the tag may have in ``resource_tags``: as given, and as CUR 2.0 spells a
        user tag (``user_`` + the key with every character not a letter, digit or ``_`` turned
        into ``_``)."""
        if self.tag is None:
            return ()
        key = self.tag[0]
        keys = [key]
        if not key.startswith(("user_", "aws_")):
            keys.append("user_" + re.sub(r"[^A-Za-z0-9_]", "_", key))
        return tuple(dict.fromkeys(keys))


@dataclass
class CurChecks:
    """What else `read_cur` found: `rejected` (source, reason, rows, samples: a few
    "resource_id usage_type" of the line items) and `warnings`."""

    rejected: DataFrame
    warnings: list[str] = field(default_factory=list)


def read_cur(
    spark: SparkSession,
    path: str | Sequence[str],
    resource_filter: CurFilter | None = None,
    *,
    date_from: str | None = None,
    date_to: str | None = None,
) -> tuple[DataFrame, CurChecks]:
    """(daily, checks) of the CUR 2.0 Parquet at `path`.

    `daily`: one row per UTC day (within `date_from`..`date_to` when given) with
    `DAILY_COLUMNS`: dt (YYYY-MM-DD), billed_gb, billed_bytes (billed_gb times 2^30, rounded),
    billed_usd (unblended cost), line_items. Raises `CurSchemaError` naming the path and the
    missing columns, FileNotFoundError for a path with nothing to read.
    """
    paths = [path] if isinstance(path, str) else list(path)
    where = ", ".join(paths)
    resource_filter = resource_filter or CurFilter()
    try:
        df = (
            spark.read.option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.parquet")
            .option("mergeSchema", "true")
            .parquet(*paths)
        )
    except Exception as exc:  # AnalysisException
        text = str(exc)
        if "PATH_NOT_FOUND" in text:
            raise FileNotFoundError(f"CUR: {_first_line(text)}") from None
        if "UNABLE_TO_INFER_SCHEMA" in text:
            raise FileNotFoundError(f"CUR: no Parquet files under {where}") from None
        raise
    needed = list(REQUIRED_COLUMNS)
    if resource_filter.tag is not None:
        needed.append(TAGS_COLUMN)
    lacking = [c for c in needed if c not in df.columns]
    if lacking:
        raise CurSchemaError(
            f"{where}: not a CUR 2.0 export the report can read: no column "
            f"{', '.join(lacking)} (CUR 2.0 data exports have {', '.join(needed)})"
        )
    if resource_filter.tag is not None and not isinstance(
        df.schema[TAGS_COLUMN].dataType, T.MapType
    ):
        raise CurSchemaError(
            f"{where}: column {TAGS_COLUMN} is {df.schema[TAGS_COLUMN].dataType.simpleString()}, "
            "not a map (CUR 2.0); --cur-tag needs CUR 2.0's resource_tags map"
        )
    warnings = [NO_FILTER] if resource_filter.empty else []

    usage_type = F.col("line_item_usage_type")
    kept = df.where(usage_type.endswith(USAGE_TYPE_SUFFIX) & _fleet(resource_filter))
    day = _utc_day(df.schema["line_item_usage_start_date"].dataType)
    amount = F.col("line_item_usage_amount").try_cast("double")
    cost = F.col("line_item_unblended_cost").try_cast("double")
    rows = kept.select(
        F.input_file_name().alias("source"),
        F.concat_ws(" ", F.col("line_item_resource_id"), usage_type).alias("sample"),
        day.cast("string").alias("dt"),
        amount.alias("amount"),
        cost.alias("cost"),
    )
    reason = (
        F.when(F.col("dt").isNull(), F.lit(NO_START))
        .when(F.col("amount").isNull(), F.lit(NO_AMOUNT))
        .when(F.col("cost").isNull(), F.lit(NO_COST))
    )
    checked = rows.select("*", reason.alias("reason"))
    bad = F.col("reason").isNotNull()
    keep = F.lit(True)
    if date_from:
        keep = keep & (bad | (F.col("dt") >= F.lit(date_from)))
    if date_to:
        keep = keep & (bad | (F.col("dt") <= F.lit(date_to)))
    both = (
        checked.where(keep)
        .select(
            "reason",
            F.when(bad, F.col("source")).alias("source"),
            F.when(bad, F.col("sample")).alias("sample"),
            F.when(~bad, F.col("dt")).alias("dt"),
            F.when(bad, F.lit(0.0)).otherwise(F.col("amount")).alias("amount"),
            F.when(bad, F.lit(0.0)).otherwise(F.col("cost")).alias("cost"),
        )
        .groupBy("reason", "source", "dt")
        .agg(
            F.sum("amount").alias("billed_gb"),
            F.sum("cost").alias("billed_usd"),
            F.count(F.lit(1)).alias("rows"),
            F.slice(F.collect_list("sample"), 1, SAMPLES_PER_REASON).alias("samples"),
        )
        .persist()
    )
    daily = (
        both.where(F.col("reason").isNull())
        .select(
            "dt",
            F.col("billed_gb").cast("double").alias("billed_gb"),
            F.round(F.col("billed_gb") * BYTES_PER_GB).cast("long").alias("billed_bytes"),
            F.col("billed_usd").cast("double").alias("billed_usd"),
            F.col("rows").cast("long").alias("line_items"),
        )
        .orderBy("dt")
    )
    rejected = both.where(F.col("reason").isNotNull()).select(
        "source", "reason", F.col("rows").cast("long").alias("rows"), "samples"
    )
    return daily, CurChecks(rejected, warnings)


def _fleet(flt: CurFilter) -> Column:
    if flt.empty:
        return F.lit(True)
    rid = F.col("line_item_resource_id")
    cond: Column = F.lit(False)
    if flt.resource_ids:
        cond = cond | rid.isin(*flt.resource_ids)
        for r in flt.resource_ids:  # an ARN: arn:aws:ec2:us-east-1:123:instance/i-0abc
            cond = cond | rid.endswith("/" + r)
    for key in flt.tag_keys():
        assert flt.tag is not None
        cond = cond | (F.try_element_at(F.col(TAGS_COLUMN), F.lit(key)) == F.lit(flt.tag[1]))
    return F.coalesce(cond, F.lit(False))


def _utc_day(kind: Any) -> Column:
    """The UTC day of the usage start (a date), whatever the column's type."""
    c = F.col("line_item_usage_start_date")
    if isinstance(kind, T.TimestampType):  # an instant
        return F.date_from_unix_date(F.floor(F.unix_seconds(c) / 86400).try_cast("int"))
    if isinstance(kind, (T.TimestampNTZType, T.DateType)):  # a wall time or day: CUR's are UTC
        return F.to_date(c)
    # A string, ISO 8601 as CUR writes it ("2026-11-22T00:00:00Z"); no zone means UTC.
    text = c.cast("string")
    instant = F.try_to_timestamp(text)
    has_zone = text.rlike(r"(?i)(z|[+-][0-9]{2}:?[0-9]{2})$")
    return F.when(
        has_zone, F.date_from_unix_date(F.floor(F.unix_seconds(instant) / 86400).try_cast("int"))
    ).otherwise(F.to_date(F.try_to_timestamp(text).cast("timestamp_ntz")))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "error"
