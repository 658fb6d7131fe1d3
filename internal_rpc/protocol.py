"""The sans-I/O core of internal RPC: which message starts, completes or cancels which call.

Like h11's `Connection`, nothing here reads or writes a socket, sleeps or knows trio. The
shells (`server`, `client`) decode a frame (`frames.decode_body`), hand the message to a
session, act on what it returns, and send the messages it builds (`frames.encode_frame`).

Messages on an authenticated connection (every one a msgpack map with a string ``t``):

    client -> {"t": "req", "id": N, "m": method, "p": params, "dl": deadline ms}
    client -> {"t": "sub", "id": N, "m": stream, "p": params}
    client -> {"t": "cancel", "id": N}
    server -> {"t": "res", "id": N, "r": result}
    server -> {"t": "err", "id": N, "code": name, "msg": text}
    server -> {"t": "push", "id": N, "d": item}
    server -> {"t": "end", "id": N[, "code": name, "msg": text]}

`ServerSession` keeps the ids in flight (a duplicate or one past `MAX_IN_FLIGHT` is refused,
an unknown method or stream too) and turns each client message into one event.
`ClientSession` allocates ids, and files each server message in the slot of its call: a
reply, or a push buffered until the subscriber takes it. A subscriber that lets more than
`MAX_BUFFERED_PUSHES` pile up loses the rest of its stream (`Slot.overflow`): a gap would
corrupt its state, so it must re-subscribe and start from a full snapshot.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DEADLINE_EXCEEDED",
    "MAX_BUFFERED_PUSHES",
    "MAX_DEADLINE_S",
    "MAX_IN_FLIGHT",
    "CallStarted",
    "CancelRequested",
    "ClientSession",
    "ProtocolViolation",
    "Refused",
    "ServerEvent",
    "ServerSession",
    "Slot",
    "SubscriptionStarted",
    "end_message",
    "error_message",
    "push_message",
    "result_message",
]

MAX_IN_FLIGHT: Final = 4096  # concurrent requests + subscriptions per server connection
MAX_BUFFERED_PUSHES: Final = 10_000  # per client subscription; past it the subscriber resyncs
MAX_DEADLINE_S: Final = 86_400.0
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"


class ProtocolViolation(Exception):
    """The peer sent a message that breaks the protocol; the connection must be closed."""


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A request to run `method`; `timeout` is the caller's deadline (seconds, maybe inf)."""

    rid: int
    method: str
    params: dict[str, Any]
    timeout: float


@dataclass(frozen=True, slots=True)
class SubscriptionStarted:
    rid: int
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """The client gave up on call or subscription `rid`, which is still in flight."""

    rid: int


@dataclass(frozen=True, slots=True)
class Refused:
    """A request or subscription not started; `message` is the answer to send."""

    rid: int
    method: str
    params: dict[str, Any]
    code: str
    message: dict[str, Any]


ServerEvent = CallStarted | SubscriptionStarted | CancelRequested | Refused


def result_message(rid: int, result: Any) -> dict[str, Any]:
    return {"t": "res", "id": rid, "r": result}


def error_message(rid: int, code: str, msg: str) -> dict[str, Any]:
    return {"t": "err", "id": rid, "code": code, "msg": msg}


def push_message(rid: int, item: Any) -> dict[str, Any]:
    return {"t": "push", "id": rid, "d": item}


def end_message(rid: int, code: str | None = None, msg: str = "") -> dict[str, Any]:
    if code is None:
        return {"t": "end", "id": rid}
    return {"t": "end", "id": rid, "code": code, "msg": msg}


def _timeout(dl: object) -> float:
    return dl / 1000 if isinstance(dl, int | float) and dl > 0 else math.inf


