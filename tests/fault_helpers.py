"""What the fault tests (tests/test_fault_*.py) share: a producer that keeps producing while
a fault comes and goes, and waiting for observable events with a deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import trio
from confluent_kafka import KafkaError, Producer


class ContinuousProducer:
    """An idempotent acks=all confluent-kafka producer writing `prefix-<i>` until stopped, in
    its own thread; counts what was acknowledged and keeps every delivery error."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        prefix: str,
        value_bytes: int = 1000,
        pace_s: float = 0.001,
        **extra: Any,
    ) -> None:
        self.pace_s = pace_s
        self.flush_s = 180.0  # how long stop() lets the queued records drain
        self.topic = topic
        self.prefix = prefix
        self.pad = b"." * value_bytes
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "delivery.timeout.ms": 300_000,
                **extra,
            }
        )
        self.sent = 0
        self.acked = 0
        self.last_ack = time.monotonic()
        self.longest_gap = 0.0  # the longest time between two acknowledgements (seconds)
        self.errors: list[KafkaError] = []
        self.flushed: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            now = time.monotonic()
            if self.acked:
                self.longest_gap = max(self.longest_gap, now - self.last_ack)
            self.last_ack = now
            self.acked += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            value = f"{self.prefix}-{self.sent}".encode()
            try:
                self.producer.produce(
                    self.topic, value + b"|" + self.pad, on_delivery=self._delivered
                )
            except BufferError:  # the local queue is full while the broker refuses: wait
                self.producer.poll(0.1)
                continue
            self.sent += 1
            self.producer.poll(self.pace_s)  # pacing: at most one record per pace_s
        self.flushed = self.producer.flush(self.flush_s)

    def start(self) -> ContinuousProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.flush_s + 30)
        assert not self._thread.is_alive(), "the producer did not finish"


def strip(records: list[Any]) -> list[Any]:
    """(partition, offset, value) with the padding cut off the values."""
    return [(p, o, v.split(b"|", 1)[0]) for p, o, v in records]


async def until(check: Any, what: str, timeout: float = 60.0) -> float:
    """Wait (polling) until `check()` is true; returns the seconds it took."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:.0f} s"
        await trio.sleep(0.02)
    return time.monotonic() - started


def wait_until(check: Any, what: str, timeout: float = 60.0) -> float:
    """`until`, for a thread."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.02)
    return time.monotonic() - started


def probe_produce(bootstrap: str, topic: str) -> KafkaError | None:
    """One record, no retries: the error the broker answers (None: acknowledged)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "retries": 0, "enable.idempotence": False}
    )
    result: list[KafkaError | None] = []
    producer.produce(topic, b"probe", on_delivery=lambda err, _m: result.append(err))
    assert producer.flush(30) == 0
    return result[0]
