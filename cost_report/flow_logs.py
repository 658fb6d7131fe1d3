"""VPC Flow Logs in, cross-zone bytes per day out (Spark), and flow-log files out (for tests).

**Input.** AWS's text format (version 5 custom format): one record per line, fields separated
by spaces, each file beginning with a header line that names its fields in the order they
appear (``version account-id interface-id srcaddr dstaddr ... az-id flow-direction``), ``-``
for a value the record lacks. Files may be gzip'd (``.gz``; Spark reads them as text) and
nested in directories (AWS's ``AWSLogs/<account>/vpcflowlogs/<region>/YYYY/MM/DD/``). Each
file is parsed by its own header, so files of different layouts can be read together. The
fields used are ``srcaddr dstaddr bytes start end az-id flow-direction`` (and ``log-status``
when present). Parsing happens in Spark expressions, never row by row in Python.

**Zones.** The interface that captured a record is the source for ``flow-direction`` egress
and the destination for ingress. Its zone is the ``az-id`` of the record, mapped to a zone
name by the fleet's zone map (`cost_report.zones`); an ``az-id`` of ``-``, or one the map does
not know, falls back to the interface's address. The other end's zone is its address in the
map, longest prefix first. An address no network of the map holds has no zone (``unknown``).

**Counting each flow once.** A flow between two interfaces that both log appears twice: as an
egress record at the sender and as an ingress record at the receiver. The rule:

- every **egress** record is counted (the sender logged it);
- an **ingress** record is counted only when its source address is **outside the zone map**
  (the sender is not one of the VPC's logged interfaces, so no egress record exists);
- an ingress record whose source is in the map is not counted: the sender's egress record
  already counts that flow. Its bytes are shown as ``double_captured_bytes``.

This assumes flow logs are captured for every network in the map (a VPC-level flow log, or one
per subnet of the map). An address in the map whose interface does not log loses the flows it
sends.

**Per counted record**, bytes are ``cross_zone`` when both ends' zones are known and differ,
``same_zone`` when they are known and equal, ``unknown_zone`` when either end's zone is
unknown (never counted as cross-zone). The day is the UTC day of ``start``; a record spanning
midnight belongs to the day it started. Records with ``log-status`` NODATA carry no traffic
and are skipped.

**Bad input is counted, never dropped**: a file with no header line, or with header lines of
different layouts, or whose header lacks a needed field; a line with another number of fields
than its header; a ``-`` in a needed field other than ``az-id``; a bad number or address; a
flow-direction that is neither ingress nor egress; and ``log-status`` SKIPDATA (AWS lost
records of that interval) are all rows of the rejected table, by file and reason, with a few
of the lines.

Flow-log ``bytes`` are IP packet bytes: every packet's IP and TCP headers (40 bytes over IPv4,
60 over IPv6, 52/72 with TCP timestamps), pure ACKs, handshakes and retransmissions included.
The traffic ledger books application bytes (Kafka and RPC frames). So the flow logs read above
the ledger on the same traffic: by a few per cent on bulk transfers, up to about twice on small
messages such as a 100-byte confirm RPC.
"""

from __future__ import annotations

import gzip
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cost_report.zones import ZoneMap

__all__ = [
    "DAILY_COLUMNS",
    "DEFAULT_FIELDS",
    "REQUIRED_FIELDS",
    "FlowLogRecord",
    "flow_records",
    "format_flow_log_records",
    "read_flow_logs",
    "rejected_rows",
    "with_address_zones",
    "write_flow_log",
]

REQUIRED_FIELDS: Final = ("srcaddr", "dstaddr", "bytes", "start", "end", "az-id", "flow-direction")
NUMBER_FIELDS: Final = ("bytes", "start", "end")
ADDRESS_FIELDS: Final = ("srcaddr", "dstaddr")
# What format_flow_log_records writes by default: AWS's default format plus the v4/v5 fields
# the report needs.
DEFAULT_FIELDS: Final = (
    "version",
    "account-id",
    "interface-id",
    "srcaddr",
    "dstaddr",
    "srcport",
    "dstport",
    "protocol",
    "packets",
    "bytes",
    "start",
    "end",
    "action",
    "log-status",
    "az-id",
    "flow-direction",
)
DAILY_COLUMNS: Final = (
    "dt",
    "cross_zone_bytes",
    "same_zone_bytes",
    "unknown_zone_bytes",
    "total_bytes",
    "double_captured_bytes",
    "records",
)
SAMPLES_PER_REASON: Final = 5

