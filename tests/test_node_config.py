"""`zonefleet node-config` against a fake IMDSv2 and moto's SSM; zone discovery's endpoint.

The fleet TOML has the shape the Terraform layout renders for one node: every node listed, this
node's own entry `zone = "auto"`, and `[internal] secret_file` next to the TOML, which
node-config fills from the SSM SecureString.
"""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from fleet.cli import main as zonefleet
from fleet.config import ConfigError, load_fleet_config, parse_fleet_config
from fleet.zone_discovery import (
    DEFAULT_IMDS_URL,
    DEFAULT_IMDS_URL_IPV6,
    discover_zone_blocking,
    imds_endpoint,
)
from tests.fake_imds import FakeImds
from tests.ports import free_port, free_port_block
from tests.s3_servers import ACCESS_KEY, SECRET_KEY, MotoServer, moto

__all__ = ["moto"]  # the module-scoped moto server fixture

ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))
REGION = "eu-west-1"


def fleet_toml(own: str, data_dir: Path, imds_url: str | None = None) -> str:
    """Two zones, a main and a proxy each; `own` ("main-1", "proxy-102", ...) is zone=auto."""
    base = free_port_block(12)
    nodes = {
        "main-1": ("main_brokers", 1, "eu-west-1a", base),
        "main-2": ("main_brokers", 2, "eu-west-1b", base + 3),
        "proxy-101": ("proxies", 101, "eu-west-1a", base + 6),
        "proxy-102": ("proxies", 102, "eu-west-1b", base + 9),
    }
    imds = f'imds_url = "{imds_url}"\n' if imds_url else ""
    parts = [
        f'[fleet]\ncluster_id = "nc"\ndata_dir = "{data_dir}"\n{imds}',
        '[internal]\nsecret_file = "internal.secret"\n',
        f'[wal]\nurl = "osfs://{data_dir}/wal"\n',
        f'[metadata]\nurl = "file://{data_dir}/metadata"\n',
        '[[zones]]\nname = "eu-west-1a"\naz_id = "euw1-az3"\n',
        '[[zones]]\nname = "eu-west-1b"\naz_id = "euw1-az1"\n',
    ]
    for key, (section, node_id, zone, port) in nodes.items():
        zone = "auto" if key == own else zone
        rpc = f"rpc_port = {port + 2}\n" if section == "main_brokers" else ""
        parts.append(
            f'[[{section}]]\nnode_id = {node_id}\nzone = "{zone}"\nhost = "127.0.0.1"\n'
            f"port = {port}\nadmin_port = {port + 1}\n{rpc}"
        )
    return "\n".join(parts)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds(zone="eu-west-1b", az_id="euw1-az1", region=REGION) as fake:
        yield fake


