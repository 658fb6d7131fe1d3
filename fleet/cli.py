"""The `zonefleet` command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import warnings
from pathlib import Path

import trio

from fleet.config import ConfigError, FleetConfig, load_fleet_config, local_fleet_toml
from fleet.logs import configure_logging
from fleet.node import run_main_broker_node
from fleet.topics_cli import add_topics_parser, run_topics_command

log = logging.getLogger("zonefleet.fleet")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zonefleet", description="zone-aware diskless Kafka")
    sub = parser.add_subparsers(dest="command", required=True)

    main = sub.add_parser("main-broker", help="run one main broker from a fleet config")
    main.add_argument("--config", required=True, help="fleet TOML file")
    main.add_argument("--node-id", type=int, default=None, help="which [[main_brokers]] entry")
    main.add_argument("--log-format", choices=["text", "json"], default=None)

    up = sub.add_parser("up", help="start the local fleet (one main broker for now)")
    up.add_argument("--data-dir", default="data", help="where the WAL and config live")
    up.add_argument("--base-port", type=int, default=19092, help="first port of the fleet")
    up.add_argument("--config", default=None, help="use this fleet TOML instead of a generated one")
    up.add_argument("--log-format", choices=["text", "json"], default=None)

    add_topics_parser(sub)
    return parser


async def _serve_fleet(config: FleetConfig, node_ids: list[int] | None, announce: bool) -> None:
    nodes = config.mains if node_ids is None else [config.main(n) for n in node_ids]
    async with trio.open_nursery() as nursery:
        for node in nodes:
            broker = await nursery.start(run_main_broker_node, node)
            if announce:
                host, port = broker.config.advertised
                print(f"zone={node.broker.zone} bootstrap={host}:{port}", flush=True)
        if announce:
            print("ready", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received signal %d, shutting down", signum)
                nursery.cancel_scope.cancel()
                break


def _configure_logs(config: FleetConfig, override: str | None, node: str) -> None:
    fmt = override or config.log_format
    configure_logging(config.log_level, "json" if fmt == "json" else "text", node)


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "main-broker":
            config = load_fleet_config(args.config)
            node = config.main(args.node_id)
            _configure_logs(config, args.log_format, f"main-{node.broker.node_id}")
            trio.run(_serve_fleet, config, [node.broker.node_id], False)
            return 0
        if args.command == "up":
            data_dir = Path(args.data_dir).resolve()
            data_dir.mkdir(parents=True, exist_ok=True)
            if args.config:
                config = load_fleet_config(args.config)
            else:
                path = data_dir / "fleet.toml"
                path.write_text(local_fleet_toml(data_dir, args.base_port))
                config = load_fleet_config(path)
            _configure_logs(config, args.log_format, "fleet")
            trio.run(_serve_fleet, config, None, True)
            return 0
        if args.command == "topics":
            return run_topics_command(args)
    except ConfigError as exc:
        print(f"zonefleet: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
