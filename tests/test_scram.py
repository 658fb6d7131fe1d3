"""SCRAM derivation (RFC 5802 / RFC 7677 test vectors, kafka_wire/sasl/scram.py) and
AlterUserScramCredentials' and DescribeUserScramCredentials' rules as Kafka 4.x applies them
(main_broker/security/scram.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac

from kio.schema.errors import ErrorCode

from kafka_wire.sasl.scram import client_key, salted_password, server_key, stored_key
from main_broker.security.scram import (
    AlterResult,
    Deletion,
    ScramCredential,
    Upsertion,
    alter_credentials,
    derive_credential,
    describe_credentials,
)

SHA256, SHA512 = 1, 2


def _exchange(
    digest: str, salt_b64: str, client_first: str, server_first: str, final_no_proof: str
) -> tuple[str, str]:
    """(client proof, server signature) of an exchange for user/pencil, base64."""
    salted = salted_password(b"pencil", base64.b64decode(salt_b64), 4096, digest)
    auth = f"{client_first},{server_first},{final_no_proof}".encode()
    signature = hmac.digest(stored_key(salted, digest), auth, digest)
    proof = bytes(a ^ b for a, b in zip(client_key(salted, digest), signature, strict=True))
    server_sig = hmac.digest(server_key(salted, digest), auth, digest)
    return base64.b64encode(proof).decode(), base64.b64encode(server_sig).decode()


def test_rfc7677_scram_sha_256_vector() -> None:
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    proof, signature = _exchange(
        "sha256",
        "W22ZaJ0SNY7soEsUEjb6gQ==",
        "n=user,r=rOprNGfwEbeRWgbNEkqO",
        f"r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
        f"c=biws,r={nonce}",
    )
    assert proof == "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    assert signature == "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc5802_scram_sha_1_vector() -> None:
    nonce = "fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j"
    proof, signature = _exchange(
        "sha1",
        "QSXCR+Q6sek8bf92",
        "n=user,r=fyko+d2lbbFgONRv9qkxdawL",
        f"r={nonce},s=QSXCR+Q6sek8bf92,i=4096",
        f"c=biws,r={nonce}",
    )
    assert proof == "v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
    assert signature == "rmF9pqV8S7suAoZWja4dJRkFsKQ="
    salted = salted_password(b"pencil", base64.b64decode("QSXCR+Q6sek8bf92"), 4096, "sha1")
    assert salted.hex() == "1d96ee3a529b5a5f9e47c01f229a2cb8a6e15f7d"
    assert stored_key(salted, "sha1").hex() == "e9d94660c39d65c38fbad91c358f14da0eef2bd6"
    assert server_key(salted, "sha1").hex() == "0fe09258b3ac852ba502cc62ba903eaacdbf7d31"


def test_derived_credential_keeps_no_password_material() -> None:
    salted = salted_password(b"secret", b"salt", 4096, "sha512")
    cred = derive_credential(b"salt", salted, 4096, SHA512)
    assert cred.stored_key == hashlib.sha512(hmac.digest(salted, b"Client Key", "sha512")).digest()
    assert cred.server_key == hmac.digest(salted, b"Server Key", "sha512")
    assert len(cred.stored_key) == len(cred.server_key) == 64
    assert salted not in (cred.stored_key, cred.server_key, cred.salt)


def up(user: str, mech: int = SHA256, iterations: int = 4096, sp: bytes = b"k" * 32) -> Upsertion:
    return Upsertion(user, mech, iterations, b"salt-" + user.encode(), sp)


def test_upsert_then_delete() -> None:
    creds, results = alter_credentials({}, [], [up("alice"), up("bob", SHA512, 8192)])
    assert results == [
        AlterResult("alice", ErrorCode.none, None),
        AlterResult("bob", ErrorCode.none, None),
    ]
    assert creds[("alice", SHA256)] == derive_credential(b"salt-alice", b"k" * 32, 4096, SHA256)
    assert creds[("bob", SHA512)].iterations == 8192
    creds2, results = alter_credentials(creds, [Deletion("alice", SHA256)], [])
    assert results == [AlterResult("alice", ErrorCode.none, None)]
    assert set(creds2) == {("bob", SHA512)}
    assert set(creds) == {("alice", SHA256), ("bob", SHA512)}  # the input is not changed


def test_iteration_bounds() -> None:
    _, results = alter_credentials(
        {}, [], [up("a", iterations=4095), up("b", iterations=16385), up("c", iterations=16384)]
    )
    assert [(r.user, r.error_code, r.error_message) for r in results] == [
        ("c", ErrorCode.none, None),
        ("a", ErrorCode.unacceptable_credential, "Too few iterations"),
        ("b", ErrorCode.unacceptable_credential, "Too many iterations"),
    ]


def test_unknown_mechanism_and_empty_name() -> None:
    creds, results = alter_credentials({}, [Deletion("x", 3)], [up("y", mech=0), up("")])
    assert creds == {}
    assert [(r.user, r.error_code) for r in results] == [
        ("x", ErrorCode.unsupported_sasl_mechanism),
        ("y", ErrorCode.unsupported_sasl_mechanism),
        ("", ErrorCode.unacceptable_credential),
    ]
    assert results[2].error_message == "Username must not be empty"


def test_deleting_a_missing_credential_is_resource_not_found() -> None:
    existing = {("alice", SHA512): ScramCredential(b"s", b"k", b"v", 4096)}
    creds, results = alter_credentials(existing, [Deletion("alice", SHA256)], [])
    assert creds == existing
    assert results == [
        AlterResult(
            "alice",
            ErrorCode.resource_not_found,
            "Attempt to delete a user credential that does not exist",
        )
    ]


def test_a_user_twice_in_one_request_is_duplicate_resource_and_changes_nothing() -> None:
    existing = {("carol", SHA256): ScramCredential(b"s", b"k", b"v", 4096)}
    creds, results = alter_credentials(
        existing,
        [Deletion("carol", SHA256)],
        [up("alice"), up("alice", SHA512), up("carol"), up("dave")],
    )
    by_user = {r.user: r for r in results}
    twice = "A user credential cannot be altered twice in the same request"
    assert by_user["alice"] == AlterResult("alice", ErrorCode.duplicate_resource, twice)
    assert by_user["carol"] == AlterResult("carol", ErrorCode.duplicate_resource, twice)
    assert by_user["dave"].error_code == ErrorCode.none
    assert set(creds) == {("carol", SHA256), ("dave", SHA256)}
    assert creds[("carol", SHA256)] == existing[("carol", SHA256)]
    assert len(results) == 3


def test_empty_salted_password_fails_like_kafkas_hmac() -> None:
    creds, results = alter_credentials({}, [], [up("e", sp=b"")])
    assert creds == {}
    assert results[0].error_code == ErrorCode.unknown_server_error


def test_describe() -> None:
    existing = {
        ("alice", SHA256): ScramCredential(b"s", b"k", b"v", 4096),
        ("alice", SHA512): ScramCredential(b"s", b"k", b"v", 8192),
        ("bob", SHA512): ScramCredential(b"s", b"k", b"v", 10000),
    }
    assert describe_credentials(existing, None) == [
        ("alice", ErrorCode.none, None, [(SHA256, 4096), (SHA512, 8192)]),
        ("bob", ErrorCode.none, None, [(SHA512, 10000)]),
    ]
    assert describe_credentials(existing, []) == describe_credentials(existing, None)
    got = describe_credentials(existing, ["bob", "zed", "alice", "alice"])
    assert got == [
        ("bob", ErrorCode.none, None, [(SHA512, 10000)]),
        (
            "zed",
            ErrorCode.resource_not_found,
            "Attempt to describe a user credential that does not exist: zed",
            [],
        ),
        (
            "alice",
            ErrorCode.duplicate_resource,
            "Cannot describe SCRAM credentials for the same user twice in a single request: alice",
            [],
        ),
    ]
