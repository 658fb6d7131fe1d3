"""What the CLI commands that speak the Kafka protocol share (`zonefleet topics`,
`zonefleet quotas`): the `--bootstrap` address, one connection for the command, and how an
error code and an unreachable broker are printed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from kafka_wire.client import KafkaClient

__all__ = ["error_name", "run_over_kafka"]

Command = Callable[[KafkaClient, argparse.Namespace], Awaitable[int]]


def _split_bootstrap(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host or "127.0.0.1", int(port)


def error_name(code: Any) -> str:
    return getattr(code, "name", str(code))


async def _connected(command: Command, args: argparse.Namespace) -> int:
    host, port = _split_bootstrap(args.bootstrap)
    client = await KafkaClient.connect(host, port)
    try:
        return await command(client, args)
    finally:
        await client.aclose()


def run_over_kafka(command: Command, args: argparse.Namespace) -> int:
    """Runs `command` with a client connected to `args.bootstrap`; its exit code, or 1 when
    the broker cannot be reached."""
    try:
        return trio.run(_connected, command, args)
    except OSError as exc:
        print(f"cannot reach {args.bootstrap}: {exc}", file=sys.stderr)
        return 1