# Reasons, worded once (tests and the report use them).
NO_HEADER: Final = (
    "no header line naming the fields (AWS's text format begins each file with one, e.g. "
    "'version srcaddr dstaddr bytes start end az-id flow-direction')"
)
MANY_HEADERS: Final = "header lines of different layouts in one file"
WRONG_FIELD_COUNT: Final = "malformed: not as many fields as the header names"
SKIPDATA: Final = "log-status SKIPDATA: AWS skipped records in this interval (bytes unknown)"
BAD_DIRECTION: Final = "flow-direction is neither ingress nor egress"


HEADER_LACKS: Final = "the header has no "


def header_lacks(names: Sequence[str]) -> str:
    return HEADER_LACKS + ", ".join(names)


def missing(name: str) -> str:
    return f"missing {name} ('-')"


def bad_number(name: str) -> str:
    return f"bad number in {name}"


def bad_address(name: str) -> str:
    return f"bad address in {name}"


# A header line: every token shaped like a field name. A record never is: its numbers start
# with a digit, its addresses hold '.' or ':', and a missing value is '-'.
_HEADER_LINE: Final = r"^\s*[a-z][a-z0-9-]*(\s+[a-z][a-z0-9-]*)+\s*$"
_BYTES: Final = r"^[0-9]{1,15}$"
_EPOCH_SECONDS: Final = r"^[0-9]{1,10}$"
_OCTET: Final = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4: Final = rf"^{_OCTET}(\.{_OCTET}){{3}}$"
_HEXTET: Final = "^[0-9a-f]{1,4}$"
_EMBEDDED_IPV4: Final = r"^(.*:)([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+)$"


# ---------------------------------------------------------------- addresses as Spark columns
#
# Addresses are parsed by Spark expressions, in stages: each stage is a select over the
# previous one's columns, so no expression is copied into the next (one nested expression per
# address grew past the JVM's 64 KB method limit and ran uncompiled, ~100 times slower).


def _no_groups() -> Column:
    return F.array().cast("array<string>")


def _ipv4_number(addr: Column) -> Column:
    """The address as a long, or null when it is not a dotted-quad IPv4 address."""
    number = F.aggregate(
        F.split(addr, r"\."), F.lit(0).cast("long"), lambda acc, o: acc * 256 + o.cast("long")
    )
    return F.when(addr.rlike(_IPV4), number)


