"""Transactions against idempotence, through a zone proxy, in one run (issue 13).

Starts `zonefleet up --zones 3` and, through one zone's proxy (az2 by default):

- produce: an idempotent producer and a transactional one that commits every
  `--commit-ms` (100 ms), alternated `--rounds` times for `--seconds` each (which goes first
  alternates too), with the same message size, linger, bounded queue and topic layout; the
  figure is the median of the per-round ratios of transactional to idempotent messages per
  second;
- consume: a `read_committed` and a `read_uncommitted` consumer read the same topic (the
  transactional rounds' records, a tenth of them in aborted transactions), alternated too;
  the figure is the median ratio of their messages per second.

Prints one JSON line. Targets (docs/performance.md): produce ratio >= 0.8, consume ratio
>= 0.9.

    python bench/transactions_bench.py [--seconds 5] [--rounds 3] [--commit-ms 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import run_zonefleet

PARTITIONS = 3


def _client_id(zone: str) -> str:
    return f"zone={zone}"


class ProduceRound:
    def __init__(self) -> None:
        self.acked = 0  # committed, for a transactional producer
        self.aborted = 0
        self.elapsed_s = 0.0  # from the first produce to the last acknowledgment
        self.drain_ms: list[float] = []  # flushing what the transaction produced
        self.end_ms: list[float] = []  # then commit_transaction: EndTxn and its markers

    @property
    def msgs_s(self) -> float:
        return self.acked / self.elapsed_s if self.elapsed_s else 0.0


def _produce(
    bootstrap: str, zone: str, topic: str, seconds: float, size: int, commit_ms: int | None
) -> ProduceRound:
    """Produce for `seconds` (then flush); a transactional producer commits every
    `commit_ms` and aborts every tenth transaction, so readers have aborted ranges to skip."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "client.id": _client_id(zone),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_048_576,
        # A bounded queue (the same for both): a commit drains at most this much, as an
        # application that commits every 100 ms keeps about that much in flight.
        "queue.buffering.max.kbytes": 16384,
    }
    if commit_ms is not None:
        config["transactional.id"] = f"bench-{uuid.uuid4().hex}"
    producer = Producer(config)
    payload = b"x" * size
    out = ProduceRound()
    acked = 0

    def delivered(err: KafkaError | None, _msg: object) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    if commit_ms is not None:
        producer.init_transactions(30)
    started = time.monotonic()
    end = started + seconds
    txns = 0
    while time.monotonic() < end:
        if commit_ms is not None:
            producer.begin_transaction()
        txn_end = time.monotonic() + (commit_ms or 100) / 1000
        before = acked
        while time.monotonic() < txn_end:
            try:
                producer.produce(topic, payload, on_delivery=delivered)
            except BufferError:
                producer.poll(0.005)
            producer.poll(0)
        if commit_ms is None:
            continue
        txns += 1
        if txns % 10 == 0:
            producer.flush(30)
            producer.abort_transaction(30)
            out.aborted += acked - before
            acked = before
        else:
            drain_started = time.monotonic()
            producer.flush(30)
            commit_started = time.monotonic()
            producer.commit_transaction(30)
            out.drain_ms.append((commit_started - drain_started) * 1000)
            out.end_ms.append((time.monotonic() - commit_started) * 1000)
    producer.flush(30)
    out.elapsed_s = time.monotonic() - started
    out.acked = acked
    return out


def _consume(bootstrap: str, zone: str, topic: str, isolation: str, expect: int) -> float:
    """Seconds to read `expect` records from the beginning of every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": _client_id(zone),
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got = 0
    started = time.monotonic()
    deadline = started + 300
    try:
        while got < expect and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if not msg.error():
                    got += 1
    finally:
        consumer.close()
    if got < expect:
        raise RuntimeError(f"{isolation}: read {got} of {expect}")
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--zone", default="az2")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zonefleet-txn-bench-") as tmp:
        with run_zonefleet(Path(tmp), zone_count=3, ready_timeout=60) as zones:
            bootstrap = zones[args.zone]
            admin = AdminClient({"bootstrap.servers": bootstrap})
            idem_topic, txn_topic = f"idem-{uuid.uuid4().hex[:6]}", f"txn-{uuid.uuid4().hex[:6]}"
            for name in (idem_topic, txn_topic):
                admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
            rounds = []
            committed = aborted = 0
            for n in range(args.rounds):
                # Alternate which goes first: the broker's background work after a phase
                # (uploads of what it wrote) then weighs on both alike.
                order = [None, args.commit_ms] if n % 2 == 0 else [args.commit_ms, None]
                done = {
                    commit_ms: _produce(
                        bootstrap,
                        args.zone,
                        txn_topic if commit_ms else idem_topic,
                        args.seconds,
                        args.size,
                        commit_ms,
                    )
                    for commit_ms in order
                }
                idem, txn = done[None], done[args.commit_ms]
                committed += txn.acked
                aborted += txn.aborted
                rounds.append(
                    {
                        "idempotent_msgs_s": round(idem.msgs_s),
                        "transactional_msgs_s": round(txn.msgs_s),
                        "ratio": txn.msgs_s / idem.msgs_s if idem.msgs_s else 0.0,
                        "commits": len(txn.end_ms),
                        "drain_p50_ms": round(statistics.median(txn.drain_ms or [0.0]), 1),
                        "end_txn_p50_ms": round(statistics.median(txn.end_ms or [0.0]), 1),
                    }
                )
            reads = []
            for _ in range(args.rounds):
                committed_s = _consume(bootstrap, args.zone, txn_topic, "read_committed", committed)
                uncommitted_s = _consume(
                    bootstrap, args.zone, txn_topic, "read_uncommitted", committed + aborted
                )
                reads.append(
                    {
                        "read_committed_msgs_s": committed / committed_s,
                        "read_uncommitted_msgs_s": (committed + aborted) / uncommitted_s,
                    }
                )
    for r in reads:
        r["ratio"] = r["read_committed_msgs_s"] / r["read_uncommitted_msgs_s"]
    result = {
        "zone": args.zone,
        "seconds": args.seconds,
        "commit_ms": args.commit_ms,
        "size": args.size,
        "produce": rounds,
        "produce_ratio_median": statistics.median(r["ratio"] for r in rounds),
        # Rounds of equal length: the ratio of the sums weighs every second alike.
        "produce_ratio_total": sum(r["transactional_msgs_s"] for r in rounds)
        / max(sum(r["idempotent_msgs_s"] for r in rounds), 1),
        "consume": reads,
        "consume_ratio_median": statistics.median(r["ratio"] for r in reads),
        "consume_ratio_total": sum(r["read_committed_msgs_s"] for r in reads)
        / max(sum(r["read_uncommitted_msgs_s"] for r in reads), 1),
        "committed": committed,
        "aborted": aborted,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
