"""Fleet TOML parsing and validation, and zone discovery against a local fake IMDSv2."""

from __future__ import annotations

import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet.config import (
    AUTO_ZONE,
    ConfigError,
    load_fleet_config,
    local_fleet_toml,
    local_zones_fleet_toml,
    parse_fleet_config,
)
from fleet.zone_discovery import discover_zone, discover_zone_blocking
from tests.ports import free_port

SECRET = "s3cret-" + "x" * 40

BASE = f"""
[fleet]
data_dir = "data"

[[zones]]
name = "us-east-1a"
az_id = "use1-az1"

[[zones]]
name = "us-east-1b"
az_id = "use1-az2"

[internal]
secret = "{SECRET}"

[[main_brokers]]
node_id = 1
zone = "us-east-1a"
port = 9092
admin_port = 9093
rpc_port = 9094
"""

PROXIES = """
[[proxies]]
node_id = 101
zone = "us-east-1a"
port = 9192
admin_port = 9193

[[proxies]]
node_id = 102
zone = "use1-az2"
host = "10.0.1.5"
advertised_host = "proxy-b.internal"
port = 9192
admin_port = 9193
"""


def parse(text: str, tmp_path: Path, **kw: Any) -> Any:
    return parse_fleet_config(tomllib.loads(text), tmp_path, **kw)


def no_discovery(url: str) -> tuple[str, str | None] | None:
    raise AssertionError("zone discovery must not run when every zone is set")


def test_proxies_get_mains_peers_and_zones(tmp_path: Path) -> None:
    config = parse(BASE + PROXIES, tmp_path, discover=no_discovery)
    main = config.main(1).broker
    assert main.rpc_port == 9094 and main.rpc_secret == SECRET.encode()
    assert main.wal_url == f"osfs://{tmp_path / 'data' / 'wal'}"
    a, b = config.proxy(101).proxy, config.proxy(102).proxy
    assert config.proxy(None).proxy is a
    assert b.zone == "us-east-1b"  # the AZ id in the TOML maps to the zone name
    assert a.rpc_secret == SECRET.encode() and a.wal_url == main.wal_url
    assert [(m.node_id, m.zone, m.host, m.kafka_port, m.rpc_port) for m in a.mains] == [
        (1, "us-east-1a", "127.0.0.1", 9092, 9094)
    ]
    # Peers are reached at their advertised address.
    assert [(p.node_id, p.zone, p.host, p.kafka_port) for p in a.peers] == [
        (102, "us-east-1b", "proxy-b.internal", 9192)
    ]
    assert [p.node_id for p in b.peers] == [101]
    assert a.zones == {"us-east-1a": "use1-az1", "us-east-1b": "use1-az2"}
    assert config.proxy(102).admin_host == "10.0.1.5"
    assert [(n.node_id, n.role, n.zone, n.admin_port) for n in config.nodes()] == [
        (1, "main", "us-east-1a", 9093),
        (101, "proxy", "us-east-1a", 9193),
        (102, "proxy", "us-east-1b", 9193),
    ]
    with pytest.raises(ConfigError, match="no proxy with node_id 7"):
        config.proxy(7)


def test_local_zones_fleet_layout(tmp_path: Path) -> None:
    text = local_zones_fleet_toml(tmp_path, 30000, 3, "ab" * 32)
    config = parse(text, tmp_path, discover=no_discovery)
    assert [z.name for z in config.zones] == ["az1", "az2", "az3"]
    assert [
        (m.broker.node_id, m.broker.zone, m.broker.port, m.admin_port, m.broker.rpc_port)
        for m in config.mains
    ] == [
        (1, "az1", 30012, 30013, 30014),
        (2, "az2", 30022, 30023, 30024),
        (3, "az3", 30032, 30033, 30034),
    ]
    main = config.mains[0]
    # Every main knows every main, and they share one cluster metadata document.
    assert [p.node_id for p in main.broker.mains] == [1, 2, 3]
    assert {m.broker.metadata_url for m in config.mains} == {f"file://{tmp_path / 'metadata'}"}
    assert [
        (p.proxy.node_id, p.proxy.zone, p.proxy.port, p.admin_port) for p in config.proxies
    ] == [
        (101, "az1", 30010, 30011),
        (102, "az2", 30020, 30021),
        (103, "az3", 30030, 30031),
    ]
    assert config.internal_secret == ("ab" * 32).encode()
    assert main.broker.wal_url == f"osfs://{tmp_path / 'wal'}"
    with pytest.raises(ConfigError, match="at least 1"):
        local_zones_fleet_toml(tmp_path, 30000, 0, "ab" * 32)