def with_address_zones(
    df: DataFrame, columns: dict[str, str], zone_map: ZoneMap, *, valid_suffix: str = "_ok"
) -> DataFrame:
    """`df` with, for each ``out: address column`` of `columns`, a column `out` holding the zone
    of the longest prefix of `zone_map` that holds the address (null: none, or not an address)
    and a boolean column ``out + valid_suffix`` (the value is an IPv4 or IPv6 address). The
    same answers as `ZoneMap.zone_of_address`. IPv6 may be compressed (``::``) or end in a
    dotted quad (``::ffff:10.0.0.1``)."""
    keep = [F.col(c) for c in df.columns]

    def stage(frame: DataFrame, made: dict[str, Column]) -> DataFrame:
        return frame.select("*", *(c.alias(n) for n, c in made.items()))

    for out, addr in columns.items():
        t = f"__{out}_"
        a, quad, head = F.col(t + "a"), F.col(t + "quad"), F.col(t + "head")
        df = stage(df, {t + "a": F.lower(F.col(addr))})
        df = stage(
            df,
            {
                t + "v4": _ipv4_number(a),
                t + "quad": F.regexp_extract(a, _EMBEDDED_IPV4, 2),
                t + "head": F.regexp_extract(a, _EMBEDDED_IPV4, 1),
            },
        )
        df = stage(df, {t + "quad_v4": _ipv4_number(quad)})
        qn = F.col(t + "quad_v4")
        quad_hex = F.concat(
            F.lpad(F.lower(F.hex(F.floor(qn / 65536))), 4, "0"),
            F.lit(":"),
            F.lpad(F.lower(F.hex(qn % 65536)), 4, "0"),
        )
        df = stage(
            df,
            {
                t + "h": F.when(quad == "", a).when(qn.isNotNull(), F.concat(head, quad_hex)),
            },
        )
        h = F.col(t + "h")
        df = stage(df, {t + "halves": F.split(h, "::", -1)})
        halves = F.col(t + "halves")

        def groups(text: Column) -> Column:
            return F.when(text == "", _no_groups()).otherwise(F.split(text, ":"))

        compressed = F.size(halves) == 2
        df = stage(
            df,
            {
                t + "left": groups(F.try_element_at(halves, F.lit(1))),
                t + "right": F.when(
                    compressed, groups(F.try_element_at(halves, F.lit(2)))
                ).otherwise(_no_groups()),
            },
        )
        left, right = F.col(t + "left"), F.col(t + "right")
        explicit = F.size(left) + F.size(right)
        df = stage(
            df,
            {
                t + "groups": F.when(
                    compressed,
                    F.concat(
                        left, F.array_repeat(F.lit("0"), F.greatest(8 - explicit, F.lit(0))), right
                    ),
                ).otherwise(left),
                t + "form_ok": h.contains(":")
                & (F.size(halves) <= 2)
                & (~compressed | (explicit <= 7)),
            },
        )
        groups_col = F.col(t + "groups")
        bits = F.array_join(
            F.transform(groups_col, lambda g: F.lpad(F.conv(g, 16, 2), 16, "0")), delimiter=""
        )
        v6_ok = (
            F.col(t + "form_ok")
            & (F.size(groups_col) == 8)
            & F.forall(groups_col, lambda g: g.rlike(_HEXTET))
        )
        df = stage(df, {t + "v6": F.when(v6_ok, bits)})
        v4, v6 = F.col(t + "v4"), F.col(t + "v6")
        zone: Any = F
        for net, name in zone_map.networks:
            if isinstance(net, ipaddress.IPv4Network):
                lo, hi = int(net.network_address), int(net.broadcast_address)
                cond = (v4 >= F.lit(lo)) & (v4 <= F.lit(hi))
            else:
                prefix = format(int(net.network_address), "0128b")[: net.prefixlen]
                cond = v6.isNotNull() & (F.substring(v6, 1, net.prefixlen) == F.lit(prefix))
            zone = zone.when(cond, F.lit(name))
        keep += [
            (F.lit(None).cast("string") if zone is F else zone).alias(out),
            (v4.isNotNull() | v6.isNotNull()).alias(out + valid_suffix),
        ]
    return df.select(*keep)


def _az_zone(az_id: Column, zone_map: ZoneMap) -> Column:
    out: Any = F
    for spelling, zone in sorted(zone_map.az_ids().items()):
        out = out.when(az_id == F.lit(spelling), F.lit(zone))
    return F.lit(None).cast("string") if out is F else out


# ---------------------------------------------------------------- reading


