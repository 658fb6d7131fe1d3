"""SASL PLAIN (RFC 4616) against a credentials file that holds hashes, never passwords.

The client sends `[authzid] NUL authcid NUL passwd` once. Kafka's PlainSaslServer checks it
against passwords in its JAAS file; here the file holds per user what SCRAM stores:
the digest, the iterations, the salt and StoredKey = H(HMAC(Hi(password, salt, i),
"Client Key")). A check computes the same from the password sent and compares in constant
time, so the file gives nobody a password (docs/formats.md, "PLAIN credentials file").

The file, UTF-8 JSON:

    {"format": 1,
     "users": {name: {"digest": "sha256" | "sha512", "iterations": 4096..16384,
                      "salt": base64, "stored_key": base64}}}
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.scram import MAX_ITERATIONS, MIN_ITERATIONS, salted_password, stored_key

__all__ = [
    "CREDENTIALS_FORMAT",
    "PLAIN",
    "CredentialsFileError",
    "PlainCredential",
    "PlainCredentials",
    "PlainServer",
    "dump_credentials",
    "load_credentials",
    "make_credential",
]

PLAIN = "PLAIN"
CREDENTIALS_FORMAT = 1
_DIGEST_SIZES = {"sha256": 32, "sha512": 64}
_ENTRY_KEYS = ("digest", "iterations", "salt", "stored_key")
# PlainSaslServer's texts for a bad password (any user) and for a foreign authorization id.
_INVALID = "Authentication failed: Invalid username or password"
_AUTHZID = (
    "Authentication failed: Client requested an authorization id that is different from username"
)


@dataclass(frozen=True, slots=True)
class PlainCredential:
    digest: str  # "sha256" or "sha512"
    iterations: int
    salt: bytes
    stored_key: bytes

    def matches(self, password: bytes) -> bool:
        salted = salted_password(password, self.salt, self.iterations, self.digest)
        return hmac.compare_digest(stored_key(salted, self.digest), self.stored_key)


# An unknown user's password is hashed against this, as much work as a default entry.
_NOBODY = PlainCredential("sha512", MIN_ITERATIONS, b"\0" * 32, b"\0" * 64)


def make_credential(
    password: str,
    *,
    digest: str = "sha512",
    iterations: int = MIN_ITERATIONS,
    salt: bytes | None = None,
) -> PlainCredential:
    """The file entry for a password (tooling and tests); a random 32-byte salt if none."""
    if digest not in _DIGEST_SIZES:
        raise ValueError(f"digest must be one of {sorted(_DIGEST_SIZES)}, not {digest!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    if not password:
        raise ValueError("the password must not be empty")
    if salt is None:
        salt = secrets.token_bytes(32)
    elif not salt:
        raise ValueError("the salt must not be empty")
    salted = salted_password(password.encode(), salt, iterations, digest)
    return PlainCredential(digest, iterations, salt, stored_key(salted, digest))


class CredentialsFileError(ValueError):
    """A credentials file that is not format 1; the message names the field."""


@dataclass(frozen=True)
class PlainCredentials:
    users: Mapping[str, PlainCredential]

    def get(self, user: str) -> PlainCredential | None:
        return self.users.get(user)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CredentialsFileError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _object(value: Any, where: str, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CredentialsFileError(f"{where}: expected an object")
    if keys is not None and sorted(value) != sorted(keys):
        raise CredentialsFileError(f"{where}: expected exactly the keys {', '.join(keys)}")
    return value


def _b64(value: Any, where: str) -> bytes:
    try:
        if isinstance(value, str) and value:
            return base64.b64decode(value, validate=True)
    except binascii.Error:
        pass
    raise CredentialsFileError(f"{where}: expected non-empty base64")


def _entry(value: Any, where: str) -> PlainCredential:
    raw = _object(value, where, _ENTRY_KEYS)
    digest = raw["digest"]
    if digest not in _DIGEST_SIZES:
        raise CredentialsFileError(f"{where}.digest: expected one of {sorted(_DIGEST_SIZES)}")
    iterations = raw["iterations"]
    if type(iterations) is not int or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialsFileError(
            f"{where}.iterations: expected an integer in {MIN_ITERATIONS}..{MAX_ITERATIONS}"
        )
    salt = _b64(raw["salt"], f"{where}.salt")
    key = _b64(raw["stored_key"], f"{where}.stored_key")
    if len(key) != _DIGEST_SIZES[digest]:
        raise CredentialsFileError(
            f"{where}.stored_key: expected {_DIGEST_SIZES[digest]} bytes for {digest}"
        )
    return PlainCredential(digest, iterations, salt, key)


def load_credentials(data: bytes | str) -> PlainCredentials:
    """The users of a format-1 credentials file; anything else is a `CredentialsFileError`."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise CredentialsFileError("the file is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise CredentialsFileError(f"the file is not JSON: {exc}") from None
    top = _object(raw, "the file", ("format", "users"))
    if type(top["format"]) is not int or top["format"] != CREDENTIALS_FORMAT:
        raise CredentialsFileError(f"format: expected {CREDENTIALS_FORMAT}")
    users: dict[str, PlainCredential] = {}
    for name, entry in _object(top["users"], "users").items():
        where = f"users[{name!r}]"
        if not name or "\0" in name:
            raise CredentialsFileError(f"{where}: a user name is non-empty and has no NUL")
        users[name] = _entry(entry, where)
    return PlainCredentials(users)


def dump_credentials(users: Mapping[str, PlainCredential]) -> bytes:
    """The file for `users`: users sorted, two-space indent, a final newline."""
    body = {
        "format": CREDENTIALS_FORMAT,
        "users": {
            name: {
                "digest": c.digest,
                "iterations": c.iterations,
                "salt": base64.b64encode(c.salt).decode(),
                "stored_key": base64.b64encode(c.stored_key).decode(),
            }
            for name, c in sorted(users.items())
        },
    }
    return json.dumps(body, indent=2, ensure_ascii=False).encode() + b"\n"


class PlainServer:
    """PLAIN's one step: `authenticate(message)` returns the user or raises
    `SaslAuthenticationFailed`. Holds no state between calls (one per listener is enough).

    Strict: exactly two NULs, all UTF-8, a non-empty user and password, an authorization id
    that is empty or the user. An unknown user costs the same hashing as a default entry
    (sha512, 4096 iterations) and fails as a wrong password does; only the reason differs.
    """

    def __init__(self, lookup: Callable[[str], PlainCredential | None]) -> None:
        self._lookup = lookup

    def authenticate(self, message: bytes) -> str:
        fields = message.split(b"\0")
        if len(fields) != 3:
            raise _failed(f"malformed message: {len(fields) - 1} NULs, not 2")
        try:
            authzid, user, password = (f.decode("utf-8") for f in fields)
        except UnicodeDecodeError:
            raise _failed("the message is not UTF-8") from None
        if not user:
            raise _failed("no user name")
        if not password:
            raise _failed("no password", user)
        if authzid and authzid != user:
            raise _failed(f"authorization id {authzid!r} is not the user name", user, _AUTHZID)
        credential = self._lookup(user)
        proven = (credential or _NOBODY).matches(fields[2])
        if credential is None or not proven:
            reason = "unknown user" if credential is None else "wrong password"
            raise _failed(reason, user, _INVALID)
        return user


def _failed(
    reason: str, user: str | None = None, client_message: str | None = None
) -> SaslAuthenticationFailed:
    return SaslAuthenticationFailed(PLAIN, reason, user=user, client_message=client_message)