def test_plain_local_fleet_has_no_rpc(tmp_path: Path) -> None:
    config = parse(local_fleet_toml(tmp_path, 30000), tmp_path, discover=no_discovery)
    (main,) = config.mains
    assert main.broker.rpc_port is None and main.broker.rpc_secret is None
    assert config.proxies == [] and config.internal_secret is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BASE.replace('secret = "', 'x = "') + PROXIES, "rpc_port but the config has no"),
        (
            BASE.replace('secret = "', 'x = "').replace("rpc_port = 9094", "") + PROXIES,
            r"\[\[proxies\]\] but no \[internal\] secret",
        ),
        (BASE.replace("rpc_port = 9094", "") + PROXIES, "needs a fixed rpc_port"),
        (BASE + PROXIES.replace("node_id = 102", "node_id = 1"), "node_id 1 is used by more"),
        (BASE + PROXIES.replace('zone = "use1-az2"', 'zone = "us-east-1c"'), "unknown zone"),
        (BASE.replace('zone = "us-east-1a"', 'zone = "mars"'), "main broker 1 names unknown"),
        (BASE + PROXIES.replace("9192", "9094", 1), "proxy 101 port and main broker 1 rpc"),
        (BASE + PROXIES.replace('zone = "use1-az2"', 'zone = "use1-az1"'), "one proxy per zone"),
        (BASE.replace(SECRET, "short"), "too short"),
        (BASE + '[cidrs]\n"10.0.0.0/33" = "us-east-1a"\n', "not a CIDR block"),
        (BASE + '[cidrs]\n"10.0.0.0/16" = "us-east-1z"\n', "cidr 10.0.0.0/16 names unknown"),
        (BASE + PROXIES.replace("[[proxies]]\nnode_id = 101\n", "[[proxies]]\n"), "node_id"),
        (
            BASE.replace("rpc_port = 9094", "rpc_port = 9094\ngroup_min_session_timeout_ms = 9")
            + "group_max_session_timeout_ms = 8\n",
            "group_min_session_timeout_ms",
        ),
        (
            BASE.replace("rpc_port = 9094", "rpc_port = 9094\ntransaction_max_timeout_ms = 0"),
            "transaction_max_timeout_ms",
        ),
    ],
)
def test_invalid_configs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(text, tmp_path, discover=no_discovery)


def test_wildcard_host_clashes_with_any_host(tmp_path: Path) -> None:
    text = BASE + PROXIES.replace('host = "10.0.1.5"', 'host = "0.0.0.0"')
    with pytest.raises(ConfigError, match="proxy 102 port and proxy 101 port"):
        parse(text, tmp_path, discover=no_discovery)


def test_secret_file_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("f" * 40 + "\n")
    text = BASE.replace(f'secret = "{SECRET}"', 'secret_file = "secret.txt"') + PROXIES
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    config = load_fleet_config(path, discover=no_discovery)
    assert config.internal_secret == b"f" * 40
    assert config.proxy(101).proxy.rpc_secret == b"f" * 40
    both = BASE.replace(f'secret = "{SECRET}"', f'secret = "{SECRET}"\nsecret_file = "s"')
    with pytest.raises(ConfigError, match="not both"):
        parse(both, tmp_path)
    missing = BASE.replace(f'secret = "{SECRET}"', 'secret_file = "nope.txt"')
    with pytest.raises(ConfigError, match="cannot read"):
        parse(missing, tmp_path)


def test_cidrs_table_and_array(tmp_path: Path) -> None:
    table = parse(
        BASE + '[cidrs]\n"10.0.0.7/16" = "us-east-1a"\n"10.1.0.0/16" = "use1-az2"\n', tmp_path
    )
    assert table.cidrs == {"10.0.0.0/16": "us-east-1a", "10.1.0.0/16": "us-east-1b"}
    array = parse(
        BASE + '[[cidrs]]\ncidr = "fd00::/8"\nzone = "us-east-1b"\n'
        '[[cidrs]]\ncidr = "10.2.0.0/16"\nzone = "us-east-1a"\n',
        tmp_path,
    )
    assert array.cidrs == {"fd00::/8": "us-east-1b", "10.2.0.0/16": "us-east-1a"}
    with pytest.raises(ConfigError, match="listed twice"):
        parse(
            BASE + '[cidrs]\n"10.0.0.1/8" = "us-east-1a"\n"10.0.0.0/8" = "us-east-1a"\n', tmp_path
        )


# -- zone discovery --------------------------------------------------------------------------


