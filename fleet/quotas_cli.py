"""`zonefleet quotas alter|describe`: client quotas over the Kafka protocol, as Kafka's
`kafka-configs.sh --entity-type users|clients` sets them (AlterClientQuotas and
DescribeClientQuotas, KIP-546).

    zonefleet quotas alter --client-id greedy --add producer_byte_rate=1048576
    zonefleet quotas alter --user alice --client-default --delete consumer_byte_rate
    zonefleet quotas describe [--user alice] [--client-id greedy]

`--user-default` / `--client-default` name the `<default>` entry of that kind.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleet.kafka_cli import error_name, run_over_kafka
from kafka_wire.client import KafkaClient
from kafka_wire.quotas.admin import MatchType
from kafka_wire.quotas.entities import CLIENT_ID, USER

__all__ = ["add_quotas_parser", "run_quotas_command"]

API_DESCRIBE_CLIENT_QUOTAS = 48
API_ALTER_CLIENT_QUOTAS = 49


def add_quotas_parser(sub: Any) -> None:
    quotas = sub.add_parser("quotas", help="set and show client quotas through any broker")
    quotas.add_argument("--bootstrap", default="127.0.0.1:19092", help="host:port of a broker")
    qsub = quotas.add_subparsers(dest="quotas_command", required=True)
    for name in ("alter", "describe"):
        cmd = qsub.add_parser(name)
        who = cmd.add_mutually_exclusive_group()
        who.add_argument("--user")
        who.add_argument("--user-default", action="store_true")
        client = cmd.add_mutually_exclusive_group()
        client.add_argument("--client-id")
        client.add_argument("--client-default", action="store_true")
        if name == "alter":
            cmd.add_argument("--add", action="append", default=[], metavar="KEY=VALUE")
            cmd.add_argument("--delete", action="append", default=[], metavar="KEY")
            cmd.add_argument("--validate-only", action="store_true")


def _entity(args: argparse.Namespace) -> dict[str, str | None]:
    """Entity type -> name, None for `<default>` (Kafka's wire form)."""
    entity: dict[str, str | None] = {}
    if args.user is not None or args.user_default:
        entity[USER] = args.user
    if args.client_id is not None or args.client_default:
        entity[CLIENT_ID] = args.client_id
    return entity


def _ops(args: argparse.Namespace) -> list[dict[str, Any]] | str:
    ops: list[dict[str, Any]] = []
    for item in args.add:
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            return f"bad --add {item!r}: expected KEY=NUMBER"
        ops.append({"key": key, "value": number, "remove": False})
    ops += [{"key": key, "value": 0.0, "remove": True} for key in args.delete]
    return ops


async def _alter(client: KafkaClient, args: argparse.Namespace) -> int:
    entity = _entity(args)
    ops = _ops(args)
    if isinstance(ops, str) or not entity or not ops:
        message = ops if isinstance(ops, str) else "name an entity and at least one --add/--delete"
        print(message, file=sys.stderr)
        return 2
    version = client.pick_version(API_ALTER_CLIENT_QUOTAS, 1)
    entry = {
        "entity": [{"entity_type": k, "entity_name": v} for k, v in entity.items()],
        "ops": ops,
    }
    resp = await client.request(
        API_ALTER_CLIENT_QUOTAS,
        version,
        {"entries": [entry], "validate_only": args.validate_only},
    )
    result = resp.entries[0]
    if int(result.error_code) != 0:
        print(f"error: {error_name(result.error_code)}: {result.error_message}", file=sys.stderr)
        return 1
    print(f"{'validated' if args.validate_only else 'altered'} quotas of {_label(entity)}")
    return 0


async def _describe(client: KafkaClient, args: argparse.Namespace) -> int:
    components = [
        {
            "entity_type": kind,
            "match_type": MatchType.DEFAULT if name is None else MatchType.EXACT,
            "match": name,
        }
        for kind, name in _entity(args).items()
    ]
    version = client.pick_version(API_DESCRIBE_CLIENT_QUOTAS, 1)
    resp = await client.request(
        API_DESCRIBE_CLIENT_QUOTAS, version, {"components": components, "strict": False}
    )
    if int(resp.error_code) != 0:
        print(f"error: {error_name(resp.error_code)}: {resp.error_message}", file=sys.stderr)
        return 1
    out = [
        {
            "entity": {e.entity_type: e.entity_name for e in entry.entity},
            "quotas": {v.key: v.value for v in entry.values},
        }
        for entry in resp.entries or ()
    ]
    print(json.dumps(out, indent=2))
    return 0


def _label(entity: dict[str, str | None]) -> str:
    return ", ".join(f"{k} {'<default>' if v is None else v}" for k, v in entity.items())


async def _run(client: KafkaClient, args: argparse.Namespace) -> int:
    if args.quotas_command == "alter":
        return await _alter(client, args)
    return await _describe(client, args)


def run_quotas_command(args: argparse.Namespace) -> int:
    return run_over_kafka(_run, args)
