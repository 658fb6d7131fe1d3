"""The cost formulas, as plain arithmetic: zonefleet's bill and classic Kafka's, per day.

Pure functions with no Spark and no I/O. `inter_az_usd` uses operators only, so it prices a
Spark Column (the per-topic and per-channel tables) as well as an int (the daily figures on the
driver). docs/cost_report.md writes the formulas out with a worked example; the golden test
(tests/test_cost_report_formulas.py) checks that example to the cent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Final

from cost_report.prices import PriceSheet

__all__ = [
    "FREE_S3_OPS",
    "GET_S3_OPS",
    "KAFKA_ZONES",
    "DailyCost",
    "DailyUsage",
    "inter_az_usd",
    "price_day",
    "stored_bytes_by_day",
]

# Classic Kafka spread over three AZs with leaders (and replicas) evenly placed: a client's
# leader sits in another zone 2 times in 3.
KAFKA_ZONES: Final = 3
GET_S3_OPS: Final = frozenset({"GetObject", "HeadObject"})
# DELETE and aborting a multipart upload cost nothing; every other operation is PUT-class.
FREE_S3_OPS: Final = frozenset({"DeleteObjects", "DeleteObject", "AbortMultipartUpload"})


def inter_az_usd(cross_zone_bytes: Any, prices: PriceSheet) -> Any:
    """Transfer cost of bytes that crossed an AZ boundary: billed on the sending and on the
    receiving side."""
    return cross_zone_bytes * (2 * prices.inter_az_usd_per_gb_each_side / prices.bytes_per_gb)


@dataclass(frozen=True)
class DailyUsage:
    """One day's traffic as the ledgers booked it (bytes unless named otherwise)."""

    dt: str
    cross_zone_bytes: int  # rows with cross_zone true (the ledgers' own flag)
    cross_zone_bytes_without_wal: int  # the same without the shared file system's rows
    wal_bytes_outside_preferred_az: int  # WAL rows of nodes outside the file system's AZ
    s3_put_requests: int  # billable PUT-class requests
    s3_get_requests: int
    produce_bytes: int  # kafka-client Produce, both directions
    fetch_bytes: int  # kafka-client Fetch, both directions
    other_client_bytes: int  # every other kafka-client API
    wal_read_bytes: int
    wal_write_bytes: int


@dataclass(frozen=True)
class DailyCost:
    dt: str
    inter_az_usd: float
    s3_requests_usd: float
    s3_storage_usd: float
    shared_fs_usd: float
    zonefleet_usd: float
    # The inter-AZ transfer of the two ways of billing the shared file system.
    inter_az_regional_usd: float
    inter_az_preferred_az_usd: float
    kafka_transfer_usd: float
    kafka_transfer_ffr_usd: float
    kafka_ebs_usd: float
    kafka_rf3_usd: float
    kafka_rf3_fetch_from_follower_usd: float
    stored_bytes: int

    @property
    def savings_usd(self) -> float:
        return self.kafka_rf3_usd - self.zonefleet_usd

    @property
    def savings_ffr_usd(self) -> float:
        return self.kafka_rf3_fetch_from_follower_usd - self.zonefleet_usd


def stored_bytes_by_day(produce_bytes: dict[str, int], retention_days: float) -> dict[str, int]:
    """What the log holds at the end of each day: the produce bytes of the last
    `retention_days` days (rounded, at least 1) that are in the data. Days before the first
    day in the data are not known, so the first days of a period are an underestimate."""
    window = max(1, round(retention_days))
    days = sorted(produce_bytes)
    out: dict[str, int] = {}
    for i, day in enumerate(days):
        first = (date.fromisoformat(day) - timedelta(days=window - 1)).isoformat()
        out[day] = sum(produce_bytes[d] for d in days[max(0, i - window) : i + 1] if d >= first)
    return out


def price_day(usage: DailyUsage, stored_bytes: int, prices: PriceSheet) -> DailyCost:
    """zonefleet's cost and classic Kafka's for one day of traffic."""
    gb = prices.bytes_per_gb
    per_day = 1.0 / prices.days_per_month
    regional = inter_az_usd(usage.cross_zone_bytes_without_wal, prices)
    preferred = inter_az_usd(
        usage.cross_zone_bytes_without_wal + usage.wal_bytes_outside_preferred_az, prices
    )
    transfer = preferred if prices.shared_fs_billing == "preferred-az" else regional
    s3_requests = (
        usage.s3_put_requests * prices.s3_put_usd_per_1000
        + usage.s3_get_requests * prices.s3_get_usd_per_1000
    ) / 1000
    s3_storage = stored_bytes / gb * prices.s3_storage_usd_per_gb_month * per_day
    if prices.shared_fs == "efs":
        shared_fs = (
            usage.wal_read_bytes / gb * prices.efs_read_usd_per_gb
            + usage.wal_write_bytes / gb * prices.efs_write_usd_per_gb
            + prices.efs_average_wal_gb * prices.efs_storage_usd_per_gb_month * per_day
        )
    else:
        shared_fs = (
            prices.fsx_ontap_capacity_gb * prices.fsx_ontap_ssd_usd_per_gb_month
            + prices.fsx_ontap_throughput_mbps * prices.fsx_ontap_throughput_usd_per_mbps_month
        ) * per_day
    zonefleet = transfer + s3_requests + s3_storage + shared_fs

    remote = (KAFKA_ZONES - 1) / KAFKA_ZONES
    copies = prices.kafka_replication_factor - 1
    to_leaders = remote * (usage.produce_bytes + usage.other_client_bytes)
    replication = copies * usage.produce_bytes
    kafka_transfer = inter_az_usd(to_leaders + replication + remote * usage.fetch_bytes, prices)
    # Fetch from follower (KIP-392): every zone holds a replica, so consumers read locally.
    kafka_transfer_ffr = inter_az_usd(to_leaders + replication, prices)
    ebs = (
        stored_bytes
        * prices.kafka_replication_factor
        / gb
        * prices.ebs_gp3_usd_per_gb_month
        * per_day
    )
    return DailyCost(
        dt=usage.dt,
        inter_az_usd=transfer,
        s3_requests_usd=s3_requests,
        s3_storage_usd=s3_storage,
        shared_fs_usd=shared_fs,
        zonefleet_usd=zonefleet,
        inter_az_regional_usd=regional,
        inter_az_preferred_az_usd=preferred,
        kafka_transfer_usd=kafka_transfer,
        kafka_transfer_ffr_usd=kafka_transfer_ffr,
        kafka_ebs_usd=ebs,
        kafka_rf3_usd=kafka_transfer + ebs,
        kafka_rf3_fetch_from_follower_usd=kafka_transfer_ffr + ebs,
        stored_bytes=stored_bytes,
    )