class FakeImds:
    """IMDSv2 on a loopback port: a PUT hands out a token; reads without it get 401."""

    TOKEN = "fake-imds-token"

    def __init__(self, zone: str = "us-east-1b", az_id: str | None = "use1-az2") -> None:
        self.zone, self.az_id = zone, az_id
        self.requests: list[tuple[str, str, str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                fake.requests.append(("PUT", self.path, ttl))
                if self.path == "/latest/api/token" and ttl and int(ttl) > 0:
                    self._reply(200, fake.TOKEN)
                else:
                    self._reply(400, "")

            def do_GET(self) -> None:
                token = self.headers.get("X-aws-ec2-metadata-token")
                fake.requests.append(("GET", self.path, token))
                if token != fake.TOKEN:
                    self._reply(401, "")
                    return
                values = {
                    "/latest/meta-data/placement/availability-zone": fake.zone,
                    "/latest/meta-data/placement/availability-zone-id": fake.az_id,
                }
                value = values.get(self.path)
                self._reply(404, "") if value is None else self._reply(200, value)

            def _reply(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def token_requests(self) -> int:
        return sum(1 for r in self.requests if r[0] == "PUT")


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    yield fake
    fake.close()


@pytest.fixture
def dead_url() -> str:
    """A loopback URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


async def test_discover_zone_speaks_imdsv2(imds: FakeImds) -> None:
    assert await discover_zone(imds.url, timeout=2.0) == ("us-east-1b", "use1-az2")
    assert imds.requests == [
        ("PUT", "/latest/api/token", "60"),
        ("GET", "/latest/meta-data/placement/availability-zone", FakeImds.TOKEN),
        ("GET", "/latest/meta-data/placement/availability-zone-id", FakeImds.TOKEN),
    ]


async def test_discover_zone_without_az_id(imds: FakeImds) -> None:
    imds.az_id = None
    assert await discover_zone(imds.url, timeout=2.0) == ("us-east-1b", None)


async def test_discover_zone_failures(imds: FakeImds, dead_url: str) -> None:
    assert await discover_zone(dead_url, timeout=1.0) is None
    imds.TOKEN = ""  # an IMDS that hands out no token (IMDSv2 off)
    assert await discover_zone(imds.url, timeout=1.0) is None


AUTO = BASE.replace('zone = "us-east-1a"\nport = 9092', "port = 9092") + PROXIES.replace(
    'zone = "use1-az2"', 'zone = "auto"'
)


def test_auto_zones_come_from_imds(tmp_path: Path, imds: FakeImds) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(AUTO.replace("[fleet]\n", f'[fleet]\nimds_url = "{imds.url}"\n'))
    config = load_fleet_config(path)  # the default discovery, pointed at the fake
    assert config.main(1).broker.zone == "us-east-1b"  # zone absent
    assert config.proxy(102).proxy.zone == "us-east-1b"  # zone = "auto"
    assert config.proxy(101).proxy.peers[0].zone == "us-east-1b"
    assert imds.token_requests == 1  # asked once per load


def test_discovered_zone_matched_by_az_id(tmp_path: Path, imds: FakeImds) -> None:
    imds.zone = "renamed-zone"  # only the AZ id matches a [[zones]] entry
    config = parse(AUTO, tmp_path, discover=lambda url: discover_zone_blocking(imds.url))
    assert config.proxy(102).proxy.zone == "us-east-1b"
    imds.az_id = "use1-az9"
    with pytest.raises(ConfigError, match="not one of the"):
        parse(AUTO, tmp_path, discover=lambda url: discover_zone_blocking(imds.url))


def test_discovered_zone_without_declared_zones(tmp_path: Path, imds: FakeImds) -> None:
    text = "[[main_brokers]]\nnode_id = 1\n"
    config = parse(text, tmp_path, discover=lambda url: discover_zone_blocking(imds.url))
    assert config.main(1).broker.zone == "us-east-1b"
    assert [(z.name, z.az_id) for z in config.zones] == [("us-east-1b", "use1-az2")]


def test_no_imds_is_a_clear_config_error(tmp_path: Path, dead_url: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(AUTO.replace("[fleet]\n", f'[fleet]\nimds_url = "{dead_url}"\n'))
    with pytest.raises(ConfigError, match=r"main broker 1 has no zone.*IMDSv2.*set zone"):
        load_fleet_config(path)


async def test_auto_zone_loaded_inside_trio(tmp_path: Path, imds: FakeImds) -> None:
    # A nested trio.run is impossible here; discovery must still work.
    config = parse(AUTO, tmp_path, discover=lambda url: discover_zone_blocking(imds.url))
    assert config.main(1).broker.zone == "us-east-1b"


def test_discovery_off_keeps_auto(tmp_path: Path) -> None:
    config = parse(AUTO, tmp_path, discover=None)
    assert config.main(1).broker.zone == AUTO_ZONE
    assert config.proxy(102).proxy.zone == AUTO_ZONE


def test_transaction_settings_reach_the_main(tmp_path: Path) -> None:
    text = BASE.replace(
        "rpc_port = 9094",
        "rpc_port = 9094\ntransaction_max_timeout_ms = 60000\n"
        "transactional_id_expiration_ms = 3600000",
    )
    broker = parse(text, tmp_path, discover=no_discovery).mains[0].broker
    assert (broker.transaction_max_timeout_ms, broker.transactional_id_expiration_ms) == (
        60000,
        3600000,
    )


def test_connection_limits_reach_mains_and_proxies(tmp_path: Path) -> None:
    limits = "max_connections = 500\nmax_connections_per_ip = 20\nconnections_max_idle_ms = 1500\n"
    text = BASE.replace("rpc_port = 9094", "rpc_port = 9094\n" + limits) + PROXIES.replace(
        "[[proxies]]\nnode_id = 101\n", "[[proxies]]\nnode_id = 101\n" + limits, 1
    )
    config = parse(text, tmp_path, discover=no_discovery)
    for node in (config.mains[0].broker, config.proxies[0].proxy):
        assert (node.max_connections, node.max_connections_per_ip) == (500, 20)
        assert node.connections_max_idle_s == 1.5


MAIN_SASL = (
    'listeners = [{ name = "SASL", protocol = "SASL_PLAINTEXT", port = 9097, '
    'advertised_host = "main-a.example" }]\n'
)
PROXY_SASL = 'listeners = [{ name = "SASL", protocol = "SASL_PLAINTEXT", port = 9197 }]\n'


def _with_listeners(extra: str = "", main: str = MAIN_SASL) -> str:
    base = BASE.replace("rpc_port = 9094\n", "rpc_port = 9094\n" + main)
    proxies = PROXIES.replace("admin_port = 9193\n", "admin_port = 9193\n" + PROXY_SASL, 1)
    return extra + base + proxies


def test_main_listeners_are_parsed_and_advertised(tmp_path: Path) -> None:
    config = parse(_with_listeners(), tmp_path, discover=no_discovery)
    main = config.main(1).broker
    (lst,) = main.listeners
    assert (lst.name, lst.protocol, lst.host, lst.port) == (
        "SASL",
        "SASL_PLAINTEXT",
        "127.0.0.1",
        9097,
    )
    assert main.sasl.mechanisms == ("SCRAM-SHA-512", "SCRAM-SHA-256")
    assert main.listener_super_users is None  # no authorizer: every authenticated principal
    # The proxies list the main on its listener; the main lists the proxies on theirs.
    proxy = config.proxy(101).proxy
    assert proxy.mains[0].listeners == (("SASL", "main-a.example", 9097),)
    assert [n.listeners for n in main.zone_proxies] == [(("SASL", "127.0.0.1", 9197),), ()]


def test_main_listeners_with_the_authorizer_serve_super_users_only(tmp_path: Path) -> None:
    security = '[security]\nauthorizer = true\nsuper_users = ["User:admin"]\n'
    config = parse(_with_listeners(security), tmp_path, discover=no_discovery)
    assert config.main(1).broker.listener_super_users == frozenset({"User:admin"})
    # The proxies, which check ACLs, send no client to a main's listener.
    assert config.proxy(101).proxy.mains[0].listeners == ()


def test_main_listener_ports_must_not_clash(tmp_path: Path) -> None:
    clash = MAIN_SASL.replace("9097", "9093")
    with pytest.raises(ConfigError, match="listener SASL and main broker 1 admin_port"):
        parse(_with_listeners(main=clash), tmp_path, discover=no_discovery)
    bad = MAIN_SASL.replace("SASL_PLAINTEXT", "KERBEROS")
    with pytest.raises(ConfigError, match="main broker 1: listener SASL has protocol"):
        parse(_with_listeners(main=bad), tmp_path, discover=no_discovery)


def test_local_tls_gives_each_main_a_sasl_ssl_listener(tmp_path: Path) -> None:
    from fleet.local_tls import LocalTls

    text = local_zones_fleet_toml(
        tmp_path,
        30000,
        2,
        "ab" * 32,
        proxy_listeners=LocalTls.proxy_listeners_toml,
        main_listeners=LocalTls.main_listeners_toml,
    )
    text = text.replace(
        "[[zones]]", "[security]\nssl_certfile = 'c'\nssl_keyfile = 'k'\n\n[[zones]]", 1
    )
    config = parse(text, tmp_path, discover=no_discovery)
    assert [[(lst.name, lst.port) for lst in m.broker.listeners] for m in config.mains] == [
        [("SASL_SSL", 30017)],
        [("SASL_SSL", 30027)],
    ]
    assert config.proxy(101).proxy.mains[1].listeners == (("SASL_SSL", "127.0.0.1", 30027),)
