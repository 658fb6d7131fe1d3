"""What the report shows, as plain data: the aggregates the Spark job hands to its renderers.

The job computes every number in Spark and collects only these small aggregates to the driver
(a row per day, per zone pair, per channel, per top topic). `summary.json` and `report.html`
are both rendered from one `ReportModel`, so the page and the file never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ReportModel"]


@dataclass
class ReportModel:
    """Every figure of one report. Rows are dicts of JSON scalars; byte counts are ints, money
    is float US dollars. Lists are sorted as they are shown (days ascending, others by size)."""

    period_from: str  # "YYYY-MM-DD", inclusive
    period_to: str  # "YYYY-MM-DD", inclusive
    # Every price used, by name (see cost_report.prices.PriceSheet), e.g. "inter_az_usd_per_gb".
    prices: dict[str, Any]
    # Period totals: cross_zone_bytes, total_bytes, payload_bytes, cross_zone_payload_bytes,
    # unknown_zone_bytes, zonefleet_usd, counterfactual_usd {kafka_rf3,
    # kafka_rf3_fetch_from_follower}, savings_usd and savings_fraction (same keys),
    # rejected_rows.
    totals: dict[str, Any]
    # One row per day: dt, cross_zone_bytes, inter_az_usd, s3_requests_usd, s3_storage_usd,
    # shared_fs_usd, zonefleet_usd, kafka_rf3_usd, kafka_rf3_fetch_from_follower_usd,
    # savings_usd, savings_fraction.
    daily: list[dict[str, Any]] = field(default_factory=list)
    # One row per (from_zone, to_zone): bytes, cross_zone (bool).
    zone_matrix: list[dict[str, Any]] = field(default_factory=list)
    # One row per channel: channel, bytes, cross_zone_bytes, usd.
    by_channel: list[dict[str, Any]] = field(default_factory=list)
    # The top topics by cost: topic, bytes, cross_zone_bytes, usd.
    top_topics: list[dict[str, Any]] = field(default_factory=list)
    # One row per day: dt, ledger_cross_zone_bytes, ledger_inter_az_usd, and where given
    # flow_log_cross_zone_bytes, cur_billed_bytes, cur_billed_usd (else None).
    sources: list[dict[str, Any]] = field(default_factory=list)
    # The shared file system's bill both ways: regional_usd, preferred_az_usd, preferred_az,
    # billed_as ("regional" or "preferred-az": the view the totals use).
    shared_fs: dict[str, Any] = field(default_factory=dict)
    # Line items of zonefleet's cost for the period: item, quantity, unit, usd.
    line_items: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Rejected input, grouped: source (file), line (first line, or None), reason, rows.
    rejected: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
