"""kill -9 while producing with acks=all; after restart every acknowledged message is there once."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer

from tests.fleet_process import FleetProcess
from tests.test_e2e_clients import create_topic


def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    fleet = FleetProcess(tmp_path / "fleet").start()
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    acked: list[bytes] = []
    try:
        create_topic(fleet.bootstrap, topic, partitions=2)
        # Committed offsets must survive the kill too.
        p = Producer({"bootstrap.servers": fleet.bootstrap, "acks": "all"})
        for i in range(10):
            p.produce(topic, f"pre-{i}".encode(), partition=0)
        assert p.flush(10) == 0
        c = Consumer(
            {
                "bootstrap.servers": fleet.bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 20
        while got < 10 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
                c.commit(m, asynchronous=False)
        c.close()
        assert got == 10

        stop = threading.Event()
        producer = Producer(
            {
                "bootstrap.servers": fleet.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 1,
                "message.timeout.ms": 5000,
            }
        )

        def on_delivery(err: object, msg: object) -> None:
            if err is None:
                acked.append(msg.value())  # type: ignore[attr-defined]

        def produce_forever() -> None:
            i = 0
            while not stop.is_set():
                try:
                    producer.produce(topic, f"m-{i}".encode(), on_delivery=on_delivery)
                    i += 1
                except BufferError:
                    pass
                producer.poll(0.001 if i % 50 else 0.01)
            producer.flush(8)

        thread = threading.Thread(target=produce_forever)
        thread.start()
        deadline = time.monotonic() + 20
        while len(acked) < 3000 and time.monotonic() < deadline:
            time.sleep(0.05)
        fleet.kill()
        stop.set()
        thread.join()
        acked_before_kill = list(acked)
        assert len(acked_before_kill) >= 1000
    finally:
        fleet.kill()

    restarted = FleetProcess(tmp_path / "fleet", base_port=fleet.base_port).start()
    try:
        consumer = Consumer(
            {
                "bootstrap.servers": restarted.bootstrap,
                "group.id": f"g-{uuid.uuid4()}",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
            }
        )
        consumer.subscribe([topic])
        values: list[bytes] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            values.append(m.value())
        consumer.close()
        assert eof == {0, 1}
        counts: dict[bytes, int] = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        missing = [v for v in acked_before_kill if v not in counts]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
        dupes = [v for v in acked_before_kill if counts[v] != 1]
        assert not dupes, f"acknowledged messages read more than once: {dupes[:3]}"

        # The group's committed offset came back too.
        c = Consumer(
            {
                "bootstrap.servers": restarted.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
            }
        )
        from confluent_kafka import TopicPartition

        committed = c.committed([TopicPartition(topic, 0)], timeout=10)
        c.close()
        assert committed[0].offset == 10
    finally:
        restarted.stop()
