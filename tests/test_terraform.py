"""terraform/: formatting, parsing, the provider-free layout module run for real (terraform
validate, terraform test, apply), its rendered fleet TOMLs loaded by fleet/config.py, checkov,
what the AWS module must guarantee (read from its parsed HCL), and the README's costs.

No provider can be downloaded here, so only the layout module runs; the AWS module is checked
statically (docs: terraform/README.md).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cost_report import infrastructure
from cost_report.prices import DEFAULT_PRICES
from fleet.config import ConfigError, FleetConfig, load_fleet_config
from tests.terraform_cli import (
    CHECKOV,
    EXAMPLE_DIR,
    LAYOUT_DIR,
    MODULE_DIR,
    REPO,
    TERRAFORM_DIR,
    copy_module,
    load_hcl,
    module_blocks,
    output_json,
    run_terraform,
    variable_defaults,
)

README = TERRAFORM_DIR / "README.md"
COST_BEGIN, COST_END = "<!-- cost:begin -->", "<!-- cost:end -->"


# ---------------------------------------------------------------- the files themselves


def test_terraform_fmt_check(tmp_path: Path) -> None:
    proc = run_terraform(
        ["fmt", "-check", "-recursive", "-diff", str(TERRAFORM_DIR)], REPO, tmp_path, check=False
    )
    assert proc.returncode == 0, f"terraform fmt would change files:\n{proc.stdout}{proc.stderr}"


def test_every_terraform_file_parses_with_python_hcl2() -> None:
    files = sorted([*TERRAFORM_DIR.rglob("*.tf"), *TERRAFORM_DIR.rglob("*.tftest.hcl")])
    assert len(files) >= 20
    for path in files:
        doc = load_hcl(path)
        assert doc, f"{path} parsed to nothing"


# ---------------------------------------------------------------- the layout module, run


def test_layout_module_validates_and_its_terraform_tests_pass(tmp_path: Path) -> None:
    work = copy_module(LAYOUT_DIR, tmp_path / "layout")
    run_terraform(["init", "-backend=false", "-input=false", "-no-color"], work, tmp_path)
    run_terraform(["validate", "-no-color"], work, tmp_path)
    proc = run_terraform(["test", "-no-color"], work, tmp_path)
    runs = sum(len(re.findall(r'^run "', p.read_text(), re.M)) for p in work.glob("tests/*.hcl"))
    assert runs >= 5
    assert f"Success! {runs} passed, 0 failed." in proc.stdout, proc.stdout


def _example_layout_root(tmp: Path) -> Path:
    """A provider-free root module that calls the layout with the example's values: its AZs
    and VPC CIDR (the subnets computed with the example's own expression), cluster id and
    version, the AWS module's URL shapes."""
    example = variable_defaults(EXAMPLE_DIR)
    expr = module_blocks(EXAMPLE_DIR)["locals"]["private_subnets"]
    assert expr.startswith("${") and expr.endswith("}")
    module = variable_defaults(MODULE_DIR)
    region, prefix = example["region"], module["s3_prefix"]
    bucket = f"{example['cluster_id']}-123456789012-{region}"
    az_ids = {az: f"use1-az{i + 1}" for i, az in enumerate(example["azs"])}
    root = tmp / "root"
    copy_module(LAYOUT_DIR, root / "layout")
    (root / "main.tf").write_text(
        f"""
variable "azs" {{ default = {json.dumps(example["azs"])} }}
variable "vpc_cidr" {{ default = {json.dumps(example["vpc_cidr"])} }}
locals {{
  private_subnets = {expr[2:-1]}
  az_ids          = {json.dumps(az_ids).replace(":", " =")}
}}
module "layout" {{
  source               = "./layout"
  zones = {{
    for az, cidr in local.private_subnets : az => {{ az_id = local.az_ids[az], subnet_cidr = cidr }}
  }}
  cluster_id           = {json.dumps(example["cluster_id"])}
  zonefleet_version    = {json.dumps(example["zonefleet_version"])}
  region               = {json.dumps(region)}
  object_store_url     = "s3://{bucket}/{prefix}/objects?region={region}"
  metadata_url         = "s3://{bucket}/{prefix}/metadata?region={region}"
  wal_url              = "nfs://svm-0123.fs-0123.fsx.{region}.amazonaws.com/zonefleet?version=4.1"
  secret_ssm_parameter = "/zonefleet/{example["cluster_id"]}/internal-secret"
}}
output "layout" {{ value = module.layout }}
output "subnets" {{ value = local.private_subnets }}
output "az_ids" {{ value = local.az_ids }}
"""
    )
    return root


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The layout applied with the example's values; each node's fleet TOML written to its own
    config directory, beside an internal.secret as the user data writes it."""
    tmp = tmp_path_factory.mktemp("layout-apply")
    root = _example_layout_root(tmp)
    run_terraform(["init", "-backend=false", "-input=false", "-no-color"], root, tmp)
    run_terraform(["apply", "-auto-approve", "-input=false", "-no-color"], root, tmp)
    out = output_json(root, tmp)
    layout = out["layout"]
    paths = {}
    for key in layout["node_keys"]:
        config_dir = tmp / "nodes" / key
        config_dir.mkdir(parents=True)
        (config_dir / "fleet.toml").write_text(layout["fleet_toml"][key])
        (config_dir / "internal.secret").write_text(secrets.token_hex(32))
        paths[key] = config_dir / "fleet.toml"
    return {"layout": layout, "subnets": out["subnets"], "az_ids": out["az_ids"], "paths": paths}


def _imds(zone: str, az_id: str, calls: list[str]) -> Callable[[str], tuple[str, str | None]]:
    def discover(url: str) -> tuple[str, str | None]:
        calls.append(url)
        return zone, az_id

    return discover


def _check_fleet(cfg: FleetConfig, rendered: dict[str, Any]) -> None:
    """What every node's view of the fleet must hold, whichever node it is."""
    layout = rendered["layout"]
    assert cfg.cluster_id == variable_defaults(EXAMPLE_DIR)["cluster_id"]
    assert [(z.name, z.az_id) for z in cfg.zones] == sorted(rendered["az_ids"].items())
    assert cfg.cidrs == {cidr: az for az, cidr in rendered["subnets"].items()}
    assert cfg.internal_secret is not None and len(cfg.internal_secret) == 64
    mains = {f"main-{m.broker.node_id}": m for m in cfg.mains}
    assert sorted(mains) == sorted(layout["mains"])
    for key, want in layout["mains"].items():
        b = mains[key].broker
        assert (b.zone, b.host, b.port, b.rpc_port) == (
            want["zone"],
            want["host"],
            want["port"],
            want["rpc_port"],
        )
        assert mains[key].admin_port == want["admin_port"]
        assert b.advertised == (want["host"], want["port"])
    proxies = {p.proxy.zone: p for p in cfg.proxies}
    assert sorted(proxies) == sorted(layout["proxies"])  # one proxy per zone
    for zone, want in layout["proxies"].items():
        p = proxies[zone]
        assert p.proxy.node_id == want["node_id"]
        assert p.proxy.advertised == (want["bootstrap_host"], want["port"])
        assert p.admin_port == want["admin_port"]
        assert f"{want['bootstrap_host']}:{want['port']}" == layout["bootstrap"][zone]


def test_main_fleet_tomls_load_with_the_zone_imds_gives(rendered: dict[str, Any]) -> None:
    layout = rendered["layout"]
    assert layout["mains"]
    for key, main in layout["mains"].items():
        calls: list[str] = []
        zone = main["zone"]
        cfg = load_fleet_config(
            rendered["paths"][key], discover=_imds(zone, rendered["az_ids"][zone], calls)
        )
        assert len(calls) == 1, "the node asks IMDS once, for its own entry"
        assert cfg.main(main["node_id"]).broker.zone == zone
        _check_fleet(cfg, rendered)
        # Without discovery, only the node's own entry is left "auto".
        unresolved = load_fleet_config(rendered["paths"][key], discover=None)
        auto = [n.node_id for n in unresolved.nodes() if n.zone == "auto"]
        assert auto == [main["node_id"]]


def test_a_node_in_the_wrong_zone_refuses_its_config(rendered: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="not one of the"):
        load_fleet_config(
            rendered["paths"]["main-1"], discover=lambda url: ("eu-west-1a", "euw1-az1")
        )


def test_proxy_fleet_tomls_say_auto_bind_all_and_advertise_the_bootstrap(
    rendered: dict[str, Any],
) -> None:
    layout = rendered["layout"]
    for zone, proxy in layout["proxies"].items():
        doc = tomllib.loads(rendered["paths"][proxy["node_key"]].read_text())
        entries = {p["node_id"]: p for p in doc["proxies"]}
        for other_zone, other in layout["proxies"].items():
            entry = entries[other["node_id"]]
            own = other_zone == zone
            assert entry["zone"] == ("auto" if own else other_zone)
            assert entry["host"] == ("0.0.0.0" if own else other["bootstrap_host"])
            assert (entry["advertised_host"], entry["advertised_port"]) == (
                other["bootstrap_host"],
                other["port"],
            )
        assert all(m["zone"] != "auto" for m in doc["main_brokers"])


def test_proxy_fleet_tomls_load_with_the_zone_imds_gives(rendered: dict[str, Any]) -> None:
    for zone, proxy in rendered["layout"]["proxies"].items():
        calls: list[str] = []
        cfg = load_fleet_config(
            rendered["paths"][proxy["node_key"]],
            discover=_imds(zone, rendered["az_ids"][zone], calls),
        )
        assert len(calls) == 1
        own = cfg.proxy(proxy["node_id"])
        assert (own.proxy.zone, own.proxy.host) == (zone, "0.0.0.0")
        _check_fleet(cfg, rendered)


# ---------------------------------------------------------------- checkov


def test_checkov_reports_no_failed_check() -> None:
    assert CHECKOV.exists(), f"{CHECKOV} is missing: run `make checkov` (make test does)"
    proc = subprocess.run(
        [
            str(CHECKOV),
            "-d",
            str(TERRAFORM_DIR),
            "--framework",
            "terraform",
            "--skip-download",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [c for r in reports for c in r["results"]["failed_checks"]]
    assert not failed, [(c["check_id"], c["resource"], c["file_path"]) for c in failed]
    assert sum(r["summary"]["passed"] for r in reports) > 100
    for r in reports:
        for check in r["results"]["skipped_checks"]:
            # Skipped only inline, each with its reason.
            assert len(check.get("check_result", {}).get("suppress_comment", "")) > 20, check


# ---------------------------------------------------------------- the AWS module, parsed


@pytest.fixture(scope="module")
def aws() -> dict[str, Any]:
    return module_blocks(MODULE_DIR)


def _resolve(value: Any, locals_: dict[str, Any]) -> Any:
    """A `${local.a.b}` reference's value from the module's locals (other values as they are)."""
    m = re.fullmatch(r"\$\{local\.([\w.]+)\}", str(value))
    if not m:
        return value
    out: Any = locals_
    for part in m.group(1).split("."):
        out = out[part]
    return out


def test_one_proxy_per_zone_that_heals_itself(aws: dict[str, Any]) -> None:
    res = aws["resource"]
    asgs = res["aws_autoscaling_group"]
    assert list(asgs) == ["proxy"]
    asg = asgs["proxy"]
    assert asg["for_each"] == "${toset(local.zone_names)}"
    assert (asg["min_size"], asg["max_size"], asg["desired_capacity"]) == (1, 1, 1)
    assert asg["vpc_zone_identifier"] == ["${var.subnet_ids[each.key]}"]  # its zone only
    assert asg["health_check_type"] == "ELB"
    assert "${aws_lb_target_group.proxy_kafka[each.key].arn}" in asg["target_group_arns"]
    assert asg["launch_template"][0]["id"] == "${aws_launch_template.proxy[each.key].id}"
    lt = res["aws_launch_template"]["proxy"]
    assert lt["for_each"] == asg["for_each"]
    assert "module.layout.proxies[each.key].node_key" in lt["user_data"]
    assert aws["locals"]["zone_names"] == "${sort(keys(var.subnet_ids))}"
    # The mains: one instance per layout main, at its fixed address, with its own user data.
    main = res["aws_instance"]["main"]
    assert main["for_each"] == "${module.layout.mains}"
    assert main["private_ip"] == "${each.value.host}"
    assert main["user_data_base64"] == "${base64encode(module.layout.user_data[each.key])}"


def test_imdsv2_required_and_ebs_encrypted_on_every_machine(aws: dict[str, Any]) -> None:
    res, locals_ = aws["resource"], aws["locals"]
    launching = {t for t in res if "instance" in t or "launch" in t} - {"aws_iam_instance_profile"}
    assert launching == {"aws_launch_template", "aws_instance"}
    machines = [*res["aws_launch_template"].values(), *res["aws_instance"].values()]
    for machine in machines:
        meta = machine["metadata_options"][0]
        assert _resolve(meta["http_tokens"], locals_) == "required"
        assert _resolve(meta["http_endpoint"], locals_) == "enabled"
    for lt in res["aws_launch_template"].values():
        assert all(b["ebs"][0]["encrypted"] is True for b in lt["block_device_mappings"])
    for inst in res["aws_instance"].values():
        assert inst["root_block_device"][0]["encrypted"] is True


def test_no_internal_port_is_open_to_clients_or_the_internet(aws: dict[str, Any]) -> None:
    res, locals_ = aws["resource"], aws["locals"]
    # Every rule is a standalone rule resource, so the ones below are all there are.
    assert "aws_security_group_rule" not in res
    for sg in res["aws_security_group"].values():
        assert "ingress" not in sg and "egress" not in sg
    internal = set(locals_["fleet_ports"]) - {"proxy_kafka"}
    assert internal == {"main_kafka", "main_admin", "main_rpc", "proxy_admin"}
    by_cidr: list[tuple[str, dict[str, Any]]] = []
    by_group: list[tuple[str, dict[str, Any]]] = []
    for name, rule in res["aws_vpc_security_group_ingress_rule"].items():
        assert "cidr_ipv6" not in rule and "prefix_list_id" not in rule, name
        (by_cidr if "cidr_ipv4" in rule else by_group).append((name, rule))
    assert by_cidr and by_group
    for name, rule in by_cidr:
        # Only the proxies' Kafka port, and only from the networks the user names.
        assert rule["for_each"] == "${toset(var.client_cidrs)}", name
        assert rule["cidr_ipv4"] == "${each.value}", name
        assert rule["from_port"] == rule["to_port"] == "${local.ports.proxy_kafka}", name
    for name, rule in by_group:
        assert rule["referenced_security_group_id"].startswith("${aws_security_group."), name
    # The internal ports are open between the fleet's nodes (the nodes group to itself), and
    # NFS from the nodes to the WAL.
    self_rule = res["aws_vpc_security_group_ingress_rule"]["nodes_from_nodes"]
    assert self_rule["for_each"] == "${local.fleet_ports}"
    assert self_rule["security_group_id"] == self_rule["referenced_security_group_id"]
    nfs = res["aws_vpc_security_group_ingress_rule"]["wal_from_nodes"]
    assert _resolve(nfs["from_port"], locals_) == 2049
    assert nfs["referenced_security_group_id"] == "${aws_security_group.nodes.id}"
    # client_cidrs itself refuses 0.0.0.0/0.
    validation = aws["variable"]["client_cidrs"]["validation"][0]["condition"]
    assert 'c != "0.0.0.0/0"' in validation


def test_bucket_is_private_encrypted_tls_only_and_aborts_multipart(aws: dict[str, Any]) -> None:
    res = aws["resource"]
    block = res["aws_s3_bucket_public_access_block"]["fleet"]
    for flag in (
        "block_public_acls",
        "block_public_policy",
        "ignore_public_acls",
        "restrict_public_buckets",
    ):
        assert block[flag] is True
    sse = res["aws_s3_bucket_server_side_encryption_configuration"]["fleet"]["rule"][0]
    assert sse["apply_server_side_encryption_by_default"][0]["sse_algorithm"] == "aws:kms"
    policy = res["aws_s3_bucket_policy"]["fleet"]
    assert policy["policy"] == "${data.aws_iam_policy_document.bucket.json}"
    statements = aws["data"]["aws_iam_policy_document"]["bucket"]["statement"]
    deny = [s for s in statements if s.get("effect") == "Deny"]
    assert len(deny) == 1
    (d,) = deny
    assert d["actions"] == ["s3:*"]
    assert d["principals"][0]["identifiers"] == ["*"]
    assert sorted(d["resources"]) == sorted(
        ["${aws_s3_bucket.fleet.arn}", "${aws_s3_bucket.fleet.arn}/*"]
    )
    assert d["condition"] == [
        {"test": "Bool", "variable": "aws:SecureTransport", "values": ["false"]}
    ]
    rules = res["aws_s3_bucket_lifecycle_configuration"]["fleet"]["rule"]
    abort = [r for r in rules if "abort_incomplete_multipart_upload" in r]
    assert abort and abort[0]["status"] == "Enabled" and abort[0]["filter"] == [{}]
    endpoint = res["aws_vpc_endpoint"]["s3"]
    assert endpoint["vpc_endpoint_type"] == "Gateway"
    assert endpoint["route_table_ids"] == "${var.route_table_ids}"


def test_each_zone_bootstraps_through_its_own_nlb(aws: dict[str, Any]) -> None:
    res = aws["resource"]
    lb = res["aws_lb"]["bootstrap"]
    assert lb["for_each"] == "${toset(local.zone_names)}"
    assert lb["internal"] is True and lb["load_balancer_type"] == "network"
    assert lb["enable_cross_zone_load_balancing"] is False
    mapping = lb["subnet_mapping"][0]
    assert mapping["subnet_id"] == "${var.subnet_ids[each.key]}"
    assert mapping["private_ipv4_address"] == "${module.layout.proxies[each.key].bootstrap_host}"
    listener = res["aws_lb_listener"]["proxy_kafka"]
    assert listener["port"] == "${local.ports.proxy_kafka}"
    assert listener["protocol"] == "TCP"
    action = listener["default_action"][0]
    assert action["target_group_arn"] == "${aws_lb_target_group.proxy_kafka[each.key].arn}"
    assert aws["output"]["bootstrap"]["value"] == "${module.layout.bootstrap}"


def test_the_nodes_role_reaches_only_the_fleet_prefix_and_its_secret(aws: dict[str, Any]) -> None:
    policy = aws["resource"]["aws_iam_role_policy"]["node"]["policy"]
    assert 'Resource = "*"' not in policy and 'Resource = ["*"]' not in policy
    assert 'Resource = "${aws_s3_bucket.fleet.arn}/${local.prefix}/*"' in policy
    assert '"s3:prefix" = ["${local.prefix}/*"]' in policy
    assert 'Action = "ssm:GetParameter", Resource = aws_ssm_parameter.internal_secret.arn' in policy
    secret = aws["resource"]["aws_ssm_parameter"]["internal_secret"]
    assert secret["type"] == "SecureString"
    assert secret["value"] == "${random_password.internal_secret.result}"


def test_flow_logs_carry_what_the_cost_report_reads(aws: dict[str, Any]) -> None:
    from cost_report import flow_logs

    fields = aws["locals"]["flow_log_fields"]
    assert set(flow_logs.REQUIRED_FIELDS) <= set(fields)
    # AWS's default fields plus az-id and flow-direction, as the report writes them itself,
    # then the packet-level addresses.
    assert tuple(fields) == (*flow_logs.DEFAULT_FIELDS, "pkt-srcaddr", "pkt-dstaddr")
    assert re.fullmatch(flow_logs._HEADER_LINE, " ".join(fields))  # the file's header line
    assert (
        aws["locals"]["flow_log_format"]
        == '${join(" ", [for f in local.flow_log_fields : "$${${f}}"])}'
    )
    log = aws["resource"]["aws_flow_log"]["vpc"]
    assert log["vpc_id"] == "${var.vpc_id}" and log["traffic_type"] == "ALL"
    assert log["destination_options"][0]["file_format"] == "plain-text"


# ---------------------------------------------------------------- the README's costs


def test_readme_cost_section_is_the_computed_one() -> None:
    text = README.read_text()
    assert text.count(COST_BEGIN) == 1 and text.count(COST_END) == 1
    section = text.split(COST_BEGIN)[1].split(COST_END)[0].strip()
    assert section == infrastructure.markdown().strip(), (
        "terraform/README.md's costs differ from cost_report/infrastructure.py: "
        "regenerate with python -m cost_report.infrastructure"
    )


def test_cost_model_defaults_are_the_deployments(rendered: dict[str, Any]) -> None:
    d = infrastructure.DEFAULT_DEPLOYMENT
    module = variable_defaults(MODULE_DIR)
    layout = variable_defaults(LAYOUT_DIR)
    assert d.zones == len(variable_defaults(EXAMPLE_DIR)["azs"])
    assert d.mains_per_zone == module["mains_per_zone"]
    assert d.proxy_instance_type == module["proxy_instance_type"]
    assert d.main_instance_type == module["main_instance_type"]
    assert d.root_volume_gb == module["root_volume_gb"]
    assert d.shared_wal == module["shared_wal"]
    assert d.fsx_storage_capacity_gb == module["fsx_storage_capacity_gb"]
    assert d.fsx_throughput_mbps == module["fsx_throughput_mbps"]
    assert d.flow_log_max_aggregation_interval_s == module["flow_log_max_aggregation_interval"]
    assert d.ledger_upload_interval_s == layout["ledger_upload_interval_s"]
    # The price sheet the cost report uses prices the same file system.
    assert DEFAULT_PRICES.fsx_ontap_capacity_gb == d.fsx_storage_capacity_gb
    assert DEFAULT_PRICES.fsx_ontap_throughput_mbps == d.fsx_throughput_mbps
    # The housekeeping intervals are the rendered fleet's.
    main = load_fleet_config(rendered["paths"]["main-1"], discover=None).mains[0].broker
    assert main.metadata_poll_s == d.metadata_poll_interval_s
    assert main.registration_interval_s == d.registration_interval_s
    assert main.upload_interval_s == d.object_upload_interval_s
    assert main.ledger_upload_interval_s == d.ledger_upload_interval_s


def test_break_even_is_where_the_two_bills_meet() -> None:
    for wal in ("fsx-ontap", "efs"):
        d = infrastructure.Deployment(shared_wal=wal)
        b = infrastructure.break_even(d)
        if b.gb_per_month is None:
            assert b.zonefleet_usd_per_gb >= b.kafka_usd_per_gb
            continue
        zonefleet, kafka, _ = infrastructure.monthly_bills(b.gb_per_month, d)
        assert zonefleet == pytest.approx(kafka, rel=1e-9)
        below = infrastructure.monthly_bills(b.gb_per_month * 0.9, d)
        above = infrastructure.monthly_bills(b.gb_per_month * 1.1, d)
        assert below[0] > below[1] and above[0] < above[1]
        assert b.gb_per_month_ffr is not None
        zonefleet, _, kafka_ffr = infrastructure.monthly_bills(b.gb_per_month_ffr, d)
        assert zonefleet == pytest.approx(kafka_ffr, rel=1e-9)


def test_kafka_cost_per_gb_is_the_documented_formula() -> None:
    """docs/cost_report.md: (2/3 (P + O) + 2 P + 2/3 F) x 2 x rate, plus EBS for the retention
    times the replication factor."""
    p, w = DEFAULT_PRICES, infrastructure.DEFAULT_WORKLOAD
    transfer = (2 / 3 + (p.kafka_replication_factor - 1) + 2 / 3 * w.fan_out) * 2
    transfer *= p.inter_az_usd_per_gb_each_side
    ebs = p.retention_days * p.kafka_replication_factor * p.ebs_gp3_usd_per_gb_month
    ebs /= p.days_per_month
    b = infrastructure.break_even()
    assert b.kafka_usd_per_gb == pytest.approx(transfer + ebs, rel=1e-6)
    assert b.kafka_ffr_usd_per_gb == pytest.approx(
        transfer - 2 / 3 * w.fan_out * 2 * p.inter_az_usd_per_gb_each_side + ebs, rel=1e-6
    )


def test_readme_documents_every_variable() -> None:
    text = README.read_text()
    for directory in (MODULE_DIR, LAYOUT_DIR):
        for name in module_blocks(directory)["variable"]:
            assert f"| `{name}` |" in text, f"terraform/README.md lacks variable {name}"
