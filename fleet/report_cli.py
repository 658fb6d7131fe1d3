"""`zonefleet cost-report`: the Spark cost report (cost_report.job) from the command line."""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from typing import Any

from cost_report.job import build_parser

__all__ = ["INSTALL_HINT", "add_report_parser", "run_report_command"]

INSTALL_HINT = (
    "zonefleet cost-report needs PySpark and Java 17: pip install 'zonefleet[report]' "
    "(or: make report)"
)


def add_report_parser(sub: Any) -> None:
    sub.add_parser(
        "cost-report",
        parents=[build_parser("zonefleet cost-report", add_help=False)],
        help="cross-AZ traffic cost report from the nodes' ledgers (Apache Spark)",
        description="What the fleet's cross-AZ traffic cost, and what classic 3-AZ Kafka would "
        "have cost, from the traffic ledgers: summary.json, Parquet tables and report.html.",
    )


def run_report_command(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pyspark") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    if shutil.which("java") is None and not _java_home():
        print(
            "zonefleet cost-report: no Java found (Spark needs Java 17: install a JRE or "
            "set JAVA_HOME)",
            file=sys.stderr,
        )
        return 2
    from cost_report.job import run_args

    return run_args(args, "zonefleet cost-report")


def _java_home() -> bool:
    import os

    return bool(os.environ.get("JAVA_HOME"))