def read_flow_logs(
    spark: SparkSession,
    path: str | Sequence[str],
    zone_map: ZoneMap,
    *,
    date_from: str | None = None,
    date_to: str | None = None,
) -> tuple[DataFrame, DataFrame]:
    """(daily, rejected) of the flow-log files under `path` (a file, a directory read
    recursively, or a list of them; ``.gz`` files are decompressed).

    `daily`: one row per UTC day of ``start`` (within `date_from`..`date_to` when given), with
    `DAILY_COLUMNS`: dt (YYYY-MM-DD), cross_zone_bytes, same_zone_bytes, unknown_zone_bytes,
    total_bytes (their sum), double_captured_bytes (ingress records not counted, see the
    module docstring) and records (counted records). `rejected`: source (the file), reason,
    rows, samples (up to 5 of the lines as they are in the file). Nothing runs until an
    action; the two share one cached aggregation, so the files are read once for both.
    """
    paths = [path] if isinstance(path, str) else list(path)
    try:
        text = spark.read.option("recursiveFileLookup", "true").text(paths)
    except Exception as exc:  # AnalysisException [PATH_NOT_FOUND]
        if "PATH_NOT_FOUND" in str(exc):
            raise FileNotFoundError(f"flow logs: {_first_line(exc)}") from None
        raise
    lines = text.select(F.input_file_name().alias("source"), F.col("value"))
    lines = lines.where(F.col("value").rlike(r"\S")).select(
        "source",
        "value",
        F.split(F.regexp_replace("value", r"^\s+|\s+$", ""), r"\s+").alias("tokens"),
        F.col("value").rlike(_HEADER_LINE).alias("is_header"),
    )
    # Each file's header (the text is scanned a second time for it: a filter, nothing parsed).
    headers = (
        lines.where("is_header")
        .groupBy("source")
        .agg(F.collect_set("tokens").alias("headers"))
        .select(
            "source",
            F.size("headers").alias("header_layouts"),
            F.try_element_at("headers", F.lit(1)).alias("header"),
        )
    )
    records = lines.where(~F.col("is_header")).join(F.broadcast(headers), "source", "left")
    checked = _checked(records, zone_map)
    bad = F.col("reason").isNotNull()
    keep = bad | (F.col("nodata") == F.lit(False))
    if date_from:
        keep = keep & (bad | (F.col("dt") >= F.lit(date_from)))
    if date_to:
        keep = keep & (bad | (F.col("dt") <= F.lit(date_to)))

    def good(c: Column) -> Column:
        return F.when(bad | ~F.col("counted"), F.lit(0)).otherwise(c)

    by = F.col("bytes")
    kind = F.col("kind")
    both = (
        checked.where(keep)
        .select(
            "reason",
            F.when(bad, F.col("source")).alias("source"),
            F.when(bad, F.col("value")).alias("value"),
            F.when(~bad, F.col("dt")).alias("dt"),
            good(F.when(kind == "cross", by).otherwise(0)).alias("cross"),
            good(F.when(kind == "same", by).otherwise(0)).alias("same"),
            good(F.when(kind == "unknown", by).otherwise(0)).alias("unknown"),
            good(F.lit(1)).alias("record"),
            F.when(~bad & ~F.col("counted"), by).otherwise(0).alias("double"),
        )
        .groupBy("reason", "source", "dt")
        .agg(
            F.sum("cross").alias("cross_zone_bytes"),
            F.sum("same").alias("same_zone_bytes"),
            F.sum("unknown").alias("unknown_zone_bytes"),
            F.sum("double").alias("double_captured_bytes"),
            F.sum("record").alias("records"),
            F.count(F.lit(1)).alias("rows"),
            F.slice(F.collect_list("value"), 1, SAMPLES_PER_REASON).alias("samples"),
        )
        .persist()
    )
    daily = (
        both.where(F.col("reason").isNull())
        .select(
            "dt",
            F.col("cross_zone_bytes").cast("long").alias("cross_zone_bytes"),
            F.col("same_zone_bytes").cast("long").alias("same_zone_bytes"),
            F.col("unknown_zone_bytes").cast("long").alias("unknown_zone_bytes"),
            (F.col("cross_zone_bytes") + F.col("same_zone_bytes") + F.col("unknown_zone_bytes"))
            .cast("long")
            .alias("total_bytes"),
            F.col("double_captured_bytes").cast("long").alias("double_captured_bytes"),
            F.col("records").cast("long").alias("records"),
        )
        .orderBy("dt")
    )
    rejected = both.where(F.col("reason").isNotNull()).select(
        "source", "reason", F.col("rows").cast("long").alias("rows"), "samples"
    )
    return daily, rejected


