"""A main's watch over the other mains and over itself: the I/O of
main_broker/cluster/liveness.py.

- **Probes.** The controller probes every other main (`probe` RPC), and the others probe the
  controller, every `PROBE_INTERVAL_S`, at once when a report of a lost connection comes in
  (`main_unreachable` from proxies and mains), and every `SUSPECT_PROBE_S` while one is
  suspected. The controller acts on what it finds, unless it cannot reach most mains: a
  main found dead whose registration does not say it stopped cleanly has its partitions
  moved (`ClusterRole.evacuate_dead`), the moves marked `source_dead`, so that the targets
  fence its WAL and take over at once. A controller whose port refuses connections has its
  lease taken by another main at once (`LeaseKeeper.seize`) rather than when it expires.
- **The fence on this main's WAL.** Every `FENCE_CHECK_S` this main looks for
  `wal/<its writer>/FENCED` (shared_wal/fence.py). Found, it raises `MainFenced`: the process
  stops and its supervisor starts a new incarnation, which lifts the fence once nothing is
  being taken over from it. The last look that found none also dates this main's reads
  (`liveness.reads_fresh`).
"""

from __future__ import annotations

import errno
import logging
import time
from typing import TYPE_CHECKING

import trio

from internal_rpc import RpcClient, RpcError, RpcUnavailable
from internal_rpc.messages import MainUnreachable, MalformedMessage, Probe
from main_broker.cluster.liveness import (
    FENCE_CHECK_S,
    ProbeOutcome,
    ProbeTracker,
    reads_fresh,
)
from s3_commit import ObjectStoreError
from s3_commit.node_registry import NodeRegistration, registration_key
from shared_wal.fence import is_fenced, read_fence

if TYPE_CHECKING:
    from main_broker.cluster.role import ClusterRole

__all__ = ["MainFenced", "MainWatch"]

log = logging.getLogger("zonefleet.main_broker.watch")

PROBE_INTERVAL_S = 4.0
SUSPECT_PROBE_S = 0.2
UNSEEN_PROBE_S = 0.5
PROBE_TIMEOUT_S = 2.0
REPORT_TIMEOUT_S = 1.0
WARN_EVERY_S = 10.0


class MainFenced(Exception):
    """Another main fenced this main's WAL to take its partitions over: it must stop."""


