"""`zonefleet node-config`: what a node's user data runs before it hands over to systemd.

On an EC2 instance the Terraform module writes the fleet TOML, in which this node's own entry
says `zone = "auto"`, and then runs

    zonefleet node-config --config /etc/zonefleet/fleet.toml --role proxy --node-id 101 \\
        --from-imds --secret-ssm-parameter /zonefleet/<cluster>/internal-secret

which

1. asks IMDSv2 (token PUT, then `placement/availability-zone`, `-zone-id` and `region`) where
   the instance runs; the endpoint is the SDKs' `AWS_EC2_METADATA_SERVICE_ENDPOINT`, else the
   TOML's `[fleet] imds_url`, else 169.254.169.254;
2. fetches the internal RPC secret, an SSM SecureString, with boto3 in that region (boto3's
   usual credential chain and endpoint settings, `AWS_ENDPOINT_URL_SSM` included) and writes
   it to the TOML's `[internal] secret_file`, readable by its owner only;
3. loads the fleet config as the node will, with the zone IMDSv2 gave, and checks that the
   node exists in it with that role and that its zone resolves;
4. prints what it configured.

Any failure is one line on stderr and a nonzero exit (1: IMDS, SSM or file system; 2: the
configuration), so `set -e` in the user data stops before systemd starts a node that cannot
run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from fleet.config import AUTO_ZONE, ConfigError, FleetConfig, load_fleet_config
from fleet.zone_discovery import ImdsError, Placement, discover_placement, imds_endpoint

__all__ = ["NodeConfigError", "add_node_config_parser", "run_node_config_command"]

ROLES = ("main", "proxy")


class NodeConfigError(RuntimeError):
    """A step of node-config failed for a reason outside the config file (IMDS, SSM, disk)."""


@dataclass(frozen=True)
class SecretWritten:
    parameter: str
    path: Path
    nbytes: int


def add_node_config_parser(sub: Any) -> None:
    p = sub.add_parser(
        "node-config",
        help="configure this host's node from IMDSv2 and SSM (run by the Terraform user data)",
        description="Find this instance's zone and region through IMDSv2, fetch the internal "
        "RPC secret from SSM into the fleet TOML's [internal] secret_file (mode 0600), and check "
        "that the config loads for this node. Exit 1 when IMDS, SSM or the disk fail, 2 when "
        "the configuration is wrong.",
    )
    p.add_argument("--config", required=True, help="the fleet TOML this node runs from")
    p.add_argument("--role", required=True, choices=ROLES, help="main (broker) or proxy")
    p.add_argument("--node-id", required=True, type=int, help="this node's node_id")
    p.add_argument(
        "--from-imds",
        action="store_true",
        help="take the zone and region from IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT, else "
        "[fleet] imds_url, else 169.254.169.254)",
    )
    p.add_argument(
        "--secret-ssm-parameter",
        default=None,
        help="SSM SecureString holding the internal RPC secret; written to [internal] secret_file",
    )
    p.add_argument(
        "--region",
        default=None,
        help="the region the fleet was configured for: with --from-imds it must match the "
        "instance's; without, the region SSM is asked in (default: the AWS environment)",
    )
    p.add_argument("--imds-timeout", type=float, default=2.0, help="seconds per IMDS request")


def run_node_config_command(args: argparse.Namespace) -> int:
    try:
        lines = node_config(
            Path(args.config),
            role=args.role,
            node_id=args.node_id,
            from_imds=args.from_imds,
            secret_parameter=args.secret_ssm_parameter,
            region=args.region,
            imds_timeout=args.imds_timeout,
        )
    except NodeConfigError as exc:
        print(f"zonefleet node-config: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"zonefleet node-config: configuration error: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line, flush=True)
    return 0


def node_config(
    config_path: Path,
    *,
    role: str,
    node_id: int,
    from_imds: bool,
    secret_parameter: str | None,
    region: str | None,
    imds_timeout: float = 2.0,
) -> list[str]:
    """Do the steps of the module docstring; returns the lines that say what was configured."""
    if role not in ROLES:
        raise ConfigError(f"--role must be one of {', '.join(ROLES)}, not {role!r}")
    doc = _read_toml(config_path)
    placement = None
    if from_imds:
        endpoint = imds_endpoint(_imds_url(doc))
        try:
            placement = trio.run(discover_placement, endpoint, imds_timeout)
        except ImdsError as exc:
            raise NodeConfigError(f"--from-imds: {exc}") from None
        if region and region != placement.region:
            raise NodeConfigError(
                f"this instance is in region {placement.region} (IMDSv2 at {endpoint}), but the "
                f"fleet was configured for {region}"
            )
        region = placement.region
    written = None
    if secret_parameter:
        target = _secret_file(doc, config_path)
        value = fetch_ssm_secret(secret_parameter, region)
        _write_private(target, value)
        written = SecretWritten(secret_parameter, target, len(value.encode()))
    config = _load_for_node(config_path, placement)
    return _summary(config, config_path, role, node_id, placement, written)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _imds_url(doc: dict[str, Any]) -> str | None:
    url = doc.get("fleet", {}).get("imds_url")
    return None if url is None else str(url)


def _secret_file(doc: dict[str, Any], config_path: Path) -> Path:
    internal = doc.get("internal", {})
    name = internal.get("secret_file")
    if name is None:
        raise ConfigError(
            f"{config_path} has no [internal] secret_file to write the SSM secret to"
            + (" (it holds the secret inline)" if "secret" in internal else "")
        )
    path = Path(str(name))
    return path if path.is_absolute() else config_path.resolve().parent / path


def fetch_ssm_secret(name: str, region: str | None) -> str:
    """The decrypted value of an SSM parameter, through boto3's usual chain."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise NodeConfigError(
            f"no region to ask SSM for {name} in: use --from-imds or --region (or AWS_REGION)"
        )
    config = Config(
        retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5, read_timeout=10
    )
    client = boto3.session.Session(region_name=region).client("ssm", config=config)
    try:
        reply = client.get_parameter(Name=name, WithDecryption=True)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "?")
        if code == "ParameterNotFound":
            raise NodeConfigError(f"SSM parameter {name} does not exist in {region}") from None
        raise NodeConfigError(
            f"SSM GetParameter {name} in {region} failed: {code}: {error.get('Message', '')}"
        ) from None
    except BotoCoreError as exc:
        raise NodeConfigError(f"SSM GetParameter {name} in {region} failed: {exc}") from None
    param = reply.get("Parameter", {})
    value = str(param.get("Value", "")).strip()
    if not value:
        raise NodeConfigError(f"SSM parameter {name} in {region} is empty")
    if param.get("Type") != "SecureString":
        # Readable by anyone with ssm:GetParameter and shown in the console: say so, go on.
        print(
            f"zonefleet node-config: warning: SSM parameter {name} is a {param.get('Type')}, "
            "not a SecureString",
            file=sys.stderr,
        )
    return value


