"""What the Terraform deployment costs a month, and the traffic above which it beats Kafka.

Pure arithmetic, no I/O: terraform/README.md prints `markdown()` of the defaults, and
tests/test_terraform.py recomputes it and checks the README against it.

- **Infrastructure**: what `terraform/modules/zonefleet` creates at its defaults (instances,
  root volumes, NLBs, the WAL file system, the KMS key, the flow logs, the standing S3 requests
  of the fleet's own housekeeping), priced with the cost report's price sheet
  (`cost_report.prices`) where it has the rate, and with `InfraPrices` (us-east-1 on-demand
  list prices, sources named there) where it does not.
- **Break-even**: one steady day of a workload is priced with the cost report's own formulas
  (`cost_report.formulas.price_day`): zonefleet's transfer, S3 and shared file system against
  classic Kafka's (RF 3 over three AZs, the counterfactual). zonefleet also pays the
  infrastructure above (less the file system, which price_day already counts) and the NLBs'
  per-GB processing. Both bills are linear in the traffic, so the break-even is where the lines
  cross. Kafka's broker instances are not counted (the counterfactual leaves out compute), which
  makes the break-even an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from cost_report.formulas import KAFKA_ZONES, DailyUsage, price_day
from cost_report.prices import DEFAULT_PRICES, PriceSheet

__all__ = [
    "DEFAULT_DEPLOYMENT",
    "DEFAULT_INFRA_PRICES",
    "DEFAULT_WORKLOAD",
    "BreakEven",
    "Deployment",
    "InfraPrices",
    "LineItem",
    "Workload",
    "break_even",
    "infrastructure_monthly",
    "markdown",
    "monthly_bills",
]


@dataclass(frozen=True)
class InfraPrices:
    """us-east-1 on-demand list prices (USD) the cost report's price sheet does not carry.

    Sources (AWS pricing pages, checked for this file): EC2 On-Demand Linux; Elastic Load
    Balancing (NLB hour, NLCU hour: an NLCU is 1 GB processed per hour for TCP, or 800 new
    connections/s, or 100,000 active flows, whichever is highest); VPC (NAT gateway hour and
    GB; gateway endpoints free); AWS KMS (a customer managed key per month); CloudWatch vended
    logs delivered to S3 (first 10 TB); SSM Parameter Store (standard parameters free).
    """

    ec2_usd_per_hour: dict[str, float] = field(
        default_factory=lambda: {
            "m7i.large": 0.1008,
            "m7i.xlarge": 0.2016,
            "c7i.large": 0.08925,
            "r7i.large": 0.1323,
            "m6i.large": 0.096,
        }
    )
    nlb_usd_per_hour: float = 0.0225
    nlb_usd_per_nlcu_hour: float = 0.006
    nlcu_gb_per_hour: float = 1.0
    nat_gateway_usd_per_hour: float = 0.045
    kms_key_usd_per_month: float = 1.0
    vended_logs_s3_usd_per_gb: float = 0.25
    s3_gateway_endpoint_usd_per_hour: float = 0.0
    ssm_standard_parameter_usd_per_month: float = 0.0


@dataclass(frozen=True)
class Deployment:
    """The module's inputs that cost money (its defaults: `DEFAULT_DEPLOYMENT`)."""

    zones: int = 3
    mains_per_zone: int = 1
    proxy_instance_type: str = "m7i.large"
    main_instance_type: str = "m7i.large"
    root_volume_gb: float = 30.0
    shared_wal: str = "fsx-ontap"  # or "efs"
    fsx_storage_capacity_gb: float = 1024.0
    fsx_throughput_mbps: float = 128.0
    flow_log_max_aggregation_interval_s: float = 600.0
    # The fleet's own S3 housekeeping, from the fleet TOML's defaults (fleet/config.py): each
    # main polls the metadata document every poll_interval_s (a GET), every node heartbeats
    # every registration_interval_s (a PUT; the controller lease renews every third, one PUT),
    # and uploads its ledger every upload_interval_s (the range and its cursor: two PUTs).
    metadata_poll_interval_s: float = 0.5
    registration_interval_s: float = 5.0
    ledger_upload_interval_s: float = 600.0
    object_upload_interval_s: float = 60.0  # at least one object per main per interval
    # Flow-log volume: each ENI (every node and NLB) logs each of its flows as two records
    # (one per direction) per aggregation interval, of about record_bytes each.
    flows_per_eni: int = 100
    flow_log_record_bytes: int = 150

    @property
    def mains(self) -> int:
        return self.zones * self.mains_per_zone

    @property
    def nodes(self) -> int:
        return self.mains + self.zones


