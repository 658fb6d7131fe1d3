"""The layout's user data (templates/user_data.sh.tftpl), rendered by Terraform with the
three-az example's values, run as cloud-init would run it, without network namespaces: a fake
IMDSv2 and moto's SSM on loopback ports, a `systemctl` shim first in PATH, the pinned zonefleet
(this checkout) already installed. tests/test_netns_deploy.py runs the same scripts for a
whole fleet, each node in its zone's namespace.
"""

from __future__ import annotations

import secrets
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.fake_imds import FakeImds
from tests.netns_deploy import (
    EXAMPLE,
    MODULE,
    ZONEFLEET,
    Host,
    RenderedLayout,
    example_values,
    render_layout,
)
from tests.s3_servers import ACCESS_KEY, SECRET_KEY, MotoServer, moto

__all__ = ["moto"]  # the module-scoped moto server fixture


@dataclass
class Rendered:
    layout: RenderedLayout
    hosts_root: Path
    parameter: str
    secret: str
    region: str


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, moto: MotoServer) -> Rendered:
    base = tmp_path_factory.mktemp("user-data")
    example = example_values(EXAMPLE, MODULE)
    cluster, region = example.variables["cluster_id"], example.variables["region"]
    install_dir = base / "opt" / "zonefleet"
    (install_dir / "bin").mkdir(parents=True)
    (install_dir / "bin" / "zonefleet").symlink_to(ZONEFLEET)
    parameter = f"/zonefleet/{cluster}-{secrets.token_hex(3)}/internal-secret"
    secret = secrets.token_hex(32)
    ssm = boto3.client(
        "ssm",
        endpoint_url=moto.endpoint,
        region_name=region,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    ssm.put_parameter(Name=parameter, Value=secret, Type="SecureString")
    resources = {
        "object_store_url": f"s3://bucket/{cluster}/objects?region={region}",
        "metadata_url": f"s3://bucket/{cluster}/metadata?region={region}",
        "wal_url": f"osfs://{base / 'wal'}",
        "secret_ssm_parameter": parameter,
    }
    layout = render_layout(example, resources, base / "hosts", install_dir, base / "terraform")
    return Rendered(layout, base / "hosts", parameter, secret, region)


class RootNamespace:
    """`DeployNamespaces.argv` for a machine that is this one: no namespace at all."""

    def argv(self, zone: str, cmd: Sequence[str]) -> list[str]:
        return list(cmd)


def host(rendered: Rendered, key: str) -> Host:
    layout = rendered.layout.outputs
    if key in layout["mains"]:
        role, node_id, zone = "main", layout["mains"][key]["node_id"], layout["mains"][key]["zone"]
    else:
        proxy = next(p for p in layout["proxies"].values() if p["node_key"] == key)
        role, node_id, zone = "proxy", proxy["node_id"], proxy["zone"]
    root = rendered.hosts_root / key
    return Host(key, role, node_id, zone, root, rendered.layout.user_data[key], "")


@pytest.fixture
def imds(rendered: Rendered) -> Iterator[FakeImds]:
    with FakeImds(region=rendered.region) as fake:
        yield fake


def env(moto: MotoServer, imds: FakeImds) -> dict[str, str]:
    return {
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url,
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
    }


def test_user_data_configures_the_node_and_hands_it_to_systemd(
    rendered: Rendered, moto: MotoServer, imds: FakeImds
) -> None:
    h = host(rendered, "proxy-us-east-1b")
    imds.zone, imds.az_id = h.zone, rendered.layout.zones[h.zone]["az_id"]
    for run in (1, 2):  # running it again on the same machine is safe
        unit_name = h.run_user_data(RootNamespace(), env(moto, imds))
        assert unit_name == "zonefleet.service", run
        assert h.systemctl_log.read_text().splitlines() == [
            "daemon-reload",
            "enable --now zonefleet.service",
        ]
    out = h.runs[-1].stdout
    assert "zonefleet 0.1.0 is already installed" in out
    assert f"proxy {h.node_id} in zone {h.zone} (AZ id {imds.az_id})" in out
    assert f"found through IMDSv2 at {imds.url}" in out
    toml, secret = h.config_dir / "fleet.toml", h.config_dir / "internal.secret"
    assert toml.read_text().rstrip("\n") == rendered.layout.fleet_toml[h.key].rstrip("\n")
    assert secret.read_text().strip() == rendered.secret
    for path in (toml, secret):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert sorted(p.name for p in h.config_dir.iterdir()) == ["fleet.toml", "internal.secret"]
    unit = h.unit(unit_name)
    assert unit.exec_start == [
        str(rendered.hosts_root.parent / "opt" / "zonefleet" / "bin" / "zonefleet"),
        "proxy",
        "--config",
        str(toml),
        "--node-id",
        str(h.node_id),
    ]
    assert unit.environment["AWS_REGION"] == rendered.region
    assert unit.working_directory == str(h.root / "var" / "lib" / "zonefleet")
    for line in ("Restart=on-failure", "WantedBy=multi-user.target", "StartLimitIntervalSec=0"):
        assert line in unit.text


@pytest.mark.parametrize(
    ("key", "zone", "az_id", "message"),
    [
        # The proxy of 1a on a machine in 1b: zone 1b has a proxy already.
        ("proxy-us-east-1a", "us-east-1b", None, "are both in zone 'us-east-1b'"),
        # A zone the fleet does not have.
        ("main-1", "us-east-1d", "use1-az3", "which is not one of the [[zones]]"),
    ],
)
def test_user_data_stops_before_systemd_on_a_wrong_zone(
    rendered: Rendered,
    moto: MotoServer,
    imds: FakeImds,
    key: str,
    zone: str,
    az_id: str | None,
    message: str,
) -> None:
    h = host(rendered, key)
    imds.zone, imds.az_id = zone, az_id or rendered.layout.zones[zone]["az_id"]
    with pytest.raises(RuntimeError, match="user data exited 2"):
        h.run_user_data(RootNamespace(), env(moto, imds))
    out = h.runs[-1].stdout
    assert message in out, out
    assert "zonefleet node-config failed (exit 2, attempt 1): not starting the node" in out
    assert not h.systemctl_log.exists()  # systemd was never asked
    assert not (h.systemd_dir / "zonefleet.service").exists()


def test_user_data_retries_ssm_until_the_parameter_is_readable(
    rendered: Rendered, moto: MotoServer, imds: FakeImds
) -> None:
    """A new instance may ask SSM before its role can read the parameter: node-config exits 1
    and the user data asks again a little later."""
    h = host(rendered, "main-3")
    imds.zone, imds.az_id = h.zone, rendered.layout.zones[h.zone]["az_id"]
    ssm = boto3.client(
        "ssm",
        endpoint_url=moto.endpoint,
        region_name=rendered.region,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    name = rendered.parameter
    ssm.delete_parameter(Name=name)
    result: list[str | BaseException] = []

    def boot() -> None:
        try:
            result.append(h.run_user_data(RootNamespace(), env(moto, imds)))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=boot)
    thread.start()
    log = h.root / "var" / "lib" / "zonefleet" / "user-data.log"
    deadline = time.monotonic() + 30
    while "(exit 1, attempt 1); again in 5 s" not in (log.read_text() if log.exists() else ""):
        assert thread.is_alive() and time.monotonic() < deadline, result
        time.sleep(0.05)
    ssm.put_parameter(Name=name, Value=rendered.secret, Type="SecureString")
    thread.join(60)
    assert result == ["zonefleet.service"], h.runs[-1].stdout if h.runs else result
    assert f"SSM parameter {name} does not exist" in h.runs[-1].stderr + h.runs[-1].stdout
    assert (h.config_dir / "internal.secret").read_text().strip() == rendered.secret
