"""A small OAuth 2.0 provider for the OAUTHBEARER tests: JWT signers with keys generated here
(RSA and EC), and a loopback HTTP server with a client-credentials token endpoint
(RFC 6749 section 4.4, HTTP Basic client authentication) and the JWKS of its signers.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

ISSUER = "https://idp.zonefleet.test"
AUDIENCE = "zonefleet"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(value: int, size: int | None = None) -> str:
    return b64url(value.to_bytes(size or (value.bit_length() + 7) // 8, "big"))


def encode_jwt(header: dict[str, Any], claims: dict[str, Any]) -> str:
    """header.payload, unsigned."""
    return f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"


class Signer:
    """One signing key with its `kid`: RS256 (or PS256) with RSA, ES256 with P-256."""

    def __init__(
        self, kid: str, kind: str = "RSA", bits: int = 2048, publish_alg: bool = True
    ) -> None:
        self.kid = kid
        self.kind = kind
        self.publish_alg = publish_alg  # the JWK names its alg (RS256 only then)
        self.key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
        if kind == "RSA":
            self.key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())

    @property
    def alg(self) -> str:
        return "RS256" if self.kind == "RSA" else "ES256"

    def jwk(self) -> dict[str, Any]:
        if isinstance(self.key, rsa.RSAPrivateKey):
            rsa_numbers = self.key.public_key().public_numbers()
            jwk = {
                "kty": "RSA",
                "kid": self.kid,
                "use": "sig",
                "n": _uint(rsa_numbers.n),
                "e": _uint(rsa_numbers.e),
            }
            return {**jwk, "alg": "RS256"} if self.publish_alg else jwk
        ec_numbers = self.key.public_key().public_numbers()
        return {
            "kty": "EC",
            "kid": self.kid,
            "use": "sig",
            "crv": "P-256",
            "x": _uint(ec_numbers.x, 32),
            "y": _uint(ec_numbers.y, 32),
        }

    def signature(self, signed: bytes, alg: str) -> bytes:
        if isinstance(self.key, rsa.RSAPrivateKey):
            if alg == "PS256":
                pss = padding.PSS(padding.MGF1(hashes.SHA256()), 32)
                return self.key.sign(signed, pss, hashes.SHA256())
            return self.key.sign(signed, padding.PKCS1v15(), hashes.SHA256())
        r, s = decode_dss_signature(self.key.sign(signed, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    def sign(self, claims: dict[str, Any], alg: str | None = None, **header: Any) -> str:
        alg = alg or self.alg
        unsigned = encode_jwt({"alg": alg, "typ": "JWT", "kid": self.kid, **header}, claims)
        return f"{unsigned}.{b64url(self.signature(unsigned.encode(), alg))}"


def claims_for(
    sub: str,
    lifetime_s: float = 3600,
    audience: str | list[str] = AUDIENCE,
    issuer: str = ISSUER,
    now: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    now = time.time() if now is None else now
    return {
        "iss": issuer,
        "sub": sub,
        "aud": audience,
        "iat": int(now),
        "nbf": int(now),
        "exp": int(now + lifetime_s),
        "jti": uuid.uuid4().hex,
        **extra,
    }


def jwks_bytes(*signers: Signer) -> bytes:
    return json.dumps({"keys": [s.jwk() for s in signers]}).encode()


@dataclass
class Client:
    secret: str
    audience: str = AUDIENCE
    sub: str | None = None  # None: the client id
    lifetime_s: float | None = None  # None: the provider's


@dataclass
class IdentityProvider:
    """What the loopback server answers: `signer` signs tokens, `published` are in the
    JWKS. `token_requests` and `jwks_requests` count the requests served."""

    signer: Signer
    published: list[Signer]
    clients: dict[str, Client] = field(default_factory=dict)
    lifetime_s: float = 3600
    token_requests: list[dict[str, Any]] = field(default_factory=list)
    jwks_requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def issue(self, client_id: str, secret: str, form: dict[str, list[str]]) -> str | None:
        client = self.clients.get(client_id)
        if client is None or client.secret != secret:
            return None
        if form.get("grant_type") != ["client_credentials"]:
            return None
        scope = " ".join(form.get("scope", []))
        lifetime = client.lifetime_s or self.lifetime_s
        claims = claims_for(client.sub or client_id, lifetime, client.audience, scope=scope)
        return self.signer.sign(claims)


def _handler(idp: IdentityProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: dict[str, Any] | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path != "/jwks":
                self._send(404, {"error": "not_found"})
                return
            with idp.lock:
                idp.jwks_requests += 1
                body = jwks_bytes(*idp.published)
            self._send(200, body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            form = parse_qs(self.rfile.read(length).decode())
            auth = self.headers.get("Authorization", "")
            client_id = secret = ""
            if auth.startswith("Basic "):
                decoded = base64.b64decode(auth[6:]).decode()
                client_id, _, secret = decoded.partition(":")
            with idp.lock:
                idp.token_requests.append({"client_id": client_id, "form": form})
                token = idp.issue(client_id, secret, form) if self.path == "/token" else None
            if token is None:
                self._send(401, {"error": "invalid_client"})
                return
            lifetime = idp.clients[client_id].lifetime_s or idp.lifetime_s
            body = {"access_token": token, "token_type": "Bearer", "expires_in": int(lifetime)}
            self._send(200, body)

    return Handler


@contextmanager
def serving(idp: IdentityProvider) -> Iterator[str]:
    """The provider on a loopback port; yields its base URL (`/token`, `/jwks`)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(idp))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="oauth-idp", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