class MainWatch:
    def __init__(self, role: ClusterRole, writer_id: str) -> None:
        self.role = role
        self.node_id = role.node_id
        self.writer_id = writer_id
        self.tracker = ProbeTracker()
        self.unfenced_at: float | None = None  # trio time the last look finding no fence began
        self.declared_dead = 0
        self.reports = 0
        self._checked = trio.Event()
        self._wake = trio.Event()
        self._fence_limiter = trio.CapacityLimiter(1)
        self._warned_at = -WARN_EVERY_S

    # -- reads -------------------------------------------------------------------------------

    def reads_fresh(self) -> bool:
        return reads_fresh(trio.current_time(), self.unfenced_at)

    async def wait_reads_fresh(self, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            while not self.reads_fresh():
                await self._checked.wait()
        return self.reads_fresh()

    def answering(self, node: int) -> bool:
        """Whether `node` answered its latest probe (this main always does)."""
        return node == self.node_id or self.tracker.answering(node)

    # -- reports -----------------------------------------------------------------------------

    def report(self, message: MainUnreachable, reporter: int) -> bool:
        """Another node lost its connection to a main: probe it now. True when this main is
        the controller (the one that acts on it)."""
        self.reports += 1
        holding = self.role.controller.lease.holding
        if message.node != self.node_id:
            log.info(
                "node %d reports main %d unreachable (%s); probing it",
                reporter,
                message.node,
                message.reason,
            )
            self._wake.set()
        return holding

    def _holder(self) -> int | None:
        lease = self.role.controller.lease.lease
        return lease.holder if lease is not None else None

    # -- the loops ---------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_fence)
            nursery.start_soon(self._probe_loop)

    async def check_fence(self) -> bool:
        """One look for a fence on this main's WAL; raises MainFenced when there is one.
        False when the look failed."""
        started = trio.current_time()
        fs = self.role.broker.store.reader.fs
        try:
            fenced = await trio.to_thread.run_sync(
                is_fenced, fs, self.writer_id, limiter=self._fence_limiter
            )
        except Exception as exc:  # any error of the file system: the next look retries
            self._warn(f"cannot look for a fence on WAL {self.writer_id}: {exc!r}")
            return False
        if fenced:
            fence = await trio.to_thread.run_sync(read_fence, fs, self.writer_id)
            if self.role.registrar is not None:
                # Not a clean stop: moves to this main may be under way, and nothing restarts
                # it in time for them, so the controller must see it die and move them on.
                self.role.registrar.abandon()
            raise MainFenced(
                f"main {self.node_id}'s WAL was fenced by main "
                f"{fence.by if fence else '?'} ({fence.reason if fence else 'no reason'}): "
                "its partitions were taken over; stopping so that a new incarnation starts"
            )
        self.unfenced_at = started
        self._checked.set()
        self._checked = trio.Event()
        return True

    async def _watch_fence(self) -> None:
        while True:
            await self.check_fence()
            await trio.sleep(FENCE_CHECK_S)

    async def _probe_loop(self) -> None:
        while True:
            targets = self._targets()
            if targets:
                async with trio.open_nursery() as nursery:
                    for node in targets:
                        nursery.start_soon(self._probe, node)
                await self._act(targets)
            if set(self._targets()) != set(targets):
                continue  # the lease changed hands meanwhile: probe the new targets now
            suspected = any(self.tracker.suspected(n) for n in targets)
            # A main only counts as dead once it answered a probe: until each target has, or
            # while this main knows no controller yet, look again soon, so that a main dying
            # in its first seconds is not left to the heartbeat timeout.
            unseen = not targets or any(not self.tracker.seen(n) for n in targets)
            if suspected:
                wait = SUSPECT_PROBE_S
            elif unseen:
                wait = UNSEEN_PROBE_S
            else:
                wait = PROBE_INTERVAL_S
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()

    def _targets(self) -> list[int]:
        """The controller probes every other main; the others probe the controller (each
        probe crosses zones: a hundred bytes each way)."""
        if self.role.controller.lease.holding:
            return [n for n in self.role.main_ids if n != self.node_id]
        holder = self._holder()
        return [holder] if holder is not None and holder != self.node_id else []

    def in_minority(self) -> bool:
        """Whether this main cannot reach most of the others, by timeouts (a refusal proves
        the other process gone; a timeout may be this main's own network): then it may be the
        one cut off, so it neither acts as controller nor competes for the lease."""
        return self.tracker.in_minority([n for n in self.role.main_ids if n != self.node_id])

    async def _probe(self, node: int) -> None:
        rpc = self.role.peer_rpc(node)
        if rpc is None:
            return
        outcome, error = await probe(rpc, self.node_id, node)
        was_suspected = self.tracker.suspected(node)
        self.tracker.record(node, outcome, error)
        if outcome is ProbeOutcome.ANSWERED and was_suspected:
            log.info("main %d answers probes again", node)

    async def _act(self, probed: list[int]) -> None:
        dead = [n for n in probed if self.tracker.dead(n)]
        if not dead:
            return
        lease = self.role.controller.lease
        if not lease.holding:
            holder = self._holder()
            if holder in dead and self.tracker.gone(holder):
                assert holder is not None
                log.warning(
                    "controller main %d is gone (%s): taking its lease",
                    holder,
                    self.tracker.why(holder),
                )
                try:
                    await lease.seize(holder)
                except (ObjectStoreError, OSError) as exc:
                    self._warn(f"cannot take the controller lease: {exc}")
                self._wake.set()  # as the controller now: probe everyone
            return
        if self.in_minority():
            log.warning(
                "cannot reach most mains (%s): maybe this one is cut off; giving up the "
                "controller lease rather than moving their partitions",
                "; ".join(f"main {n}: {self.tracker.why(n)}" for n in dead),
            )
            await lease.release()
            return
        confirmed = [n for n in dead if await self._not_stopped(n)]
        if confirmed and self.role.reassign_dead_mains:
            live = [n for n in self.role.main_ids if n not in dead]
            moved = await self.role.evacuate_dead(
                set(confirmed), live, {n: self.tracker.why(n) for n in confirmed}
            )
            self.declared_dead += moved

    async def _not_stopped(self, node: int) -> bool:
        """The registration side of the verdict: a main that stopped cleanly is being
        restarted and keeps its partitions."""
        try:
            found = await self.role.astore.get(registration_key("main", node))
        except (ObjectStoreError, OSError) as exc:
            self._warn(f"cannot read main {node}'s registration: {exc}")
            return False
        if found is None:
            return True
        try:
            return NodeRegistration.from_bytes(found[0]).state != "stopped"
        except ValueError:
            return True

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("%s", message)


async def probe(rpc: RpcClient, me: int, node: int) -> tuple[ProbeOutcome, str]:
    """One probe of main `node`: answered, refused (nothing listens on its port), or failed."""
    try:
        answer = Probe.from_wire(
            await rpc.call("probe", Probe(me).to_wire(), timeout=PROBE_TIMEOUT_S, retries=0)
        )
    except RpcUnavailable as exc:
        refused = _refused(exc)
        return (ProbeOutcome.REFUSED if refused else ProbeOutcome.FAILED), str(exc)
    except (RpcError, MalformedMessage) as exc:
        return ProbeOutcome.FAILED, str(exc)
    if answer.node != node:
        return ProbeOutcome.FAILED, f"answered by node {answer.node}"
    return ProbeOutcome.ANSWERED, ""


def _refused(exc: BaseException) -> bool:
    """Whether the connection was refused (trio's "all attempts to connect" error carries
    each attempt's error in a group behind it)."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        cause = pending.pop()
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError) or (
            isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED
        ):
            return True
        if isinstance(cause, BaseExceptionGroup):
            pending.extend(cause.exceptions)
        pending.extend(c for c in (cause.__cause__, cause.__context__) if c is not None)
    return False
