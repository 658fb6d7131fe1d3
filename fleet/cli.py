"""The `zonefleet` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import secrets
import signal
import sys
import warnings
from pathlib import Path

import trio

from fleet.config import (
    ZONE_PORT_STRIDE,
    ConfigError,
    FleetConfig,
    MainBrokerNode,
    ProxyNode,
    load_fleet_config,
    local_fleet_toml,
    local_zones_fleet_toml,
)
from fleet.inspect_cli import add_inspect_parser, run_inspect_command
from fleet.local_tls import write_local_tls
from fleet.logs import configure_logging
from fleet.node import run_main_broker_node, run_proxy_node
from fleet.node_config import add_node_config_parser, run_node_config_command
from fleet.quotas_cli import add_quotas_parser, run_quotas_command
from fleet.report_cli import add_report_parser, run_report_command
from fleet.status_cli import add_status_parser, run_status_command
from fleet.supervisor import PARENT_PID_ENV, NodeFailed, NodeSpec, Supervisor, exit_with_parent
from fleet.topics_cli import add_topics_parser, run_topics_command
from kafka_wire.connection_limits import raise_open_files_limit
from main_broker.cluster.watch import MainFenced

log = logging.getLogger("zonefleet.fleet")

EXIT_FENCED = 3  # a main broker whose WAL another main fenced
DEFAULT_ZONES = 3  # `zonefleet up` with no flags: the zone fleet, as in production


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zonefleet", description="zone-aware diskless Kafka")
    parser.add_argument("--version", action="version", version=f"zonefleet {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    main = sub.add_parser("main-broker", help="run one main broker from a fleet config")
    main.add_argument("--config", required=True, help="fleet TOML file")
    main.add_argument("--node-id", type=int, default=None, help="which [[main_brokers]] entry")
    main.add_argument("--log-format", choices=["text", "json"], default=None)

    proxy = sub.add_parser("proxy", help="run one zone proxy from a fleet config")
    proxy.add_argument("--config", required=True, help="fleet TOML file")
    proxy.add_argument("--node-id", type=int, default=None, help="which [[proxies]] entry")
    proxy.add_argument("--log-format", choices=["text", "json"], default=None)

    up = sub.add_parser(
        "up",
        help="start a local fleet (one process per node)",
        description="Start a local fleet. By default three zones: in each zone azK (K = 1..N, "
        "--zones N) a zone proxy (node 100+K; kafka +10*K, admin +10*K+1) and a main broker "
        "(node K; kafka +10*K+2, admin +10*K+3, internal RPC +10*K+4), all on <data-dir>/wal "
        "with the cluster metadata in <data-dir>/metadata; clients bootstrap from their zone's "
        "proxy. --zones 1: one main broker alone on --base-port (admin +1), no proxy.",
    )
    up.add_argument("--data-dir", default="data", help="where the WAL and config live")
    up.add_argument("--base-port", type=int, default=19092, help="first port of the fleet")
    which = up.add_mutually_exclusive_group()
    which.add_argument(
        "--config", default=None, help="use this fleet TOML instead of a generated one"
    )
    which.add_argument(
        "--zones",
        type=int,
        default=DEFAULT_ZONES,
        help=f"zones az1..azN, each with a main broker and a zone proxy (default "
        f"{DEFAULT_ZONES}); 1: a lone main broker",
    )
    up.add_argument("--log-format", choices=["text", "json"], default=None)
    up.add_argument(
        "--tls",
        action="store_true",
        help="generate a throwaway CA and certificates under <data-dir>/tls and give each "
        "zone proxy a SASL_SSL listener (+10*K+5, user admin with PLAIN) and an mTLS listener "
        "(+10*K+6), and each main a SASL_SSL listener (+10*K+7); prints the client settings",
    )
    up.add_argument(
        "--single-process",
        action="store_true",
        help="run every node in this one process (by default each node is its own process)",
    )

    add_topics_parser(sub)
    add_quotas_parser(sub)
    add_status_parser(sub)
    add_inspect_parser(sub)
    add_report_parser(sub)
    add_node_config_parser(sub)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("zonefleet")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


async def _serve_fleet(
    mains: list[MainBrokerNode], proxies: list[ProxyNode], announce: bool
) -> None:
    """Run the given nodes until SIGINT/SIGTERM; announce each zone's bootstrap when asked.

    Clients bootstrap from their zone's proxy, so with proxies only they are announced.
    """
    raise_open_files_limit()  # a file descriptor per client connection
    async with trio.open_nursery() as nursery:
        for node in mains:
            broker = await nursery.start(run_main_broker_node, node)
            if announce and not proxies:
                host, port = broker.config.advertised
                print(f"zone={node.broker.zone} bootstrap={host}:{port}", flush=True)
        # Mains first: a proxy syncs its mirror from the mains' internal RPC as it starts.
        for pnode in proxies:
            proxy = await nursery.start(run_proxy_node, pnode)
            if announce:
                host, port = proxy.config.advertised
                print(f"zone={pnode.proxy.zone} bootstrap={host}:{port}", flush=True)
        if announce:
            print("ready", flush=True)
        parent = os.environ.get(PARENT_PID_ENV)
        if parent is not None and parent.isdigit():
            nursery.start_soon(exit_with_parent, int(parent), nursery.cancel_scope)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received signal %d, shutting down", signum)
                nursery.cancel_scope.cancel()
                break


def _configure_logs(config: FleetConfig, override: str | None, node: str) -> None:
    fmt = override or config.log_format
    configure_logging(config.log_level, "json" if fmt == "json" else "text", node)
    found = config.discovered_zone
    if found is not None:  # looked up while the config loaded, before logging was set up
        log.info(
            "found %s",
            found.describe(),
            extra={"zone": found.zone, "az_id": found.az_id, "imds_endpoint": found.endpoint},
        )


def _up_config(args: argparse.Namespace) -> tuple[Path, FleetConfig]:
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if args.config:
        return Path(args.config).resolve(), load_fleet_config(args.config)
    path = data_dir / "fleet.toml"
    if args.zones == 1:
        if args.tls:
            raise ConfigError("--tls puts its listeners on zone proxies: use --zones 2 or more")
        text = local_fleet_toml(data_dir, args.base_port)
    elif args.tls:
        tls = write_local_tls(data_dir)
        text = local_zones_fleet_toml(
            data_dir,
            args.base_port,
            args.zones,
            secrets.token_hex(32),
            security_toml=tls.security_toml() + tls.admin_toml(),
            proxy_listeners=tls.proxy_listeners_toml,
            main_listeners=tls.main_listeners_toml,
        )
        for k in range(1, args.zones + 1):
            for line in tls.client_settings(args.base_port + ZONE_PORT_STRIDE * k):
                print(f"zone=az{k} client {line}", flush=True)
            main_line = tls.main_client_settings(args.base_port + ZONE_PORT_STRIDE * k)
            print(f"zone=az{k} main {main_line}", flush=True)
        print(tls.admin_line(), flush=True)
    else:
        text = local_zones_fleet_toml(data_dir, args.base_port, args.zones, secrets.token_hex(32))
    # The file may hold the internal secret: readable by its owner only.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file left by an earlier run
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path, load_fleet_config(path)


def _run_up(args: argparse.Namespace) -> None:
    path, config = _up_config(args)
    _configure_logs(config, args.log_format, "fleet")
    if args.single_process or len(config.mains) + len(config.proxies) == 1:
        trio.run(_serve_fleet, config.mains, config.proxies, True)
        return
    # Clients bootstrap from their zone's proxy, so with proxies only they are announced.
    mains = [
        NodeSpec("main-broker", m.broker.node_id, m.broker.zone, not config.proxies)
        for m in config.mains
    ]
    proxies = [NodeSpec("proxy", p.proxy.node_id, p.proxy.zone, True) for p in config.proxies]
    trio.run(Supervisor(path, args.log_format).serve, mains, proxies)


def _run_main_broker(node: MainBrokerNode) -> int:
    """One main broker; EXIT_FENCED when another main fenced its WAL (the supervisor, or
    systemd, starts a new incarnation: main_broker/cluster/watch.py)."""
    try:
        trio.run(_serve_fleet, [node], [], True)
    except BaseExceptionGroup as group:
        fenced = group.subgroup(MainFenced)
        if fenced is None:
            raise
        first: BaseException = fenced
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        log.critical("%s", first)
        return EXIT_FENCED
    return 0


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "main-broker":
            config = load_fleet_config(args.config)
            node = config.main(args.node_id)
            _configure_logs(config, args.log_format, f"main-{node.broker.node_id}")
            return _run_main_broker(node)
        if args.command == "proxy":
            config = load_fleet_config(args.config)
            pnode = config.proxy(args.node_id)
            _configure_logs(config, args.log_format, f"proxy-{pnode.proxy.node_id}")
            trio.run(_serve_fleet, [], [pnode], True)
            return 0
        if args.command == "up":
            _run_up(args)
            return 0
        if args.command == "topics":
            return run_topics_command(args)
        if args.command == "quotas":
            return run_quotas_command(args)
        if args.command == "status":
            return run_status_command(args)
        if args.command == "inspect-object":
            return run_inspect_command(args)
        if args.command == "cost-report":
            return run_report_command(args)
        if args.command == "node-config":
            return run_node_config_command(args)
    except ConfigError as exc:
        print(f"zonefleet: configuration error: {exc}", file=sys.stderr)
        return 2
    except NodeFailed as exc:
        print(f"zonefleet: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
