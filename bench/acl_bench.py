"""A produce's latency with ACLs on and off (issue 15, target p99 on / off <= 1.1).

Two 3-zone fleets, one after the other and alternating over `--rounds`, each with
SASL_PLAINTEXT listeners on the proxies (tests/test_e2e_sasl_proxies.write_sasl_config):
one without an authorizer, one with `authorizer = true` and `--acls` bindings for other
principals beside the producer's own (so the lookup is over a real index, not an empty one).
In each, a confluent-kafka producer (acks=all, SCRAM-SHA-512 user alice) sends `--rate`
records a second for `--seconds` through az1's proxy; a record's latency is from `produce()`
to its delivery report. Prints one JSON line per round and a summary with the p50 and p99 of
each side and their ratios.

    .venv/bin/python bench/acl_bench.py --rounds 2 --seconds 20 --rate 1000 --acls 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.test_e2e_sasl_proxies import sasl_bootstrap, write_sasl_config
from tests.zone_fleet import running_up_fleet

ADMIN_PW, ALICE_PW = "admin-pw-bench", "alice-pw-bench"


def _conf(bootstrap: str, user: str, pw: str, mech: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mech,
        "sasl.username": user,
        "sasl.password": pw,
    }


def _bindings(n: int, topic: str) -> list[AclBinding]:
    allow, literal = AclPermissionType.ALLOW, ResourcePatternType.LITERAL
    alice = "User:alice"
    out = [
        AclBinding(ResourceType.TOPIC, topic, literal, alice, "*", AclOperation.WRITE, allow),
        # confluent-kafka's BROKER is Kafka's CLUSTER resource.
        AclBinding(
            ResourceType.BROKER, "kafka-cluster", literal, alice, "*",
            AclOperation.IDEMPOTENT_WRITE, allow,
        ),
    ]  # fmt: skip
    for i in range(n):
        pattern = ResourcePatternType.PREFIXED if i % 2 else literal
        out.append(
            AclBinding(
                ResourceType.TOPIC, f"other-{i}", pattern, f"User:u{i}", "*",
                AclOperation.ALL, allow,
            )
        )  # fmt: skip
    return out


def one_round(data_dir: Path, acls_on: bool, args: argparse.Namespace) -> dict[str, Any]:
    extra = 'authorizer = true\nsuper_users = ["User:admin"]\n' if acls_on else ""
    config = write_sasl_config(data_dir, {"admin": ADMIN_PW}, extra)
    with running_up_fleet(data_dir, config) as (_, fleet):
        bootstrap = sasl_bootstrap(fleet, "az1")
        admin = AdminClient(_conf(bootstrap, "admin", ADMIN_PW, "PLAIN"))
        topic = f"acl-bench-{uuid.uuid4().hex[:6]}"
        admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(timeout=30)
        upsert = UserScramCredentialUpsertion(
            "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), ALICE_PW.encode()
        )
        for f in admin.alter_user_scram_credentials([upsert]).values():
            f.result(timeout=30)
        if acls_on:
            for start in range(0, args.acls + 2, 500):
                batch = _bindings(args.acls, topic)[start : start + 500]
                for f in admin.create_acls(batch).values():
                    f.result(timeout=60)
        producer = Producer(
            {**_conf(bootstrap, "alice", ALICE_PW, "SCRAM-SHA-512"), "linger.ms": 1, "acks": "all"}
        )
        # Warm up (and wait for the proxies to read credentials and ACLs): until a record goes.
        deadline = time.monotonic() + 60
        ok: list[bool] = []

        def warmed(err: Any, msg: Any) -> None:
            if err is None:
                ok.append(True)

        while not ok and time.monotonic() < deadline:
            producer.produce(topic, b"warm", on_delivery=warmed)
            producer.flush(5)
        latencies: list[float] = []

        def delivered(err: Any, msg: Any, *, sent: float) -> None:
            if err is None:
                latencies.append(time.perf_counter() - sent)

        interval = 1.0 / args.rate
        start = time.perf_counter()
        n = int(args.rate * args.seconds)
        for i in range(n):
            due = start + i * interval
            while (now := time.perf_counter()) < due:
                producer.poll(0)
                if due - now > 0.002:
                    time.sleep(0.001)
            sent = time.perf_counter()
            producer.produce(topic, b"x" * 200, on_delivery=partial(delivered, sent=sent))
        producer.flush(60)
    latencies.sort()
    return {
        "acls": "on" if acls_on else "off",
        "records": len(latencies),
        "p50_ms": round(1000 * statistics.median(latencies), 2),
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--acls", type=int, default=1000)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="zf-acl-bench-") as tmp:
        for r in range(args.rounds):
            for acls_on in (r % 2 == 0, r % 2 == 1):
                row = one_round(Path(tmp) / f"r{r}-{int(acls_on)}", acls_on, args)
                row["round"] = r
                results[row["acls"]].append(row)
                print(json.dumps(row), flush=True)
    p99 = {k: statistics.median(r["p99_ms"] for r in v) for k, v in results.items()}
    p50 = {k: statistics.median(r["p50_ms"] for r in v) for k, v in results.items()}
    summary = {
        "p50_ms": p50,
        "p99_ms": p99,
        "p99_ratio_on_over_off": round(p99["on"] / p99["off"], 3),
        "p50_ratio_on_over_off": round(p50["on"] / p50["off"], 3),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
