"""Issue 14: a network partition between zones, with each zone in its own network namespace.

The fleet runs one process per node in three zone namespaces (tests/netns.py); in each zone an
idempotent acks=all producer and a consumer reading the whole topic run all along through
their zone's proxy. Then one zone is cut off from the others: its bridge port stops
forwarding, so every frame to or from it is dropped, both ways, silently (a partition, not a
closed port: nothing answers, nothing resets). Inside the zone its clients still reach its
proxy. The mains' cluster metadata and the shared WAL are outside the cut, as S3 and the
regional file system are reachable from every zone.

- `proxy-only`: az3 holds a proxy and no main, so every partition's main is across the cut.
  Its clients get timeouts (retriable; a client with a short delivery timeout sees them) and
  nothing else; az1 and az2 keep producing and consuming; when the cut heals, az3's clients
  carry on by themselves (no restart).
- `with-main`: every zone holds a main; a zone whose main is not the controller is cut off.
  The controller, which cannot probe that main, finds it dead and moves its partitions to the
  mains it reaches, fencing its WAL; the cut-off main sees the fence and stops (EXIT_FENCED)
  for its supervisor, which the test plays after the heal. The other zones produce to those
  partitions again; the cut zone's clients wait for the heal as in `proxy-only`.
- `controller-cut-off`: the controller's zone is cut off. It reaches most other mains only by
  timeouts, so it may be the one cut off (`ProbeTracker.in_minority`): it moves nothing and
  gives its lease up; a main on the other side takes the lease and moves the cut-off main's
  partitions, fencing its WAL.

In every case no node logs a traceback, every acknowledged record of every zone is read
exactly once and in order by every zone's consumer, and a record that timed out is there at
most once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleet.cli import EXIT_FENCED
from tests.netns import REPO, NamespacedFleet, NetnsUnavailable, ZoneNamespaces

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ZONES = ("az1", "az2", "az3")
CUT_ZONE = "az3"
PARTITIONS = 4
RATE = 100.0  # records a second per producer
PROBE_TIMEOUT_S = 5.0
# librdkafka's request timeout is what is left of the oldest record's: a record that may
# wait out a whole cut must have time left then, or the producer bumps its epoch and sends it
# again as new (the proxy may have had it appended meanwhile: a duplicate, as with Kafka).
MESSAGE_TIMEOUT_MS = 120000
# Errors a client may report while its brokers are out of reach: timeouts and transport
# errors, all of which librdkafka retries by itself.
CLEAN_ERRORS = frozenset(
    {
        "_MSG_TIMED_OUT",
        "_TIMED_OUT",
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "REQUEST_TIMED_OUT",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "_TIMED_OUT_QUEUE",
    }
)


@dataclass
class Client:
    zone: str
    kind: str  # "produce-stream" or "tail"
    proc: subprocess.Popen[bytes]
    progress: Path
    log: Path
    result: dict[str, Any] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.progress.read_text()))
        except (OSError, ValueError):
            return {}

    def count(self) -> int:
        st = self.state()
        return int(st.get("acked" if self.kind == "produce-stream" else "read", 0))

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def by_partition(self) -> dict[int, int]:
        return {int(p): n for p, n in self.state().get("by_partition", {}).items()}


def _wait(what: str, predicate: Callable[[], bool], timeout: float, clients: list[Client]) -> float:
    """Until `predicate()`; returns the time it took. Fails at once when a client exits."""
    t0 = time.monotonic()
    while not predicate():
        for c in clients:
            if c.proc.poll() is not None:
                err = c.log.read_text(errors="replace")[-3000:]
                pytest.fail(f"the {c.kind} client of {c.zone} exited ({c.proc.returncode}): {err}")
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture
def zones() -> Iterator[ZoneNamespaces]:
    ns = ZoneNamespaces(ZONES)
    try:
        ns.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        ns.cut(CUT_ZONE)
        ns.heal(CUT_ZONE)
    except RuntimeError as exc:
        ns.destroy()
        pytest.skip(f"cannot stop a bridge port forwarding here: {exc}")
    try:
        yield ns
    finally:
        ns.destroy()


def _start_fleet(
    zones: ZoneNamespaces, data_dir: Path, main_zones: tuple[str, ...]
) -> NamespacedFleet:
    fleet = NamespacedFleet(zones, data_dir, main_zones=main_zones)
    try:
        fleet.start()
    except BaseException:
        fleet.stop()
        raise
    return fleet


def _spawn(zones: ZoneNamespaces, where: str, kind: str, work: Path, **kwargs: Any) -> Client:
    progress = work / f"{kind}-{where}.json"
    with open(work / f"{kind}-{where}.log", "wb") as log:
        proc = subprocess.Popen(
            zones.client_argv(where, kind, progress=str(progress), **kwargs),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    return Client(where, kind, proc, progress, work / f"{kind}-{where}.log")


def _finish(client: Client, timeout: float) -> None:
    try:
        out, _ = client.proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        client.proc.kill()
        client.proc.communicate()
        pytest.fail(f"the {client.kind} client of {client.zone} did not finish: {client.stderr()}")
    assert client.proc.returncode == 0, f"{client.kind} in {client.zone}: {client.stderr()}"
    client.result = json.loads(out)
    client.progress.with_suffix(".result.json").write_bytes(out)  # for a failure's post-mortem


_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.M)


def _warnings(log_text: str) -> str:
    """The WARNING and ERROR lines of a node's log."""
    return "\n".join(
        line for line in log_text.splitlines() if " WARNING " in line or " ERROR " in line
    )


