"""Internal RPC: the fleet's own protocol between proxies and mains (confirm, the state
stream, relay, control calls), on its own authenticated TCP port.

`protocol` is the sans-I/O core (which message starts, completes or cancels which call),
`frames` the framing (`length | crc32c | msgpack`), `auth` the HMAC handshake, `messages` the
typed, versioned params and results of the methods (confirm, relay, meta_changed),
`state_frames` the typed frames of the state stream a main publishes to each proxy; `server`
and `client` are the trio shells around them, `tls` the optional mutual TLS with the fleet's
certificates under the HMAC handshake, and `accounting` books their traffic by zone.
The byte layouts are in docs/formats.md, "Internal RPC".
"""

from internal_rpc.client import RpcClient
from internal_rpc.errors import (
    Handler,
    OnBytes,
    RpcAuthError,
    RpcError,
    RpcMeter,
    RpcPeer,
    RpcRemoteError,
    RpcTimeout,
    RpcUnavailable,
    StreamHandler,
)
from internal_rpc.server import RpcServer
from internal_rpc.tls import RpcTlsSettings

__all__ = [
    "Handler",
    "OnBytes",
    "RpcAuthError",
    "RpcClient",
    "RpcError",
    "RpcMeter",
    "RpcPeer",
    "RpcRemoteError",
    "RpcServer",
    "RpcTimeout",
    "RpcTlsSettings",
    "RpcUnavailable",
    "StreamHandler",
]