class ServerSession:
    """The server's view of one connection: which calls and subscriptions are in flight."""

    def __init__(
        self,
        methods: Collection[str],
        streams: Collection[str],
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.methods = methods
        self.streams = streams
        self.max_in_flight = max_in_flight
        self.in_flight: set[int] = set()

    def receive(self, msg: dict[str, Any]) -> ServerEvent | None:
        """The event one client message makes; None for a cancel of nothing in flight.
        Raises `ProtocolViolation`."""
        kind, rid = msg["t"], msg.get("id")
        if type(rid) is not int:
            raise ProtocolViolation(f"{kind!r} message without an integer id")
        if kind == "cancel":
            return CancelRequested(rid) if rid in self.in_flight else None
        if kind not in ("req", "sub"):
            raise ProtocolViolation(f"unexpected message type {kind!r}")
        method, params = msg.get("m"), msg.get("p", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            raise ProtocolViolation(f"{kind!r} without a method name or a params map")
        known = self.methods if kind == "req" else self.streams
        if rid in self.in_flight:
            code = "DuplicateId"
        elif len(self.in_flight) >= self.max_in_flight:
            code = "TooManyRequests"
        elif method not in known:
            code = "UnknownMethod" if kind == "req" else "UnknownStream"
        else:
            self.in_flight.add(rid)
            if kind == "req":
                return CallStarted(rid, method, params, _timeout(msg.get("dl")))
            return SubscriptionStarted(rid, method, params)
        reply = (
            error_message(rid, code, method) if kind == "req" else end_message(rid, code, method)
        )
        return Refused(rid, method, params, code, reply)

    def finish(self, rid: int) -> None:
        """Call or subscription `rid` is over (answered, ended or cancelled)."""
        self.in_flight.discard(rid)


class Slot:
    """One outstanding call or subscription on a client connection."""

    __slots__ = ("items", "method", "overflow", "reply", "tag")

    def __init__(self, method: str, tag: Any) -> None:
        self.method = method
        self.tag = tag  # the accounting tag of the call
        self.reply: dict[str, Any] | None = None  # res/err, or a subscription's end
        self.items: deque[Any] = deque()
        self.overflow = False

    def ready(self) -> bool:
        return self.reply is not None or bool(self.items) or self.overflow


class ClientSession:
    """The client's view of one connection: ids, and the slot each server message fills."""

    def __init__(self, max_buffered_pushes: int | None = None) -> None:
        self.max_buffered_pushes = (
            MAX_BUFFERED_PUSHES if max_buffered_pushes is None else max_buffered_pushes
        )
        self.slots: dict[int, Slot] = {}
        self.next_id = 1

    def open(self, method: str, tag: Any = None) -> tuple[int, Slot]:
        rid, self.next_id = self.next_id, self.next_id + 1
        slot = self.slots[rid] = Slot(method, tag)
        return rid, slot

    def close(self, rid: int) -> None:
        self.slots.pop(rid, None)

    @staticmethod
    def request(rid: int, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        """A request whose server-side deadline is `timeout` seconds (at least 1 ms)."""
        dl = int(min(max(timeout, 0.001), MAX_DEADLINE_S) * 1000)
        return {"t": "req", "id": rid, "m": method, "p": params, "dl": dl}

    @staticmethod
    def subscription(rid: int, stream: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"t": "sub", "id": rid, "m": stream, "p": params}

    @staticmethod
    def cancel(rid: int) -> dict[str, Any]:
        return {"t": "cancel", "id": rid}

    def receive(self, msg: dict[str, Any]) -> Slot | None:
        """Files one server message; returns the slot it filled, or None for a late reply
        to a call that already gave up."""
        rid = msg.get("id")
        if type(rid) is not int or (slot := self.slots.get(rid)) is None:
            return None
        if msg["t"] == "push":
            if slot.overflow or len(slot.items) >= self.max_buffered_pushes:
                slot.overflow = True  # drop the rest: a gap would corrupt the subscriber's state
            else:
                slot.items.append(msg.get("d"))
        else:
            slot.reply = msg
        return slot
