"""Node registrations in the object store: which mains and proxies are up, in which zone, at
which endpoints, and since when.

One object per node, `cluster/nodes/<role>-<node id>.json`, written only by that node and only
by conditional PUT (its last ETag), so a second process started with the same role and node id
takes the registration over and the first one learns on its next heartbeat that it was
displaced (`NodeDisplaced`), as Kafka fences a broker whose registration another took. The
bytes are JSON (docs/formats.md, "Node registration"):

    {"format": 1, "role": "main" | "proxy", "node_id": int, "zone": str, "host": str,
     "port": int, "rpc_port": int | null, "incarnation": 32 hex, "started_ms": int,
     "heartbeat_ms": int, "state": "running" | "stopped"}

A registration whose heartbeat is older than the session timeout, and that is not "stopped",
belongs to a node that died without saying so.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import trio

from s3_commit.async_store import AsyncObjectStore
from s3_commit.json_fields import expect_int, expect_str
from s3_commit.object_store import ConditionalPutUnknown, ObjectStoreError, PreconditionFailed

__all__ = [
    "REGISTRY_PREFIX",
    "NodeDisplaced",
    "NodeRegistrar",
    "NodeRegistration",
    "RegistrationFormatError",
    "read_registrations",
    "registration_key",
]

log = logging.getLogger("zonefleet.s3_commit.registry")

FORMAT = 1
REGISTRY_PREFIX = "cluster/nodes/"
ROLES = ("main", "proxy")
STATES = ("running", "stopped")


class RegistrationFormatError(ValueError):
    pass


class NodeDisplaced(ObjectStoreError):
    """Another process registered with this node's role and id: this one must stop serving."""