def _write_private(path: Path, value: str) -> None:
    """Replace `path` atomically with `value`, mode 0600 from the first byte."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(value + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise NodeConfigError(f"cannot write the internal secret to {path}: {exc}") from None


def _load_for_node(config_path: Path, placement: Placement | None) -> FleetConfig:
    if placement is None:
        return load_fleet_config(config_path)  # zone = "auto" asks IMDS as the node will
    found = (placement.zone, placement.az_id)
    return load_fleet_config(config_path, discover=lambda url: found)


def _summary(
    config: FleetConfig,
    path: Path,
    role: str,
    node_id: int,
    placement: Placement | None,
    written: SecretWritten | None,
) -> list[str]:
    if role == "main":
        main = config.main(node_id)
        zone, host, port = main.broker.zone, main.broker.host, main.broker.port
        admin = f"{main.admin_host}:{main.admin_port}"
        extra = f", internal RPC {main.broker.rpc_port}" if main.broker.rpc_port else ""
        if main.broker.rpc_tls is not None:
            extra += " (mutual TLS)"
        what = f"main broker {node_id}"
    else:
        proxy = config.proxy(node_id)
        zone, host, port = proxy.proxy.zone, proxy.proxy.host, proxy.proxy.port
        admin = f"{proxy.admin_host}:{proxy.admin_port}"
        adv_host, adv_port = proxy.proxy.advertised
        extra = f", advertised {adv_host}:{adv_port}"
        if proxy.proxy.rpc_tls is not None:
            extra += ", internal RPC over mutual TLS"
        what = f"proxy {node_id}"
    if zone == AUTO_ZONE:
        raise ConfigError(f"{what}'s zone is still 'auto': nothing answered for it")
    az_id = next((z.az_id for z in config.zones if z.name == zone), None)
    if placement is not None and zone != placement.zone and az_id != placement.az_id:
        raise ConfigError(
            f"{what} is configured for zone {zone} (AZ id {az_id or '?'}), but this instance "
            f"is in {placement.zone} (AZ id {placement.az_id or '?'})"
        )
    lines = [f"zonefleet node-config: {what} in zone {zone} (AZ id {az_id or '?'})"]
    if placement is not None:
        lines.append(
            f"  placement: zone {placement.zone} (AZ id {placement.az_id or '?'}), region "
            f"{placement.region}, found through IMDSv2 at {placement.endpoint}"
        )
    if written is not None:
        lines.append(
            f"  internal secret: SSM parameter {written.parameter} -> {written.path} "
            f"(mode 0600, {written.nbytes} bytes)"
        )
    lines.append(f"  config: {path} loads; kafka {host}:{port}{extra}; admin {admin}")
    return lines
