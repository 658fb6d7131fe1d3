"""Internal RPC handshake, pure functions: success and every way a peer can fail it."""

from __future__ import annotations

import hmac
from typing import Any

import pytest

from internal_rpc.auth import (
    AuthError,
    answer_hello,
    check_secret,
    client_mac,
    hello_message,
    new_nonce,
    server_mac,
    verify_auth,
    verify_ok,
)

SECRET = b"s" * 32
OTHER = b"o" * 32


def _exchange(
    client_secret: bytes, server_secret: bytes
) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    server_nonce = new_nonce()
    hello = hello_message(1, server_nonce)
    auth, expected, server_node = answer_hello(client_secret, 2, hello, new_nonce())
    assert server_node == 1
    client_node, ok = verify_auth(server_secret, 1, server_nonce, auth)
    assert client_node == 2
    return auth, ok, expected


def test_mutual_success() -> None:
    auth, ok, expected = _exchange(SECRET, SECRET)
    verify_ok(expected, ok)
    assert auth["t"] == "auth" and len(auth["mac"]) == 32


def test_client_with_wrong_secret_is_refused() -> None:
    with pytest.raises(AuthError, match="client MAC"):
        _exchange(OTHER, SECRET)


def test_server_with_wrong_secret_is_refused_by_client() -> None:
    # An impostor server that skips verification still cannot produce the proof.
    server_nonce, client_nonce = new_nonce(), new_nonce()
    hello = hello_message(1, server_nonce)
    _auth, expected, _ = answer_hello(SECRET, 2, hello, client_nonce)
    forged = {"t": "ok", "mac": server_mac(OTHER, server_nonce, client_nonce, 1, 2)}
    with pytest.raises(AuthError, match="server MAC"):
        verify_ok(expected, forged)


def test_proofs_cannot_be_reflected_or_replayed() -> None:
    a, b = new_nonce(), new_nonce()
    assert a != b and len(a) == 32
    assert client_mac(SECRET, a, b, 1, 2) != server_mac(SECRET, a, b, 1, 2)
    assert client_mac(SECRET, a, b, 1, 2) != client_mac(SECRET, a, b, 2, 1)
    # A recorded auth message fails against a fresh server nonce.
    hello = hello_message(1, a)
    auth, _, _ = answer_hello(SECRET, 2, hello, b)
    with pytest.raises(AuthError):
        verify_auth(SECRET, 1, new_nonce(), auth)


@pytest.mark.parametrize(
    "change",
    [
        {"t": "ok"},
        {"node": True},
        {"node": "2"},
        {"node": 2**63},
        {"nonce": b"short"},
        {"nonce": "x" * 32},
        {"mac": b"\x00" * 31},
        {"mac": None},
    ],
)
def test_malformed_auth_is_refused(change: dict[str, Any]) -> None:
    server_nonce = new_nonce()
    auth, _, _ = answer_hello(SECRET, 2, hello_message(1, server_nonce), new_nonce())
    with pytest.raises(AuthError):
        verify_auth(SECRET, 1, server_nonce, {**auth, **change})


@pytest.mark.parametrize(
    "change", [{"t": "auth"}, {"v": 2}, {"nonce": b"x"}, {"node": None}, {"node": 1.0}]
)
def test_malformed_hello_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(AuthError):
        answer_hello(SECRET, 2, {**hello_message(1, new_nonce()), **change}, new_nonce())


def test_malformed_ok_is_refused() -> None:
    _, ok, expected = _exchange(SECRET, SECRET)
    with pytest.raises(AuthError):
        verify_ok(expected, {**ok, "t": "hello"})
    with pytest.raises(AuthError):
        verify_ok(expected, {"t": "ok"})


def test_short_secret_is_rejected() -> None:
    with pytest.raises(ValueError):
        check_secret(b"short")
    assert check_secret(bytearray(SECRET)) == SECRET


def test_golden_macs() -> None:
    # docs/formats.md "Internal RPC": secret b"k" * 32, Ns = 00..1f, Nc = 20..3f, S = 1, C = 2.
    secret, ns, nc = b"k" * 32, bytes(range(32)), bytes(range(32, 64))
    assert client_mac(secret, ns, nc, 1, 2) == bytes.fromhex(
        "4503b042536a03fb8bfe3cf4366fb3bc9cb65c33c61f55fea7ec8f3bb34483e7"
    )
    assert server_mac(secret, ns, nc, 1, 2) == bytes.fromhex(
        "eddceac84ba2f79e6dfee9d6f24bde612122b7ac4ee305f9024db956fe4cdfd6"
    )
    transcript = b"zf-rpc-v1|c|" + ns + nc + (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    assert client_mac(secret, ns, nc, 1, 2) == hmac.new(secret, transcript, "sha256").digest()
