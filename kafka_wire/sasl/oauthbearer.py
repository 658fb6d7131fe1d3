"""SASL OAUTHBEARER (RFC 7628) with JWT access tokens checked against a JWKS, as Kafka's
KIP-768 validator (OAuthBearerValidatorCallbackHandler) does, without I/O.

The client's one message is a GS2 header and key-value pairs, `n,[a=authzid],^Aauth=Bearer
<token>^A[key=value^A...]^A` (^A is %x01). The token is a JWS compact serialization (RFC 7515)
signed with RS256/384/512, PS256/384/512 or ES256/384/512 by a key of the JSON Web Key Set
(RFC 7517) the caller hands in; `alg: none` and HMAC are refused, as is a `crit` header.
Then its claims: `exp` and `iat` present (Kafka requires both), not expired and not before
`nbf` (each with the clock skew), `iss` the expected issuer and one `aud` an expected audience
when those are configured, and the principal claim (`sub` by default) a non-empty string.

The order matters: a claim is believed only after the signature holds, so a failure before
that names no subject. An exchange whose token fails gets the RFC 7628 error challenge,
`{"status":"invalid_token"}`; the client answers %x01, and only then does the exchange fail,
with that JSON as the client's message (Kafka's OAuthBearerSaslServer does the same). A
message that is not RFC 7628 fails at once.

Keys come from a `KeySource`: the current set, and a set refreshed because a token named a
`kid` the current one lacks (that call may block while the edge fetches; `jwks.py`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from kafka_wire.sasl.errors import SaslAuthenticationFailed

__all__ = [
    "ALGORITHMS",
    "OAUTHBEARER",
    "ClientFirst",
    "InvalidToken",
    "JsonWebKey",
    "JwksError",
    "KeySet",
    "KeySource",
    "MalformedClientMessage",
    "OAuthBearerExchange",
    "OAuthBearerSettings",
    "TokenValidator",
    "UnknownKey",
    "VerifiedToken",
    "error_challenge",
    "parse_client_first",
    "parse_jwks",
    "verify_token",
]

OAUTHBEARER: Final = "OAUTHBEARER"
KVSEP: Final = "\x01"
MIN_RSA_BITS: Final = 2048  # as jose4j, Kafka's JWT library

_HASHES: Final[dict[str, type[hashes.HashAlgorithm]]] = {
    "256": hashes.SHA256,
    "384": hashes.SHA384,
    "512": hashes.SHA512,
}
# alg -> (key type, EC curve name or None)
ALGORITHMS: Final[dict[str, tuple[str, str | None]]] = {
    **{f"RS{bits}": ("RSA", None) for bits in _HASHES},
    **{f"PS{bits}": ("RSA", None) for bits in _HASHES},
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
}
_CURVES: Final[dict[str, ec.EllipticCurve]] = {
    "P-256": ec.SECP256R1(),
    "P-384": ec.SECP384R1(),
    "P-521": ec.SECP521R1(),
}
_CURVE_BYTES: Final = {"P-256": 32, "P-384": 48, "P-521": 66}

_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]*")
_BEARER = re.compile(r"([A-Za-z]+) +([A-Za-z0-9\-._~+/]+=*)")
_SHOWN = 64  # at most this much of a claim value in a reason


# -- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OAuthBearerSettings:
    """Kafka's `sasl.oauthbearer.*` broker settings (KIP-768), as the `[security]` table
    spells them with underscores. `expected_audiences` empty: `aud` is not checked."""

    jwks_endpoint_url: str
    expected_issuer: str | None = None
    expected_audiences: tuple[str, ...] = ()
    sub_claim_name: str = "sub"
    clock_skew_s: int = 30
    jwks_refresh_ms: int = 3_600_000  # a periodic refresh; Kafka's default, one hour
    jwks_min_refresh_ms: int = 5_000  # refreshes for an unknown kid: at most one this often
    jwks_timeout_ms: int = 10_000


# -- JSON Web Keys -------------------------------------------------------------------------


class JwksError(ValueError):
    """A JWKS document that is not one (not JSON, no `keys` list)."""


PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


@dataclass(frozen=True, slots=True)
class JsonWebKey:
    kid: str | None
    kty: str  # "RSA" or "EC"
    alg: str | None  # the key's own `alg`, if it names one
    curve: str | None  # EC only
    key: PublicKey

    def fits(self, alg: str) -> bool:
        kty, curve = ALGORITHMS[alg]
        return self.kty == kty and self.curve == curve and self.alg in (None, alg)


@dataclass(frozen=True)
class KeySet:
    """The signature keys of one JWKS. `skipped` says which entries were left out, and why
    (another `use`, an unsupported `kty`, a malformed or too small key)."""

    keys: tuple[JsonWebKey, ...] = ()
    skipped: tuple[str, ...] = ()

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(k.kid for k in self.keys if k.kid is not None)

    def candidates(self, kid: str | None, alg: str) -> list[JsonWebKey]:
        """The keys that may have made a signature with `alg`: the one with that `kid`, or
        without a `kid` in the token every key that fits the algorithm."""
        return [k for k in self.keys if (kid is None or k.kid == kid) and k.fits(alg)]


def _b64url(value: Any, where: str) -> bytes:
    """Base64url without padding (RFC 7515 section 2), strictly."""
    if not isinstance(value, str) or not _B64URL.fullmatch(value) or len(value) % 4 == 1:
        raise ValueError(f"{where} is not base64url")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"{where} is not base64url") from None


def _uint(value: Any, where: str) -> int:
    raw = _b64url(value, where)
    if not raw:
        raise ValueError(f"{where} is empty")
    return int.from_bytes(raw, "big")


def _jwk(raw: Any) -> JsonWebKey:
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    kid = raw.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise ValueError("kid is not a string")
    use = raw.get("use")
    if use is not None and use != "sig":
        raise ValueError(f"use {str(use)[:_SHOWN]!r}, not sig")
    alg = raw.get("alg")
    if alg is not None and alg not in ALGORITHMS:
        raise ValueError(f"alg {str(alg)[:_SHOWN]!r} is not supported")
    kty = raw.get("kty")
    if kty == "RSA":
        n, e = _uint(raw.get("n"), "n"), _uint(raw.get("e"), "e")
        if n.bit_length() < MIN_RSA_BITS:
            raise ValueError(f"an RSA key of {n.bit_length()} bits (at least {MIN_RSA_BITS})")
        return JsonWebKey(kid, "RSA", alg, None, rsa.RSAPublicNumbers(e, n).public_key())
    if kty == "EC":
        crv = raw.get("crv")
        if crv not in _CURVES:
            raise ValueError(f"curve {str(crv)[:_SHOWN]!r} is not supported")
        x, y = _uint(raw.get("x"), "x"), _uint(raw.get("y"), "y")
        numbers = ec.EllipticCurvePublicNumbers(x, y, _CURVES[crv])
        return JsonWebKey(kid, "EC", alg, crv, numbers.public_key())  # checks the point
    raise ValueError(f"kty {str(kty)[:_SHOWN]!r} is not supported")


def parse_jwks(data: bytes | str) -> KeySet:
    """The signature keys of a JWKS document (RFC 7517 section 5). An entry that is not a
    usable signature key is skipped, not fatal: a set may hold encryption keys or kinds this
    does not know. A document that is not a JWKS raises `JwksError`."""
    try:
        raw = json.loads(data, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise JwksError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("keys"), list):
        raise JwksError('not a JWKS: expected an object with a "keys" list')
    keys: list[JsonWebKey] = []
    skipped: list[str] = []
    for i, entry in enumerate(raw["keys"]):
        try:
            keys.append(_jwk(entry))
        except ValueError as exc:
            kid = entry.get("kid") if isinstance(entry, dict) else None
            skipped.append(f"keys[{i}] (kid {str(kid)[:_SHOWN]!r}): {exc}")
    return KeySet(tuple(keys), tuple(skipped))


# -- tokens --------------------------------------------------------------------------------


class InvalidToken(Exception):
    """A token refused. `str()` is for the broker's log and never holds the token;
    `subject` is the principal claim once the signature held (else None)."""

    def __init__(self, reason: str, subject: str | None = None) -> None:
        super().__init__(reason)
        self.subject = subject


class UnknownKey(InvalidToken):
    """No key of the set fits the token's `kid` and `alg`: a fresher set may have it."""

    def __init__(self, kid: str | None, alg: str) -> None:
        named = "no kid" if kid is None else f"kid {kid[:_SHOWN]!r}"
        super().__init__(f"no key in the JWKS for {named} and alg {alg}")
        self.kid = kid


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    principal: str
    expires_at: float  # `exp`, seconds since the epoch
    issued_at: float
    lifetime_ms: int  # from the time of the check to `exp`, at least 0
    claims: Mapping[str, Any] = field(repr=False)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the name {key[:_SHOWN]!r} appears twice")
        out[key] = value
    return out


