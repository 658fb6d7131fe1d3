"""One local Spark session per test module (a cold start takes seconds): the fixture factory
the cost-report tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


def local_spark(app: str) -> Iterator[Any]:
    """A local[2] SparkSession for one module, stopped after it."""
    pytest.importorskip("pyspark", reason="pyspark is in the 'report' extra")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from cost_report.job import spark_session

    spark = spark_session("local[2]", app)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