@pytest.fixture
def aws_env(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """boto3 pointed at moto (as a simulation does), with no IMDS of its own to fall back to."""
    env = {
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    }
    for name in ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def parameter(moto: MotoServer) -> tuple[str, str]:
    name, value = f"/zonefleet/nc-{secrets.token_hex(4)}/internal-secret", secrets.token_hex(32)
    ssm = boto3.client(
        "ssm",
        endpoint_url=moto.endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    ssm.put_parameter(Name=name, Value=value, Type="SecureString")
    return name, value


def write_config(tmp_path: Path, own: str, imds_url: str | None = None) -> Path:
    path = tmp_path / "etc" / "fleet.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fleet_toml(own, tmp_path / "data", imds_url))
    path.chmod(0o600)
    return path


def node_config(config: Path, role: str, node_id: int, *extra: str) -> list[str]:
    return [
        "node-config",
        "--config",
        str(config),
        "--role",
        role,
        "--node-id",
        str(node_id),
        *extra,
    ]


def test_node_config_from_imds_and_ssm(
    tmp_path: Path,
    imds: FakeImds,
    aws_env: dict[str, str],
    parameter: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, value = parameter
    config = write_config(tmp_path, "proxy-102", imds.url)
    argv = node_config(config, "proxy", 102, "--from-imds", "--secret-ssm-parameter", name)
    assert zonefleet([*argv, "--region", REGION]) == 0
    out = capsys.readouterr().out
    assert "proxy 102 in zone eu-west-1b (AZ id euw1-az1)" in out
    assert f"region {REGION}, found through IMDSv2 at {imds.url}" in out
    secret = config.parent / "internal.secret"
    assert f"SSM parameter {name} -> {secret} (mode 0600, 64 bytes)" in out
    assert secret.read_text().strip() == value
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert [(r.method, r.path.rsplit("/", 1)[-1], r.status) for r in imds.requests] == [
        ("PUT", "token", 200),
        ("GET", "availability-zone", 200),
        ("GET", "availability-zone-id", 200),
        ("GET", "region", 200),
    ]
    # The node then loads the same file and finds the same zone and secret.
    loaded = load_fleet_config(config)
    assert loaded.proxy(102).proxy.zone == "eu-west-1b"
    assert loaded.internal_secret == value.encode()
    assert loaded.discovered_zone is not None
    assert loaded.discovered_zone.endpoint == imds.url


def test_the_sdk_endpoint_variable_wins_over_imds_url(
    tmp_path: Path,
    imds: FakeImds,
    aws_env: dict[str, str],
    parameter: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = write_config(tmp_path, "main-2", dead)  # [fleet] imds_url: nothing listens
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url + "/")
    argv = node_config(config, "main", 2, "--from-imds", "--secret-ssm-parameter", parameter[0])
    assert zonefleet(argv) == 0
    out = capsys.readouterr().out
    assert f"found through IMDSv2 at {imds.url}" in out
    assert "main broker 2 in zone eu-west-1b" in out
    assert load_fleet_config(config).main(2).broker.zone == "eu-west-1b"


def test_node_config_failures_are_clear(
    tmp_path: Path,
    imds: FakeImds,
    aws_env: dict[str, str],
    parameter: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = parameter[0]
    config = write_config(tmp_path, "proxy-102", imds.url)
    cases: list[tuple[list[str], int, str]] = [
        # No IMDS where the config says.
        (["--from-imds"], 1, "no EC2 instance metadata at http://127.0.0.1:"),
        # The parameter is not there.
        (["--from-imds", "--secret-ssm-parameter", name + "-gone"], 1, "does not exist in"),
        # A launch template of another region.
        (["--from-imds", "--region", "us-east-1"], 1, f"is in region {REGION}"),
    ]
    dead = write_config(tmp_path / "dead", "proxy-102", f"http://127.0.0.1:{free_port()}")
    assert zonefleet(node_config(dead, "proxy", 102, *cases[0][0])) == cases[0][1]
    assert cases[0][2] in capsys.readouterr().err
    for extra, code, message in cases[1:]:
        assert zonefleet(node_config(config, "proxy", 102, *extra)) == code, extra
        assert message in capsys.readouterr().err, extra
    # Configuration errors exit 2: no such node, or not this node's role.
    secret_args = ["--from-imds", "--secret-ssm-parameter", name]
    assert zonefleet(node_config(config, "proxy", 105, *secret_args)) == 2
    assert "no proxy with node_id 105" in capsys.readouterr().err
    assert zonefleet(node_config(config, "main", 102, *secret_args)) == 2
    assert "no main broker with node_id 102" in capsys.readouterr().err
    # A main whose entry names its zone, on an instance in the other zone.
    assert zonefleet(node_config(config, "main", 1, *secret_args)) == 2
    err = capsys.readouterr().err
    assert "configured for zone eu-west-1a (AZ id euw1-az3), but this instance is in" in err
    # An instance in a zone the fleet does not have.
    imds.zone, imds.az_id = "eu-west-1c", "euw1-az2"
    assert zonefleet(node_config(config, "proxy", 102, *secret_args)) == 2
    assert "'eu-west-1c' (AZ id euw1-az2), which is not one of the [[zones]]" in (
        capsys.readouterr().err
    )
    # The config holds no secret_file to write to.
    imds.zone, imds.az_id = "eu-west-1b", "euw1-az1"
    inline = tmp_path / "inline.toml"
    inline.write_text(
        config.read_text().replace('secret_file = "internal.secret"', f'secret = "{"x" * 64}"')
    )
    assert zonefleet(node_config(inline, "proxy", 102, *secret_args)) == 2
    assert "no [internal] secret_file to write the SSM secret to" in capsys.readouterr().err


def test_the_node_logs_the_zone_it_found_through_imdsv2(
    tmp_path: Path, imds: FakeImds, aws_env: dict[str, str], parameter: tuple[str, str]
) -> None:
    """A main with `zone = "auto"` started as its systemd unit would: the log names the zone,
    the AZ id and the IMDS endpoint (taken from the SDK's variable)."""
    config = write_config(tmp_path, "main-2", f"http://127.0.0.1:{free_port()}")
    (config.parent / "internal.secret").write_text(parameter[1])
    log = tmp_path / "main-2.log"
    env = {**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [ZONEFLEET, "main-broker", "--config", str(config), "--node-id", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    want = f"found zone eu-west-1b (AZ id euw1-az1) through IMDSv2 at {imds.url}"
    try:
        deadline = time.monotonic() + 30
        while want not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        assert want in log.read_text(), log.read_text()
    finally:
        proc.terminate()
        proc.wait(15)
    assert "imds_endpoint=" + imds.url in log.read_text()


def test_imds_endpoint_follows_the_aws_sdks() -> None:
    assert imds_endpoint(None, {}) == DEFAULT_IMDS_URL
    assert imds_endpoint("http://10.0.0.1:80/", {}) == "http://10.0.0.1:80"
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.9:1338/"}
    assert imds_endpoint("http://10.0.0.1:80", env) == "http://127.0.0.9:1338"
    assert imds_endpoint(None, {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"}) == (
        DEFAULT_IMDS_URL_IPV6
    )


def test_imds_disabled_means_no_discovery(imds: FakeImds, monkeypatch: pytest.MonkeyPatch) -> None:
    assert discover_zone_blocking(imds.url) == ("eu-west-1b", "euw1-az1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert discover_zone_blocking(imds.url) is None


def test_fake_imds_speaks_imdsv2(imds: FakeImds) -> None:
    import httpx

    with httpx.Client(base_url=imds.url, trust_env=False) as http:
        assert http.get("/latest/meta-data/placement/region").status_code == 401
        assert http.put("/latest/api/token").status_code == 400  # no TTL
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "30"}
        forwarded = {**ttl, "X-Forwarded-For": "10.0.0.9"}
        assert http.put("/latest/api/token", headers=forwarded).status_code == 403
        token = http.put("/latest/api/token", headers=ttl).text
        auth = {"X-aws-ec2-metadata-token": token}
        assert http.get("/latest/meta-data/placement/region", headers=auth).text == REGION
        assert http.get("/latest/meta-data/local-ipv4", headers=auth).status_code == 404
        bad = {"X-aws-ec2-metadata-token": token + "x"}
        assert http.get("/latest/meta-data/placement/region", headers=bad).status_code == 401


WILDCARD_FLEET = """
[internal]
secret = "%s"
[[zones]]
name = "a"
[[zones]]
name = "b"
[[main_brokers]]
node_id = 1
zone = "a"
host = "10.1.0.20"
port = 9192
admin_port = 9193
rpc_port = 9194
[[proxies]]
node_id = 101
zone = "a"
host = "10.1.0.10"
port = 9092
admin_port = 9093
[[proxies]]
node_id = 102
zone = "b"
host = "0.0.0.0"
port = 9092
admin_port = 9093
advertised_host = "10.1.16.10"
""" % ("s" * 64)


def test_a_wildcard_proxy_and_other_zones_proxies_on_the_same_port(tmp_path: Path) -> None:
    """As the Terraform layout renders a proxy's file: it binds 0.0.0.0, and the other zones'
    proxies are listed at their bootstrap addresses on the same ports (other machines)."""
    config = parse_fleet_config(tomllib.loads(WILDCARD_FLEET), tmp_path, discover=None)
    assert config.proxy(102).proxy.host == "0.0.0.0"
    # A wildcard still clashes with a loopback bind, which is surely on the same machine.
    clash = WILDCARD_FLEET.replace('host = "10.1.0.10"', 'host = "127.0.0.1"')
    with pytest.raises(ConfigError, match="proxy 102 port and proxy 101 port are both"):
        parse_fleet_config(tomllib.loads(clash), tmp_path, discover=None)
