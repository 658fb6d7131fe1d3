"""Interleaved A/B runs of `produce_consume.py --zones --json` between two checkouts.

Each checkout runs its own bench with its own interpreter from inside its tree, so the fleet it
starts (`zonefleet up`, nodes started as `sys.executable -m fleet.cli` in the working
directory) runs that tree's code. Runs alternate old, new, new, old, ... so that the machine's
drift weighs on both; the summary gives per figure the median (min-max) of each side, the
median of the paired new/old quotients, and in how many pairs new was higher.

    python bench/ab_zones.py --old /tmp/wt_old --new /tmp/wt_new --pairs 5 [-- bench args]

Each tree needs a `.venv/bin/python` that imports that tree's packages first and a
`.venv/bin/zonefleet` entry point (docs/performance.md says how to make one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIGURES: list[tuple[str, tuple[str, ...]]] = [
    ("proxy p50 ms", ("latency", "proxy", "p50_ms")),
    ("proxy p99 ms", ("latency", "proxy", "p99_ms")),
    ("direct p50 ms", ("latency", "direct", "p50_ms")),
    ("direct p99 ms", ("latency", "direct", "p99_ms")),
    ("proxy/direct p50", ("derived", "p50_ratio")),
    ("proxy/direct p99", ("derived", "p99_ratio")),
    ("e2e p50 ms", ("e2e", "p50_ms")),
    ("e2e p99 ms", ("e2e", "p99_ms")),
    ("proxy MB/s", ("throughput", "proxy_mb_s")),
    ("direct MB/s", ("throughput", "direct_mb_s")),
    ("proxy/direct MB/s", ("throughput", "ratio")),
    ("confirm B/partition", ("cross_zone", "confirm_bytes_per_partition")),
]


def _figure(run: dict[str, Any], path: tuple[str, ...]) -> float | None:
    if path[0] == "derived":
        proxy, direct = run["latency"]["proxy"], run["latency"]["direct"]
        key = "p50_ms" if path[1] == "p50_ratio" else "p99_ms"
        return float(proxy[key]) / float(direct[key]) if direct[key] else None
    value: Any = run
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value)


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_once(tree: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    cmd = [str(tree / ".venv/bin/python"), "bench/produce_consume.py", "--zones", "--json"]
    proc = subprocess.run(
        cmd + extra, cwd=tree, capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{tree}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, help="append every run's JSON line here")
    parser.add_argument("extra", nargs="*", help="arguments for produce_consume.py")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for pair in range(args.pairs):
        order = ("old", "new") if pair % 2 == 0 else ("new", "old")
        for side in order:
            tree = args.old if side == "old" else args.new
            load = _load()
            started = time.monotonic()
            result = run_once(tree, args.extra, args.timeout)
            result["ab"] = {"side": side, "pair": pair, "load": load}
            runs[side].append(result)
            if args.out is not None:
                with args.out.open("a") as out:
                    out.write(json.dumps(result) + "\n")
            lat = result["latency"]
            print(
                f"pair {pair + 1} {side}: load {load:.1f}, proxy p50/p99 "
                f"{lat['proxy']['p50_ms']:.1f}/{lat['proxy']['p99_ms']:.1f} ms, direct "
                f"{lat['direct']['p50_ms']:.1f}/{lat['direct']['p99_ms']:.1f} ms, e2e p99 "
                f"{result['e2e']['p99_ms']:.1f} ms, MB/s ratio "
                f"{result['throughput']['ratio']:.2f} ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    print("| figure | old | new | new/old (paired median) | new higher in |")
    print("|---|---|---|---:|---:|")
    for name, path in FIGURES:
        old = [_figure(r, path) for r in runs["old"]]
        new = [_figure(r, path) for r in runs["new"]]
        pairs = [(o, n) for o, n in zip(old, new, strict=True) if o and n is not None]
        quotient = statistics.median(n / o for o, n in pairs) if pairs else float("nan")
        higher = sum(n > o for o, n in pairs)
        print(
            f"| {name} | {_cell([v for v in old if v is not None])} | "
            f"{_cell([v for v in new if v is not None])} | {quotient:.2f} | "
            f"{higher} of {len(pairs)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
