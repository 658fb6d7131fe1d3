"""The SCRAM server (kafka_wire/sasl/scram.py): the RFC 7677 exchange byte for byte, whole
exchanges for both mechanisms against a client written here from RFC 5802's formulas, and
every way an exchange fails."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable

import pytest

from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.scram import (
    ScramCredential,
    ScramServer,
    _fake_credential,
    salted_password,
    server_key,
    stored_key,
)

SECRET = b"s" * 32
DIGESTS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
GENERIC = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism "
)

# RFC 7677, section 3.
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = "W22ZaJ0SNY7soEsUEjb6gQ=="
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


class Client:
    """A SCRAM client from RFC 5802's formulas (section 3), with hashlib and hmac only."""

    def __init__(
        self,
        mechanism: str,
        name: str,
        password: str,
        nonce: str = "fyko+d2lbbFgONRv9qkxdawL",
        gs2_header: str = "n,,",
        extensions: str = "",
    ) -> None:
        self.digest = DIGESTS[mechanism]
        self.password = password.encode()
        self.nonce = nonce
        self.gs2_header = gs2_header
        self.bare = f"n={name},r={nonce}{extensions}"
        self.server_signature = b""

    def first(self) -> bytes:
        return (self.gs2_header + self.bare).encode()

    def final(
        self,
        server_first: bytes,
        *,
        nonce: str | None = None,
        binding: str | None = None,
        extensions: str = "",
    ) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce)
        salt, iterations = base64.b64decode(attrs["s"]), int(attrs["i"])
        salted = hashlib.pbkdf2_hmac(self.digest, self.password, salt, iterations)
        if binding is None:
            binding = base64.b64encode(self.gs2_header.encode()).decode()
        without_proof = f"c={binding},r={attrs['r'] if nonce is None else nonce}{extensions}"
        auth = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        key = hmac.new(salted, b"Client Key", self.digest).digest()
        signature = hmac.new(hashlib.new(self.digest, key).digest(), auth, self.digest).digest()
        proof = bytes(a ^ b for a, b in zip(key, signature, strict=True))
        server = hmac.new(salted, b"Server Key", self.digest).digest()
        self.server_signature = hmac.new(server, auth, self.digest).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def nobody(user: str) -> ScramCredential | None:
    return None


def credential(
    mechanism: str, password: str, salt: bytes = b"salty", i: int = 4096
) -> ScramCredential:
    digest = DIGESTS[mechanism]
    salted = salted_password(password.encode(), salt, i, digest)
    return ScramCredential(salt, stored_key(salted, digest), server_key(salted, digest), i)


def server(mechanism: str = "SCRAM-SHA-256", users: dict[str, str] | None = None) -> ScramServer:
    if users is None:
        users = {"alice": "alice-secret"}
    creds = {name: credential(mechanism, pw) for name, pw in users.items()}
    return ScramServer(mechanism, creds.get, fake_secret=SECRET)


def failure(step: Callable[[bytes], bytes], message: bytes) -> SaslAuthenticationFailed:
    with pytest.raises(SaslAuthenticationFailed) as info:
        step(message)
    return info.value


def test_rfc7677_exchange_byte_for_byte() -> None:
    salt = base64.b64decode(RFC_SALT)
    s = ScramServer(
        "SCRAM-SHA-256",
        {"user": credential("SCRAM-SHA-256", "pencil", salt)}.get,
        fake_secret=SECRET,
        nonce=lambda: RFC_SERVER_NONCE,
    )
    client = Client("SCRAM-SHA-256", "user", "pencil", RFC_CLIENT_NONCE)
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert s.first(client.first()) == RFC_SERVER_FIRST
    assert not s.complete and s.user is None
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL  # the test's client is right
    assert s.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert s.complete and s.user == "user"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize(
    ("user", "sasl_name", "gs2_header"),
    [
        ("alice", "alice", "n,,"),
        ("alice", "alice", "y,,"),
        ("alice", "alice", "n,a=alice,"),
        ("a,b=c", "a=2Cb=3Dc", "n,a=a=2Cb=3Dc,"),
        ("Jörg", "Jörg", "n,,"),
    ],
)
def test_whole_exchange(mechanism: str, user: str, sasl_name: str, gs2_header: str) -> None:
    s = server(mechanism, {user: "pw-" + user})
    client = Client(mechanism, sasl_name, "pw-" + user, gs2_header=gs2_header)
    server_first = s.first(client.first())
    assert server_first.startswith(f"r={client.nonce}".encode())
    assert server_first.endswith(b",s=c2FsdHk=,i=4096")
    server_final = s.final(client.final(server_first))
    assert server_final == b"v=" + base64.b64encode(client.server_signature)
    assert len(client.server_signature) == hashlib.new(DIGESTS[mechanism]).digest_size
    assert s.complete and s.user == user


