"""SASL PLAIN (kafka_wire/sasl/plain.py): the credentials file's golden bytes
(docs/formats.md, "PLAIN credentials file"), its strict loader, and the PLAIN step."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest

from kafka_wire.errors import ErrorCode
from kafka_wire.sasl import plain
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.plain import (
    CredentialsFileError,
    PlainCredential,
    PlainServer,
    dump_credentials,
    load_credentials,
    make_credential,
)

GOLDEN = (
    b"{\n"
    b'  "format": 1,\n'
    b'  "users": {\n'
    b'    "alice": {\n'
    b'      "digest": "sha512",\n'
    b'      "iterations": 4096,\n'
    b'      "salt": "AAECAwQFBgcICQoLDA0ODw==",\n'
    b'      "stored_key": "qEd00mCR6v0ATnzoFvpOcTsvkx1nS456dRfz9G8wKT4VNInO6UsK5JsPRImf05RuAt51G'
    b'l4fjOTypF5vwLz8pw=="\n'
    b"    },\n"
    b'    "bob": {\n'
    b'      "digest": "sha256",\n'
    b'      "iterations": 4096,\n'
    b'      "salt": "EBESExQVFhcYGRobHB0eHw==",\n'
    b'      "stored_key": "A5MiNEzDRRRvvLw28sWjrVuuOyC57flgax8Oa+sZpRs="\n'
    b"    }\n"
    b"  }\n"
    b"}\n"
)
INVALID = "Authentication failed: Invalid username or password"


def golden_users() -> dict[str, PlainCredential]:
    return {
        "alice": make_credential("alice-secret", salt=bytes(range(16))),
        "bob": make_credential("bob-secret", digest="sha256", salt=bytes(range(16, 32))),
    }


def test_golden_file_bytes_match_the_docs_and_rfc5802() -> None:
    assert dump_credentials(golden_users()) == GOLDEN
    docs = (Path(__file__).parent.parent / "docs" / "formats.md").read_text()
    section = docs[docs.index("## PLAIN credentials file") :]
    block = section[section.index("```json\n") + len("```json\n") :]
    assert block[: block.index("```")].encode() == GOLDEN
    # StoredKey = H(HMAC(Hi(password, salt, i), "Client Key")), from hashlib alone.
    salted = hashlib.pbkdf2_hmac("sha512", b"alice-secret", bytes(range(16)), 4096)
    key = hashlib.sha512(hmac.new(salted, b"Client Key", "sha512").digest()).digest()
    assert load_credentials(GOLDEN).users["alice"].stored_key == key


def test_golden_file_loads_back_and_authenticates() -> None:
    creds = load_credentials(GOLDEN)
    assert creds.users == golden_users()
    assert load_credentials(GOLDEN.decode()) == creds
    assert creds.get("carol") is None
    server = PlainServer(creds.get)
    assert server.authenticate(b"\0alice\0alice-secret") == "alice"
    assert server.authenticate(b"bob\0bob\0bob-secret") == "bob"
    assert server.authenticate(b"\0alice\0alice-secret") == "alice"  # no state between calls


def test_make_credential_draws_a_fresh_salt_and_refuses_bad_parameters() -> None:
    a, b = make_credential("pw"), make_credential("pw")
    assert len(a.salt) == 32 and a.salt != b.salt and a.stored_key != b.stored_key
    assert a.matches(b"pw") and not a.matches(b"pw2")
    assert make_credential("pw", iterations=16384).iterations == 16384
    for kwargs in (
        {"digest": "sha1"},
        {"iterations": 4095},
        {"iterations": 16385},
        {"salt": b""},
    ):
        with pytest.raises(ValueError):
            make_credential("pw", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        make_credential("")


@pytest.fixture
def hashing(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(digest, iterations) of every Hi() the PLAIN check computes."""
    calls: list[tuple[str, int]] = []
    real = plain.salted_password

    def counted(password: bytes, salt: bytes, iterations: int, digest: str) -> bytes:
        calls.append((digest, iterations))
        return real(password, salt, iterations, digest)

    monkeypatch.setattr(plain, "salted_password", counted)
    return calls


def test_unknown_user_and_wrong_password_fail_alike(hashing: list[tuple[str, int]]) -> None:
    server = PlainServer(load_credentials(GOLDEN).get)
    with pytest.raises(SaslAuthenticationFailed) as wrong:
        server.authenticate(b"\0alice\0alice-guess")
    assert hashing == [("sha512", 4096)]
    with pytest.raises(SaslAuthenticationFailed) as unknown:
        server.authenticate(b"\0mallory\0alice-secret")
    assert hashing == [("sha512", 4096)] * 2  # the same work as alice's entry
    assert (wrong.value.reason, unknown.value.reason) == ("wrong password", "unknown user")
    for exc, user in ((wrong.value, "alice"), (unknown.value, "mallory")):
        assert exc.client_message == INVALID
        assert exc.error_code is ErrorCode.sasl_authentication_failed
        assert exc.mechanism == "PLAIN" and exc.user == user
        assert str(exc) == f"PLAIN authentication of user {user!r} failed: {exc.reason}"
        assert "alice-guess" not in str(exc) and "alice-secret" not in str(exc)


