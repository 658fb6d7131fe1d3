"""The cost-report job: ledgers in, summary.json + Parquet tables + report.html out.

Runs the same three ways: ``zonefleet cost-report ...``, ``python -m cost_report.job ...`` and
``spark-submit cost_report/job.py ...`` on a cluster (where ``--master`` is left to
spark-submit). Only aggregates reach the driver: a row per day, zone pair, channel and top
topic, and the rejected input.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # spark-submit cost_report/job.py: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cost_report.prices import PriceSheetError, load_prices

__all__ = ["build_parser", "main", "run_args"]


def build_parser(prog: str = "cost-report", add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        add_help=add_help,
        description="What the fleet's cross-AZ traffic cost, and what classic Kafka would have "
        "cost, from the nodes' traffic ledgers (Apache Spark).",
    )
    p.add_argument(
        "--accounting",
        required=True,
        help="the ledgers: a directory holding dt=YYYY-MM-DD/*.jsonl, a path Spark reads "
        "(s3a://...), or the fleet's object store (s3://bucket/prefix?endpoint=..., file://...)",
    )
    p.add_argument("--out", required=True, help="output directory (created; files replaced)")
    p.add_argument("--prices", help="TOML price sheet (defaults: us-east-1 list prices)")
    p.add_argument("--from", dest="date_from", type=_day, help="first day, YYYY-MM-DD (UTC)")
    p.add_argument("--to", dest="date_to", type=_day, help="last day, YYYY-MM-DD (inclusive)")
    p.add_argument("--flow-logs", help="VPC Flow Logs (v5 text records) to compare with")
    p.add_argument("--cur", help="AWS Cost and Usage Report 2.0 (Parquet) to compare with")
    p.add_argument(
        "--zones",
        help="subnet-to-zone map for flow logs: a fleet TOML, or az1=10.0.0.0/20,az2=...",
    )
    p.add_argument("--cur-resource-ids", help="comma-separated resource ids of the fleet (CUR)")
    p.add_argument("--cur-tag", help="key=value of a resource tag marking the fleet (CUR)")
    p.add_argument(
        "--master", help="Spark master (default local[*]; leave unset under spark-submit)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def _day(text: str) -> str:
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a day (YYYY-MM-DD): {text!r}") from None


class Progress:
    """Steps on stderr with the time since start, so a long run shows where it is."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def spark_session(master: str | None, app: str = "zonefleet-cost-report") -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    elif not _under_spark_submit():
        builder = builder.master("local[*]")
    if master or not _under_spark_submit():  # under spark-submit, the cluster's settings stand
        builder = builder.config("spark.sql.shuffle.partitions", _shuffle_partitions(master))
    return (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.sources.partitionOverwriteMode", "static")
        .getOrCreate()
    )


def _shuffle_partitions(master: str | None) -> str:
    """Two per core on a laptop (the aggregates after the first pass are small, and every
    extra task of the ~10 table writes costs start-up time); Spark's default on a cluster."""
    import os
    import re

    if master and not master.startswith("local"):
        return "200"  # Spark's default
    m = re.fullmatch(r"local\[(\d+)\]", master or "")
    cores = int(m.group(1)) if m else (os.cpu_count() or 2)
    return str(max(2, 2 * cores))


def _under_spark_submit() -> bool:
    import os

    return "SPARK_ENV_LOADED" in os.environ or "PYSPARK_GATEWAY_PORT" in os.environ


def main(argv: Sequence[str] | None = None, prog: str = "cost-report") -> int:
    return run_args(build_parser(prog).parse_args(argv), prog)


def run_args(args: argparse.Namespace, prog: str = "cost-report") -> int:
    """Run the report for parsed arguments (the `zonefleet cost-report` entry point too)."""
    try:
        prices = load_prices(args.prices)
    except PriceSheetError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.flow_logs and not args.zones:
        print(
            f"{prog}: --flow-logs needs --zones (the fleet TOML, or az1=10.0.0.0/20,...): "
            "flow logs name addresses, the zone map places them",
            file=sys.stderr,
        )
        return 2
    if args.date_from and args.date_to and args.date_from > args.date_to:
        print(f"{prog}: --from {args.date_from} is after --to {args.date_to}", file=sys.stderr)
        return 2
    progress = Progress(args.quiet)
    progress("starting Spark")
    spark = spark_session(args.master)
    if not args.quiet:
        spark.sparkContext.setLogLevel("ERROR")
    try:
        from cost_report.report import ReportInputs, run_report

        with tempfile.TemporaryDirectory(prefix="zonefleet-ledgers-") as staging:
            inputs = ReportInputs(
                accounting=args.accounting,
                out=Path(args.out),
                prices=prices,
                date_from=args.date_from,
                date_to=args.date_to,
                flow_logs=args.flow_logs,
                cur=args.cur,
                zones=args.zones,
                cur_resource_ids=tuple(filter(None, (args.cur_resource_ids or "").split(","))),
                cur_tag=args.cur_tag,
                staging_dir=Path(staging),
            )
            try:
                model = run_report(spark, inputs, progress)
            except (FileNotFoundError, ValueError) as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
    finally:
        if not _under_spark_submit() or args.master:
            spark.stop()
    from cost_report.text_summary import text_summary

    print(text_summary(model, Path(args.out)))
    return 0


def days_between(first: str, last: str) -> list[str]:
    d0, d1 = date.fromisoformat(first), date.fromisoformat(last)
    return [(d0 + timedelta(days=i)).isoformat() for i in range((d1 - d0).days + 1)]


if __name__ == "__main__":
    sys.exit(main())