@dataclass(frozen=True)
class Workload:
    """Assumptions behind the break-even. Per GB produced, clients spread evenly over the zones,
    each through its zone's proxy."""

    fan_out: float = 1.0  # GB fetched by consumers per GB produced
    # zonefleet's own cross-zone bytes per produced byte (confirm RPCs of ~100 B per batch, the
    # state stream, metadata): 1 % is above what 64 KiB batches cause (~0.2 %).
    residual_cross_zone_fraction: float = 0.01
    # Shared-WAL bytes per produced byte: each payload is written once by its proxy and read
    # by the zone's peer proxies (KAFKA_ZONES - 1) and, 2 times in 3, by a main in another zone.
    wal_reads_per_produced_byte: float = (KAFKA_ZONES - 1) + (KAFKA_ZONES - 1) / KAFKA_ZONES


DEFAULT_INFRA_PRICES: Final = InfraPrices()
DEFAULT_DEPLOYMENT: Final = Deployment()
DEFAULT_WORKLOAD: Final = Workload()


@dataclass(frozen=True)
class LineItem:
    item: str
    quantity: str
    usd_per_month: float
    shared_fs: bool = False  # the WAL file system (price_day prices it too)


def _hours(prices: PriceSheet) -> float:
    return prices.days_per_month * 24


def infrastructure_monthly(
    deployment: Deployment = DEFAULT_DEPLOYMENT,
    prices: PriceSheet = DEFAULT_PRICES,
    infra: InfraPrices = DEFAULT_INFRA_PRICES,
    *,
    nat_gateways: int = 0,
) -> list[LineItem]:
    """The fixed monthly bill of the module at `deployment`, line by line (no traffic)."""
    d, hours = deployment, _hours(prices)
    seconds = hours * 3600
    items = [
        LineItem(
            f"EC2 proxies ({d.proxy_instance_type})",
            f"{d.zones} x {hours:g} h",
            d.zones * infra.ec2_usd_per_hour[d.proxy_instance_type] * hours,
        ),
        LineItem(
            f"EC2 mains ({d.main_instance_type})",
            f"{d.mains} x {hours:g} h",
            d.mains * infra.ec2_usd_per_hour[d.main_instance_type] * hours,
        ),
        LineItem(
            "EBS gp3 root volumes",
            f"{d.nodes} x {d.root_volume_gb:g} GB",
            d.nodes * d.root_volume_gb * prices.ebs_gp3_usd_per_gb_month,
        ),
    ]
    shared = replace(
        prices,
        shared_fs=d.shared_wal,
        fsx_ontap_capacity_gb=d.fsx_storage_capacity_gb,
        fsx_ontap_throughput_mbps=d.fsx_throughput_mbps,
    )
    if d.shared_wal == "efs":
        items.append(
            LineItem(
                "EFS storage (the WAL's average size; reads and writes are per GB)",
                f"{shared.efs_average_wal_gb:g} GB",
                shared.efs_average_wal_gb * shared.efs_storage_usd_per_gb_month,
                shared_fs=True,
            )
        )
    else:
        items.append(
            LineItem(
                "FSx for NetApp ONTAP Multi-AZ (SSD + throughput)",
                f"{d.fsx_storage_capacity_gb:g} GB, {d.fsx_throughput_mbps:g} MBps",
                d.fsx_storage_capacity_gb * shared.fsx_ontap_ssd_usd_per_gb_month
                + d.fsx_throughput_mbps * shared.fsx_ontap_throughput_usd_per_mbps_month,
                shared_fs=True,
            )
        )
    items.append(
        LineItem(
            "NLBs, one per zone (hours; per-GB processing is traffic)",
            f"{d.zones} x {hours:g} h",
            d.zones * infra.nlb_usd_per_hour * hours,
        )
    )
    items.append(
        LineItem(
            "S3 gateway endpoint",
            "1",
            infra.s3_gateway_endpoint_usd_per_hour * hours,
        )
    )
    items.append(LineItem("KMS customer managed key", "1", infra.kms_key_usd_per_month))
    items.append(
        LineItem(
            "SSM SecureString parameter (standard)",
            "1",
            infra.ssm_standard_parameter_usd_per_month,
        )
    )
    records = (d.nodes + d.zones) * d.flows_per_eni * 2 * seconds
    records /= d.flow_log_max_aggregation_interval_s
    flow_gb = records * d.flow_log_record_bytes / prices.bytes_per_gb
    items.append(
        LineItem(
            "VPC flow logs to S3 (delivery + storage)",
            f"{flow_gb:.2f} GB",
            flow_gb * (infra.vended_logs_s3_usd_per_gb + prices.s3_storage_usd_per_gb_month),
        )
    )
    gets = d.mains * seconds / d.metadata_poll_interval_s
    puts = d.nodes * seconds / d.registration_interval_s
    puts += seconds / (3 * d.registration_interval_s)  # the controller lease
    puts += d.nodes * 2 * seconds / d.ledger_upload_interval_s
    puts += d.mains * seconds / d.object_upload_interval_s
    items.append(
        LineItem(
            "S3 requests of the fleet's housekeeping",
            f"{puts / 1e6:.2f} M PUT, {gets / 1e6:.2f} M GET",
            puts / 1000 * prices.s3_put_usd_per_1000 + gets / 1000 * prices.s3_get_usd_per_1000,
        )
    )
    if nat_gateways:
        items.append(
            LineItem(
                "NAT gateway (the example's; per GB: boot-time installs only)",
                f"{nat_gateways} x {hours:g} h",
                nat_gateways * infra.nat_gateway_usd_per_hour * hours,
            )
        )
    return items


