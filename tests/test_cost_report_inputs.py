"""Issue 10: the cost report's optional inputs, VPC Flow Logs and the AWS CUR 2.0, in real Spark.

The flow-log fixture is counted by hand below (docs/cost_report.md, "Flow logs and CUR"):
cross-zone, same-zone and unknown ends, flows captured at both ends counted once, a gzip'd
file with another field order, and bad lines rejected and counted by file and reason.
"""

from __future__ import annotations

import calendar
import gzip
import ipaddress
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cost_report.zones import ZoneMapError, load_zone_map, parse_zone_spec
from tests.spark_session import local_spark

D1, D2 = "2026-11-22", "2026-11-23"
T1 = calendar.timegm((2026, 11, 22, 10, 0, 0))
T2 = calendar.timegm((2026, 11, 23, 0, 0, 30))
GIB = 1 << 30

ZONES = (
    "az1:use1-az1=10.1.0.0/16,az2:use1-az2=10.2.0.0/16,az3:use1-az3=10.3.0.0/16,"
    "az2=10.1.5.0/24,az1=2600:1f18:1:100::/56,az2=2600:1f18:1:200::/56"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("test_cost_report_inputs")


# ---------------------------------------------------------------- the zone map (pure)


def test_zone_spec_longest_prefix_and_az_ids() -> None:
    zm = parse_zone_spec(ZONES)
    assert zm.names == ("az1", "az2", "az3")
    assert zm.zone_of_address("10.1.0.10") == "az1"
    assert zm.zone_of_address("10.1.5.9") == "az2"  # the /24 wins over the /16
    assert zm.zone_of_address("10.4.0.1") is None
    assert zm.zone_of_address("2600:1f18:1:1ff::1") == "az1"
    assert zm.zone_of_address("not-an-ip") is None
    assert zm.zone_of_az_id("use1-az2") == "az2"
    assert zm.zone_of_az_id("az3") == "az3"  # a zone name matches too
    assert zm.zone_of_az_id("use1-az9") is None
    # A zone named by its AZ id matches records' az-id directly.
    assert parse_zone_spec("use1-az4=10.9.0.0/16").zone_of_az_id("use1-az4") == "use1-az4"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("az1", "ZONE=CIDR"),
        ("az1=10.0.0.0/33", "not a CIDR block"),
        ("az1=10.0.0.0/8,az2=10.0.0.0/8", "two zones"),
        ("az1:use1-az1=10.0.0.0/8,az1:use1-az2=10.1.0.0/16", "two AZ ids"),
        ("", "names no network"),
    ],
)
def test_zone_spec_errors(spec: str, words: str) -> None:
    with pytest.raises(ZoneMapError, match=words):
        parse_zone_spec(spec)


def test_zone_map_from_fleet_toml(tmp_path: Path) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text(
        """
[[zones]]
name = "us-east-1a"
az_id = "use1-az1"
[[zones]]
name = "us-east-1b"
az_id = "use1-az2"

[cidrs]
"10.0.0.0/20" = "us-east-1a"
"10.0.16.0/20" = "use1-az2"     # an AZ id is a zone too

[[main_brokers]]
node_id = 1
zone = "use1-az1"
host = "10.0.99.7"              # outside every [cidrs] network: a host route
advertised_host = "10.0.99.7"
[[main_brokers]]
node_id = 2
zone = "us-east-1b"
host = "0.0.0.0"                # wildcard: not an address a flow log records
advertised_host = "broker-2.internal"
[[proxies]]
node_id = 101
zone = "auto"
host = "10.0.99.8"
"""
    )
    zm = load_zone_map(str(toml))
    assert zm.names == ("us-east-1a", "us-east-1b")
    assert zm.zone_of_address("10.0.3.4") == "us-east-1a"
    assert zm.zone_of_address("10.0.17.1") == "us-east-1b"
    assert zm.zone_of_address("10.0.99.7") == "us-east-1a"
    assert zm.zone_of_address("10.0.99.8") is None  # zone "auto": unknown from the file
    assert zm.zone_of_az_id("use1-az2") == "us-east-1b"

    arrays = tmp_path / "arrays.toml"
    arrays.write_text('[[cidrs]]\ncidr = "10.5.0.0/16"\nzone = "az5"\n')
    assert load_zone_map(str(arrays)).zone_of_address("10.5.1.1") == "az5"

    bad = tmp_path / "bad.toml"
    bad.write_text('[[zones]]\nname = "a"\n[cidrs]\n"10.0.0.0/8" = "b"\n')
    with pytest.raises(ZoneMapError, match=r"bad\.toml.*unknown zone 'b'"):
        load_zone_map(str(bad))
    bad.write_text('[cidrs]\n"10.0.0.300/8" = "b"\n')
    with pytest.raises(ZoneMapError, match=r"bad\.toml.*not a CIDR block"):
        load_zone_map(str(bad))
    with pytest.raises(ZoneMapError, match="cannot read"):
        load_zone_map(str(tmp_path / "missing.toml"))


