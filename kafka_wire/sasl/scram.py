"""SCRAM (RFC 5802, RFC 7677): the key derivation, and the server side of an exchange.

`ScramServer` is one exchange: `first(client-first-message)` returns the server-first-message,
`final(client-final-message)` the server-final-message, and `user` is then the authenticated
name. It keeps the rules of Kafka's ScramSaslServer: it holds only what Kafka stores per user
(`ScramCredential`: salt, StoredKey, ServerKey, iterations), refuses a credential with fewer
than 4096 iterations, a `tokenauth=true` extension (delegation tokens, KIP-48, not supported)
and an authorization id other than the user, compares the client's nonce exactly and the
proof in constant time, and any failure ends the exchange: a later message is out of order.

Where Kafka is looser than the RFC this follows the RFC: the gs2 header may be `y,,` as well
as `n,,` (`p=`, channel binding, is refused), a name may be any UTF-8 but for `,` and `=`
(written `=2C` and `=3D`), `m=` is refused, and the client-final-message's channel binding
must be the gs2 header. Where Kafka tells the client that a user does not exist (it fails
the first message), this goes on with a fake credential derived from the name and a secret
of the server's, so that an unknown user and a wrong password look the same to the client
up to the failed proof; only the reason in the exception (the broker's log) tells them apart.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.errors import SaslAuthenticationFailed

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "ScramCredential",
    "ScramServer",
    "client_key",
    "salted_password",
    "server_key",
    "stored_key",
]

# Wire type -> (mechanism name, hashlib name) (org.apache.kafka.clients.admin.ScramMechanism).
MECHANISMS: dict[int, tuple[str, str]] = {
    1: ("SCRAM-SHA-256", "sha256"),
    2: ("SCRAM-SHA-512", "sha512"),
}
MIN_ITERATIONS = 4096  # ScramMechanism.minIterations, both mechanisms
MAX_ITERATIONS = 16384  # ScramControlManager.MAX_ITERATIONS
_DIGESTS = dict(MECHANISMS.values())  # mechanism name -> hashlib name


def salted_password(password: bytes, salt: bytes, iterations: int, digest: str) -> bytes:
    """Hi(password, salt, i): what a client computes and sends in an upsertion."""
    return hashlib.pbkdf2_hmac(digest, password, salt, iterations)


def client_key(salted: bytes, digest: str) -> bytes:
    return hmac.digest(salted, b"Client Key", digest)


def stored_key(salted: bytes, digest: str) -> bytes:
    return hashlib.new(digest, client_key(salted, digest)).digest()


def server_key(salted: bytes, digest: str) -> bytes:
    return hmac.digest(salted, b"Server Key", digest)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _base36(bits: int) -> str:
    """Kafka's ScramFormatter.secureRandomString: `new BigInteger(130, random).toString(36)`,
    for the given 130 bits. Kafka makes server nonces and its tools' salts this way, so a
    fake salt looks like a real one."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while bits:
        bits, d = divmod(bits, 36)
        out = digits[d] + out
    return out or "0"


def _random_nonce() -> str:
    return _base36(secrets.randbits(130))


def _fake_credential(secret: bytes, mechanism: str, user: str) -> ScramCredential:
    """The same every time for the same user, so asking twice tells nothing either."""
    digest = _DIGESTS[mechanism]

    def derive(label: bytes) -> bytes:
        return hmac.digest(secret, b"\0".join((label, mechanism.encode(), user.encode())), digest)

    salt = _base36(int.from_bytes(derive(b"salt")[:17]) >> 6).encode()
    return ScramCredential(salt, derive(b"stored key"), derive(b"server key"), MIN_ITERATIONS)


_SASLNAME = re.compile(r"(?:[^=,\x00]|=2C|=3D)+")
_ESCAPE = re.compile(r"=2C|=3D")
_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # printable ASCII but ","
_EXTENSION = re.compile(r"([A-Za-z]+)=([^\x00]+)")  # Kafka's keys are words ("tokenauth")


def _malformed(what: str) -> str:
    return f"malformed {what}"


class _State(enum.Enum):
    FIRST = "awaiting client-first-message"
    FINAL = "awaiting client-final-message"
    COMPLETE = "complete"
    FAILED = "failed"