@dataclass(frozen=True)
class BreakEven:
    fixed_usd_per_month: float  # zonefleet with no traffic
    zonefleet_usd_per_gb: float  # per GB produced
    kafka_usd_per_gb: float
    kafka_ffr_usd_per_gb: float  # with fetch from follower
    gb_per_month: float | None  # None: zonefleet never costs less
    gb_per_month_ffr: float | None


def _day(
    produced_gb: float, deployment: Deployment, prices: PriceSheet, workload: Workload
) -> tuple[float, float, float]:
    """zonefleet's and Kafka's (plain, fetch from follower) cost of one steady day on which
    `produced_gb` are produced, from the report's own formulas; zonefleet's without the fixed
    infrastructure other than the file system."""
    gb = prices.bytes_per_gb
    produce = round(produced_gb * gb)
    fetch = round(produced_gb * workload.fan_out * gb)
    cross = round(produced_gb * workload.residual_cross_zone_fraction * gb)
    usage = DailyUsage(
        dt="steady",
        cross_zone_bytes=cross,
        cross_zone_bytes_without_wal=cross,
        wal_bytes_outside_preferred_az=0,
        s3_put_requests=0,  # counted as housekeeping, one object per main per interval
        s3_get_requests=0,
        produce_bytes=produce,
        fetch_bytes=fetch,
        other_client_bytes=0,
        wal_read_bytes=round(produce * workload.wal_reads_per_produced_byte),
        wal_write_bytes=produce,
    )
    stored = round(produce * prices.retention_days)
    sheet = replace(
        prices,
        shared_fs=deployment.shared_wal,
        fsx_ontap_capacity_gb=deployment.fsx_storage_capacity_gb,
        fsx_ontap_throughput_mbps=deployment.fsx_throughput_mbps,
    )
    cost = price_day(usage, stored, sheet)
    return cost.zonefleet_usd, cost.kafka_rf3_usd, cost.kafka_rf3_fetch_from_follower_usd


def monthly_bills(
    produced_gb_per_month: float,
    deployment: Deployment = DEFAULT_DEPLOYMENT,
    prices: PriceSheet = DEFAULT_PRICES,
    infra: InfraPrices = DEFAULT_INFRA_PRICES,
    workload: Workload = DEFAULT_WORKLOAD,
) -> tuple[float, float, float]:
    """(zonefleet, Kafka RF 3, Kafka RF 3 with fetch from follower) a month, for a month of
    steady days producing `produced_gb_per_month` in all."""
    month = prices.days_per_month
    items = infrastructure_monthly(deployment, prices, infra)
    # price_day counts the file system itself; the rest of the infrastructure is added here.
    other_fixed = sum(i.usd_per_month for i in items if not i.shared_fs)
    # The NLB bills the bytes it processes: every client byte, produced and fetched.
    nlb_per_gb = (1 + workload.fan_out) * infra.nlb_usd_per_nlcu_hour / infra.nlcu_gb_per_hour
    zonefleet, kafka, kafka_ffr = _day(produced_gb_per_month / month, deployment, prices, workload)
    return (
        zonefleet * month + other_fixed + produced_gb_per_month * nlb_per_gb,
        kafka * month,
        kafka_ffr * month,
    )


