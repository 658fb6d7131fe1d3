"""What callers of internal RPC see: the errors, the authenticated peer, the handler types
and the accounting hooks. No I/O."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = [
    "ACCOUNT_HANDSHAKE",
    "Accounting",
    "Handler",
    "OnBytes",
    "RpcAuthError",
    "RpcError",
    "RpcMeter",
    "RpcPeer",
    "RpcRemoteError",
    "RpcTimeout",
    "RpcUnavailable",
    "StreamHandler",
    "remote_error",
]

ACCOUNT_HANDSHAKE: Final = "_handshake"


class RpcError(Exception):
    """Base class of RPC client errors."""


class RpcTimeout(RpcError):
    """The call's deadline passed before a response arrived."""


class RpcUnavailable(RpcError):
    """No usable connection to the peer (refused, dropped, or the handshake failed).
    `request_sent`: the call's request was written before the connection failed, so the peer
    may have acted on it (a caller must not report it as surely not done)."""

    request_sent: bool = False


class RpcAuthError(RpcUnavailable):
    """The peer failed mutual authentication; retrying will not help."""


class RpcRemoteError(RpcError):
    """The remote handler raised; `code` is its exception class name."""

    def __init__(self, code: str, msg: str) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg


def remote_error(msg: dict[str, Any]) -> RpcRemoteError:
    """The error an ``err`` reply, or an ``end`` with a code, stands for."""
    return RpcRemoteError(str(msg.get("code", "Error")), str(msg.get("msg", "")))


@dataclass(frozen=True, slots=True)
class RpcPeer:
    """The authenticated caller, as a handler sees it."""

    node_id: int
    address: str


Handler = Callable[[RpcPeer, dict[str, Any]], Awaitable[Any]]
StreamHandler = Callable[
    [RpcPeer, dict[str, Any], Callable[[Any], Awaitable[None]]], Awaitable[None]
]
OnBytes = Callable[[str, str, int, int], None]


class RpcMeter(Protocol):
    """Traffic accounting of RPC frames; both methods run on the hot path."""

    def classify(self, method: str, params: dict[str, Any]) -> Any:
        """A tag for a call or subscription, computed once from its request (the handshake
        is classified as method ``_handshake`` with no params)."""
        ...

    def count(self, tag: Any, direction: str, nbytes: int, peer_node: int) -> None:
        """One frame of the call tagged `tag`: ``in`` or ``out`` as seen from this side."""
        ...


class Accounting:
    """The `on_bytes` and `meter` hooks of one server or client."""

    __slots__ = ("meter", "on_bytes")

    def __init__(self, on_bytes: OnBytes | None, meter: RpcMeter | None) -> None:
        self.on_bytes = on_bytes
        self.meter = meter

    def tag(self, method: str, params: dict[str, Any]) -> Any:
        meter = self.meter
        return meter.classify(method, params) if meter is not None else None

    def __call__(self, direction: str, method: str, tag: Any, nbytes: int, peer: int) -> None:
        if self.on_bytes is not None:
            self.on_bytes(direction, method, nbytes, peer)
        if self.meter is not None:
            self.meter.count(tag, direction, nbytes, peer)

    def handshake(self, received: int, sent: int, peer: int) -> None:
        tag = self.tag(ACCOUNT_HANDSHAKE, {})
        self("in", ACCOUNT_HANDSHAKE, tag, received, peer)
        self("out", ACCOUNT_HANDSHAKE, tag, sent, peer)