def _json_object(part: str, where: str) -> dict[str, Any]:
    try:
        raw = json.loads(
            _b64url(part, where).decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidToken(f"malformed JWT {where}: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidToken(f"malformed JWT {where}: not a JSON object")
    return raw


def _numeric_date(claims: Mapping[str, Any], name: str, required: bool) -> float | None:
    value = claims.get(name)
    if value is None:
        if required:
            raise InvalidToken(f"no {name} claim")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidToken(f"the {name} claim is not a NumericDate")
    return float(value)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text[:_SHOWN])


def _signature_holds(key: JsonWebKey, alg: str, signed: bytes, signature: bytes) -> bool:
    digest = _HASHES[alg[2:]]()
    try:
        if isinstance(key.key, rsa.RSAPublicKey):
            if alg.startswith("PS"):
                pss = padding.PSS(padding.MGF1(digest), digest.digest_size)
                key.key.verify(signature, signed, pss, digest)
            else:
                key.key.verify(signature, signed, padding.PKCS1v15(), digest)
            return True
        size = _CURVE_BYTES[key.curve or ""]
        if len(signature) != 2 * size:  # JWS: R || S, each the curve's size (RFC 7518 3.4)
            return False
        r = int.from_bytes(signature[:size], "big")
        s = int.from_bytes(signature[size:], "big")
        key.key.verify(encode_dss_signature(r, s), signed, ec.ECDSA(digest))
        return True
    except InvalidSignature:
        return False


def verify_token(
    token: str, keys: KeySet, now: float, settings: OAuthBearerSettings
) -> VerifiedToken:
    """The checked token at wall-clock time `now` (seconds since the epoch), or
    `InvalidToken` (`UnknownKey` when no key of `keys` fits its `kid` and `alg`)."""
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken(f"not a JWS compact serialization: {len(parts)} parts, not 3")
    header = _json_object(parts[0], "header")
    alg = header.get("alg")
    if alg not in ALGORITHMS:  # `none` and HS* included: never accepted
        raise InvalidToken(f"alg {_shown(alg)} is not accepted")
    if "crit" in header:
        raise InvalidToken("the header names critical extensions (crit)")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise InvalidToken("the kid header is not a string")
    try:
        signature = _b64url(parts[2], "signature")
    except ValueError as exc:
        raise InvalidToken(f"malformed JWT: {exc}") from None
    candidates = keys.candidates(kid, alg)
    if not candidates:
        raise UnknownKey(kid, alg)
    signed = f"{parts[0]}.{parts[1]}".encode("ascii")
    if not any(_signature_holds(key, alg, signed, signature) for key in candidates):
        raise InvalidToken(f"the signature ({alg}) does not verify")
    claims = _json_object(parts[1], "payload")
    return _checked_claims(claims, now, settings)


def _checked_claims(
    claims: dict[str, Any], now: float, settings: OAuthBearerSettings
) -> VerifiedToken:
    name = settings.sub_claim_name
    principal = claims.get(name)
    if not isinstance(principal, str) or not principal:
        raise InvalidToken(f"the principal claim {name!r} is missing or not a string")
    if principal != principal.strip() or any(ord(c) < 0x20 for c in principal):
        # Kafka trims; refusing instead keeps " admin" from becoming User:admin.
        raise InvalidToken(f"the principal claim {name!r} has spaces or control characters")

    def refuse(reason: str) -> InvalidToken:
        return InvalidToken(reason, principal)

    try:
        exp = _numeric_date(claims, "exp", required=True)
        iat = _numeric_date(claims, "iat", required=True)
        nbf = _numeric_date(claims, "nbf", required=False)
    except InvalidToken as exc:
        raise refuse(str(exc)) from None
    assert exp is not None and iat is not None
    skew = settings.clock_skew_s
    if now >= exp + skew:
        raise refuse(f"expired {now - exp:.0f} s ago (exp {exp:.0f}, skew {skew} s)")
    if nbf is not None and now + skew < nbf:
        raise refuse(f"not valid for {nbf - now:.0f} s more (nbf {nbf:.0f}, skew {skew} s)")
    issuer = settings.expected_issuer
    if issuer is not None and claims.get("iss") != issuer:
        raise refuse(f"issuer {_shown(claims.get('iss'))}, not {issuer!r}")
    expected = settings.expected_audiences
    if expected:
        aud = claims.get("aud")
        auds = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if not any(isinstance(a, str) and a in expected for a in auds):
            raise refuse(f"audience {_shown(aud)}, none of {list(expected)}")
    lifetime_ms = max(0, int((exp - now) * 1000))
    return VerifiedToken(principal, exp, iat, lifetime_ms, claims)


class KeySource(Protocol):
    def current(self) -> KeySet: ...

    def refreshed(self, kid: str | None) -> KeySet:
        """A set fetched again because a token named `kid`, or the current one if a fetch
        is not allowed now (rate limit). May block: it is called off the event loop."""
        ...


class TokenValidator:
    """Checks tokens against a `KeySource` with a wall clock: one for a listener."""

    def __init__(
        self,
        settings: OAuthBearerSettings,
        keys: KeySource,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.clock = clock

    def validate(self, token: str) -> VerifiedToken:
        try:
            return verify_token(token, self.keys.current(), self.clock(), self.settings)
        except UnknownKey as exc:
            fresher = self.keys.refreshed(exc.kid)
            return verify_token(token, fresher, self.clock(), self.settings)


# -- the SASL exchange ---------------------------------------------------------------------


class MalformedClientMessage(ValueError):
    """A client message that is not RFC 7628's (the reason never quotes the token)."""


@dataclass(frozen=True, slots=True)
class ClientFirst:
    token: str
    authzid: str  # "" when the GS2 header names none
    extensions: Mapping[str, str]  # every key-value pair but auth (KIP-342 extensions)


def _saslname(text: str) -> str:
    """RFC 5801's saslname: `,` and `=` only as =2C and =3D."""
    if "\0" in text or re.search(r"=(?!2C|3D)", text):
        raise MalformedClientMessage("a malformed authorization id")
    return text.replace("=2C", ",").replace("=3D", "=")


def parse_client_first(message: bytes) -> ClientFirst:
    """RFC 7628 section 3.1's client response: `gs2-header kvsep *kvpair kvsep`."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedClientMessage("not UTF-8") from None
    head = text.split(",", 2)
    if len(head) != 3:
        raise MalformedClientMessage("no GS2 header")
    flag, authz, rest = head
    if flag not in ("n", "y"):  # p=...: OAUTHBEARER has no channel binding
        raise MalformedClientMessage(f"GS2 channel binding flag {flag[:8]!r}")
    authzid = ""
    if authz:
        if not authz.startswith("a="):
            raise MalformedClientMessage("a GS2 header field that is not a=authzid")
        authzid = _saslname(authz[2:])
    if len(rest) < 2 or rest[0] != KVSEP or rest[-1] != KVSEP:
        raise MalformedClientMessage("the key-value pairs are not framed by %x01")
    body = rest[1:-1]
    if not body.endswith(KVSEP):
        raise MalformedClientMessage("no key-value pairs, or one not ended by %x01")
    pairs: dict[str, str] = {}
    for item in body[:-1].split(KVSEP):
        key, eq, value = item.partition("=")
        if not eq or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value):
            raise MalformedClientMessage("a malformed key-value pair")
        if key in pairs:
            raise MalformedClientMessage(f"the key {key[:_SHOWN]!r} appears twice")
        pairs[key] = value
    auth = pairs.pop("auth", None)
    if auth is None:
        raise MalformedClientMessage("no auth key")
    bearer = _BEARER.fullmatch(auth)
    if bearer is None or bearer.group(1).lower() != "bearer":
        raise MalformedClientMessage("auth is not 'Bearer <token>'")
    return ClientFirst(bearer.group(2), authzid, pairs)


def error_challenge(status: str = "invalid_token") -> bytes:
    """RFC 7628 section 3.2.2's server error, as Kafka's OAuthBearerSaslServer sends it."""
    return json.dumps({"status": status}, separators=(",", ":")).encode()


class OAuthBearerExchange:
    """One connection's OAUTHBEARER exchange: a token that checks authenticates its
    principal claim at once; one that does not gets the error challenge, then the client's
    %x01 fails the exchange. `credential_lifetime_ms` is set on success (the session then
    ends by the token's `exp`, KIP-368)."""

    def __init__(self, validator: TokenValidator) -> None:
        self._validator = validator
        self._refused: InvalidToken | None = None
        self._challenge = b""
        self.credential_lifetime_ms: int | None = None

    def step(self, message: bytes) -> tuple[bytes, str | None]:
        refused = self._refused
        if refused is not None:
            # The client's answer to the error challenge: %x01, by RFC 7628 section 3.2.3.
            extra = "" if message == KVSEP.encode() else " (and the client did not answer %x01)"
            raise SaslAuthenticationFailed(
                OAUTHBEARER,
                f"{refused}{extra}",
                user=refused.subject,
                client_message=self._challenge.decode(),
            )
        try:
            first = parse_client_first(message)
        except MalformedClientMessage as exc:
            raise SaslAuthenticationFailed(
                OAUTHBEARER, f"malformed client message: {exc}"
            ) from None
        try:
            token = self._validator.validate(first.token)
        except InvalidToken as exc:
            self._refused = exc
            self._challenge = error_challenge()
            return self._challenge, None
        if first.authzid and first.authzid != token.principal:
            raise SaslAuthenticationFailed(
                OAUTHBEARER,
                f"authorization id {first.authzid[:_SHOWN]!r} is not the token's principal",
                user=token.principal,
                client_message=(
                    "Authentication failed: Client requested an authorization id that is "
                    "different from the token's principal name"
                ),
            )
        self.credential_lifetime_ms = token.lifetime_ms
        return b"", token.principal