def test_zone_map_agrees_with_the_fleets_own_parse(tmp_path: Path) -> None:
    """cost_report reads the fleet TOML without importing fleet: same zones, same networks."""
    from fleet.config import load_fleet_config, local_zones_fleet_toml

    toml = tmp_path / "fleet.toml"
    toml.write_text(
        local_zones_fleet_toml(tmp_path / "data", 19000, 3, "s" * 32)
        + '\n[cidrs]\n"10.1.0.0/16" = "use1-az1"\n"10.2.0.0/16" = "az2"\n'
        '"2600:1f18:1:300::/56" = "use1-az3"\n'
    )
    fleet = load_fleet_config(toml, discover=None)
    zm = load_zone_map(str(toml))
    assert {z.name: z.az_id for z in fleet.zones} == {z.name: z.az_id for z in zm.zones}
    assert fleet.cidrs == {str(net): zone for net, zone in zm.networks}


# ---------------------------------------------------------------- addresses in Spark


def test_address_zones_in_spark_match_python(spark: Any) -> None:
    from cost_report.flow_logs import with_address_zones

    zm = parse_zone_spec(ZONES + ",az3=0.0.0.0/1,az3=::/0")
    addrs = [
        "10.1.0.1",
        "10.1.5.255",
        "10.2.255.255",
        "127.0.0.1",
        "200.1.1.1",
        "256.1.1.1",
        "01.2.3.4",
        "1.2.3",
        "1.2.3.4.",
        " 1.2.3.4",
        "-",
        "",
        "::",
        "::1",
        "1::",
        "2600:1f18:1:100::5",
        "2600:1F18:1:2ff:ffff:ffff:ffff:ffff",
        "2600:1f18:1:300::",
        "2600:1f18:1:200:0:0:10.1.0.1",
        "::ffff:10.1.0.1",
        "1:2:3:4:5:6:7:8",
        "1:2:3:4:5:6:7::",
        "1::2::3",
        "1:2:3:4:5:6:7:8:9",
        ":::1",
        ":1:2:3:4:5:6:7",
        "12345::",
        "g::1",
        "1:2:3:4:5:6:7:1.2.3.4",
        "::1.2.3.256",
    ]
    df = spark.createDataFrame([(a,) for a in addrs], "a string")
    got = {r["a"]: (r["z"], r["z_ok"]) for r in with_address_zones(df, {"z": "a"}, zm).collect()}

    def valid(a: str) -> bool:
        try:
            ipaddress.ip_address(a)
        except ValueError:
            return False
        return True

    assert got == {a: (zm.zone_of_address(a), valid(a)) for a in addrs}


# ---------------------------------------------------------------- flow logs


