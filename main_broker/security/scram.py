"""SCRAM credentials as Kafka stores them (KIP-554), and AlterUserScramCredentials' rules.

Pure functions, no I/O. The client never sends a password: an upsertion carries the salt, the
iteration count and SaltedPassword = Hi(password, salt, i) (RFC 5802, PBKDF2 with the
mechanism's HMAC). The broker keeps what a SCRAM server needs and nothing a client could log
in with: the salt, the iterations, StoredKey = H(HMAC(SaltedPassword, "Client Key")) and
ServerKey = HMAC(SaltedPassword, "Server Key"), as Kafka's ScramControlManager does. The
derivation, `ScramCredential` and the mechanism table live in `kafka_wire.sasl.scram`, next to
the SCRAM server that reads these credentials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from kafka_wire.sasl.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredential,
    server_key,
    stored_key,
)

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "AlterResult",
    "Deletion",
    "ScramCredential",
    "Upsertion",
    "alter_credentials",
    "derive_credential",
    "describe_credentials",
]

_UNKNOWN_SERVER_ERROR = "The server experienced an unexpected error when processing the request."
_TWICE = "A user credential cannot be altered twice in the same request"
_DESCRIBE_TWICE = "Cannot describe SCRAM credentials for the same user twice in a single request: "


def derive_credential(
    salt: bytes, salted: bytes, iterations: int, mechanism: int
) -> ScramCredential:
    digest = MECHANISMS[mechanism][1]
    return ScramCredential(salt, stored_key(salted, digest), server_key(salted, digest), iterations)


@dataclass(frozen=True, slots=True)
class Deletion:
    user: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class Upsertion:
    user: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class AlterResult:
    user: str
    error_code: ErrorCode
    error_message: str | None


Credentials = Mapping[tuple[str, int], ScramCredential]  # (user, mechanism) -> credential


def _name_and_mechanism_error(user: str, mechanism: int) -> AlterResult | None:
    if not user:
        return AlterResult(user, ErrorCode.unacceptable_credential, "Username must not be empty")
    if mechanism not in MECHANISMS:
        return AlterResult(user, ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
    return None


def _upsertion_error(u: Upsertion) -> AlterResult | None:
    error = _name_and_mechanism_error(u.user, u.mechanism)
    if error is not None:
        return error
    if u.iterations < MIN_ITERATIONS:
        return AlterResult(u.user, ErrorCode.unacceptable_credential, "Too few iterations")
    if u.iterations > MAX_ITERATIONS:
        return AlterResult(u.user, ErrorCode.unacceptable_credential, "Too many iterations")
    return None


def alter_credentials(
    existing: Credentials, deletions: Sequence[Deletion], upsertions: Sequence[Upsertion]
) -> tuple[dict[tuple[str, int], ScramCredential], list[AlterResult]]:
    """The credentials after the request, and one result per user named in it.

    Kafka's rules (ScramControlManager.alterCredentials): a user may appear once in a request
    (a second deletion or upsertion, whatever the mechanism, is DUPLICATE_RESOURCE for that
    user and drops the first); an empty name is UNACCEPTABLE_CREDENTIAL, an unknown mechanism
    UNSUPPORTED_SASL_MECHANISM; deleting a credential that does not exist is
    RESOURCE_NOT_FOUND; iterations must be in 4096..16384. Results list the deletions, then
    the upsertions, then the refused users; a refused user changes nothing.
    """
    errors: dict[str, AlterResult] = {}
    to_delete: dict[str, Deletion] = {}
    to_upsert: dict[str, Upsertion] = {}
    for d in deletions:
        if d.user in errors:
            continue
        if to_delete.pop(d.user, None) is not None:
            errors[d.user] = AlterResult(d.user, ErrorCode.duplicate_resource, _TWICE)
            continue
        error = _name_and_mechanism_error(d.user, d.mechanism)
        if error is None and (d.user, d.mechanism) not in existing:
            error = AlterResult(
                d.user,
                ErrorCode.resource_not_found,
                "Attempt to delete a user credential that does not exist",
            )
        if error is not None:
            errors[d.user] = error
        else:
            to_delete[d.user] = d
    for u in upsertions:
        if u.user in errors:
            continue
        if to_delete.pop(u.user, None) is not None or to_upsert.pop(u.user, None) is not None:
            errors[u.user] = AlterResult(u.user, ErrorCode.duplicate_resource, _TWICE)
            continue
        error = _upsertion_error(u)
        if error is not None:
            errors[u.user] = error
        else:
            to_upsert[u.user] = u
    new = dict(existing)
    results: list[AlterResult] = []
    for d in to_delete.values():
        del new[(d.user, d.mechanism)]
        results.append(AlterResult(d.user, ErrorCode.none, None))
    for u in to_upsert.values():
        if not u.salted_password:
            # Kafka's HMAC refuses an empty key (IllegalArgumentException in the controller).
            errors[u.user] = AlterResult(
                u.user, ErrorCode.unknown_server_error, _UNKNOWN_SERVER_ERROR
            )
            continue
        new[(u.user, u.mechanism)] = derive_credential(
            u.salt, u.salted_password, u.iterations, u.mechanism
        )
        results.append(AlterResult(u.user, ErrorCode.none, None))
    results.extend(errors.values())
    return new, results


def describe_credentials(
    existing: Credentials, users: Sequence[str] | None
) -> list[tuple[str, ErrorCode, str | None, list[tuple[int, int]]]]:
    """DescribeUserScramCredentials (Kafka's ScramImage.describe): per user its (mechanism,
    iterations); no users (None or empty): every user that has a credential. A user named
    twice is DUPLICATE_RESOURCE, one without credentials RESOURCE_NOT_FOUND."""
    if not users:
        names = sorted({user for user, _ in existing})
        counts = dict.fromkeys(names, 1)
    else:
        counts = {}
        for name in users:
            counts[name] = counts.get(name, 0) + 1
    out: list[tuple[str, ErrorCode, str | None, list[tuple[int, int]]]] = []
    for name, count in counts.items():
        if count > 1:
            message = f"{_DESCRIBE_TWICE}{name}"
            out.append((name, ErrorCode.duplicate_resource, message, []))
            continue
        infos = [
            (mech, existing[(name, mech)].iterations)
            for mech in MECHANISMS
            if (name, mech) in existing
        ]
        if infos:
            out.append((name, ErrorCode.none, None, infos))
        else:
            message = f"Attempt to describe a user credential that does not exist: {name}"
            out.append((name, ErrorCode.resource_not_found, message, []))
    return out