def test_other_extensions_are_ignored_and_signed() -> None:
    s = server()
    client = Client("SCRAM-SHA-256", "alice", "alice-secret", extensions=",foo=bar,tokenauth=false")
    server_first = s.first(client.first())
    assert s.final(client.final(server_first, extensions=",x=y")) == b"v=" + base64.b64encode(
        client.server_signature
    )
    assert s.user == "alice"


def test_server_nonces_are_fresh_and_kafka_shaped() -> None:
    nonces = set()
    for _ in range(20):
        first = server().first(Client("SCRAM-SHA-256", "alice", "x", nonce="abc").first())
        nonce = first.split(b",")[0][len(b"r=abc") :]
        assert 20 <= len(nonce) <= 26 and nonce.isalnum() and nonce.lower() == nonce
        nonces.add(nonce)
    assert len(nonces) == 20


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_fails_at_the_proof_and_logs_no_secret(mechanism: str) -> None:
    s = server(mechanism)
    client = Client(mechanism, "alice", "not-the-password")
    final = client.final(s.first(client.first()))
    exc = failure(s.final, final)
    assert exc.reason == "wrong password (the client proof does not match)"
    assert exc.user == "alice" and exc.mechanism == mechanism
    assert str(exc) == f"{mechanism} authentication of user 'alice' failed: {exc.reason}"
    assert exc.client_message == GENERIC + mechanism
    assert exc.error_code is ErrorCode.sasl_authentication_failed
    proof = final.rsplit(b"p=", 1)[1].decode()
    for secret in ("not-the-password", "alice-secret", proof):
        assert secret not in str(exc) and secret not in exc.client_message
    assert not s.complete and s.user is None


def test_unknown_user_looks_like_a_wrong_password_to_the_client() -> None:
    s = server()
    client = Client("SCRAM-SHA-256", "mallory", "guess")
    server_first = s.first(client.first())
    attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
    assert attrs["i"] == "4096"
    salt = base64.b64decode(attrs["s"])
    assert 20 <= len(salt) <= 26 and salt.isalnum()  # like the salts Kafka's tools make
    # The same fake every time for this server's secret: asking again tells nothing.
    again = server().first(Client("SCRAM-SHA-256", "mallory", "guess").first())
    assert again.split(b",")[1] == server_first.split(b",")[1]
    other = ScramServer("SCRAM-SHA-256", nobody, fake_secret=b"another secret")
    assert other.first(client.first()).split(b",")[1] != server_first.split(b",")[1]
    exc = failure(s.final, client.final(server_first))
    assert exc.reason == "unknown user" and exc.user == "mallory"
    wrong = Client("SCRAM-SHA-256", "alice", "guess")
    s2 = server()
    wrong_exc = failure(s2.final, wrong.final(s2.first(wrong.first())))
    assert (exc.client_message, exc.error_code) == (wrong_exc.client_message, wrong_exc.error_code)


def test_unknown_user_fails_even_with_the_fake_keys() -> None:
    """A proof made from the fake credential's own StoredKey still fails: the user is unknown."""
    s = ScramServer("SCRAM-SHA-256", nobody, fake_secret=SECRET, nonce=lambda: "srv")
    server_first = s.first(b"n,,n=mallory,r=cli")
    without_proof = b"c=biws,r=clisrv"
    # Recover the fake StoredKey as only the server could, and forge a matching proof.
    fake = _fake_credential(SECRET, "SCRAM-SHA-256", "mallory")
    assert server_first == b"r=clisrv,s=" + base64.b64encode(fake.salt) + b",i=4096"
    auth = b"n=mallory,r=cli," + server_first + b"," + without_proof
    signature = hmac.digest(fake.stored_key, auth, "sha256")
    exc = failure(s.final, without_proof + b",p=" + base64.b64encode(signature))
    assert exc.reason == "unknown user"


@pytest.mark.parametrize(
    "nonce",
    [
        "fyko+d2lbbFgONRv9qkxdawL",  # the client's part only
        "fyko+d2lbbFgONRv9qkxdawLx",  # starts with it, is not the server's
        "other",
    ],
)
def test_a_nonce_other_than_the_exchanges_is_refused(nonce: str) -> None:
    s = server()
    client = Client("SCRAM-SHA-256", "alice", "alice-secret")
    server_first = s.first(client.first())
    exc = failure(s.final, client.final(server_first, nonce=nonce))
    assert exc.reason == "the nonce is not the one of this exchange"