@pytest.mark.parametrize(
    "case",
    [
        "proxy-only",
        "with-main",
        "controller-cut-off",
    ],
)
def test_a_zone_cut_off_fails_cleanly_and_heals(
    zones: ZoneNamespaces, tmp_path: Path, case: str
) -> None:
    """`proxy-only`: az3 holds no main. `with-main`: a zone whose main is not the controller
    is cut off. `controller-cut-off`: the controller's zone is."""
    main_zones = ("az1", "az2") if case == "proxy-only" else ZONES
    fleet = _start_fleet(zones, tmp_path / "fleet", main_zones)
    clients: list[Client] = []
    try:
        controller = _controller_zone(fleet)
        if case == "proxy-only":
            cut_zone = "az3"
        elif case == "with-main":
            cut_zone = "az3" if controller != "az3" else "az2"
        else:
            cut_zone = controller
        print(f"\nthe controller is in {controller}; cutting {cut_zone} off")
        _run(zones, fleet, tmp_path, main_zones, cut_zone, clients)
    finally:
        for c in clients:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.communicate()
        fleet.stop()
        for node in fleet.nodes:
            print(fleet.log_tail(node, 20), file=sys.stderr)
    logs = {node.label: node.log.read_text(errors="replace") for node in fleet.nodes}
    tracebacks = {label: text for label, text in logs.items() if _TRACEBACK.search(text)}
    assert not tracebacks, f"tracebacks in the logs of {sorted(tracebacks)}"


_LEASE = re.compile(r"^(\S+) .* took lease \S*controller\S*", re.M)


def _controller_zone(fleet: NamespacedFleet) -> str:
    """The zone of the main that last took the controller lease, from the mains' logs."""
    taken: list[tuple[str, str]] = []
    for node in fleet.nodes:
        if node.role == "main":
            text = node.log.read_text(errors="replace")
            taken += [(stamp, node.zone) for stamp in _LEASE.findall(text)]
    assert taken, "no main took the controller lease"
    return max(taken)[1]


