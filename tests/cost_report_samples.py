"""ReportModels for the HTML report's tests: a realistic month, an empty report, and the edges.

`python -m tests.cost_report_samples docs/img/cost_report.png` renders the realistic month in
headless Chromium and keeps the screenshot the README shows.
"""

from __future__ import annotations

import random
import sys
import tempfile
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from cost_report.model import ReportModel
from cost_report.prices import DEFAULT_PRICES

GB = 1 << 30
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
LONG_TOPIC = "analytics.enterprise-data-platform.customer-360.events.enriched.v17-backfill-" * 2
TOPICS = (
    "payments.transactions.v2",
    "clickstream-raw",
    "orders",
    LONG_TOPIC,
    "inventory.updates",
    "fraud-scores",
    "search-queries",
    "audit-log",
    "notifications.email",
    "iot.telemetry.eu",
)


def _days(first: str, n: int) -> list[str]:
    start = date.fromisoformat(first)
    return [(start + timedelta(days=i)).isoformat() for i in range(n)]


def _daily_row(dt: str, rng: random.Random, weekday: int, ramp: float) -> dict[str, Any]:
    load = (0.72 if weekday >= 5 else 1.0) * rng.uniform(0.93, 1.07)
    cross = int(38 * GB * load)
    row: dict[str, Any] = {
        "dt": dt,
        "cross_zone_bytes": cross,
        "inter_az_usd": cross / GB * 0.02,
        "s3_requests_usd": 14.2 * load,
        "s3_storage_usd": 23.5 * ramp,
        "shared_fs_usd": 13.46,
        "kafka_rf3_usd": 402.0 * load,
        "kafka_rf3_fetch_from_follower_usd": 229.0 * load,
    }
    row["zonefleet_usd"] = sum(
        row[k] for k in ("inter_az_usd", "s3_requests_usd", "s3_storage_usd", "shared_fs_usd")
    )
    row["savings_usd"] = row["kafka_rf3_usd"] - row["zonefleet_usd"]
    row["savings_fraction"] = row["savings_usd"] / row["kafka_rf3_usd"]
    return row


def _totals(daily: list[dict[str, Any]], rejected_rows: int) -> dict[str, Any]:
    def s(key: str) -> float:
        return sum(r[key] for r in daily)

    zonefleet = s("zonefleet_usd")
    kafka = {"kafka_rf3": s("kafka_rf3_usd"), "kafka_rf3_fetch_from_follower": 0.0}
    kafka["kafka_rf3_fetch_from_follower"] = s("kafka_rf3_fetch_from_follower_usd")
    savings = {k: v - zonefleet for k, v in kafka.items()}
    payload = int(17.3e12 * len(daily))
    return {
        "cross_zone_bytes": int(s("cross_zone_bytes")),
        "total_bytes": int(payload * 1.9),
        "payload_bytes": payload,
        "cross_zone_payload_bytes": 0,
        "unknown_zone_bytes": int(2.1e9 * len(daily)),
        "zonefleet_usd": zonefleet,
        "counterfactual_usd": kafka,
        "savings_usd": savings,
        "savings_fraction": {k: savings[k] / v if v else None for k, v in kafka.items()},
        "cross_zone_share_of_payload": s("cross_zone_bytes") / payload if payload else None,
        "inter_az_usd": s("inter_az_usd"),
        "s3_requests_usd": s("s3_requests_usd"),
        "s3_storage_usd": s("s3_storage_usd"),
        "shared_fs_usd": s("shared_fs_usd"),
        "rejected_rows": rejected_rows,
    }


def _zone_matrix(n_days: int) -> list[dict[str, Any]]:
    rows = []
    for i, a in enumerate(ZONES):
        for j, b in enumerate(ZONES):
            same = a == b
            per_day = (5.4e12 + i * 0.6e12) if same else (9.5e9 + 1.7e9 * (i + 2 * j))
            rows.append({"from_zone": a, "to_zone": b, "bytes": int(per_day * n_days)})
        rows.append({"from_zone": a, "to_zone": "regional", "bytes": int(4.1e12 * n_days)})
        rows.append({"from_zone": "regional", "to_zone": a, "bytes": int(3.3e12 * n_days)})
    rows.append({"from_zone": "unknown", "to_zone": ZONES[0], "bytes": int(2.1e9 * n_days)})
    for r in rows:
        r["cross_zone"] = r["from_zone"] != r["to_zone"] and "regional" not in (
            r["from_zone"],
            r["to_zone"],
        )
        r["cross_zone"] = r["cross_zone"] and "unknown" not in (r["from_zone"], r["to_zone"])
    return sorted(rows, key=lambda r: (r["from_zone"], r["to_zone"]))