def _checked(records: DataFrame, zone_map: ZoneMap) -> DataFrame:
    """Every record line with its `reason` (null: usable), and for usable ones dt, bytes,
    kind (cross / same / unknown), counted (the count-once rule) and nodata."""
    tokens, header = F.col("tokens"), F.col("header")

    def value(name: str) -> Column:
        position = F.array_position(header, F.lit(name)).cast("int")
        return F.when(position > 0, F.try_element_at(tokens, position))

    lacking = F.filter(
        F.array(*(F.lit(n) for n in REQUIRED_FIELDS)), lambda n: ~F.array_contains(header, n)
    )
    raw = {name: value(name) for name in (*REQUIRED_FIELDS, "log-status")}
    status = F.coalesce(raw["log-status"], F.lit("OK"))
    # The checks that need no address parsed, in order; NODATA ends them (no traffic).
    early: Any = (
        F.when(header.isNull(), F.lit(NO_HEADER))
        .when(F.col("header_layouts") > 1, F.lit(MANY_HEADERS))
        .when(F.size(lacking) > 0, F.concat(F.lit(HEADER_LACKS), F.array_join(lacking, ", ")))
        .when(F.size(tokens) != F.size(header), F.lit(WRONG_FIELD_COUNT))
        .when(status == "NODATA", F.lit(None).cast("string"))
        .when(status == "SKIPDATA", F.lit(SKIPDATA))
    )
    for name in REQUIRED_FIELDS:
        if name != "az-id":  # '-': the interface's zone comes from its address
            early = early.when(raw[name] == "-", F.lit(missing(name)))
    for name in NUMBER_FIELDS:
        pattern = _BYTES if name == "bytes" else _EPOCH_SECONDS
        early = early.when(~raw[name].rlike(pattern), F.lit(bad_number(name)))
    fields_ = records.select(
        "source",
        "value",
        early.alias("early"),
        (F.col("header").isNotNull() & (status == "NODATA")).alias("nodata"),
        raw["srcaddr"].alias("srcaddr"),
        raw["dstaddr"].alias("dstaddr"),
        raw["bytes"].try_cast("long").alias("bytes"),
        raw["start"].try_cast("long").alias("start"),
        raw["az-id"].alias("az_id"),
        raw["flow-direction"].alias("direction"),
    )
    zoned = with_address_zones(
        fields_, {"src_zone": "srcaddr", "dst_zone": "dstaddr"}, zone_map
    ).select("*", _az_zone(F.col("az_id"), zone_map).alias("az_zone"))
    reason = (
        F.when(F.col("early").isNotNull() | F.col("nodata"), F.col("early"))
        .when(~F.col("src_zone_ok"), F.lit(bad_address("srcaddr")))
        .when(~F.col("dst_zone_ok"), F.lit(bad_address("dstaddr")))
        .when(~F.col("direction").isin("ingress", "egress"), F.lit(BAD_DIRECTION))
    )
    egress = F.col("direction") == "egress"
    local = F.coalesce(
        F.col("az_zone"), F.when(egress, F.col("src_zone")).otherwise(F.col("dst_zone"))
    )
    remote = F.when(egress, F.col("dst_zone")).otherwise(F.col("src_zone"))
    kind = (
        F.when(local.isNull() | remote.isNull(), F.lit("unknown"))
        .when(local == remote, F.lit("same"))
        .otherwise(F.lit("cross"))
    )
    return zoned.select(
        "source",
        "value",
        reason.alias("reason"),
        F.coalesce(F.col("nodata"), F.lit(False)).alias("nodata"),
        F.col("bytes"),
        F.date_from_unix_date(F.floor(F.col("start") / 86400).try_cast("int"))
        .cast("string")
        .alias("dt"),
        kind.alias("kind"),
        # The count-once rule (module docstring): egress always, ingress from outside the map.
        (egress | F.col("src_zone").isNull()).alias("counted"),
    )