def _flow_fixture(root: Path) -> dict[str, Path]:
    """Four files; the expected figures are in test_flow_logs_counted_once."""
    from cost_report.flow_logs import DEFAULT_FIELDS, FlowLogRecord, flow_records, write_flow_log

    e1 = T1 + 60
    records: list[Any] = [
        # 1. az1 -> az2, captured at both ends: cross 1000 once, 1000 double-captured.
        *flow_records("10.1.0.10", "10.2.0.20", 1000, T1, e1, "use1-az1", "use1-az2"),
        # 2. az1 -> az1, both ends: same 500, 500 double-captured.
        *flow_records("10.1.0.10", "10.1.0.11", 500, T1, e1, "use1-az1", "use1-az1"),
        # 3. az2 -> an address outside the map (S3, say): unknown 300.
        *flow_records("10.2.0.20", "52.216.1.1", 300, T1, e1, "use1-az2", None),
        # 4. the internet -> az3, only the receiver logs: counted (unknown 200).
        *flow_records("203.0.113.5", "10.3.0.5", 200, T1, e1, None, "use1-az3"),
        # 5. az1 -> 10.1.5.9, which the /24 puts in az2: cross 700 (tuple form).
        ("10.1.0.10", "10.1.5.9", 700, T1, e1, "use1-az1", "egress"),
        # 6. az-id '-': the interface's zone from its address (az3) -> az2: cross 80.
        FlowLogRecord("10.3.0.5", "10.2.0.20", 80, T1, e1, None, "egress"),
        # 7. no traffic: skipped, neither counted nor rejected.
        FlowLogRecord("-", "-", None, T1, e1, "use1-az1", "-", protocol=None, log_status="NODATA"),
        # 8. IPv6 az1 -> az2, both ends: cross 400, 400 double-captured.
        *flow_records(
            "2600:1f18:1:100::5", "2600:1f18:1:200::7", 400, T1, e1, "use1-az1", "use1-az2"
        ),
        # 9. starts on D2 (the file's folder says D1): az2 -> az3 cross 250 on D2.
        ("10.2.0.20", "10.3.0.5", 250, T2, T2 + 60, "use1-az2", "egress"),
    ]
    a = write_flow_log(root / "2026" / "11" / "22" / "a.log", records)
    good = " ".join(
        FlowLogRecord("10.1.0.1", "10.2.0.1", 9, T1, e1, "use1-az1", "egress").value(f)
        for f in DEFAULT_FIELDS
    )
    bad_lines = [
        "5 123456789012 - 10.1.0.1 10.2.0.1 1 2 6 1 100",  # too few fields
        good.replace(" 9 ", " 12x "),  # bad number in bytes
        good.replace("10.2.0.1", "-"),  # missing dstaddr
        good.replace(" OK ", " SKIPDATA "),
        good.replace("10.1.0.1", "10.1.0.300"),  # bad address in srcaddr
        good.replace("egress", "sideways"),
    ]
    with a.open("a") as f:
        f.write("\n".join(bad_lines) + "\n\n")  # a blank line is not a record
    fields = ("flow-direction", "az-id", "start", "end", "bytes", "dstaddr", "srcaddr", "version")
    b = write_flow_log(
        root / "2026" / "11" / "23" / "b.log.gz",
        [
            # az3 -> az1 both ends: cross 4000, 4000 double-captured.
            *flow_records("10.3.0.5", "10.1.0.10", 4000, T2, T2 + 60, "use1-az3", "use1-az1"),
            # From outside, only the receiver logs: unknown 60.
            *flow_records("198.51.100.1", "10.2.0.20", 60, T2, T2 + 60, None, "use1-az2"),
        ],
        fields,
    )
    c = root / "noheader.log"
    c.write_text("\n".join(good.split("\n")[0] for _ in range(2)) + "\n")
    d = root / "lacking.log"
    d.write_text(
        "version srcaddr dstaddr bytes start end flow-direction\n"
        f"5 10.1.0.1 10.2.0.1 100 {T1} {e1} egress\n"
    )
    return {"a": a, "b": b, "c": c, "d": d}


@pytest.fixture(scope="module")
def flow_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("flows")
    return root, _flow_fixture(root)