class ScramServer:
    """The server side of one SCRAM exchange, without I/O.

    `lookup(user)` gives the user's credential for this mechanism, or None. `fake_secret` is
    the broker's, the same for every exchange and across restarts (a fake salt that changed
    would give an unknown user away). `nonce()` makes the server's part of the nonce
    (printable ASCII without `,`); tests pass a fixed one.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], ScramCredential | None],
        *,
        fake_secret: bytes,
        nonce: Callable[[], str] | None = None,
    ) -> None:
        if mechanism not in _DIGESTS:
            raise ValueError(f"not a SCRAM mechanism: {mechanism!r}")
        if not fake_secret:
            raise ValueError("fake_secret must not be empty")
        self.mechanism = mechanism
        self.user: str | None = None  # the authenticated user, once complete
        self._digest = _DIGESTS[mechanism]
        self._lookup = lookup
        self._fake_secret = fake_secret
        self._nonce = nonce or _random_nonce
        self._state = _State.FIRST
        self._name: str | None = None  # the name the client gave, for the log
        self._known = False
        self._credential: ScramCredential | None = None
        self._gs2_header = b""
        self._full_nonce = ""
        self._auth_prefix = b""  # client-first-message-bare "," server-first-message ","

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    def first(self, client_first: bytes) -> bytes:
        """The server-first-message for a client-first-message."""
        return self._step(_State.FIRST, self._first, client_first)

    def final(self, client_final: bytes) -> bytes:
        """The server-final-message (`v=ServerSignature`) for a client-final-message whose
        proof holds; then `user` is set."""
        return self._step(_State.FINAL, self._final, client_final)

    def _step(self, expected: _State, step: Callable[[bytes], bytes], message: bytes) -> bytes:
        try:
            if self._state is not expected:
                raise SaslAuthenticationFailed(
                    self.mechanism,
                    f"message out of order: the exchange is {self._state.value}",
                    user=self._name,
                    client_message=f"Unexpected SASL message, exchange {self._state.value}",
                    error_code=ErrorCode.illegal_sasl_state,
                )
            return step(message)
        except SaslAuthenticationFailed:
            # As Kafka: any failure, even a message after completion, ends the exchange.
            self._state = _State.FAILED
            self._credential = None
            self.user = None
            raise

    def _fail(self, reason: str, client_message: str | None = None) -> SaslAuthenticationFailed:
        return SaslAuthenticationFailed(
            self.mechanism, reason, user=self._name, client_message=client_message
        )

    def _text(self, message: bytes, what: str) -> str:
        try:
            return message.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(f"{what} is not UTF-8") from None

    def _saslname(self, raw: str, what: str) -> str:
        if not _SASLNAME.fullmatch(raw):
            raise self._fail(_malformed(what))
        return _ESCAPE.sub(lambda m: "," if m.group() == "=2C" else "=", raw)

    def _extensions(self, attrs: list[str], what: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for attr in attrs:
            match = _EXTENSION.fullmatch(attr)
            if match is None or match[1] in out:
                raise self._fail(_malformed(f"extension in the {what}"))
            out[match[1]] = match[2]
        return out

    def _first(self, message: bytes) -> bytes:
        text = self._text(message, "client-first-message")
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise self._fail(_malformed("client-first-message"))
        flag, authz, bare = parts
        if flag.startswith("p="):
            raise self._fail("channel binding (gs2 header p=) is not supported")
        if flag not in ("n", "y"):
            raise self._fail(_malformed("gs2 header"))
        if authz and not authz.startswith("a="):
            raise self._fail(_malformed("gs2 header"))
        authzid = self._saslname(authz[2:], "authorization id") if authz else None
        attrs = bare.split(",")
        if attrs[0].startswith("m="):
            raise self._fail("mandatory extension (m=) is not supported")
        if len(attrs) < 2 or not attrs[0].startswith("n=") or not attrs[1].startswith("r="):
            raise self._fail(_malformed("client-first-message"))
        user = self._saslname(attrs[0][2:], "user name")
        self._name = user
        client_nonce = attrs[1][2:]
        if not _NONCE.fullmatch(client_nonce):
            raise self._fail(_malformed("client nonce"))
        extensions = self._extensions(attrs[2:], "client-first-message")
        if extensions.get("tokenauth", "").lower() == "true":
            raise self._fail("delegation tokens (tokenauth) are not supported")
        if authzid is not None and authzid != user:
            raise self._fail(
                f"authorization id {authzid!r} is not the user name",
                "Authentication failed: Client requested an authorization id that is "
                "different from username",
            )
        credential = self._lookup(user)
        self._known = credential is not None
        if credential is None:
            credential = _fake_credential(self._fake_secret, self.mechanism, user)
        elif credential.iterations < MIN_ITERATIONS:
            raise self._fail(
                f"the stored credential has {credential.iterations} iterations, fewer than "
                f"the minimum {MIN_ITERATIONS}"
            )
        server_nonce = self._nonce()
        if not _NONCE.fullmatch(server_nonce):
            raise ValueError("the server nonce must be printable ASCII without ','")
        self._credential = credential
        self._gs2_header = text[: len(flag) + len(authz) + 2].encode()
        self._full_nonce = client_nonce + server_nonce
        salt = base64.b64encode(credential.salt).decode()
        server_first = f"r={self._full_nonce},s={salt},i={credential.iterations}".encode()
        self._auth_prefix = bare.encode() + b"," + server_first + b","
        self._state = _State.FINAL
        return server_first

    def _final(self, message: bytes) -> bytes:
        credential = self._credential
        assert credential is not None  # set by _first, which put us in FINAL
        text = self._text(message, "client-final-message")
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        attrs = without_proof.split(",")
        if not sep or len(attrs) < 2 or not attrs[0].startswith("c="):
            raise self._fail(_malformed("client-final-message"))
        if not attrs[1].startswith("r="):
            raise self._fail(_malformed("client-final-message"))
        self._extensions(attrs[2:], "client-final-message")  # allowed, and ignored, as Kafka
        try:
            binding = base64.b64decode(attrs[0][2:], validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except binascii.Error:
            raise self._fail(_malformed("base64 in the client-final-message")) from None
        if binding != self._gs2_header:
            raise self._fail("the channel binding (c=) is not the gs2 header")
        # As Kafka's ScramSaslServer: the nonce must end with this exchange's, not equal it.
        # librdkafka 2.0 (Debian's kcat) sends its own part twice before the server's.
        if not attrs[1][2:].endswith(self._full_nonce):
            raise self._fail("the nonce is not the one of this exchange")
        if len(proof) != len(credential.stored_key):
            raise self._fail("the client proof has the wrong length")
        auth_message = self._auth_prefix + without_proof.encode()
        signature = hmac.digest(credential.stored_key, auth_message, self._digest)
        key = bytes(p ^ s for p, s in zip(proof, signature, strict=True))
        proven = hmac.compare_digest(hashlib.new(self._digest, key).digest(), credential.stored_key)
        if not self._known:
            raise self._fail("unknown user")
        if not proven:
            raise self._fail("wrong password (the client proof does not match)")
        verifier = hmac.digest(credential.server_key, auth_message, self._digest)
        self.user = self._name
        self._credential = None
        self._state = _State.COMPLETE
        return b"v=" + base64.b64encode(verifier)
