"""Classic consumer groups with a real client: share, leave, take over from committed offsets."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer, Producer

from tests.fleet_process import FleetProcess
from tests.test_e2e_clients import create_topic


def _consumer(bootstrap: str, group: str) -> Consumer:
    # Client defaults for session and heartbeat timing: rebalances must settle with them.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )


def _produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    for i in range(start, start + n):
        producer.produce(topic, f"m-{i}".encode(), key=str(i).encode())
    assert producer.flush(30) == 0


def _poll_until(
    consumer: Consumer,
    stop: threading.Event,
    seen: list[tuple[int, int, bytes]],
    assignments: list[set[int]],
) -> None:
    while not stop.is_set():
        msg = consumer.poll(0.2)
        assignments.append({tp.partition for tp in consumer.assignment()})
        if msg is None or msg.error():
            continue
        seen.append((msg.partition(), msg.offset(), msg.value()))
        consumer.commit(msg, asynchronous=False)


def test_two_members_share_then_one_takes_over(fleet: FleetProcess) -> None:
    topic = f"grp-{uuid.uuid4().hex[:8]}"
    group = f"group-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic, partitions=4)
    _produce(fleet.bootstrap, topic, 0, 400)

    c1, c2 = _consumer(fleet.bootstrap, group), _consumer(fleet.bootstrap, group)
    c1.subscribe([topic])
    c2.subscribe([topic])
    seen1: list[tuple[int, int, bytes]] = []
    seen2: list[tuple[int, int, bytes]] = []
    a1: list[set[int]] = []
    a2: list[set[int]] = []
    stop1, stop2 = threading.Event(), threading.Event()
    t1 = threading.Thread(target=_poll_until, args=(c1, stop1, seen1, a1))
    t2 = threading.Thread(target=_poll_until, args=(c2, stop2, seen2, a2))
    started = time.monotonic()
    t1.start()
    t2.start()
    # Both members settle with disjoint, non-empty shares within a few seconds.
    while time.monotonic() - started < 20:
        if (
            a1
            and a2
            and a1[-1]
            and a2[-1]
            and not (a1[-1] & a2[-1])
            and a1[-1] | a2[-1] == {0, 1, 2, 3}
        ):
            break
        time.sleep(0.1)
    settle = time.monotonic() - started
    assert a1[-1] and a2[-1], "both members should own partitions"
    assert a1[-1] | a2[-1] == {0, 1, 2, 3} and not (a1[-1] & a2[-1])
    assert settle < 10, f"rebalance took {settle:.1f}s"
    while len(seen1) + len(seen2) < 400 and time.monotonic() - started < 40:
        time.sleep(0.1)
    assert len(seen1) + len(seen2) == 400

    # Member 2 leaves; member 1 takes over every partition from the committed offsets.
    stop2.set()
    t2.join()
    c2.close()
    _produce(fleet.bootstrap, topic, 400, 200)
    deadline = time.monotonic() + 30
    while len(seen1) + len(seen2) < 600 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop1.set()
    t1.join()
    c1.close()
    assert a1[-1] == {0, 1, 2, 3}
    values = sorted(v for _, _, v in seen1 + seen2)
    assert values == sorted(f"m-{i}".encode() for i in range(600)), "skipped or repeated"
