"""Produce throughput through a zone proxy: SASL_SSL against PLAINTEXT (issue 15, target
SASL_SSL / PLAINTEXT >= 0.7).

Starts `zonefleet up --zones 3 --tls` (fleet/local_tls.py) and, for `--rounds` rounds, times
one confluent-kafka producer (idempotent, acks=all, lz4 off, `--messages` records of
`--size` bytes) through az1's proxy twice: on its PLAINTEXT port and on its SASL_SSL listener
(PLAIN user admin, TLS 1.3), the order alternating between rounds so that drift on a shared
machine hits both alike. Prints one JSON line per phase and a summary with the per-round
ratios of MB/s and their median.

    .venv/bin/python bench/security_bench.py --rounds 6 --messages 100000 --size 1024
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))


def start_fleet(data_dir: Path, base_port: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    cmd = [ZONEFLEET, "up", "--zones", "3", "--tls", "--data-dir", str(data_dir)]
    cmd += ["--base-port", str(base_port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    confs: dict[str, Any] = {}
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        m = re.match(r"zone=az1 client SASL_SSL: (.*)", line)
        if m:
            confs["SASL_SSL"] = dict(kv.split("=", 1) for kv in m.group(1).split())
        m = re.match(r"zone=az1 bootstrap=(\S+)", line)
        if m:
            confs["PLAINTEXT"] = {"bootstrap.servers": m.group(1)}
        if line.strip() == "ready" or time.monotonic() > deadline:
            break
    if set(confs) != {"SASL_SSL", "PLAINTEXT"}:
        proc.kill()
        raise SystemExit("zonefleet up --tls did not start")
    # The rest of its output is not read: send it nowhere so the pipe never fills.
    subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.DEVNULL)
    return proc, confs


def produce(conf: dict[str, Any], topic: str, messages: int, size: int) -> float:
    producer = Producer(
        {**conf, "enable.idempotence": True, "linger.ms": 5, "batch.size": 1_000_000}
    )
    payload = b"x" * size
    started = time.perf_counter()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, payload, partition=i % 6)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "records not acknowledged"
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--base-port", type=int, default=27000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zf-security-bench-") as tmp:
        proc, confs = start_fleet(Path(tmp) / "fleet", args.base_port)
        try:
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            admin = AdminClient(confs["PLAINTEXT"])
            admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(timeout=30)
            produce(confs["SASL_SSL"], topic, 2000, args.size)  # warm both paths
            produce(confs["PLAINTEXT"], topic, 2000, args.size)
            mb = args.messages * args.size / 1e6
            ratios = []
            for r in range(args.rounds):
                order = ["PLAINTEXT", "SASL_SSL"] if r % 2 == 0 else ["SASL_SSL", "PLAINTEXT"]
                rates = {}
                for name in order:
                    seconds = produce(confs[name], topic, args.messages, args.size)
                    rates[name] = mb / seconds
                    print(json.dumps({"round": r, "listener": name, "mb_s": round(rates[name], 2),
                                      "seconds": round(seconds, 2)}), flush=True)  # fmt: skip
                ratios.append(rates["SASL_SSL"] / rates["PLAINTEXT"])
            summary = {
                "ratios_sasl_ssl_over_plaintext": [round(x, 3) for x in ratios],
                "median_ratio": round(statistics.median(ratios), 3),
                "min_ratio": round(min(ratios), 3),
                "messages": args.messages,
                "size": args.size,
            }
            print(json.dumps(summary), flush=True)
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