@pytest.fixture(scope="module")
def flow_result(spark: Any, flow_dir: tuple[Path, dict[str, Path]]) -> Any:
    from cost_report.flow_logs import read_flow_logs

    daily, rejected = read_flow_logs(spark, str(flow_dir[0]), parse_zone_spec(ZONES))
    return [r.asDict() for r in daily.collect()], rejected


def test_flow_logs_counted_once(flow_result: Any) -> None:
    from cost_report.flow_logs import DAILY_COLUMNS

    daily, _ = flow_result
    assert daily == [
        {
            "dt": D1,
            "cross_zone_bytes": 1000 + 700 + 80 + 400,
            "same_zone_bytes": 500,
            "unknown_zone_bytes": 300 + 200,
            "total_bytes": 2180 + 500 + 500,
            "double_captured_bytes": 1000 + 500 + 400,
            "records": 7,
        },
        {
            "dt": D2,
            "cross_zone_bytes": 250 + 4000,
            "same_zone_bytes": 0,
            "unknown_zone_bytes": 60,
            "total_bytes": 4310,
            "double_captured_bytes": 4000,
            "records": 3,
        },
    ]
    assert tuple(daily[0]) == DAILY_COLUMNS


def test_flow_logs_bad_input_rejected_and_counted(
    spark: Any, flow_result: Any, flow_dir: tuple[Path, dict[str, Path]]
) -> None:
    from cost_report import flow_logs as fl

    _, rejected = flow_result
    files = flow_dir[1]
    got = sorted((Path(r["source"]).name, r["reason"], r["rows"]) for r in rejected.collect())
    assert got == sorted(
        [
            ("a.log", fl.WRONG_FIELD_COUNT, 1),
            ("a.log", fl.bad_number("bytes"), 1),
            ("a.log", fl.missing("dstaddr"), 1),
            ("a.log", fl.SKIPDATA, 1),
            ("a.log", fl.bad_address("srcaddr"), 1),
            ("a.log", fl.BAD_DIRECTION, 1),
            ("noheader.log", fl.NO_HEADER, 2),
            ("lacking.log", fl.header_lacks(["az-id"]), 1),
        ]
    )
    # In the report's shape, with the file's line numbers.
    rows = fl.rejected_rows(spark, rejected)
    lines = files["a"].read_text().splitlines()
    by_reason = {r["reason"]: r for r in rows}
    skip = by_reason[fl.SKIPDATA]
    assert skip["source"].endswith("/a.log") and skip["rows"] == 1
    assert lines[skip["line"] - 1].split()[13] == "SKIPDATA"
    assert by_reason[fl.NO_HEADER]["lines"] == "1,2"
    assert sum(r["rows"] for r in rows) == 9


def test_flow_logs_period_and_one_file(spark: Any, flow_dir: tuple[Path, dict[str, Path]]) -> None:
    from cost_report.flow_logs import read_flow_logs

    zm = parse_zone_spec(ZONES)
    daily, rejected = read_flow_logs(spark, str(flow_dir[0]), zm, date_from=D2, date_to=D2)
    assert [(r["dt"], r["cross_zone_bytes"]) for r in daily.collect()] == [(D2, 4250)]
    # The gzip'd file alone, read by its own header.
    daily, rejected = read_flow_logs(spark, str(flow_dir[1]["b"]), zm)
    assert [(r["dt"], r["cross_zone_bytes"], r["unknown_zone_bytes"]) for r in daily.collect()] == [
        (D2, 4000, 60)
    ]
    assert rejected.count() == 0
    with pytest.raises(FileNotFoundError, match="flow logs"):
        read_flow_logs(spark, str(flow_dir[0] / "nothing-here"), zm)