def _channels(totals: dict[str, Any], n: int) -> list[dict[str, Any]]:
    cross = totals["cross_zone_bytes"]
    rows = [("confirm-rpc", 0.46), ("state-stream", 0.38), ("rpc", 0.10), ("relay", 0.06)]
    out = [
        {
            "channel": name,
            "bytes": int(cross * share * 1.5),
            "cross_zone_bytes": int(cross * share),
            "usd": cross * share / GB * 0.02,
        }
        for name, share in rows
    ]
    out.append(
        {
            "channel": "s3-put",
            "bytes": int(4.4e12 * n),
            "cross_zone_bytes": 0,
            "usd": totals["s3_requests_usd"] * 0.86,
        }
    )
    out.append(
        {
            "channel": "s3-get",
            "bytes": int(2.9e12 * n),
            "cross_zone_bytes": 0,
            "usd": totals["s3_requests_usd"] * 0.14,
        }
    )
    for name, b in (("kafka-client", 17.3e12), ("wal-write", 12.3e12), ("wal-read", 9.9e12)):
        out.append({"channel": name, "bytes": int(b * n), "cross_zone_bytes": 0, "usd": 0.0})
    return sorted(out, key=lambda r: (-r["usd"], -r["bytes"]))


def _topics(totals: dict[str, Any], names: tuple[str, ...] = TOPICS) -> list[dict[str, Any]]:
    usd = totals["inter_az_usd"] + totals["s3_requests_usd"]
    weights = [0.5 ** (i / 2.2) for i in range(len(names) + 1)]
    scale = usd / sum(weights)
    rows = [
        {
            "topic": name,
            "usd": w * scale,
            "bytes": int(w * totals["payload_bytes"] / 4),
            "cross_zone_bytes": int(w * totals["cross_zone_bytes"] / 5),
        }
        for name, w in zip(names, weights, strict=False)
    ]
    rows.append(
        {
            "topic": "(other topics and no topic)",
            "usd": weights[-1] * scale,
            "bytes": int(weights[-1] * totals["payload_bytes"] / 4),
            "cross_zone_bytes": int(weights[-1] * totals["cross_zone_bytes"] / 5),
        }
    )
    return rows


