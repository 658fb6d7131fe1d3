"""The price sheet: every rate the report multiplies by, with us-east-1 list prices as defaults.

A TOML file overrides any of them; a key the sheet does not know, or a value of the wrong type,
is refused with the file and line, because a typo in a price silently falling back to the
default would make a wrong bill look right. The report prints every price it used.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

__all__ = ["DEFAULT_PRICES", "PriceSheet", "PriceSheetError", "load_prices"]

SHARED_FS_KINDS: Final = ("fsx-ontap", "efs")
SHARED_FS_BILLING: Final = ("regional", "preferred-az")


class PriceSheetError(ValueError):
    """A price sheet that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class PriceSheet:
    """Rates in US dollars. `bytes_per_gb` is AWS's billing gigabyte (2**30 bytes)."""

    region: str = "us-east-1"
    bytes_per_gb: int = 1 << 30
    # Inter-AZ transfer is billed on each side: a byte that crosses costs twice this.
    inter_az_usd_per_gb_each_side: float = 0.01
    s3_put_usd_per_1000: float = 0.005  # PUT, COPY, POST, LIST
    s3_get_usd_per_1000: float = 0.0004  # GET, HEAD
    s3_storage_usd_per_gb_month: float = 0.023
    ebs_gp3_usd_per_gb_month: float = 0.08
    # How long data stays: S3 objects for zonefleet, broker disks (x replication) for Kafka.
    retention_days: float = 7.0
    kafka_replication_factor: int = 3
    # The shared file system (the WAL). Which AWS service, and whether NFS traffic from other
    # AZs is billed as inter-AZ transfer: "regional" (not billed) or "preferred-az" (billed for
    # every node outside `shared_fs_preferred_az`; empty = the first zone in the ledgers).
    shared_fs: str = "fsx-ontap"
    shared_fs_billing: str = "regional"
    shared_fs_preferred_az: str = ""
    # FSx for NetApp ONTAP (Multi-AZ, us-east-1 list prices; check AWS's page for yours):
    # provisioned SSD capacity and throughput, prorated per day.
    fsx_ontap_ssd_usd_per_gb_month: float = 0.25
    fsx_ontap_throughput_usd_per_mbps_month: float = 1.20
    fsx_ontap_capacity_gb: float = 1024.0
    fsx_ontap_throughput_mbps: float = 128.0
    # EFS (Elastic throughput): per GB read and written, and the WAL's average size.
    efs_read_usd_per_gb: float = 0.03
    efs_write_usd_per_gb: float = 0.06
    efs_storage_usd_per_gb_month: float = 0.30
    efs_average_wal_gb: float = 50.0
    days_per_month: float = 30.4375  # AWS prorates GB-months by the hour: 730 h a month

    def validate(self) -> None:
        if self.shared_fs not in SHARED_FS_KINDS:
            raise PriceSheetError(f"shared_fs must be one of {SHARED_FS_KINDS}: {self.shared_fs!r}")
        if self.shared_fs_billing not in SHARED_FS_BILLING:
            raise PriceSheetError(
                f"shared_fs_billing must be one of {SHARED_FS_BILLING}: {self.shared_fs_billing!r}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise PriceSheetError(f"{f.name} must not be negative: {value}")
        if self.bytes_per_gb <= 0 or self.days_per_month <= 0:
            raise PriceSheetError("bytes_per_gb and days_per_month must be positive")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT_PRICES: Final = PriceSheet()

_FIELD_TYPES: Final = {f.name: type(getattr(DEFAULT_PRICES, f.name)) for f in fields(PriceSheet)}


def _line_of(text: str, key: str) -> int | None:
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=", re.MULTILINE)
    m = pattern.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _where(path: Path, text: str, key: str) -> str:
    line = _line_of(text, key)
    return f"{path}:{line}" if line else str(path)


def load_prices(path: str | Path | None) -> PriceSheet:
    """The defaults, overridden by the TOML file at `path` (top level or a ``[prices]`` table)."""
    if path is None:
        return DEFAULT_PRICES
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise PriceSheetError(f"{p}: cannot read the price sheet: {exc.strerror}") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PriceSheetError(f"{p}: not valid TOML: {exc}") from exc
    table = doc.get("prices", doc) if isinstance(doc.get("prices"), dict) else doc
    changes: dict[str, Any] = {}
    for key, value in table.items():
        want = _FIELD_TYPES.get(key)
        if want is None:
            near = _closest(key)
            hint = f" (did you mean {near!r}?)" if near else ""
            raise PriceSheetError(f"{_where(p, text, key)}: unknown price {key!r}{hint}")
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or isinstance(value, bool):
            raise PriceSheetError(
                f"{_where(p, text, key)}: {key} must be a {want.__name__}, not {value!r}"
            )
        changes[key] = value
    sheet = replace(DEFAULT_PRICES, **changes)
    try:
        sheet.validate()
    except PriceSheetError as exc:
        raise PriceSheetError(f"{p}: {exc}") from exc
    return sheet


def _closest(key: str) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, list(_FIELD_TYPES), n=1, cutoff=0.6)
    return match[0] if match else None
