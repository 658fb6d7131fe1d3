"""The audit log's events and their JSON line, without I/O (docs/formats.md, "Audit log").

Security-relevant events (a failed authentication, a denied operation, a change of the ACLs
or SCRAM credentials) are typed dataclasses. `AuditLog` stamps each with the wall clock,
rate-limits the repetitive kinds, and hands each line to a `write(line)` callable that the
node assembly supplies (`fleet/audit_file.py` appends it to a file from a thread). A line
never holds a secret: no password, proof, salt, key or token is ever an event field.

Rate limits, so that a client retrying in a loop cannot fill the disk. For the limited kinds
(`authentication_failed`, `operation_denied`) the first event of a key (the event without its
peer port) is written at once; identical events in the next `interval_s` are held back, and
when that window has passed the last of them is written with `suppressed`, the number of the
others. Every line is an event, so the events were the lines plus the sum of `suppressed`.
Across keys at most `burst` limited lines go out at once and `rate_per_s` after that; what
that budget drops is counted in one `audit_dropped` line once there is budget again. The
changes (`acl_change`, `scram_change`) are never limited.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

__all__ = [
    "ANONYMOUS",
    "FORMAT_VERSION",
    "AclEntry",
    "AclsChanged",
    "AuditDropped",
    "AuditEvent",
    "AuditLog",
    "AuthenticationFailed",
    "OperationDenied",
    "ScramChange",
    "ScramCredentialsChanged",
    "change_outcome",
    "encode_line",
    "iso_utc",
]

FORMAT_VERSION: Final = 1
MAX_TEXT: Final = 512  # longer client-supplied text (a user name, a reason) is cut to this
ANONYMOUS: Final = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True)
class AuthenticationFailed:
    """A failed login: SASL on a Kafka listener, or a bearer token on the admin HTTP port.

    `principal` is the connection's before the attempt (User:ANONYMOUS, or the one a KIP-368
    re-authentication failed to renew); `user` the name the client claimed, if it got that
    far; `outcome` the error answered (SASL_AUTHENTICATION_FAILED, HTTP_401)."""

    KIND: ClassVar[str] = "authentication_failed"
    LIMITED: ClassVar[bool] = True

    principal: str
    peer_host: str
    peer_port: int
    listener: str
    mechanism: str
    user: str | None
    reason: str
    outcome: str


@dataclass(frozen=True, slots=True)
class OperationDenied:
    """An operation the authorizer refused. `resource_type` and `operation` are Kafka's names
    (TOPIC, WRITE); `outcome` the error code the client got for it
    (TOPIC_AUTHORIZATION_FAILED ...), or CONNECTION_CLOSED; `api` the request when known."""

    KIND: ClassVar[str] = "operation_denied"
    LIMITED: ClassVar[bool] = True

    principal: str
    peer_host: str
    peer_port: int
    listener: str
    api: str | None
    resource_type: str
    resource: str
    operation: str
    outcome: str


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One ACL binding, by Kafka's names (TOPIC, LITERAL, WRITE, ALLOW)."""

    resource_type: str
    resource: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass(frozen=True, slots=True)
class AclsChanged:
    """CreateAcls (the bindings it created) or DeleteAcls (those it deleted); `outcome` NONE,
    or the error of a write that failed (then `acls` are those it meant to create)."""

    KIND: ClassVar[str] = "acl_change"
    LIMITED: ClassVar[bool] = False

    principal: str
    peer_host: str
    peer_port: int
    listener: str
    api: str
    acls: tuple[AclEntry, ...]
    outcome: str


@dataclass(frozen=True, slots=True)
class ScramChange:
    """One credential of an AlterUserScramCredentials: `change` is upsert or delete."""

    user: str
    mechanism: str
    change: str
    outcome: str


@dataclass(frozen=True, slots=True)
class ScramCredentialsChanged:
    """AlterUserScramCredentials, each credential with its own outcome; `outcome` NONE when
    every one succeeded, FAILED when none did, else PARTIAL (`change_outcome`)."""

    KIND: ClassVar[str] = "scram_change"
    LIMITED: ClassVar[bool] = False

    principal: str
    peer_host: str
    peer_port: int
    listener: str
    api: str
    changes: tuple[ScramChange, ...]
    outcome: str


@dataclass(frozen=True, slots=True)
class AuditDropped:
    """Limited events the log's overall budget left out, since the last such line."""

    KIND: ClassVar[str] = "audit_dropped"
    LIMITED: ClassVar[bool] = False

    count: int


AuditEvent = (
    AuthenticationFailed | OperationDenied | AclsChanged | ScramCredentialsChanged | AuditDropped
)


def change_outcome(outcomes: list[str]) -> str:
    """NONE when every outcome is NONE (or there are none), FAILED when none is, else
    PARTIAL."""
    ok = sum(1 for o in outcomes if o == "NONE")
    if ok == len(outcomes):
        return "NONE"
    return "FAILED" if ok == 0 else "PARTIAL"


