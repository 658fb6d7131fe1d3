"""Where the ledgers are: a local directory, a path Spark reads itself (``s3a://``, ``hdfs://``),
or the fleet's own object store (``s3://bucket/prefix?endpoint=...``, ``file://``), which is
staged to a local directory through the project's object store first."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["is_object_store_url", "list_files", "local_or_staged"]


def is_object_store_url(location: str) -> bool:
    return location.startswith(("s3://", "file://"))


def local_or_staged(location: str, staging_dir: Path) -> str:
    """A path Spark can read: `location` itself, or a local copy of an object store's
    ``accounting/`` prefix."""
    if not is_object_store_url(location):
        return location
    from cost_report.staging import stage_accounting

    print(f"staging ledgers from {location} ...", file=sys.stderr)
    staged = stage_accounting(location, staging_dir)
    print(f"staged {len(staged)} ledger objects to {staging_dir}", file=sys.stderr)
    return str(staging_dir)


def list_files(spark: SparkSession, location: str) -> list[tuple[str, int]]:
    """(path, size) of every file under `location`, recursively. Local directories are walked
    here; any other URI through Hadoop's FileSystem (what Spark itself will read with)."""
    if "://" not in location or location.startswith("file:/"):
        root = Path(location.removeprefix("file://")).resolve()
        if not root.exists():
            raise FileNotFoundError(f"{location}: no such directory")
        out = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath, name)
                out.append((str(path), path.stat().st_size))
        return out
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(conf)
    it = fs.listFiles(path, True)
    out = []
    while it.hasNext():
        status = it.next()
        out.append((str(status.getPath().toString()), int(status.getLen())))
    return sorted(out)