def _run(
    zones: ZoneNamespaces,
    fleet: NamespacedFleet,
    work: Path,
    main_zones: tuple[str, ...],
    cut_zone: str,
    clients: list[Client],
) -> None:
    topic = "cut-off"
    zones.client(
        "az1",
        "create-topic",
        bootstrap=fleet.bootstrap("az1"),
        zone="az1",
        topic=topic,
        partitions=PARTITIONS,
    )
    probe_topic = "cut-off-probe"
    zones.client(
        "az1",
        "create-topic",
        bootstrap=fleet.bootstrap("az1"),
        zone="az1",
        topic=probe_topic,
        partitions=len(main_zones),
    )
    # A client sees its zone's main as the leader of that main's partitions, its zone's proxy
    # as the leader of the rest: the cut zone's view names the partitions its own main leads.
    mains = {m.broker.node_id for m in fleet.config.mains}
    seen = zones.client(
        cut_zone, "leaders", bootstrap=fleet.bootstrap(cut_zone), zone=cut_zone, topic=topic
    )
    cut_led = {int(p) for p, leader in seen.items() if leader in mains}
    assert bool(cut_led) == (cut_zone in main_zones), seen
    print(f"\n{cut_zone} sees leaders {seen}; its own main leads {sorted(cut_led)}")
    stop = work / "stop-producers"
    stop_tails = work / "stop-tails"
    producers = {
        z: _spawn(
            zones,
            z,
            "produce-stream",
            work,
            bootstrap=fleet.bootstrap(z),
            zone=z,
            topic=topic,
            partitions=PARTITIONS,
            stop=str(stop),
            message_timeout_ms=MESSAGE_TIMEOUT_MS,
            rate=RATE,
        )
        for z in ZONES
    }
    tails = {
        z: _spawn(
            zones,
            z,
            "tail",
            work,
            bootstrap=fleet.bootstrap(z),
            zone=z,
            topic=topic,
            partitions=PARTITIONS,
            stop=str(stop_tails),
        )
        for z in ZONES
    }
    clients += [*producers.values(), *tails.values()]
    _wait(
        "every zone producing and consuming",
        lambda: all(c.count() >= 200 for c in clients),
        60,
        clients,
    )
    other = [z for z in ZONES if z != cut_zone]

    # -- the cut ---------------------------------------------------------------------------
    before = {z: c.count() for z, c in producers.items()}
    before_parts = {z: c.by_partition() for z, c in producers.items()}
    read_before = {z: c.count() for z, c in tails.items()}
    sent_at_cut = {z: int(producers[z].state().get("sent", 0)) for z in other}
    zones.cut(cut_zone)
    t_cut = time.time()
    print(f"cut {cut_zone} at {before}")
    cut_producer = producers[cut_zone]

    def others_carry_on() -> bool:
        for z in other:
            parts = producers[z].by_partition()
            if any(
                parts.get(p, 0) < before_parts[z].get(p, 0) + 100
                for p in range(PARTITIONS)
                if p not in cut_led
            ):
                return False
            if tails[z].count() < read_before[z] + 400:
                return False
        return True

    _wait("the other zones to carry on", others_carry_on, 60, clients)
    cut_proxy = next(n for n in fleet.nodes if n.role == "proxy" and n.zone == cut_zone)
    _wait(
        f"{cut_zone}'s proxy to give up on a confirm",
        lambda: "confirm" in _warnings(cut_proxy.log.read_text(errors="replace")),
        60,
        clients,
    )
    # A client of the cut zone that waits a few seconds only: clean timeouts.
    seen = zones.client(
        cut_zone,
        "probe",
        bootstrap=fleet.bootstrap(cut_zone),
        zone=cut_zone,
        topic=probe_topic,
        timeout_s=PROBE_TIMEOUT_S,
    )
    print(f"a client of {cut_zone} during the cut: {seen}")
    for step, got in seen.items():
        assert got["error"] is None or got["error"] in CLEAN_ERRORS, (step, got)
        assert got["seconds"] < PROBE_TIMEOUT_S + 5, (step, got)
    if not cut_led:  # every main is across the cut: nothing can be answered
        assert seen["produce"]["error"] == "_MSG_TIMED_OUT", seen
    # Its records whose main is across the cut are not acknowledged during the cut (those in
    # flight at the cut excepted, which it may have had answered just before).
    stalled = [p for p in range(PARTITIONS) if p not in cut_led]
    during = cut_producer.by_partition()
    cut_parts = before_parts[cut_zone]
    grown = {p: during.get(p, 0) - cut_parts.get(p, 0) for p in stalled}
    assert all(n <= RATE for n in grown.values()), (
        f"{cut_zone} acknowledged across the cut: {grown}"
    )
    cut_main = next((n for n in fleet.nodes if n.role == "main" and n.zone == cut_zone), None)
    moved = 0.0
    if cut_led:
        # The controller, across the cut, finds the cut zone's main dead (its probes time
        # out) and moves its partitions to the mains it reaches, fencing that main's WAL on
        # the shared file system (outside the cut): the other zones produce to them again.
        moved = _wait(
            f"the other zones to produce to {cut_zone}'s main's partitions again",
            lambda: all(
                producers[z].by_partition().get(p, 0) >= before_parts[z].get(p, 0) + 20
                for z in other
                for p in cut_led
            ),
            120,
            clients,
        )
    for node in fleet.nodes:
        if node is cut_main and node.proc.poll() == EXIT_FENCED:
            continue  # it saw the fence and stopped, for its supervisor to start it again
        assert node.proc.poll() is None, (
            f"{node.label} exited during the cut:\n{fleet.log_tail(node)}"
        )
    cut_for = time.time() - t_cut

    # -- the heal --------------------------------------------------------------------------
    at_heal = cut_producer.by_partition()
    sent_at_heal = {z: int(producers[z].state().get("sent", 0)) for z in other}
    read_in_cut = dict(tails[cut_zone].state().get("latest", {}))
    print(
        f"during the cut {cut_zone}'s consumer read up to {read_in_cut} "
        f"(sent at the cut: {sent_at_cut}, at the heal: {sent_at_heal})"
    )
    zones.heal(cut_zone)
    t_heal = time.monotonic()
    restarted = 0.0
    if cut_main is not None and cut_main.proc.poll() is not None:
        fleet.restart(cut_main)  # as systemd does (Restart=on-failure)
        restarted = time.monotonic() - t_heal

    def producer_back() -> bool:
        parts = cut_producer.by_partition()
        return all(parts.get(p, 0) >= at_heal.get(p, 0) + 20 for p in range(PARTITIONS))

    def consumer_back() -> bool:
        latest = tails[cut_zone].state().get("latest", {})
        return all(latest.get(z, -1) >= sent_at_heal[z] for z in other)

    def others_back() -> bool:
        return all(
            producers[z].by_partition().get(p, 0) >= before_parts[z].get(p, 0) + 20
            for z in other
            for p in cut_led
        )

    steps = {
        f"{cut_zone}'s producer acknowledged again on every partition": producer_back,
        f"{cut_zone}'s consumer read what the other zones produced after the heal": consumer_back,
        f"the other zones acknowledged again on {cut_zone}'s main's partitions": others_back,
    }
    healed: dict[str, float] = {}

    def all_back() -> bool:
        for what, done in steps.items():
            if what not in healed and done():
                healed[what] = time.monotonic() - t_heal
        return len(healed) == len(steps)

    _wait("every zone to carry on after the heal", all_back, 120, clients)
    print(
        f"cut for {cut_for:.1f} s; {cut_zone}'s main's partitions moved in {moved:.1f} s; "
        f"after the heal: its main started again in {restarted:.1f} s, {healed}"
    )

    # -- everything, exactly once ----------------------------------------------------------
    stop.touch()
    for c in producers.values():
        _finish(c, MESSAGE_TIMEOUT_MS / 1000 + 60)
    stop_tails.touch()
    for c in tails.values():
        _finish(c, 90)
    _check(producers, tails, cut_led, cut_zone)