def test_a_nonce_that_ends_with_the_exchanges_is_taken_as_kafka_takes_it() -> None:
    """librdkafka 2.0.2 (Debian's kcat) sends its nonce again before the whole one; Kafka's
    ScramSaslServer checks endsWith, so the proof decides."""
    s = server()
    client = Client("SCRAM-SHA-256", "alice", "alice-secret")
    server_first = s.first(client.first())
    full = dict(a.split("=", 1) for a in server_first.decode().split(","))["r"]
    final = client.final(server_first, nonce=client.nonce + full)
    assert s.final(final) == b"v=" + base64.b64encode(client.server_signature)
    assert s.user == "alice"


@pytest.mark.parametrize(
    ("gs2_header", "binding"),
    [
        ("n,,", base64.b64encode(b"y,,").decode()),
        ("y,,", "biws"),  # base64 of "n,,"
        ("n,a=alice,", "biws"),
        ("n,,", ""),
    ],
)
def test_channel_binding_must_be_the_gs2_header(gs2_header: str, binding: str) -> None:
    s = server()
    client = Client("SCRAM-SHA-256", "alice", "alice-secret", gs2_header=gs2_header)
    exc = failure(s.final, client.final(s.first(client.first()), binding=binding))
    assert exc.reason == "the channel binding (c=) is not the gs2 header"


@pytest.mark.parametrize(
    ("final", "reason"),
    [
        (b"c=b!ws,r={nonce},p=AAAA", "malformed base64 in the client-final-message"),
        (b"c=biws,r={nonce},p=AAA", "malformed base64 in the client-final-message"),
        (b"c=biws,r={nonce},p=AAAA", "the client proof has the wrong length"),
        (b"c=biws,r={nonce}", "malformed client-final-message"),
        (b"r={nonce},c=biws,p=AAAA", "malformed client-final-message"),
        (b"c=biws,x={nonce},p=AAAA", "malformed client-final-message"),
        (b"c=biws,r={nonce},1=2,p=AAAA", "malformed extension in the client-final-message"),
        (b"c=biws,r={nonce},p=\xff", "client-final-message is not UTF-8"),
        (b"", "malformed client-final-message"),
    ],
)
def test_malformed_client_final_messages(final: bytes, reason: str) -> None:
    s = ScramServer("SCRAM-SHA-256", nobody, fake_secret=SECRET, nonce=lambda: "srv")
    s.first(b"n,,n=alice,r=cli")
    exc = failure(s.final, final.replace(b"{nonce}", b"clisrv"))
    assert exc.reason == reason and exc.user == "alice"


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (b"p=tls-unique,,n=alice,r=abc", "channel binding (gs2 header p=) is not supported"),
        (b"p=tls-exporter,a=alice,n=alice,r=a", "channel binding (gs2 header p=) is not supported"),
        (b"x,,n=alice,r=abc", "malformed gs2 header"),
        (b"N,,n=alice,r=abc", "malformed gs2 header"),
        (b"n,alice,n=alice,r=abc", "malformed gs2 header"),
        (b"n,,m=ext,n=alice,r=abc", "mandatory extension (m=) is not supported"),
        (b"n,,n=alice,r=abc,tokenauth=true", "delegation tokens (tokenauth) are not supported"),
        (b"n,,n=alice,r=abc,tokenauth=TRUE", "delegation tokens (tokenauth) are not supported"),
        (b"n,,n=al=2Cice,r=abc,a=b,a=c", "malformed extension in the client-first-message"),
        (b"n,,n=alice,r=abc,novalue", "malformed extension in the client-first-message"),
        (b"n,,n=alice,r=abc,=x", "malformed extension in the client-first-message"),
        (b"n,,n=a=2Db,r=abc", "malformed user name"),
        (b"n,,n=a=2c,r=abc", "malformed user name"),  # the escapes are upper case
        (b"n,,n=alice=,r=abc", "malformed user name"),
        (b"n,,n=a=3,r=abc", "malformed user name"),
        (b"n,,n=,r=abc", "malformed user name"),
        (b"n,,n=al\x00ice,r=abc", "malformed user name"),
        (b"n,a=a=41,n=alice,r=abc", "malformed authorization id"),
        (b"n,a=,n=alice,r=abc", "malformed authorization id"),
        (b"n,,n=alice,r=", "malformed client nonce"),
        (b"n,,n=alice,r=a b", "malformed client nonce"),
        (b"n,,n=alice,r=\xc3\xa9", "malformed client nonce"),
        (b"n,,r=abc,n=alice", "malformed client-first-message"),
        (b"n,,n=alice", "malformed client-first-message"),
        (b"n,,", "malformed client-first-message"),
        (b"n,", "malformed client-first-message"),
        (b"", "malformed client-first-message"),
        (b"garbage", "malformed client-first-message"),
        (b"\x00alice\x00alice-secret", "malformed client-first-message"),  # a PLAIN message
        (b"n,,n=al\xffice,r=abc", "client-first-message is not UTF-8"),
        (b"\xff\xfe", "client-first-message is not UTF-8"),
    ],
)
def test_malformed_or_refused_client_first_messages(first: bytes, reason: str) -> None:
    looked_up: list[str] = []

    def lookup(user: str) -> ScramCredential | None:
        looked_up.append(user)
        return None

    s = ScramServer("SCRAM-SHA-256", lookup, fake_secret=SECRET)
    exc = failure(s.first, first)
    assert exc.reason == reason
    assert exc.client_message == GENERIC + "SCRAM-SHA-256"
    assert b"alice-secret" not in str(exc).encode()
    assert looked_up == []  # refused before any credential is read
    assert failure(s.first, b"n,,n=alice,r=abc").error_code is ErrorCode.illegal_sasl_state