def _sources(daily: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for r in daily:
        b = r["cross_zone_bytes"]
        out.append(
            {
                "dt": r["dt"],
                "ledger_cross_zone_bytes": b,
                "ledger_inter_az_usd": r["inter_az_usd"],
                "flow_log_cross_zone_bytes": int(b * rng.uniform(1.01, 1.05)),
                "cur_billed_bytes": int(b * rng.uniform(1.02, 1.06)),
                "cur_billed_usd": r["inter_az_usd"] * rng.uniform(1.02, 1.06),
            }
        )
    return out


def sample_model(n_days: int = 30, first: str = "2026-11-01") -> ReportModel:
    """A month of a three-zone fleet: about 200 MB/s of client traffic, zonefleet around an
    eighth of classic Kafka's bill."""
    rng = random.Random(10)
    days = _days(first, n_days)
    daily = [
        _daily_row(dt, rng, date.fromisoformat(dt).weekday(), min(1.0, (i + 1) / 7))
        for i, dt in enumerate(days)
    ]
    rejected: list[dict[str, Any]] = [
        {
            "source": f"accounting/dt={days[-1]}/node=proxy-b/part-0003.jsonl",
            "dt": days[-1],
            "line": 1187,
            "lines": "1187,1188",
            "reason": "not JSON (torn line)",
            "rows": 2,
        },
        {
            "source": f"accounting/dt={days[min(2, n_days - 1)]}/node=main-1/part-0000.jsonl",
            "dt": days[min(2, n_days - 1)],
            "line": 55,
            "lines": "55",
            "reason": "unknown channel 'gossip'",
            "rows": 1,
        },
    ]
    totals = _totals(daily, sum(r["rows"] for r in rejected))
    regional = totals["inter_az_usd"]
    return ReportModel(
        period_from=days[0],
        period_to=days[-1],
        prices=DEFAULT_PRICES.as_dict(),
        totals=totals,
        daily=daily,
        zone_matrix=_zone_matrix(n_days),
        by_channel=_channels(totals, n_days),
        top_topics=_topics(totals),
        sources=_sources(daily, rng),
        shared_fs={
            "regional_usd": regional,
            "preferred_az_usd": regional + 0.0205 * 2 * 12.3e12 * n_days / GB * 2 / 3,
            "preferred_az": ZONES[0],
            "billed_as": "regional",
            "kind": "fsx-ontap",
            "fixed_usd": totals["shared_fs_usd"],
        },
        line_items=[
            {
                "item": "inter-AZ transfer (both sides)",
                "quantity": totals["cross_zone_bytes"] / GB,
                "unit": "GB",
                "usd": totals["inter_az_usd"],
            },
            {
                "item": "S3 PUT-class requests",
                "quantity": 2_440_000 * n_days,
                "unit": "requests",
                "usd": totals["s3_requests_usd"] * 0.86,
            },
            {
                "item": "S3 GET-class requests",
                "quantity": 5_100_000 * n_days,
                "unit": "requests",
                "usd": totals["s3_requests_usd"] * 0.14,
            },
            {
                "item": "S3 storage",
                "quantity": None,
                "unit": "GB-month",
                "usd": totals["s3_storage_usd"],
            },
            {
                "item": "shared file system (fsx-ontap)",
                "quantity": None,
                "unit": "",
                "usd": totals["shared_fs_usd"],
            },
        ],
        warnings=[
            f"node proxy-c has no ledger for {days[min(13, n_days - 1)]}",
            "0.4% of the bytes have zone 'unknown' (not counted as cross-zone): map the "
            "clients' networks to zones ([cidrs] in the fleet TOML) or tag their client.id "
            "with zone=...",
        ],
        rejected=rejected,
    )


def empty_model() -> ReportModel:
    """What the job hands over for a period without a single ledger row."""
    zero = {"kafka_rf3": 0.0, "kafka_rf3_fetch_from_follower": 0.0}
    return ReportModel(
        period_from="",
        period_to="",
        prices={},
        totals={
            "cross_zone_bytes": 0,
            "total_bytes": 0,
            "payload_bytes": 0,
            "zonefleet_usd": 0.0,
            "counterfactual_usd": zero,
            "savings_usd": zero,
            "savings_fraction": {"kafka_rf3": None, "kafka_rf3_fetch_from_follower": None},
            "cross_zone_share_of_payload": None,
            "rejected_rows": 0,
        },
    )


SCRIPT_TOPIC = '<script>alert("topic")</script>'
HOSTILE_ZONE = '"><img src=x onerror=alert(1)>'
HOSTILE_FILE = "accounting/</td><script>alert('file')</script>.jsonl"


def hostile_model() -> ReportModel:
    """One day of huge figures with hostile names: a <script> topic, a zone and a file name
    built to break out of an attribute or a cell, 100 topics, names of 300 characters, and no
    flow logs or CUR."""
    model = sample_model(n_days=1, first="2027-02-28")
    scale = 3e6
    for row in model.daily:
        for key, value in list(row.items()):
            if key != "dt" and key != "savings_fraction" and isinstance(value, int | float):
                row[key] = type(value)(value * scale)
    for key in ("cross_zone_bytes", "total_bytes", "payload_bytes", "zonefleet_usd"):
        model.totals[key] *= scale
    names = [SCRIPT_TOPIC, "x" * 300, *(f"topic-{i:03d}." + "long" * 20 for i in range(98))]
    model.top_topics = [
        {
            "topic": name,
            "usd": 1e9 / (i + 1),
            "bytes": int(9e18 / (i + 1)),
            "cross_zone_bytes": int(1e17 / (i + 1)),
        }
        for i, name in enumerate(names)
    ]
    model.zone_matrix.append(
        {"from_zone": HOSTILE_ZONE, "to_zone": "us-east-1a", "bytes": 10**19, "cross_zone": True}
    )
    model.sources = [
        {**r, "flow_log_cross_zone_bytes": None, "cur_billed_bytes": None, "cur_billed_usd": None}
        for r in model.sources
    ]
    model.rejected.append(
        {
            "source": HOSTILE_FILE,
            "dt": None,
            "line": None,
            "lines": "",
            "reason": "<b>bad</b>",
            "rows": -1,
        }
    )
    model.warnings.append(f"topic {SCRIPT_TOPIC} & zone {HOSTILE_ZONE}")
    return model


def zero_cost_model() -> ReportModel:
    """Three days of rows that cost nothing at all (every fraction is a share of zero)."""
    model = sample_model(n_days=3)
    for row in model.daily:
        for key in row:
            if key != "dt":
                row[key] = None if key == "savings_fraction" else 0
    model.totals = _totals(model.daily, 0)
    model.totals["payload_bytes"] = 0
    model.totals["cross_zone_share_of_payload"] = None
    for rows in (model.by_channel, model.top_topics):
        for r in rows:
            r["usd"] = 0.0
    model.line_items = [{**r, "usd": 0.0} for r in model.line_items]
    return model


def main(argv: list[str]) -> int:
    from cost_report.html_report import render_html
    from tests.headless_chromium import launch, open_page

    if len(argv) != 1:
        print("usage: python -m tests.cost_report_samples OUT.png", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(render_html(sample_model()))
        with launch() as browser:
            open_page(browser, page.as_uri(), "true", screenshot=out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