def _eos_log(producers: dict[str, Client]) -> str:
    """librdkafka's idempotence lines (epoch bumps, sequence gaps, retries) of each producer."""
    keep = re.compile(r"epoch|sequence|gap|persisted|drain|bump|PID", re.I)
    out = []
    for zone, c in producers.items():
        lines = [
            line for line in c.log.read_text(errors="replace").splitlines() if keep.search(line)
        ]
        out.append(f"{zone}: {len(lines)} lines\n" + "\n".join(lines[-60:]))
    return "\n".join(out)


def _check(
    producers: dict[str, Client], tails: dict[str, Client], cut_led: set[int], cut_zone: str
) -> None:
    acked: dict[str, tuple[int, int | None]] = {}
    failed: set[str] = set()
    for zone, c in producers.items():
        res = c.result
        assert res["unflushed"] == 0, zone
        for p, offset, key, _ in res["acked"]:
            acked[key] = (p, offset)
        failed |= {key for key, _ in res["failed"]}
        bad = [e for _, e in res["failed"] if e["name"] not in CLEAN_ERRORS or e["fatal"]]
        bad += [e for e in res["client_errors"] if e["name"] not in CLEAN_ERRORS or e["fatal"]]
        assert not bad, f"{zone}'s producer: {bad[:5]}"
        if zone != cut_zone:  # only records to a main across the cut may time out
            lost = [
                k for k, _ in res["failed"] if int(k.rsplit("-", 1)[1]) % PARTITIONS not in cut_led
            ]
            assert not lost, f"{zone}'s producer lost records of reachable mains: {lost[:5]}"
        print(
            f"{zone} producer: {res['sent']} sent, {len(res['acked'])} acknowledged, "
            f"{len(res['failed'])} timed out; client errors "
            f"{dict(Counter(e['name'] for e in res['client_errors']))}"
        )
    for zone, c in tails.items():
        res = c.result
        bad = [e for e in res["client_errors"] if e["name"] not in CLEAN_ERRORS or e["fatal"]]
        assert not bad, f"{zone}'s consumer: {bad[:5]}"
        records = res["records"]
        keys = Counter(k for _, _, k in records)
        dups = [k for k, n in keys.items() if n > 1]
        assert not dups, (
            f"{zone} read {len(dups)} records twice, e.g. {dups[:3]}; at "
            f"{[(p, o) for p, o, k in records if k in dups[:3]]}; the producers' "
            f"idempotence log:\n{_eos_log(producers)}"
        )
        missing = [k for k in acked if k not in keys]
        assert not missing, f"{zone} never read {len(missing)} acknowledged records: {missing[:5]}"
        by_part: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for p, offset, key in records:
            by_part[p].append((offset, key))
        for p, items in by_part.items():
            offsets = [o for o, _ in items]
            assert offsets == list(range(len(offsets))), f"{zone}: partition {p} not dense from 0"
            seqs: dict[str, list[int]] = defaultdict(list)
            for _, key in items:
                producer_zone, n = key.rsplit("-", 1)
                seqs[producer_zone].append(int(n))
            for producer_zone, ns in seqs.items():
                assert ns == sorted(ns), f"{zone}: {producer_zone}'s records reordered in {p}"
        where = {k: (p, o) for p, o, k in records}
        # An acknowledgement without an offset: the main had the batch already (a confirm
        # sent before the cut landed, and the producer's retry was its duplicate).
        moved = [k for k, at in acked.items() if at[1] is not None and where[k] != at]
        assert not moved, f"{zone} read records at other offsets than acknowledged: {moved[:5]}"
        extra = {k for k in keys if k not in acked}
        assert extra <= failed, f"{zone} read records nobody produced: {sorted(extra)[:5]}"
        errors = dict(Counter(e["name"] for e in res["client_errors"]))
        print(
            f"{zone} consumer: {len(records)} records, {len(extra)} of them timed out at the "
            f"producer yet written; client errors {errors}"
        )
