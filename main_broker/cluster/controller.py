"""The controller: the one main that holds the controller lease watches the node registrations
and tells live nodes from dead ones.

Every main competes for the lease (`s3_commit.lease`); the holder reads the registrations
(`s3_commit.node_registry`) every `registration_interval_s`, logs a node that died (its
heartbeat went stale without a clean stop) or came back, and reports the fleet's membership in
the admin status and as metrics. Its `on_members` hook (ClusterRole) moves a dead main's
partitions to live mains (main_broker/cluster/reassignment.py `evacuate`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from s3_commit.async_store import AsyncObjectStore
from s3_commit.lease import LeaseKeeper
from s3_commit.node_registry import NodeRegistration, now_ms, read_registrations
from s3_commit.object_store import ObjectStoreError
from telemetry import MetricsRegistry

__all__ = ["Controller", "Membership", "membership"]

log = logging.getLogger("zonefleet.main_broker.controller")


@dataclass(frozen=True, slots=True)
class Membership:
    alive: tuple[NodeRegistration, ...]
    dead: tuple[NodeRegistration, ...]  # stale heartbeat, no clean stop
    stopped: tuple[NodeRegistration, ...]


def membership(
    registrations: Sequence[NodeRegistration], at_ms: int, session_timeout_ms: int
) -> Membership:
    alive, dead, stopped = [], [], []
    for reg in sorted(registrations, key=lambda r: (r.role, r.node_id)):
        if reg.state == "stopped":
            stopped.append(reg)
        elif reg.alive(at_ms, session_timeout_ms):
            alive.append(reg)
        else:
            dead.append(reg)
    return Membership(tuple(alive), tuple(dead), tuple(stopped))


class Controller:
    def __init__(
        self,
        store: AsyncObjectStore,
        node_id: int,
        registry: MetricsRegistry,
        *,
        lease_s: float,
        interval_s: float,
        session_timeout_s: float,
        on_members: Callable[[Membership], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.on_members = on_members
        self.lease = LeaseKeeper(store, node_id, duration_s=lease_s, safety_s=lease_s / 5)
        self.interval_s = interval_s
        self.session_timeout_ms = int(session_timeout_s * 1000)
        self.members: Membership | None = None
        self._known_dead: set[tuple[str, int]] = set()
        registry.gauge_functions(
            {
                "zonefleet_controller_active": (
                    "1 on the main holding the controller lease.",
                    lambda: float(self.lease.holding),
                ),
                **{
                    f"zonefleet_cluster_nodes_{state}": (
                        f"Registered nodes that are {state}, as the controller last saw them.",
                        partial(self._count, state),
                    )
                    for state in ("alive", "dead", "stopped")
                },
            }
        )

    def _count(self, state: str) -> float:
        if self.members is None or not self.lease.holding:
            return 0.0
        return float(len(getattr(self.members, state)))

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.lease.run)
            while True:
                if self.lease.holding:
                    try:
                        members = await self.watch_once()
                        if self.on_members is not None:
                            await self.on_members(members)
                    except (ObjectStoreError, OSError) as exc:
                        log.warning("cannot read the node registrations: %s", exc)
                    with trio.move_on_after(self.interval_s):
                        await self.lease.changed.wait()
                else:
                    self.members = None
                    self._known_dead.clear()
                    await self.lease.changed.wait()

    async def watch_once(self) -> Membership:
        found = membership(await read_registrations(self.store), now_ms(), self.session_timeout_ms)
        dead = {(r.role, r.node_id) for r in found.dead}
        for reg in found.dead:
            if (reg.role, reg.node_id) not in self._known_dead:
                log.warning(
                    "%s %d (zone %s, %s:%d) is dead: no heartbeat for %.1f s",
                    reg.role,
                    reg.node_id,
                    reg.zone,
                    reg.host,
                    reg.port,
                    (now_ms() - reg.heartbeat_ms) / 1000,
                )
        for role, node in self._known_dead - dead:
            log.info("%s %d is back or was stopped cleanly", role, node)
        self._known_dead = dead
        self.members = found
        return found

    async def stop(self) -> None:
        await self.lease.release()

    def status(self) -> dict[str, Any]:
        lease = self.lease.lease
        out: dict[str, Any] = {
            "holder": self.lease.holder,
            "epoch": lease.epoch if lease is not None else 0,
            "active": self.lease.holding,
        }
        if self.members is not None and self.lease.holding:
            for state in ("alive", "dead", "stopped"):
                out[state] = [
                    f"{r.role}-{r.node_id}@{r.zone}" for r in getattr(self.members, state)
                ]
        return out