def test_format_flow_log_records(tmp_path: Path) -> None:
    from cost_report.flow_logs import format_flow_log_records, write_flow_log

    text = format_flow_log_records(
        [("10.1.0.1", "10.2.0.1", 120, 60, 120, "use1-az1", "egress")],
        ("srcaddr", "dstaddr", "bytes", "start", "end", "az-id", "flow-direction", "packets"),
    )
    assert text == (
        "srcaddr dstaddr bytes start end az-id flow-direction packets\n"
        "10.1.0.1 10.2.0.1 120 60 120 use1-az1 egress -\n"
    )
    path = write_flow_log(tmp_path / "x.log.gz", [("a", "b", 1, 2, 3, None, "ingress")])
    assert gzip.decompress(path.read_bytes()).decode().splitlines()[1].split()[3:5] == ["a", "b"]


# ---------------------------------------------------------------- CUR 2.0


def _ts(day: str, hour: int) -> datetime:
    return datetime.fromisoformat(day).replace(hour=hour, tzinfo=UTC)


CUR_ROWS: list[tuple[Any, ...]] = [
    # usage type, GB, usd, resource id, start, tags, operation
    ("USE1-DataTransfer-Regional-Bytes", 2.0, 0.02, "i-aaa", _ts(D1, 10), {}, "InterZone-Out"),
    ("USE1-DataTransfer-Regional-Bytes", 1.0, 0.01, "i-aaa", _ts(D1, 23), {}, "InterZone-In"),
    (
        "USE1-DataTransfer-Regional-Bytes",
        0.5,
        0.005,
        "i-bbb",
        _ts(D1, 11),
        {"user_zonefleet_fleet": "prod"},
        "InterZone-In",
    ),
    ("DataTransfer-Regional-Bytes", 0.25, 0.0025, "i-aaa", _ts(D2, 0), {}, "InterZone-Out"),
    (
        "USE1-DataTransfer-Regional-Bytes",
        0.125,
        0.00125,
        "arn:aws:ec2:us-east-1:123456789012:instance/i-ccc",
        _ts(D2, 5),
        None,
        "InterZone-Out",
    ),
    # Not the fleet's: another instance, another fleet's tag.
    (
        "USE1-DataTransfer-Regional-Bytes",
        5.0,
        0.05,
        "i-zzz",
        _ts(D1, 12),
        {"user_zonefleet_fleet": "staging"},
        "InterZone-Out",
    ),
    # The fleet's, but other usage types.
    ("USE1-BoxUsage:m5.large", 24.0, 2.304, "i-aaa", _ts(D1, 0), {}, "RunInstances"),
    ("USE1-DataTransfer-Out-Bytes", 3.0, 0.27, "i-aaa", _ts(D1, 0), {}, "RunInstances"),
    ("USE1-DataTransfer-Regional-Bytes-x", 3.0, 0.27, "i-aaa", _ts(D1, 0), {}, "InterZone-In"),
    # The fleet's, no start date: rejected and counted.
    ("USE1-DataTransfer-Regional-Bytes", 1.0, 0.01, "i-aaa", None, {}, "InterZone-In"),
]


def _write_cur(spark: Any, root: Path, rows: list[tuple[Any, ...]], drop: str = "") -> Path:
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("line_item_usage_type", T.StringType()),
            T.StructField("line_item_usage_amount", T.DoubleType()),
            T.StructField("line_item_unblended_cost", T.DoubleType()),
            T.StructField("line_item_resource_id", T.StringType()),
            T.StructField("line_item_usage_start_date", T.TimestampType()),
            T.StructField("resource_tags", T.MapType(T.StringType(), T.StringType())),
            T.StructField("line_item_operation", T.StringType()),
        ]
    )
    df = spark.createDataFrame(rows, schema)
    if drop:
        df = df.drop(drop)
    data = root / "data" / "BILLING_PERIOD=2026-11"
    df.coalesce(1).write.mode("overwrite").parquet(str(data))
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    (root / "metadata" / "manifest.json").write_text('{"not": "parquet"}\n')
    return root


