"""Internal RPC handshake: mutual shared-secret HMAC-SHA256 challenge, as pure functions.

    server -> {"t": "hello", "v": 1, "nonce": Ns, "node": S}
    client -> {"t": "auth", "node": C, "nonce": Nc, "mac": HMAC(k, "zf-rpc-v1|c|" Ns Nc S C)}
    server -> {"t": "ok", "mac": HMAC(k, "zf-rpc-v1|s|" Ns Nc S C)}

S and C are node ids as i64 big-endian. Different labels per direction stop a peer from
reflecting one side's proof back; fresh nonces on both sides stop replays.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import Any, Final

__all__ = [
    "MIN_SECRET_BYTES",
    "NONCE_BYTES",
    "PROTOCOL_VERSION",
    "AuthError",
    "answer_hello",
    "check_secret",
    "client_mac",
    "hello_message",
    "new_nonce",
    "server_mac",
    "verify_auth",
    "verify_ok",
]

PROTOCOL_VERSION: Final = 1
NONCE_BYTES: Final = 32
MAC_BYTES: Final = 32
MIN_SECRET_BYTES: Final = 16
_CLIENT_LABEL: Final = b"zf-rpc-v1|c|"
_SERVER_LABEL: Final = b"zf-rpc-v1|s|"
_NODES: Final = struct.Struct(">qq")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


class AuthError(Exception):
    """The peer failed the handshake. Never sent to the peer: the connection just closes."""


def check_secret(secret: bytes | bytearray) -> bytes:
    if not isinstance(secret, bytes | bytearray) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the RPC secret must be at least {MIN_SECRET_BYTES} bytes")
    return bytes(secret)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _transcript(
    label: bytes, server_nonce: bytes, client_nonce: bytes, server_node: int, client_node: int
) -> bytes:
    return label + server_nonce + client_nonce + _NODES.pack(server_node, client_node)


def client_mac(
    secret: bytes, server_nonce: bytes, client_nonce: bytes, server_node: int, client_node: int
) -> bytes:
    data = _transcript(_CLIENT_LABEL, server_nonce, client_nonce, server_node, client_node)
    return hmac.new(secret, data, hashlib.sha256).digest()


def server_mac(
    secret: bytes, server_nonce: bytes, client_nonce: bytes, server_node: int, client_node: int
) -> bytes:
    data = _transcript(_SERVER_LABEL, server_nonce, client_nonce, server_node, client_node)
    return hmac.new(secret, data, hashlib.sha256).digest()


def _node(msg: dict[str, Any]) -> int:
    node = msg.get("node")
    # bool is an int subclass; msgpack never produces one for an integer, so refuse it.
    if type(node) is not int or not _I64_MIN <= node <= _I64_MAX:
        raise AuthError("bad node id")
    return node


def _blob(msg: dict[str, Any], key: str, size: int) -> bytes:
    value = msg.get(key)
    if not isinstance(value, bytes) or len(value) != size:
        raise AuthError(f"bad {key!r}")
    return value


def hello_message(server_node: int, server_nonce: bytes) -> dict[str, Any]:
    return {"t": "hello", "v": PROTOCOL_VERSION, "nonce": server_nonce, "node": server_node}


def answer_hello(
    secret: bytes, client_node: int, hello: dict[str, Any], client_nonce: bytes
) -> tuple[dict[str, Any], bytes, int]:
    """Client side: returns (auth message, the server proof to expect, server node id)."""
    if hello.get("t") != "hello" or hello.get("v") != PROTOCOL_VERSION:
        raise AuthError("not an RPC v1 hello")
    server_nonce = _blob(hello, "nonce", NONCE_BYTES)
    server_node = _node(hello)
    mac = client_mac(secret, server_nonce, client_nonce, server_node, client_node)
    auth = {"t": "auth", "node": client_node, "nonce": client_nonce, "mac": mac}
    expected = server_mac(secret, server_nonce, client_nonce, server_node, client_node)
    return auth, expected, server_node


def verify_auth(
    secret: bytes, server_node: int, server_nonce: bytes, auth: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Server side: checks the client's proof; returns (client node id, the ok message)."""
    if auth.get("t") != "auth":
        raise AuthError("expected an auth message")
    client_node = _node(auth)
    client_nonce = _blob(auth, "nonce", NONCE_BYTES)
    mac = _blob(auth, "mac", MAC_BYTES)
    expected = client_mac(secret, server_nonce, client_nonce, server_node, client_node)
    if not hmac.compare_digest(mac, expected):
        raise AuthError("client MAC mismatch")
    proof = server_mac(secret, server_nonce, client_nonce, server_node, client_node)
    return client_node, {"t": "ok", "mac": proof}


def verify_ok(expected: bytes, ok: dict[str, Any]) -> None:
    """Client side: checks the server's proof (mutual authentication)."""
    if ok.get("t") != "ok":
        raise AuthError("expected an ok message")
    if not hmac.compare_digest(_blob(ok, "mac", MAC_BYTES), expected):
        raise AuthError("server MAC mismatch")