def test_authorization_id_other_than_the_user_is_refused_as_kafka_says() -> None:
    exc = failure(server().first, b"n,a=bob,n=alice,r=abc")
    assert exc.reason == "authorization id 'bob' is not the user name"
    assert exc.user == "alice"
    assert exc.client_message == (
        "Authentication failed: Client requested an authorization id that is different from "
        "username"
    )


def test_a_stored_credential_below_4096_iterations_is_refused() -> None:
    weak = credential("SCRAM-SHA-256", "pw", i=4095)
    s = ScramServer("SCRAM-SHA-256", {"alice": weak}.get, fake_secret=SECRET)
    exc = failure(s.first, b"n,,n=alice,r=abc")
    assert exc.reason == "the stored credential has 4095 iterations, fewer than the minimum 4096"


def test_messages_out_of_order_are_illegal_sasl_state() -> None:
    s = server()
    exc = failure(s.final, b"c=biws,r=abc,p=AAAA")
    assert exc.error_code is ErrorCode.illegal_sasl_state
    assert exc.reason == "message out of order: the exchange is awaiting client-first-message"
    assert failure(s.first, b"n,,n=alice,r=abc").reason.endswith("the exchange is failed")

    s = server()
    client = Client("SCRAM-SHA-256", "alice", "alice-secret")
    server_first = s.first(client.first())
    exc = failure(s.first, client.first())
    assert exc.error_code is ErrorCode.illegal_sasl_state and exc.user == "alice"
    assert exc.reason.endswith("awaiting client-final-message")
    # The exchange is over: even the right final message is refused now.
    exc = failure(s.final, client.final(server_first))
    assert exc.reason.endswith("the exchange is failed") and s.user is None

    # As Kafka: a message after completion is refused, and fails the exchange.
    for step in ("first", "final"):
        s = server()
        s.final(client.final(s.first(client.first())))
        assert s.complete and s.user == "alice"
        exc = failure(getattr(s, step), b"n,,n=alice,r=abc")
        assert exc.error_code is ErrorCode.illegal_sasl_state
        assert exc.reason.endswith("the exchange is complete")
        assert not s.complete and s.user is None


def test_a_failed_exchange_stays_failed() -> None:
    s = server()
    failure(s.first, b"garbage")
    client = Client("SCRAM-SHA-256", "alice", "alice-secret")
    assert failure(s.first, client.first()).error_code is ErrorCode.illegal_sasl_state
    assert not s.complete and s.user is None


def test_construction_refuses_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="not a SCRAM mechanism"):
        ScramServer("SCRAM-SHA-1", nobody, fake_secret=SECRET)
    with pytest.raises(ValueError, match="fake_secret"):
        ScramServer("SCRAM-SHA-256", nobody, fake_secret=b"")
    s = ScramServer("SCRAM-SHA-256", nobody, fake_secret=SECRET, nonce=lambda: "a,b")
    with pytest.raises(ValueError, match="server nonce"):
        s.first(b"n,,n=alice,r=abc")