def break_even(
    deployment: Deployment = DEFAULT_DEPLOYMENT,
    prices: PriceSheet = DEFAULT_PRICES,
    infra: InfraPrices = DEFAULT_INFRA_PRICES,
    workload: Workload = DEFAULT_WORKLOAD,
) -> BreakEven:
    """Monthly produced GB above which zonefleet (infrastructure + its traffic) costs less than
    classic Kafka's transfer and disks for the same traffic. Both bills are linear in the
    traffic: intercept and slope come from the bills of 0 and of 1000 GB a month."""
    step = 1000.0
    z0, k0, kf0 = monthly_bills(0.0, deployment, prices, infra, workload)
    z1, k1, kf1 = monthly_bills(step, deployment, prices, infra, workload)
    zonefleet_per_gb = (z1 - z0) / step
    kafka_per_gb, kafka_ffr_per_gb = (k1 - k0) / step, (kf1 - kf0) / step

    def crossing(kafka_fixed: float, per_gb: float) -> float | None:
        if per_gb <= zonefleet_per_gb:
            return None
        return (z0 - kafka_fixed) / (per_gb - zonefleet_per_gb)

    return BreakEven(
        fixed_usd_per_month=z0,
        zonefleet_usd_per_gb=zonefleet_per_gb,
        kafka_usd_per_gb=kafka_per_gb,
        kafka_ffr_usd_per_gb=kafka_ffr_per_gb,
        gb_per_month=crossing(k0, kafka_per_gb),
        gb_per_month_ffr=crossing(kf0, kafka_ffr_per_gb),
    )


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def _gb(value: float | None) -> str:
    return "never" if value is None else f"{value:,.0f} GB"


def markdown(
    deployment: Deployment = DEFAULT_DEPLOYMENT,
    prices: PriceSheet = DEFAULT_PRICES,
    infra: InfraPrices = DEFAULT_INFRA_PRICES,
    workload: Workload = DEFAULT_WORKLOAD,
) -> str:
    """The README's cost section: a table per shared WAL, and the break-even of each."""
    out: list[str] = []
    for wal in ("fsx-ontap", "efs"):
        d = replace(deployment, shared_wal=wal)
        items = infrastructure_monthly(d, prices, infra)
        out.append(f'**shared_wal = "{wal}"**\n')
        out.append("| item | quantity | USD / month |")
        out.append("|---|---|---:|")
        out += [f"| {i.item} | {i.quantity} | {_usd(i.usd_per_month)} |" for i in items]
        total = sum(i.usd_per_month for i in items)
        out.append(f"| **module total** | | **{_usd(total)}** |")
        nat = infrastructure_monthly(d, prices, infra, nat_gateways=1)[-1]
        out.append(f"| {nat.item} | {nat.quantity} | {_usd(nat.usd_per_month)} |")
        with_nat = _usd(total + nat.usd_per_month)
        out.append(f"| **with the example's NAT gateway** | | **{with_nat}** |")
        b = break_even(d, prices, infra, workload)
        out.append("")
        line = (
            f"zonefleet costs {_usd(b.fixed_usd_per_month)} a month with no traffic and "
            f"${b.zonefleet_usd_per_gb:.4f} per GB produced; classic Kafka (RF "
            f"{prices.kafka_replication_factor}, three AZs) costs ${b.kafka_usd_per_gb:.4f} per GB "
            f"produced (${b.kafka_ffr_usd_per_gb:.4f} with fetch from follower). "
        )
        if b.gb_per_month is None:
            line += "**zonefleet never costs less**: its cost per GB is above Kafka's."
        else:
            line += (
                f"**Break-even: {_gb(b.gb_per_month)} produced a month** "
                f"({_gb(b.gb_per_month_ffr)} against Kafka with fetch from follower)."
            )
        out.append(line + "\n")
    out.append(
        f"Assumptions: consumers fetch {workload.fan_out:g} GB per GB produced (fan-out); "
        f"zonefleet's own cross-zone traffic is {workload.residual_cross_zone_fraction:.0%} of "
        f"the produced bytes; each produced byte is read "
        f"{workload.wal_reads_per_produced_byte:.3g} times from the shared WAL; data is kept "
        f"{prices.retention_days:g} days (S3 for "
        f"zonefleet, EBS x {prices.kafka_replication_factor} for Kafka); the shared file "
        f"system's NFS traffic is not billed as inter-AZ transfer (shared_fs_billing = "
        f'"{prices.shared_fs_billing}"); a month is {_hours(prices):g} hours; Kafka\'s broker '
        f"instances are not counted."
    )
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown())
