"""SASL OAUTHBEARER: the JWT/JWKS core (kafka_wire/sasl/oauthbearer.py) with keys generated
here, the RFC 7628 client message and error challenge, the session lifetime from `exp`
(KIP-368), the JWKS cache's refreshes (kafka_wire/sasl/jwks.py) and the gate over a loopback
socket with a JWKS served on loopback."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kafka_wire.errors import ErrorCode
from kafka_wire.sasl.errors import SaslAuthenticationFailed
from kafka_wire.sasl.gate import SaslSettings, sasl_listener
from kafka_wire.sasl.jwks import JwksFetchError, JwksKeys, fetch_jwks
from kafka_wire.sasl.oauthbearer import (
    OAUTHBEARER,
    InvalidToken,
    KeySet,
    MalformedClientMessage,
    OAuthBearerExchange,
    OAuthBearerSettings,
    TokenValidator,
    UnknownKey,
    error_challenge,
    parse_client_first,
    parse_jwks,
    verify_token,
)
from kafka_wire.sasl.session import SaslSession
from kafka_wire.server_loop import serve_connection
from telemetry import BadInputLog
from tests.oauth_idp import (
    AUDIENCE,
    ISSUER,
    IdentityProvider,
    Signer,
    b64url,
    claims_for,
    encode_jwt,
    jwks_bytes,
    serving,
)
from tests.test_sasl_session import Echo, _call, _read

RSA = Signer("rsa-1")
EC = Signer("ec-1", kind="EC")
PS = Signer("ps-1", publish_alg=False)  # RS256 and PS256 alike
OTHER = Signer("rsa-1")  # the same kid, another key
NOW = 1_700_000_000.0
SETTINGS = OAuthBearerSettings(
    "http://unused/jwks", expected_issuer=ISSUER, expected_audiences=(AUDIENCE,)
)
KEYS = parse_jwks(jwks_bytes(RSA, EC, PS))


def claims(sub: str = "alice", **kw: Any) -> dict[str, Any]:
    return claims_for(sub, now=NOW, **kw)


def verify(token: str, keys: KeySet = KEYS, now: float = NOW, **settings: Any) -> Any:
    config = OAuthBearerSettings(
        "http://unused/jwks",
        **{"expected_issuer": ISSUER, "expected_audiences": (AUDIENCE,), **settings},
    )
    return verify_token(token, keys, now, config)


def client_first(token: str, authzid: str = "", extra: str = "") -> bytes:
    head = f"n,a={authzid}," if authzid else "n,,"
    return f"{head}\x01auth=Bearer {token}\x01{extra}\x01".encode()


# -- tokens --------------------------------------------------------------------------------


def test_good_rs256_ps256_and_es256_tokens_give_the_principal_and_lifetime() -> None:
    for token in (
        RSA.sign(claims()),
        PS.sign(claims(), alg="PS256"),
        PS.sign(claims()),
        EC.sign(claims()),
    ):
        verified = verify(token)
        assert verified.principal == "alice"
        assert verified.expires_at == NOW + 3600
        assert verified.lifetime_ms == 3_600_000
    # aud may be a list; one expected audience is enough.
    assert verify(RSA.sign(claims(audience=["other", AUDIENCE]))).principal == "alice"


def test_a_bad_signature_or_a_changed_payload_is_refused_and_names_no_subject() -> None:
    with pytest.raises(InvalidToken, match="signature") as info:
        verify(OTHER.sign(claims()))
    assert info.value.subject is None
    head, _, sig = RSA.sign(claims()).split(".")
    forged = f"{head}.{b64url(json.dumps(claims('admin')).encode())}.{sig}"
    with pytest.raises(InvalidToken, match="signature"):
        verify(forged)
    # An ES256 signature of the wrong length, and a truncated token.
    head, body, sig = EC.sign(claims()).split(".")
    with pytest.raises(InvalidToken, match="signature"):
        verify(f"{head}.{body}.{sig[:-4]}")
    with pytest.raises(InvalidToken, match="2 parts, not 3"):
        verify(f"{head}.{body}")


def test_alg_none_and_hmac_are_refused_even_with_a_known_kid() -> None:
    unsigned = encode_jwt({"alg": "none", "kid": "rsa-1"}, claims())
    with pytest.raises(InvalidToken, match="alg 'none' is not accepted"):
        verify(f"{unsigned}.")
    # HS256 with the public key as the secret: the classic confusion, never tried.
    hs = encode_jwt({"alg": "HS256", "kid": "rsa-1"}, claims())
    with pytest.raises(InvalidToken, match="HS256"):
        verify(f"{hs}.{b64url(b'x' * 32)}")
    # An algorithm the kid's key does not fit (nor its own alg): no key, not a crash.
    with pytest.raises(UnknownKey):
        verify(EC.sign(claims(), kid="rsa-1"))
    with pytest.raises(UnknownKey):
        verify(RSA.sign(claims(), alg="PS256"))
    with pytest.raises(InvalidToken, match="crit"):
        verify(RSA.sign(claims(), crit=["exp"]))


def test_wrong_issuer_and_wrong_audience_are_refused_with_the_subject() -> None:
    with pytest.raises(InvalidToken, match="issuer") as info:
        verify(RSA.sign(claims(issuer="https://evil.test")))
    assert info.value.subject == "alice"
    with pytest.raises(InvalidToken, match="audience"):
        verify(RSA.sign(claims(audience="another-cluster")))
    with pytest.raises(InvalidToken, match="audience"):
        verify(RSA.sign({k: v for k, v in claims().items() if k != "aud"}))
    # Without an expected issuer and audience neither is checked.
    token = RSA.sign(claims(issuer="x", audience="y"))
    assert verify(token, expected_issuer=None, expected_audiences=()).principal == "alice"


def test_expiry_and_not_before_with_the_clock_skew() -> None:
    token = RSA.sign(claims(lifetime_s=60))
    assert verify(token, now=NOW + 60 + 29).lifetime_ms == 0  # inside the 30 s skew
    with pytest.raises(InvalidToken, match="expired"):
        verify(token, now=NOW + 60 + 30)
    with pytest.raises(InvalidToken, match="expired"):
        verify(token, now=NOW + 61, clock_skew_s=0)
    early = RSA.sign(claims(nbf=int(NOW + 100)))
    with pytest.raises(InvalidToken, match="not valid for"):
        verify(early, now=NOW + 69)
    assert verify(early, now=NOW + 70).principal == "alice"


def test_required_claims_and_a_configurable_principal_claim() -> None:
    for missing in ("exp", "iat", "sub"):
        body = {k: v for k, v in claims().items() if k != missing}
        with pytest.raises(InvalidToken, match=missing):
            verify(RSA.sign(body))
    with pytest.raises(InvalidToken, match="NumericDate"):
        verify(RSA.sign(claims(exp="tomorrow")))
    with pytest.raises(InvalidToken, match="spaces"):
        verify(RSA.sign(claims(sub=" admin")))
    token = RSA.sign(claims(client_id="svc-orders"))
    assert verify(token, sub_claim_name="client_id").principal == "svc-orders"
    with pytest.raises(InvalidToken, match="'azp'"):
        verify(token, sub_claim_name="azp")


def test_malformed_tokens_are_refused_cleanly() -> None:
    head, body, sig = RSA.sign(claims()).split(".")
    dup = b64url(b'{"sub":"alice","sub":"admin"}')
    for token in (
        "not-a-jwt",
        f"{head}=.{body}.{sig}",
        f"{b64url(b'[1]')}.{body}.{sig}",
        f"{b64url(b'{')}.{body}.{sig}",
        f"{head}.{body}.{sig}!",
        f"{head}.{b64url(b'NaN')}.{sig}",
    ):
        with pytest.raises(InvalidToken):
            verify(token)
    with pytest.raises(InvalidToken, match="signature"):  # the signature guards the payload
        verify(f"{head}.{dup}.{sig}")


# -- JWKS ----------------------------------------------------------------------------------


def test_parse_jwks_skips_keys_it_cannot_use() -> None:
    small = Signer("tiny", bits=1024)
    doc = json.loads(jwks_bytes(RSA, EC, small))
    doc["keys"] += [
        {**RSA.jwk(), "kid": "enc", "use": "enc"},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "AA"},
        {"kty": "EC", "kid": "bad-point", "crv": "P-256", "x": "AQ", "y": "AQ"},
        "junk",
    ]
    keys = parse_jwks(json.dumps(doc))
    assert keys.kids == {"rsa-1", "ec-1"}
    assert len(keys.skipped) == 5 and any("1024 bits" in s for s in keys.skipped)
    for bad in (b"", b"[]", b'{"keys": {}}', b"\xff"):
        with pytest.raises(ValueError):
            parse_jwks(bad)


class FakeKeys:
    def __init__(self, current: KeySet, fresher: KeySet) -> None:
        self.keys = current
        self.fresher = fresher
        self.refreshes: list[str | None] = []

    def current(self) -> KeySet:
        return self.keys

    def refreshed(self, kid: str | None) -> KeySet:
        self.refreshes.append(kid)
        self.keys = self.fresher
        return self.keys


def test_an_unknown_kid_asks_for_a_refresh_once_and_then_verifies() -> None:
    rotated = Signer("rsa-2")
    keys = FakeKeys(KEYS, parse_jwks(jwks_bytes(RSA, rotated)))
    validator = TokenValidator(SETTINGS, keys, clock=lambda: NOW)
    assert validator.validate(RSA.sign(claims())).principal == "alice"
    assert keys.refreshes == []
    assert validator.validate(rotated.sign(claims("bob"))).principal == "bob"
    assert keys.refreshes == ["rsa-2"]
    with pytest.raises(UnknownKey):
        validator.validate(Signer("rsa-3").sign(claims()))
    assert keys.refreshes == ["rsa-2", "rsa-3"]


# -- the SASL exchange ---------------------------------------------------------------------


def test_client_first_message_per_rfc_7628() -> None:
    token = RSA.sign(claims())
    first = parse_client_first(client_first(token, "alice", "host=broker\x01port=9092\x01"))
    assert (first.token, first.authzid) == (token, "alice")
    assert first.extensions == {"host": "broker", "port": "9092"}
    assert parse_client_first(client_first(token, "a=3Db=2Cc")).authzid == "a=b,c"
    assert parse_client_first(f"y,,\x01auth=bearer  {token}\x01\x01".encode()).token == token
    for bad in (
        b"",
        b"\x01",
        b"n,,auth=Bearer x\x01\x01",
        f"p=tls-unique,,\x01auth=Bearer {token}\x01\x01".encode(),
        f"n,u=x,\x01auth=Bearer {token}\x01\x01".encode(),
        f"n,a=a=b,\x01auth=Bearer {token}\x01\x01".encode(),
        f"n,,\x01auth=Bearer {token}\x01".encode(),
        f"n,,\x01auth=Bearer {token}\x01auth=Bearer {token}\x01\x01".encode(),
        f"n,,\x01auth=Basic {token}\x01\x01".encode(),
        b"n,,\x01auth=Bearer\x01\x01",
        b"n,,\x01host=x\x01\x01",
        b"n,,\x011host=x\x01auth=Bearer a.b.c\x01\x01",
        b"n,,\x01auth=Bearer a.b.c\x01k=\x00\x01\x01",
        b"n,,\x01auth=Bearer \xff\x01\x01",
    ):
        with pytest.raises(MalformedClientMessage):
            parse_client_first(bad)


def exchange(keys: KeySet = KEYS, now: float = NOW) -> OAuthBearerExchange:
    return OAuthBearerExchange(TokenValidator(SETTINGS, FakeKeys(keys, keys), lambda: now))


def test_a_refused_token_gets_the_json_challenge_then_fails_on_x01() -> None:
    ex = exchange()
    reply, user = ex.step(client_first(RSA.sign(claims(audience="other"))))
    assert (reply, user) == (b'{"status":"invalid_token"}', None)
    assert json.loads(reply) == {"status": "invalid_token"} and reply == error_challenge()
    with pytest.raises(SaslAuthenticationFailed) as info:
        ex.step(b"\x01")
    failure = info.value
    assert failure.client_message == '{"status":"invalid_token"}'
    assert failure.error_code == ErrorCode.sasl_authentication_failed
    assert failure.user == "alice" and "audience" in str(failure)
    # Anything but %x01 after the challenge fails the same way.
    ex = exchange()
    ex.step(client_first(OTHER.sign(claims())))
    with pytest.raises(SaslAuthenticationFailed, match="did not answer %x01") as info:
        ex.step(b"again")
    assert info.value.user is None  # the signature failed: the sub is not believed


def test_a_malformed_message_fails_at_once_without_quoting_the_token() -> None:
    token = RSA.sign(claims())
    with pytest.raises(SaslAuthenticationFailed) as info:
        exchange().step(f"n,,\x01auth=Basic {token}\x01\x01".encode())
    assert "malformed" in str(info.value) and token not in str(info.value)
    assert "invalid credentials" in info.value.client_message
    with pytest.raises(SaslAuthenticationFailed, match="authorization id"):
        exchange().step(client_first(token, authzid="admin"))
    assert exchange().step(client_first(token, authzid="alice")) == (b"", "alice")


def oauth_session(reauth_ms: int = 0, now: float = NOW) -> SaslSession:
    return SaslSession({OAUTHBEARER: partial(exchange, KEYS, now)}, reauth_ms)


def test_session_lifetime_follows_exp_and_reauthentication_is_allowed() -> None:
    session = oauth_session(now=NOW + 600)  # the token has 3000 s left
    assert session.handshake(OAUTHBEARER).error_code == ErrorCode.none
    answer = session.authenticate(client_first(RSA.sign(claims())), 10.0)
    assert answer.principal == "User:alice"
    assert answer.session_lifetime_ms == 3_000_000
    assert session.refusal(3, 10.0 + 2999) is None
    assert "expired" in (session.refusal(3, 10.0 + 3000) or "")
    # KIP-368 without connections.max.reauth.ms: the token's expiry allows it.
    assert session.handshake(OAUTHBEARER).error_code == ErrorCode.none
    again = session.authenticate(client_first(RSA.sign(claims())), 3000.0)
    assert again.principal == "User:alice" and again.session_lifetime_ms == 3_000_000
    # Another principal on re-authentication fails.
    assert session.handshake(OAUTHBEARER).error_code == ErrorCode.none
    other = session.authenticate(client_first(RSA.sign(claims("mallory"))), 3001.0)
    assert other.error_code == ErrorCode.sasl_authentication_failed and other.close

    capped = oauth_session(reauth_ms=60_000)
    capped.handshake(OAUTHBEARER)
    assert capped.authenticate(client_first(EC.sign(claims())), 0.0).session_lifetime_ms == 60_000


def test_a_failed_session_answers_the_challenge_and_then_sasl_authentication_failed() -> None:
    session = oauth_session()
    session.handshake(OAUTHBEARER)
    expired = RSA.sign(claims(lifetime_s=-3600))
    first = session.authenticate(client_first(expired), 0.0)
    assert first.error_code == ErrorCode.none and first.auth_bytes == error_challenge()
    assert first.principal is None and not first.close
    final = session.authenticate(b"\x01", 0.0)
    assert final.error_code == ErrorCode.sasl_authentication_failed and final.close
    assert final.error_message == '{"status":"invalid_token"}'
    assert final.failure is not None and "expired" in str(final.failure)


# -- the JWKS cache ------------------------------------------------------------------------


class FakeEndpoint:
    def __init__(self, *signers: Signer) -> None:
        self.body = jwks_bytes(*signers)
        self.calls = 0
        self.fail = False
        self.gate = trio.Event()
        self.gate.set()

    async def __call__(self, url: str, timeout_s: float) -> bytes:
        self.calls += 1
        await self.gate.wait()
        if self.fail:
            raise JwksFetchError(f"{url}: HTTP 503")
        return self.body


def _settings(**kw: Any) -> OAuthBearerSettings:
    return OAuthBearerSettings("http://idp/jwks", jwks_refresh_ms=60_000, **kw)


async def test_jwks_is_refreshed_on_a_period_and_keeps_the_old_keys_on_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    endpoint = FakeEndpoint(RSA)
    keys = JwksKeys(_settings(), endpoint)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keys.keep_fresh)
        await keys.loaded.wait()
        assert keys.current().kids == {"rsa-1"} and endpoint.calls == 1
        endpoint.body = jwks_bytes(RSA, EC)
        await trio.sleep(60.5)
        assert keys.current().kids == {"rsa-1", "ec-1"} and endpoint.calls == 2
        endpoint.fail = True
        await trio.sleep(60.0)  # a failed fetch, then retries after 0.1, 0.2, ... s
        assert endpoint.calls > 3
        assert keys.current().kids == {"rsa-1", "ec-1"}
        endpoint.fail = False
        endpoint.body = jwks_bytes(EC)
        await trio.sleep(20.0)  # within the 10 s retry cap
        assert keys.current().kids == {"ec-1"}
        nursery.cancel_scope.cancel()


async def test_unknown_kid_refreshes_are_joined_and_rate_limited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    endpoint = FakeEndpoint(RSA)
    keys = JwksKeys(_settings(jwks_min_refresh_ms=5_000), endpoint)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keys.keep_fresh)
        await keys.loaded.wait()
        endpoint.body = jwks_bytes(RSA, Signer("rsa-2"))
        # Within 5 s of the last fetch: no new fetch for an unknown kid.
        assert (await keys.refresh_for("rsa-2")).kids == {"rsa-1"}
        assert endpoint.calls == 1
        await trio.sleep(5.0)
        # Three at once share one fetch.
        endpoint.gate = trio.Event()
        results: list[frozenset[str]] = []

        async def ask(kid: str) -> None:
            results.append((await keys.refresh_for(kid)).kids)

        async with trio.open_nursery() as askers:
            for kid in ("rsa-2", "made-up-1", "made-up-2"):
                askers.start_soon(ask, kid)
            await trio.testing.wait_all_tasks_blocked()
            endpoint.gate.set()
        assert endpoint.calls == 2
        assert results == [frozenset({"rsa-1", "rsa-2"})] * 3
        # A kid the set has now needs no fetch; a made-up one waits for the interval.
        await keys.refresh_for("rsa-2")
        await keys.refresh_for("made-up-3")
        assert endpoint.calls == 2
        nursery.cancel_scope.cancel()


async def test_fetch_jwks_reads_http_and_file_urls(tmp_path: Path) -> None:
    idp = IdentityProvider(RSA, [RSA, EC])
    with serving(idp) as base:
        data = await fetch_jwks(f"{base}/jwks", 5.0)
        assert parse_jwks(data).kids == {"rsa-1", "ec-1"}
        with pytest.raises(JwksFetchError, match="HTTP 404"):
            await fetch_jwks(f"{base}/nothing", 5.0)
    path = tmp_path / "jwks.json"
    path.write_bytes(jwks_bytes(EC))
    assert parse_jwks(await fetch_jwks(path.as_uri(), 5.0)).kids == {"ec-1"}
    with pytest.raises(JwksFetchError):
        await fetch_jwks((tmp_path / "missing.json").as_uri(), 5.0)
    with pytest.raises(JwksFetchError, match="not an http"):
        await fetch_jwks("ftp://idp/jwks", 5.0)


# -- the gate, over loopback ---------------------------------------------------------------


async def test_gate_waits_for_a_jwks_fetch_for_a_new_kid_then_authenticates() -> None:
    rotated = Signer("rsa-2")
    idp = IdentityProvider(RSA, [RSA])
    with serving(idp) as base:
        settings = OAuthBearerSettings(
            f"{base}/jwks",
            expected_issuer=ISSUER,
            expected_audiences=(AUDIENCE,),
            jwks_min_refresh_ms=0,
        )
        keys = JwksKeys(settings)
        listener = sasl_listener(
            SaslSettings((OAUTHBEARER,), failed_delay_ms=0, oauthbearer=settings),
            lambda mech, user: None,
            lambda user: None,
            b"fake",
            BadInputLog(logging.getLogger("test")),
            oauth_keys=keys,
        )
        failures: list[SaslAuthenticationFailed] = []
        listener.on_failure = lambda conn, failure: failures.append(failure)
        echo = Echo()

        async def handle(stream: trio.SocketStream) -> None:
            await serve_connection(stream, echo, max_frame_bytes=1 << 20, gate=listener.gate)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keys.keep_fresh)
            await keys.loaded.wait()
            listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]

            async def login(token: str) -> Any:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                assert (await _call(stream, 17, 1, {"mechanism": OAUTHBEARER})).error_code == 0
                return stream, await _call(stream, 36, 2, {"auth_bytes": client_first(token)})

            # The provider rotates: the new key is published after the proxy's last fetch.
            idp.published = [RSA, rotated]
            stream, resp = await login(rotated.sign(claims_for("bob", lifetime_s=120)))
            assert resp.error_code == ErrorCode.none
            assert 110 < resp.session_lifetime.total_seconds() <= 120
            assert idp.jwks_requests == 2
            await _call(stream, 3, 12, {"topics": [], "allow_auto_topic_creation": False})
            assert echo.principals == ["User:bob"]
            await stream.aclose()

            # A wrong audience: the challenge, %x01, SASL_AUTHENTICATION_FAILED, closed.
            stream, resp = await login(RSA.sign(claims_for("eve", audience="other")))
            assert resp.error_code == ErrorCode.none
            assert resp.auth_bytes == error_challenge()
            final = await _call(stream, 36, 2, {"auth_bytes": b"\x01"})
            assert final.error_code == ErrorCode.sasl_authentication_failed
            assert final.error_message == '{"status":"invalid_token"}'
            with pytest.raises(EOFError):
                await _read(stream, 1)
            assert len(failures) == 1 and failures[0].user == "eve"
            nursery.cancel_scope.cancel()