def iso_utc(ts: float) -> str:
    """`2026-11-22T10:30:00.123Z`: UTC, milliseconds."""
    text = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _clip(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + "..."
    if isinstance(value, dict):
        return {k: _clip(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clip(v) for v in value]
    return value


def encode_line(ts: float, node: str, event: AuditEvent, suppressed: int = 0) -> str:
    """One JSON object, ASCII, compact, keys in this order: v, ts, node, event, the event's
    fields, then `suppressed` for the limited kinds. No newline: the writer adds it."""
    body: dict[str, Any] = {"v": FORMAT_VERSION, "ts": iso_utc(ts), "node": node}
    body["event"] = event.KIND
    body.update(_clip(dataclasses.asdict(event)))
    if event.LIMITED:
        body["suppressed"] = suppressed
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True)


def _key(event: AuditEvent) -> AuditEvent:
    """What makes two limited events identical: all but the peer's port (a client that
    reconnects to retry gets a new one)."""
    if isinstance(event, AuthenticationFailed | OperationDenied):
        return dataclasses.replace(event, peer_port=0)
    return event


class _Held:
    """A key's window: when it opened, and the events held back in it (the last one kept)."""

    __slots__ = ("count", "last", "last_ts", "opened")

    def __init__(self, opened: float) -> None:
        self.opened = opened
        self.count = 0
        self.last: AuditEvent | None = None
        self.last_ts = 0.0


class AuditLog:
    """Stamps, limits and encodes events; `write(line)` gets each line (None: the audit log is
    off, and `record` does nothing). `sweep()` writes the windows that have passed (the node
    calls it every second or so); `close()` writes every window still holding events.

    `clock` is monotonic (the limits), `wall` the time in the lines."""

    def __init__(
        self,
        node: str,
        write: Callable[[str], None] | None,
        *,
        interval_s: float = 10.0,
        burst: int = 200,
        rate_per_s: float = 20.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._write = write
        self.interval_s = interval_s
        self.burst = burst
        self.rate_per_s = rate_per_s
        self.max_keys = max_keys
        self.clock = clock
        self.wall = wall
        self._held: OrderedDict[AuditEvent, _Held] = OrderedDict()  # by window opening
        self._tokens = float(burst)
        self._refilled = clock()
        self._dropped = 0

    @classmethod
    def off(cls, node: str = "") -> AuditLog:
        return cls(node, None)

    @property
    def enabled(self) -> bool:
        return self._write is not None

    def record(self, event: AuditEvent) -> None:
        if self._write is None:
            return
        now = self.clock()
        ts = self.wall()
        if not event.LIMITED:
            self._emit(ts, event, 0)
            return
        self._sweep(now)
        key = _key(event)
        held = self._held.get(key)
        if held is not None:
            held.count += 1
            held.last, held.last_ts = event, ts
            return
        if len(self._held) >= self.max_keys:
            self._close_window(*self._held.popitem(last=False), now)
        self._held[key] = _Held(now)
        self._limited(now, ts, event, 0)

    def sweep(self) -> None:
        if self._write is not None:
            self._sweep(self.clock())

    def close(self) -> None:
        if self._write is None:
            return
        now = self.clock()
        while self._held:
            self._close_window(*self._held.popitem(last=False), now, budget=False)
        self._report_dropped(now, budget=False)

    def _sweep(self, now: float) -> None:
        self._report_dropped(now)
        while self._held:
            key, held = next(iter(self._held.items()))
            if now - held.opened < self.interval_s:
                break
            del self._held[key]
            self._close_window(key, held, now)

    def _close_window(
        self, key: AuditEvent, held: _Held, now: float, *, budget: bool = True
    ) -> None:
        if held.last is None:
            return
        if budget:
            self._limited(now, held.last_ts, held.last, held.count - 1)
        else:
            self._emit(held.last_ts, held.last, held.count - 1)

    def _limited(self, now: float, ts: float, event: AuditEvent, suppressed: int) -> None:
        """Write a limited event if the overall budget allows, else count it (and the events
        it stood for) as dropped."""
        self._tokens = min(
            float(self.burst), self._tokens + (now - self._refilled) * self.rate_per_s
        )
        self._refilled = now
        if self._tokens < 1.0:
            self._dropped += 1 + suppressed
            return
        self._tokens -= 1.0
        self._emit(ts, event, suppressed)

    def _report_dropped(self, now: float, *, budget: bool = True) -> None:
        if not self._dropped:
            return
        if budget:
            self._tokens = min(
                float(self.burst), self._tokens + (now - self._refilled) * self.rate_per_s
            )
            self._refilled = now
            if self._tokens < 1.0:
                return
        count, self._dropped = self._dropped, 0
        self._emit(self.wall(), AuditDropped(count), 0)

    def _emit(self, ts: float, event: AuditEvent, suppressed: int) -> None:
        assert self._write is not None
        self._write(encode_line(ts, self.node, event, suppressed))
