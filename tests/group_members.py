"""Consumer group members for the group tests: a confluent-kafka consumer in its own thread that
records what it read and every assignment change, and commits what it read before it gives a
partition up, so that a group's members together read every record exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from fleet.admin_http import bearer_headers
from tests.fleet_process import FleetProcess
from tests.raw_kafka import RawKafka
from tests.test_fleet_supervisor import node_pids
from tests.zone_fleet import Record, ZoneFleet, confluent_record, zone_client_id
from zone_router import group_coordinator

# (monotonic time, member name, "assign" | "revoke" | "lost", partitions)
Event = tuple[float, str, str, frozenset[int]]
# A ConfluentMember's config for `heartbeats()`: librdkafka statistics five times a second.
STATS = {"statistics.interval.ms": 200}


class ConfluentMember(threading.Thread):
    """Polls until `stop` is set (then commits and closes), or until `leave_without_close`."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        zone: str,
        group: str,
        topics: Sequence[str],
        events: list[Event] | None = None,
        **config: Any,
    ) -> None:
        super().__init__(daemon=True, name=name)
        self.member = name
        self.group = group
        self.records: list[Record] = []
        self.events: list[Event] = events if events is not None else []
        self.errors: list[KafkaError] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.abandon = threading.Event()  # stop without committing or closing (a crash)
        self.owned: set[int] = set()
        self._next: dict[int, int] = {}  # partition -> offset after the last one read
        self._lock = threading.Lock()
        self._heartbeats = -1  # from librdkafka's statistics; -1 until the first of them
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": zone_client_id(zone),
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "stats_cb": self._stats,  # called only with statistics.interval.ms (STATS)
                **config,
            }
        )
        self.topic = topics[0]
        self.consumer.subscribe(
            list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._lost
        )

    def _event(self, kind: str, parts: list[TopicPartition]) -> None:
        with self._lock:
            parts_set = frozenset(p.partition for p in parts)
            self.events.append((time.monotonic(), self.member, kind, parts_set))

    def _on_assign(self, _consumer: Any, parts: list[TopicPartition]) -> None:
        self._event("assign", parts)
        self.owned |= {p.partition for p in parts}

    def _on_revoke(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self._commit(consumer, [p.partition for p in parts])
        self._event("revoke", parts)
        self.owned -= {p.partition for p in parts}

    def _lost(self, _consumer: Any, parts: list[TopicPartition]) -> None:
        self._event("lost", parts)
        self.owned -= {p.partition for p in parts}

    def _commit(self, consumer: Any, partitions: list[int]) -> None:
        offsets = [
            TopicPartition(self.topic, p, self._next[p]) for p in partitions if p in self._next
        ]
        if offsets:
            consumer.commit(offsets=offsets, asynchronous=False)

    def assigned(self) -> set[int]:
        return set(self.owned)

    def _stats(self, stats: str) -> None:
        brokers = json.loads(stats).get("brokers", {}).values()
        self._heartbeats = sum(b.get("req", {}).get("Heartbeat", 0) for b in brokers)

    def heartbeats(self) -> int:
        """The classic Heartbeat requests this member sent its coordinator so far, as of its
        last statistics (members built with `**STATS`; -1 before the first). librdkafka keeps
        one heartbeat in flight: once the count grew by two, the first was answered."""
        return self._heartbeats

    def run(self) -> None:
        try:
            while not self.stop.is_set() and not self.abandon.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None:
                    continue
                if msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                    self.errors.append(msg.error())
                    if msg.error().fatal():
                        return
                    continue
                record = confluent_record(msg)
                if record is not None:
                    self.records.append(record)
                    self._next[record[0]] = record[1] + 1
            if self.stop.is_set():
                self._commit(self.consumer, sorted(self.owned))
                self.consumer.close()
        except BaseException as exc:
            self.error = exc


def wait_heartbeats(members: Sequence[ConfluentMember], n: int, timeout: float = 60) -> None:
    """Until each member sent `n` more heartbeats than now, so that its coordinator answered
    at least `n - 1` of them (one is in flight at a time)."""
    wait_until(lambda: all(m.heartbeats() >= 0 for m in members), timeout, lambda: "no stats")
    start = {m.member: m.heartbeats() for m in members}
    wait_until(
        lambda: all(m.heartbeats() >= start[m.member] + n for m in members),
        timeout,
        lambda: f"heartbeats since {start}: {[m.heartbeats() for m in members]}",
    )


def wait_kafka_python_heartbeats(consumer: Any, n: int, timeout: float = 60) -> None:
    """Until a kafka-python consumer's heartbeat thread got `n` more answers its coordinator
    did not refuse (a REBALANCE_IN_PROGRESS one counts too: kafka-python then rejoins)."""
    heartbeat = consumer._coordinator.heartbeat
    answered, seen = 0, heartbeat.last_receive
    deadline = time.monotonic() + timeout
    while answered < n:  # polled far faster than it heartbeats: no answer goes uncounted
        assert time.monotonic() < deadline, f"{answered} of {n} heartbeats answered"
        if heartbeat.last_receive > seen:
            answered, seen = answered + 1, heartbeat.last_receive
        time.sleep(0.05)


def values_read(members: Sequence[ConfluentMember]) -> list[bytes]:
    return [v for m in members for _, _, v in m.records]


_CHILD_MEMBER = r"""
import json, sys
from confluent_kafka import Consumer
bootstrap, zone, group, topic, extra = sys.argv[1:6]
c = Consumer({"bootstrap.servers": bootstrap, "client.id": "zone=" + zone, "group.id": group,
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              **json.loads(extra)})
def on_assign(_c, parts):
    print("assigned", *sorted(p.partition for p in parts), flush=True)
c.subscribe([topic], on_assign=on_assign)
while True:
    c.poll(0.1)
"""


class ChildMember:
    """A confluent-kafka group member in a process of its own, to be killed -9 (gone for good:
    no LeaveGroup, no leaving heartbeat); `lines` are the assignments it printed."""

    def __init__(self, bootstrap: str, zone: str, group: str, topic: str, **config: Any):
        args = [bootstrap, zone, group, topic, json.dumps(config)]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_MEMBER, *args], stdout=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        threading.Thread(
            target=lambda: self.lines.extend(self.proc.stdout or []), daemon=True
        ).start()

    def holds_partitions(self) -> bool:
        return any(len(line.split()) > 1 for line in self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def wait_until(check: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def stop_all(members: Sequence[ConfluentMember]) -> None:
    for m in members:
        m.stop.set()
    for m in members:
        m.join(30)


def check_exclusive_ownership(events: list[Event]) -> None:
    """No partition is ever held by two members at once: each assignment of a partition comes
    after its previous holder revoked (or lost) it."""
    holder: dict[int, str] = {}
    for _, member, kind, parts in sorted(events):
        for p in parts:
            if kind == "assign":
                assert holder.get(p) in (None, member), (
                    f"partition {p} given to {member} while {holder[p]} still held it"
                )
                holder[p] = member
            elif holder.get(p) == member:
                del holder[p]


def by_member(members: Sequence[ConfluentMember]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = defaultdict(set)
    for m in members:
        out[m.member] |= {p for p, _, _ in m.records}
    return dict(out)


def main_bootstraps(fleet: ZoneFleet) -> dict[int, str]:
    """Main node id -> its own Kafka bootstrap."""
    return {
        m.broker.node_id: f"{m.broker.advertised[0]}:{m.broker.advertised[1]}"
        for m in fleet.config.mains
    }


def coordinator_of(fleet: ZoneFleet, group: str) -> int:
    return group_coordinator(group, sorted(main_bootstraps(fleet)))


def restart_main(proc: FleetProcess, fleet: ZoneFleet, node_id: int) -> float:
    """SIGTERM one main; `up` restarts it. Returns once it answers Kafka requests again and
    its zone's Metadata lists it: the monotonic time it first answered."""
    assert proc.proc is not None
    supervisor = proc.proc.pid
    key = f"main-broker {node_id}"
    pid = node_pids(supervisor)[key]
    os.kill(pid, signal.SIGTERM)
    wait_until(
        lambda: node_pids(supervisor).get(key) not in (None, pid),
        60,
        lambda: f"main {node_id} was not restarted",
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            raw = RawKafka(main_bootstraps(fleet)[node_id])
            raw.request(3, 12, {"topics": [], "allow_auto_topic_creation": False})
            raw.close()
            answered = time.monotonic()
            break
        except Exception:
            assert time.monotonic() < deadline, f"main {node_id} does not answer"
            time.sleep(0.3)
    # ...and once its zone's proxy has its state stream back: until then the proxy stands for
    # it in the zone view (Topology.down_mains) and sends its zone's clients to itself.
    zone = next(m.broker.zone for m in fleet.config.mains if m.broker.node_id == node_id)
    wait_until(
        lambda: _proxy_has_main(fleet, zone, node_id),
        60,
        lambda: f"{zone}'s proxy does not have main {node_id}'s state stream again",
    )
    return answered


def _proxy_has_main(fleet: ZoneFleet, zone: str, node_id: int) -> bool:
    proxy = next(p for p in fleet.config.proxies if p.proxy.zone == zone)
    url = f"http://{proxy.admin_host}:{proxy.admin_port}/status"
    request = urllib.request.Request(url, headers=bearer_headers(proxy.admin_token))
    with urllib.request.urlopen(request, timeout=5) as resp:
        status = json.load(resp)
    return bool(status["mains"].get(str(node_id)))