def rejected_rows(
    spark: SparkSession, rejected: DataFrame, *, files_with_lines: int = 50
) -> list[dict[str, Any]]:
    """The rejected table collected in the report's shape: source, dt (None), line (the first
    rejected line's number), lines (up to 5, comma-separated), reason, rows. Line numbers are
    found by reading the file again (for the first `files_with_lines` groups only)."""
    from cost_report.spark_ledger import rejected_lines

    out: list[dict[str, Any]] = []
    rows = sorted(
        (r.asDict() for r in rejected.collect()), key=lambda r: (r["source"], r["reason"])
    )
    for n, r in enumerate(rows):
        found = rejected_lines(spark, r["source"], r["samples"]) if n < files_with_lines else []
        out.append(
            {
                "source": r["source"],
                "dt": None,
                "line": found[0] if found else None,
                "lines": ",".join(map(str, found)),
                "reason": r["reason"],
                "rows": int(r["rows"]),
            }
        )
    return out


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# ---------------------------------------------------------------- writing (tests, tools)


@dataclass(frozen=True)
class FlowLogRecord:
    """One flow-log record. The first seven fields are what the report reads; None is written
    as '-'. `packets` defaults to '-'."""

    srcaddr: str
    dstaddr: str
    bytes: int | None
    start: int
    end: int
    az_id: str | None
    flow_direction: str  # "ingress" or "egress"
    srcport: int | None = None
    dstport: int | None = None
    protocol: int | None = 6
    packets: int | None = None
    action: str | None = "ACCEPT"
    log_status: str | None = "OK"
    interface_id: str | None = None
    account_id: str | None = "123456789012"
    version: int | None = 5

    def value(self, field_name: str) -> str:
        attr = field_name.replace("-", "_")
        if attr not in _RECORD_FIELDS:
            return "-"
        v = getattr(self, attr)
        return "-" if v is None or v == "" else str(v)


_RECORD_FIELDS: Final = frozenset(f.name for f in dataclass_fields(FlowLogRecord))


def _record(r: FlowLogRecord | Sequence[Any]) -> FlowLogRecord:
    return r if isinstance(r, FlowLogRecord) else FlowLogRecord(*r)


def format_flow_log_records(
    records: Iterable[FlowLogRecord | Sequence[Any]], fields: Sequence[str] = DEFAULT_FIELDS
) -> str:
    """A flow-log file's text: the header line naming `fields`, then one line per record.
    A record is a `FlowLogRecord` or a tuple (srcaddr, dstaddr, bytes, start, end, az-id,
    flow-direction, ...more FlowLogRecord fields in order). A field the record has no value
    for (or does not know) is written '-'."""
    lines = [" ".join(fields)]
    for r in records:
        rec = _record(r)
        lines.append(" ".join(rec.value(f) for f in fields))
    return "\n".join(lines) + "\n"


def write_flow_log(
    path: Path,
    records: Iterable[FlowLogRecord | Sequence[Any]],
    fields: Sequence[str] = DEFAULT_FIELDS,
) -> Path:
    """Write `records` as a flow-log file at `path` (gzip'd when it ends in ``.gz``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = format_flow_log_records(records, fields).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def flow_records(
    srcaddr: str,
    dstaddr: str,
    nbytes: int,
    start: int,
    end: int,
    src_az_id: str | None,
    dst_az_id: str | None,
    **extra: Any,
) -> list[FlowLogRecord]:
    """The records AWS writes for one flow (one direction of a connection): an egress record
    at the sender's interface when it logs (`src_az_id` given) and an ingress record at the
    receiver's when it logs (`dst_az_id` given). A TCP connection is two flows: call this for
    each direction (e.g. conntrack's original and reply byte counts)."""
    out = []
    if src_az_id is not None:
        out.append(
            FlowLogRecord(srcaddr, dstaddr, nbytes, start, end, src_az_id, "egress", **extra)
        )
    if dst_az_id is not None:
        out.append(
            FlowLogRecord(srcaddr, dstaddr, nbytes, start, end, dst_az_id, "ingress", **extra)
        )
    return out
