"""`zonefleet topics create|list|describe|delete`, spoken over the Kafka protocol."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleet.kafka_cli import error_name, run_over_kafka
from kafka_wire.client import KafkaClient

API_METADATA = 3
API_CREATE_TOPICS = 19
API_DELETE_TOPICS = 20
API_DESCRIBE_CONFIGS = 32
RESOURCE_TOPIC = 2


def add_topics_parser(sub: Any) -> None:
    topics = sub.add_parser("topics", help="manage topics through any broker")
    topics.add_argument("--bootstrap", default="127.0.0.1:19092", help="host:port of a broker")
    tsub = topics.add_subparsers(dest="topics_command", required=True)
    create = tsub.add_parser("create")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    tsub.add_parser("list")
    describe = tsub.add_parser("describe")
    describe.add_argument("name")
    delete = tsub.add_parser("delete")
    delete.add_argument("name")


async def _run(client: KafkaClient, args: argparse.Namespace) -> int:
    cmd = args.topics_command
    if cmd == "create":
        configs = []
        for item in args.config:
            key, sep, value = item.partition("=")
            if not sep:
                print(f"bad --config {item!r}: expected KEY=VALUE", file=sys.stderr)
                return 2
            configs.append({"name": key, "value": value})
        version = client.pick_version(API_CREATE_TOPICS, 7)
        resp = await client.request(
            API_CREATE_TOPICS,
            version,
            {
                "topics": [
                    {
                        "name": args.name,
                        "num_partitions": args.partitions,
                        "replication_factor": -1,
                        "assignments": [],
                        "configs": configs,
                    }
                ],
                "timeout_ms": 30000,
                "validate_only": False,
            },
        )
        result = resp.topics[0]
        if int(result.error_code) != 0:
            print(
                f"error: {error_name(result.error_code)}: {result.error_message}",
                file=sys.stderr,
            )
            return 1
        print(f"created topic {args.name} with {args.partitions} partition(s)")
        return 0
    if cmd == "delete":
        version = client.pick_version(API_DELETE_TOPICS, 5)
        resp = await client.request(
            API_DELETE_TOPICS, version, {"topic_names": [args.name], "timeout_ms": 30000}
        )
        result = resp.responses[0]
        if int(result.error_code) != 0:
            print(f"error: {error_name(result.error_code)}", file=sys.stderr)
            return 1
        print(f"deleted topic {args.name}")
        return 0
    version = client.pick_version(API_METADATA, 12)
    wanted = None if cmd == "list" else [{"name": args.name}]
    meta = await client.request(
        API_METADATA,
        version,
        {
            "topics": wanted,
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    if cmd == "list":
        for topic in sorted(meta.topics, key=lambda t: t.name or ""):
            print(topic.name)
        return 0
    topic = meta.topics[0]
    if int(topic.error_code) != 0:
        print(f"error: {error_name(topic.error_code)}", file=sys.stderr)
        return 1
    cversion = client.pick_version(API_DESCRIBE_CONFIGS, 4)
    configs = await client.request(
        API_DESCRIBE_CONFIGS,
        cversion,
        {
            "resources": [
                {
                    "resource_type": RESOURCE_TOPIC,
                    "resource_name": args.name,
                    "configuration_keys": None,
                }
            ],
            "include_synonyms": False,
            "include_documentation": False,
        },
    )
    out = {
        "name": topic.name,
        "topic_id": str(getattr(topic, "topic_id", "")),
        "partitions": [
            {
                "partition": p.partition_index,
                "leader": p.leader_id,
                "leader_epoch": getattr(p, "leader_epoch", -1),
                "replicas": list(p.replica_nodes),
                "isr": list(p.isr_nodes),
            }
            for p in topic.partitions
        ],
        "configs": {c.name: c.value for c in configs.results[0].configs},
    }
    print(json.dumps(out, indent=2))
    return 0


def run_topics_command(args: argparse.Namespace) -> int:
    return run_over_kafka(_run, args)