@pytest.mark.parametrize(
    ("message", "reason", "user"),
    [
        (b"", "malformed message: 0 NULs, not 2", None),
        (b"alice", "malformed message: 0 NULs, not 2", None),
        (b"\0alice-secret", "malformed message: 1 NULs, not 2", None),
        (b"\0alice\0alice-secret\0", "malformed message: 3 NULs, not 2", None),
        (b"alice\0alice\0alice\0alice-secret", "malformed message: 3 NULs, not 2", None),
        (b"\0\0alice-secret", "no user name", None),
        (b"alice\0\0alice-secret", "no user name", None),
        (b"\0alice\0", "no password", "alice"),
        (b"\0al\xffice\0alice-secret", "the message is not UTF-8", None),
        (b"\0alice\0alice-secret\xff", "the message is not UTF-8", None),
        (b"\xc3\0alice\0alice-secret", "the message is not UTF-8", None),
    ],
)
def test_malformed_messages_are_refused_before_any_hashing(
    hashing: list[tuple[str, int]], message: bytes, reason: str, user: str | None
) -> None:
    with pytest.raises(SaslAuthenticationFailed) as info:
        PlainServer(load_credentials(GOLDEN).get).authenticate(message)
    assert (info.value.reason, info.value.user) == (reason, user)
    assert info.value.client_message.startswith("Authentication failed during authentication")
    assert "alice-secret" not in str(info.value)
    assert hashing == []


def test_an_authorization_id_other_than_the_user_is_refused(
    hashing: list[tuple[str, int]],
) -> None:
    with pytest.raises(SaslAuthenticationFailed) as info:
        PlainServer(load_credentials(GOLDEN).get).authenticate(b"bob\0alice\0alice-secret")
    assert info.value.reason == "authorization id 'bob' is not the user name"
    assert info.value.client_message == (
        "Authentication failed: Client requested an authorization id that is different from "
        "username"
    )
    assert hashing == []


def _entry(**changes: object) -> bytes:
    entry: dict[str, object] = {
        "digest": '"sha256"',
        "iterations": "4096",
        "salt": '"c2FsdA=="',
        "stored_key": '"' + base64.b64encode(b"k" * 32).decode() + '"',
    }
    entry.update(changes)
    body = ",".join(f'"{k}":{v}' for k, v in entry.items() if v is not None)
    return b'{"format":1,"users":{"alice":{' + body.encode() + b"}}}"


def test_the_entry_helper_makes_a_valid_file() -> None:
    assert load_credentials(_entry()).users["alice"].iterations == 4096


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"{", "the file is not JSON"),
        (b'{"format":1,"users":{"\xe9":{}}}', "the file is not UTF-8"),
        (b"[]", "the file: expected an object"),
        (b'{"format":2,"users":{}}', "format: expected 1"),
        (b'{"format":"1","users":{}}', "format: expected 1"),
        (b'{"format":true,"users":{}}', "format: expected 1"),
        (b'{"format":1.0,"users":{}}', "format: expected 1"),
        (b'{"format":1}', "the file: expected exactly the keys format, users"),
        (b'{"format":1,"users":{},"x":1}', "the file: expected exactly the keys format, users"),
        (b'{"format":1,"users":[]}', "users: expected an object"),
        (b'{"format":1,"users":{"":{}}}', "users['']: a user name is non-empty and has no NUL"),
        (b'{"format":1,"users":{"a\\u0000":{}}}', "a user name is non-empty and has no NUL"),
        (b'{"format":1,"users":{"a":{},"a":{}}}', "key 'a' appears twice"),
        (b'{"format":1,"users":{"alice":[]}}', "users['alice']: expected an object"),
        (_entry(salt=None), "users['alice']: expected exactly the keys digest, iterations"),
        (_entry(extra="1"), "users['alice']: expected exactly the keys digest, iterations"),
        (_entry(digest='"md5"'), "users['alice'].digest: expected one of"),
        (_entry(digest='"SHA256"'), "users['alice'].digest: expected one of"),
        (_entry(iterations='"4096"'), "users['alice'].iterations: expected an integer"),
        (_entry(iterations="true"), "users['alice'].iterations: expected an integer"),
        (_entry(iterations="4096.0"), "users['alice'].iterations: expected an integer"),
        (_entry(iterations="4095"), "users['alice'].iterations: expected an integer in 4096"),
        (_entry(iterations="16385"), "users['alice'].iterations: expected an integer in 4096"),
        (_entry(salt='""'), "users['alice'].salt: expected non-empty base64"),
        (_entry(salt='"c2Fsd"'), "users['alice'].salt: expected non-empty base64"),
        (_entry(salt='"c2F!dA=="'), "users['alice'].salt: expected non-empty base64"),
        (_entry(salt="1"), "users['alice'].salt: expected non-empty base64"),
        (_entry(stored_key='"a2s="'), "users['alice'].stored_key: expected 32 bytes for sha256"),
        (_entry(digest='"sha512"'), "users['alice'].stored_key: expected 64 bytes for sha512"),
    ],
)
def test_bad_files_are_refused_naming_the_field(data: bytes, error: str) -> None:
    with pytest.raises(CredentialsFileError) as info:
        load_credentials(data)
    assert error in str(info.value)