@pytest.fixture(scope="module")
def cur_dir(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_cur(spark, tmp_path_factory.mktemp("cur"), CUR_ROWS)


def _cur_daily(spark: Any, path: Path, flt: Any) -> tuple[list[dict[str, Any]], Any]:
    from cost_report.cur import read_cur

    daily, checks = read_cur(spark, str(path), flt)
    return [r.asDict() for r in daily.collect()], checks


def test_cur_fleet_resources_by_id(spark: Any, cur_dir: Path) -> None:
    from cost_report.cur import DAILY_COLUMNS, NO_START, CurFilter

    flt = CurFilter.from_cli("i-aaa,i-ccc", None)
    daily, checks = _cur_daily(spark, cur_dir, flt)
    assert tuple(daily[0]) == DAILY_COLUMNS
    assert [(r["dt"], r["line_items"]) for r in daily] == [(D1, 2), (D2, 2)]
    assert daily[0]["billed_gb"] == pytest.approx(3.0)
    assert daily[0]["billed_bytes"] == 3 * GIB
    assert daily[0]["billed_usd"] == pytest.approx(0.03)
    assert daily[1]["billed_gb"] == pytest.approx(0.375)
    assert daily[1]["billed_bytes"] == 3 * GIB // 8
    assert daily[1]["billed_usd"] == pytest.approx(0.00375)
    assert checks.warnings == []
    rejected = [r.asDict() for r in checks.rejected.collect()]
    assert [(r["reason"], r["rows"]) for r in rejected] == [(NO_START, 1)]
    assert rejected[0]["source"].endswith(".parquet")
    assert rejected[0]["samples"] == ["i-aaa USE1-DataTransfer-Regional-Bytes"]


def test_cur_fleet_resources_by_tag_and_both(spark: Any, cur_dir: Path) -> None:
    from cost_report.cur import CurFilter

    # The AWS tag key is matched as CUR 2.0 spells it (user_ + key, ':' -> '_').
    daily, _ = _cur_daily(spark, cur_dir, CurFilter.from_cli(None, "zonefleet:fleet=prod"))
    assert [(r["dt"], r["billed_gb"], r["line_items"]) for r in daily] == [(D1, 0.5, 1)]
    daily, _ = _cur_daily(spark, cur_dir, CurFilter.from_cli(["i-aaa"], "zonefleet:fleet=prod"))
    assert [(r["dt"], r["line_items"]) for r in daily] == [(D1, 3), (D2, 1)]
    assert daily[0]["billed_gb"] == pytest.approx(3.5)
    assert daily[1]["billed_gb"] == pytest.approx(0.25)


def test_cur_without_filter_takes_all_with_a_warning(spark: Any, cur_dir: Path) -> None:
    from cost_report.cur import NO_FILTER, read_cur

    daily, checks = read_cur(spark, str(cur_dir), None, date_from=D1, date_to=D1)
    rows = [r.asDict() for r in daily.collect()]
    assert [(r["dt"], r["line_items"]) for r in rows] == [(D1, 4)]
    assert rows[0]["billed_gb"] == pytest.approx(8.5)
    assert rows[0]["billed_usd"] == pytest.approx(0.085)
    assert checks.warnings == [NO_FILTER]


def test_cur_bad_input_is_named(spark: Any, tmp_path: Path) -> None:
    from cost_report.cur import CurFilter, CurSchemaError, read_cur

    no_cost = _write_cur(spark, tmp_path / "no_cost", CUR_ROWS[:2], drop="line_item_unblended_cost")
    with pytest.raises(CurSchemaError, match=r"no_cost.*line_item_unblended_cost"):
        read_cur(spark, str(no_cost), CurFilter(("i-aaa",)))
    no_tags = _write_cur(spark, tmp_path / "no_tags", CUR_ROWS[:2], drop="resource_tags")
    read_cur(spark, str(no_tags), CurFilter(("i-aaa",)))  # tags are needed for a tag filter only
    with pytest.raises(CurSchemaError, match=r"no_tags.*resource_tags"):
        read_cur(spark, str(no_tags), CurFilter.from_cli(None, "k=v"))
    with pytest.raises(FileNotFoundError, match="CUR"):
        read_cur(spark, str(tmp_path / "missing"), None)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        CurFilter.from_cli(None, "no-equals-sign")
