"""SASL OAUTHBEARER through the zone proxies (issue 15), with librdkafka's own OIDC flow.

One `zonefleet up --config` fleet of three zones, each proxy with a SASL_PLAINTEXT listener
that takes OAUTHBEARER besides SCRAM and PLAIN. The test serves a small OAuth provider on
loopback (`tests/oauth_idp.py`): a client-credentials token endpoint and the JWKS of an RSA
key generated here. confluent-kafka fetches its tokens from that endpoint itself
(`sasl.oauthbearer.method=oidc`) and produces and consumes through the proxies, which check
the tokens against the JWKS they fetch. A token for another audience is refused with
SASL_AUTHENTICATION_FAILED (one log line, no traceback); a rotated signing key is picked up
by the proxy's refresh on an unknown `kid`; SaslAuthenticate's session lifetime is the
token's.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from tests.fleet_process import FleetProcess
from tests.oauth_idp import AUDIENCE, ISSUER, Client, IdentityProvider, Signer, claims_for, serving
from tests.test_e2e_sasl_proxies import (
    _closed,
    _request,
    round_trip,
    sasl_bootstrap,
    sasl_port,
    write_sasl_config,
)
from tests.zone_fleet import ZoneFleet, running_up_fleet

MECHANISMS = 'sasl_enabled_mechanisms = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]'
CLIENTS = {
    "orders-svc": Client("orders-secret"),
    "billing-svc": Client("billing-secret"),
    "stranger-svc": Client("stranger-secret", audience="another-cluster"),
    "short-svc": Client("short-secret", lifetime_s=6),
}


class OAuthFleet:
    def __init__(self, proc: FleetProcess, fleet: ZoneFleet, idp: IdentityProvider, url: str):
        self.proc = proc
        self.fleet = fleet
        self.idp = idp
        self.url = url

    def client_conf(self, zone: str, client_id: str, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": sasl_bootstrap(self.fleet, zone),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": client_id,
            "sasl.oauthbearer.client.secret": CLIENTS[client_id].secret,
            "sasl.oauthbearer.token.endpoint.url": f"{self.url}/token",
            "sasl.oauthbearer.scope": "kafka",
            **extra,
        }


def _wait_until(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def oauth_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthFleet]:
    idp = IdentityProvider(Signer("idp-key-1"), [], clients=dict(CLIENTS))
    idp.published = [idp.signer]
    with serving(idp) as url:
        data_dir = tmp_path_factory.mktemp("oauth") / "fleet"
        data_dir.mkdir(parents=True)
        security = (
            f'sasl_oauthbearer_jwks_endpoint_url = "{url}/jwks"\n'
            f'sasl_oauthbearer_expected_issuer = "{ISSUER}"\n'
            f'sasl_oauthbearer_expected_audience = ["{AUDIENCE}"]\n'
            "sasl_oauthbearer_jwks_endpoint_min_refresh_ms = 1000\n"
        )
        config = write_sasl_config(data_dir, security_extra=security)
        text = config.read_text()
        assert MECHANISMS in text
        config.write_text(text.replace(MECHANISMS, MECHANISMS[:-1] + ', "OAUTHBEARER"]'))
        with running_up_fleet(data_dir, config) as (proc, fleet):
            # Each proxy fetches the JWKS as its listeners start.
            _wait_until("every proxy's JWKS fetch", lambda: idp.jwks_requests >= 3)
            yield OAuthFleet(proc, fleet, idp, url)


def test_librdkafka_oidc_produces_and_consumes_through_every_proxy(
    oauth_fleet: OAuthFleet,
) -> None:
    f = oauth_fleet
    round_trip(f.client_conf("az1", "orders-svc"), f.client_conf("az2", "billing-svc"), 50)
    round_trip(f.client_conf("az3", "billing-svc"), f.client_conf("az3", "orders-svc"), 20)
    # librdkafka asked the token endpoint itself: client credentials, with the scope.
    requests = f.idp.token_requests
    assert {r["client_id"] for r in requests} >= {"orders-svc", "billing-svc"}
    assert all(r["form"].get("grant_type") == ["client_credentials"] for r in requests)
    assert any(r["form"].get("scope") == ["kafka"] for r in requests)
    # Metadata on the listener names its addresses only, as for the other mechanisms.
    admin = AdminClient(f.client_conf("az2", "orders-svc"))
    ports = {b.port for b in admin.list_topics(timeout=10).brokers.values()}
    assert ports == {sasl_port(f.fleet, "az2")}


def test_a_token_for_another_audience_is_refused_and_the_proxy_serves_on(
    oauth_fleet: OAuthFleet,
) -> None:
    f = oauth_fleet
    errors: list[KafkaError] = []
    admin = AdminClient({**f.client_conf("az1", "stranger-svc"), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    deadline = time.monotonic() + 30
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, errors
        admin.poll(0.5)  # error_cb is served by poll
    assert any("invalid_token" in e.str() for e in errors), errors
    # The same proxy still serves a good client.
    good = AdminClient(f.client_conf("az1", "orders-svc"))
    assert good.list_topics(timeout=10).brokers
    log = "".join(f.proc.output)
    lines = re.findall(r"authentication failed from 127\.0\.0\.1[^\n]*", log)
    assert any("OAUTHBEARER" in line and "audience" in line for line in lines), lines
    assert not any("eyJ" in line for line in lines)  # never the token
    assert "Traceback" not in log


def test_the_session_lifetime_is_the_tokens_and_bad_messages_fail_cleanly(
    oauth_fleet: OAuthFleet,
) -> None:
    f = oauth_fleet
    port = sasl_port(f.fleet, "az2")
    token = f.idp.signer.sign(claims_for("orders-svc", lifetime_s=120))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert int(_request(sock, 17, 1, {"mechanism": "OAUTHBEARER"}).error_code) == 0
        first = f"n,,\x01auth=Bearer {token}\x01\x01".encode()
        resp = _request(sock, 36, 2, {"auth_bytes": first})
        assert int(resp.error_code) == 0
        assert 100 < resp.session_lifetime.total_seconds() <= 120
    # KIP-368 by hand: re-authenticate on the connection, then let the session run out:
    # the first request after the token's exp closes the connection.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(2):
            short = f.idp.signer.sign(claims_for("orders-svc", lifetime_s=3))
            assert int(_request(sock, 17, 1, {"mechanism": "OAUTHBEARER"}).error_code) == 0
            auth = f"n,,\x01auth=Bearer {short}\x01\x01".encode()
            assert int(_request(sock, 36, 2, {"auth_bytes": auth}).error_code) == 0
        deadline = time.monotonic() + 30
        with pytest.raises(ConnectionError):
            while time.monotonic() < deadline:
                _request(sock, 3, 12, {"topics": [], "allow_auto_topic_creation": False})
                time.sleep(0.1)
    _wait_until(
        "the expired session's log line",
        lambda: "session of User:orders-svc expired" in "".join(f.proc.output),
    )
    # Not RFC 7628: SASL_AUTHENTICATION_FAILED at once, then closed.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert int(_request(sock, 17, 1, {"mechanism": "OAUTHBEARER"}).error_code) == 0
        resp = _request(sock, 36, 2, {"auth_bytes": b"\xff\x00garbage"})
        assert int(resp.error_code) == 58
        assert _closed(sock)
    # An expired token: the RFC 7628 error challenge, then %x01 fails it.
    old = f.idp.signer.sign(claims_for("orders-svc", now=time.time() - 7200))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        _request(sock, 17, 1, {"mechanism": "OAUTHBEARER"})
        resp = _request(sock, 36, 2, {"auth_bytes": f"n,,\x01auth=Bearer {old}\x01\x01".encode()})
        assert int(resp.error_code) == 0 and resp.auth_bytes == b'{"status":"invalid_token"}'
        resp = _request(sock, 36, 2, {"auth_bytes": b"\x01"})
        assert int(resp.error_code) == 58
        assert resp.error_message == '{"status":"invalid_token"}'
        assert _closed(sock)


def test_librdkafka_re_authenticates_before_its_short_tokens_expire(
    oauth_fleet: OAuthFleet,
) -> None:
    """KIP-368: the session ends with the token (6 s); librdkafka fetches a new token and
    re-authenticates on the same connection, so a producer goes on across several tokens
    and the proxy never closes a connection for an expired session."""
    f = oauth_fleet
    from confluent_kafka import Producer

    def tokens() -> int:
        return sum(r["client_id"] == "short-svc" for r in f.idp.token_requests)

    topic = f"oauth-reauth-{int(time.time() * 1000)}"
    failed: list[Any] = []
    delivered: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        (failed if err is not None else delivered).append(err or msg)

    producer = Producer({**f.client_conf("az2", "short-svc"), "acks": "all"})
    sent = 0
    deadline = time.monotonic() + 90
    while tokens() < 3:  # three tokens: two re-authentications
        assert time.monotonic() < deadline, f"{tokens()} tokens"
        producer.produce(topic, f"r{sent}".encode(), on_delivery=on_delivery)
        sent += 1
        producer.poll(0.2)
    assert producer.flush(30) == 0
    assert not failed and len(delivered) == sent
    log = "".join(f.proc.output)
    assert "session of User:short-svc expired" not in log


def test_a_rotated_signing_key_is_fetched_on_its_first_token(oauth_fleet: OAuthFleet) -> None:
    f = oauth_fleet
    before = f.idp.jwks_requests
    rotated = Signer("idp-key-2")
    with f.idp.lock:
        f.idp.published = [f.idp.signer, rotated]
        f.idp.signer = rotated
    admin = AdminClient(f.client_conf("az3", "billing-svc"))
    assert admin.list_topics(timeout=30).brokers
    assert f.idp.jwks_requests > before  # the proxy asked again for the new kid
    assert "Traceback" not in "".join(f.proc.output)


def test_config_names_oauthbearer(tmp_path: Path) -> None:
    """The fleet file refuses OAUTHBEARER without a JWKS URL."""
    from fleet.config import ConfigError, load_fleet_config

    config = write_sasl_config(tmp_path)
    text = config.read_text()
    config.write_text(text.replace(MECHANISMS, MECHANISMS[:-1] + ', "OAUTHBEARER"]'))
    with pytest.raises(ConfigError, match="sasl_oauthbearer_jwks_endpoint_url"):
        load_fleet_config(config, discover=None)