def registration_key(role: str, node_id: int) -> str:
    return f"{REGISTRY_PREFIX}{role}-{node_id}.json"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    role: str
    node_id: int
    zone: str
    host: str
    port: int
    rpc_port: int | None
    incarnation: str
    started_ms: int
    heartbeat_ms: int
    state: str = "running"

    @property
    def key(self) -> str:
        return registration_key(self.role, self.node_id)

    def alive(self, at_ms: int, session_timeout_ms: int) -> bool:
        return self.state == "running" and at_ms - self.heartbeat_ms < session_timeout_ms

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT,
            "role": self.role,
            "node_id": self.node_id,
            "zone": self.zone,
            "host": self.host,
            "port": self.port,
            "rpc_port": self.rpc_port,
            "incarnation": self.incarnation,
            "started_ms": self.started_ms,
            "heartbeat_ms": self.heartbeat_ms,
            "state": self.state,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> NodeRegistration:
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise RegistrationFormatError(f"registration is not JSON: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise RegistrationFormatError("not a format-1 registration object")
        role, state = raw.get("role"), raw.get("state")
        if role not in ROLES or state not in STATES:
            raise RegistrationFormatError(f"bad role {role!r} or state {state!r}")
        rpc_port = raw.get("rpc_port")
        return cls(
            role=str(role),
            node_id=_int(raw, "node_id"),
            zone=_str(raw, "zone"),
            host=_str(raw, "host"),
            port=_int(raw, "port"),
            rpc_port=None if rpc_port is None else _int(raw, "rpc_port"),
            incarnation=_str(raw, "incarnation"),
            started_ms=_int(raw, "started_ms"),
            heartbeat_ms=_int(raw, "heartbeat_ms"),
            state=str(state),
        )

    @classmethod
    def new(
        cls, role: str, node_id: int, zone: str, host: str, port: int, rpc_port: int | None
    ) -> NodeRegistration:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        started = now_ms()
        return cls(role, node_id, zone, host, port, rpc_port, uuid.uuid4().hex, started, started)


def _int(raw: dict[str, Any], name: str) -> int:
    return expect_int(raw.get(name), name, RegistrationFormatError)


def _str(raw: dict[str, Any], name: str) -> str:
    return expect_str(raw.get(name), name, RegistrationFormatError)


async def read_registrations(store: AsyncObjectStore) -> list[NodeRegistration]:
    """Every node registration; one that cannot be read is logged and left out."""
    out: list[NodeRegistration] = []
    for info in await store.list(REGISTRY_PREFIX):
        found = await store.get(info.key)
        if found is None:
            continue
        try:
            out.append(NodeRegistration.from_bytes(found[0]))
        except RegistrationFormatError as exc:
            log.warning("ignoring unreadable node registration %s: %s", info.key, exc)
    return out


class NodeRegistrar:
    """Keeps one node's registration fresh: register at start, heartbeat every `interval_s`,
    mark it stopped at a clean stop (not after `abandon`)."""

    def __init__(
        self,
        store: AsyncObjectStore,
        me: NodeRegistration,
        interval_s: float = 5.0,
        session_timeout_s: float = 18.0,
    ) -> None:
        self.store = store
        self.me = me
        self.interval_s = interval_s
        self.session_timeout_ms = int(session_timeout_s * 1000)
        self.etag: str | None = None
        self.heartbeats = 0
        self.failures = 0
        self.last_error: str | None = None
        self.abandoned = False

    def abandon(self) -> None:
        """This process is about to stop as if it died (its WAL was fenced): its registration
        is left running, to go stale, rather than marked stopped. A stopped main keeps what
        it leads until it is restarted; a dead one has it moved to the others."""
        self.abandoned = True

    async def register(self) -> None:
        """Write this node's registration, taking over one a previous process left.

        A live registration (fresh heartbeat) at another endpoint is a second process with
        the same node id: that raises NodeDisplaced and this one must not start. At this
        node's own endpoint it can only be a predecessor that died (the port is ours now).
        """
        found = await self.store.get(self.me.key)
        if found is not None:
            try:
                old = NodeRegistration.from_bytes(found[0])
                elsewhere = (old.host, old.port) != (self.me.host, self.me.port)
                if old.alive(now_ms(), self.session_timeout_ms) and elsewhere:
                    raise NodeDisplaced(
                        f"{old.role} {old.node_id} is registered by a live process at "
                        f"{old.host}:{old.port} (heartbeat "
                        f"{(now_ms() - old.heartbeat_ms) / 1000:.1f} s ago): node ids must be "
                        "unique"
                    )
                if old.state == "running" and old.incarnation != self.me.incarnation:
                    log.warning(
                        "%s %d was registered by another process (%s:%d, heartbeat %.1f s ago); "
                        "taking the registration over",
                        old.role,
                        old.node_id,
                        old.host,
                        old.port,
                        (now_ms() - old.heartbeat_ms) / 1000,
                    )
            except RegistrationFormatError as exc:
                log.warning("replacing unreadable registration %s: %s", self.me.key, exc)
        await self._write(found[1] if found is not None else None, create=found is None)

    async def _write(self, etag: str | None, *, create: bool) -> None:
        self.me = replace(self.me, heartbeat_ms=now_ms())
        self.etag = await self.store.put(
            self.me.key, self.me.to_bytes(), if_match=etag, if_none_match=create
        )

    async def heartbeat(self) -> None:
        """One heartbeat by CAS; raises NodeDisplaced when another process holds the key."""
        try:
            await self._write(self.etag, create=self.etag is None)
        except (PreconditionFailed, ConditionalPutUnknown):
            found = await self.store.get(self.me.key)
            current = NodeRegistration.from_bytes(found[0]) if found is not None else None
            if current is not None and current.incarnation == self.me.incarnation:
                assert found is not None
                self.etag = found[1]  # our own write whose answer was lost
                return
            if current is None or current.state == "stopped":
                # Deleted by an operator, or marked stopped by our own lost final write.
                await self._write(found[1] if found is not None else None, create=found is None)
                return
            raise NodeDisplaced(
                f"{self.me.role} {self.me.node_id} is now registered by another process "
                f"({current.host}:{current.port}, incarnation {current.incarnation})"
            ) from None
        self.heartbeats += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, heartbeat until cancelled, then mark the registration stopped.

        An unreachable store is logged and retried (the node keeps serving: only the
        controller's view of it goes stale). NodeDisplaced propagates: the node must stop.
        """
        try:
            await self._register_and_beat(task_status)
        except NodeDisplaced as exc:
            log.critical("stopping: %s", exc)
            raise
        finally:
            if not self.abandoned:
                with trio.CancelScope(shield=True):
                    await self.stop()

    async def _register_and_beat(self, task_status: trio.TaskStatus[None]) -> None:
        while True:
            try:
                await self.register()
                break
            except NodeDisplaced:
                raise
            except (ObjectStoreError, OSError) as exc:
                self._failed(exc)
                await trio.sleep(self.interval_s)
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.heartbeat()
            except NodeDisplaced:
                raise
            except (ObjectStoreError, OSError, RegistrationFormatError) as exc:
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.warning("node registration %s not written: %s", self.me.key, exc)

    async def stop(self) -> None:
        """Mark the registration stopped (a clean shutdown, not a death)."""
        self.me = replace(self.me, state="stopped")
        try:
            await self._write(self.etag, create=self.etag is None)
        except ObjectStoreError as exc:
            log.info("could not mark %s stopped: %s", self.me.key, exc)
