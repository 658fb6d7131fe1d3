"""SASL through the zone proxies (issue 15), with stock clients over real sockets.

One `zonefleet up --config` fleet of three zones for the module, each proxy with a named
SASL_PLAINTEXT listener besides its PLAINTEXT port. SCRAM users are created with
AlterUserScramCredentials (stored by the mains in the metadata store, read from there by
the proxies); PLAIN users come from a credentials file of hashes. confluent-kafka, kcat,
kafka-python and aiokafka authenticate with SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, produce
and consume; Metadata on the SASL listener names only SASL addresses. Wrong passwords,
unknown mechanisms, garbage SASL bytes and requests before authentication are refused with
Kafka's error codes, one log line each and no traceback.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kafka_wire.codec import build_request, decode_response, encode_request
from kafka_wire.sasl.plain import dump_credentials, make_credential
from tests.fleet_process import FleetProcess
from tests.zone_fleet import ZoneFleet, create_topic, running_up_fleet, write_zones_toml

SASL_OFFSET = 5  # a free port in each zone's block of ten (fleet/config.py)
USERS = {"alice": "alice-secret-512", "bob": "bob-secret-256"}
PLAIN_USER = ("carol", "carol-plain-pw")


def sasl_port(fleet: ZoneFleet, zone: str) -> int:
    proxy = next(p.proxy for p in fleet.config.proxies if p.proxy.zone == zone)
    return next(lst.port for lst in proxy.listeners if lst.name == "SASL")


def sasl_bootstrap(fleet: ZoneFleet, zone: str) -> str:
    return f"127.0.0.1:{sasl_port(fleet, zone)}"


def write_sasl_config(
    data_dir: Path, plain_users: dict[str, str] | None = None, security_extra: str = ""
) -> Path:
    """The `up --zones 3` fleet TOML with a SASL_PLAINTEXT listener named SASL on each proxy
    (its port + SASL_OFFSET), PLAIN users from a credentials file, and `security_extra` lines
    in [security]."""
    path, config = write_zones_toml(data_dir)
    text = path.read_text()
    for p in config.proxies:
        port = p.proxy.port
        block = f"port = {port}\nadmin_port = {port + 1}\n"
        listener = (
            f'listeners = [{{ name = "SASL", protocol = "SASL_PLAINTEXT", '
            f"port = {port + SASL_OFFSET} }}]\n"
        )
        assert block in text
        text = text.replace(block, block + listener)
    creds = data_dir / "plain.json"
    users = plain_users if plain_users is not None else dict([PLAIN_USER])
    creds.write_bytes(dump_credentials({u: make_credential(pw) for u, pw in users.items()}))
    security = (
        "[security]\n"
        'sasl_enabled_mechanisms = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]\n'
        f'plain_credentials_file = "{creds}"\n' + security_extra
    )
    # [security] goes before the first array of tables so TOML keeps it a table of its own.
    text = text.replace("[[zones]]", security + "\n[[zones]]", 1)
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def sasl_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    data_dir = tmp_path_factory.mktemp("sasl") / "fleet"
    data_dir.mkdir(parents=True)
    config = write_sasl_config(data_dir)
    with running_up_fleet(data_dir, config) as (proc, fleet):
        admin = AdminClient({"bootstrap.servers": fleet.bootstrap("az1")})
        upserts = [
            UserScramCredentialUpsertion(
                "alice",
                ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                b"alice-secret-512",
            ),
            UserScramCredentialUpsertion(
                "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"bob-secret-256"
            ),
        ]
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(timeout=30)
        # Every proxy reads the stored credentials on its own schedule: wait until each
        # zone's SASL listener takes alice.
        for zone in fleet.zones:
            _wait_authenticates(fleet, zone)
        yield proc, fleet


def _sasl_config(fleet: ZoneFleet, zone: str, mechanism: str, user: str, pw: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": sasl_bootstrap(fleet, zone),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": pw,
    }


def _wait_authenticates(fleet: ZoneFleet, zone: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = AdminClient(_sasl_config(fleet, zone, "SCRAM-SHA-512", "alice", USERS["alice"]))
        try:
            admin.list_topics(timeout=5)
            return
        except KafkaException as exc:
            last = exc
    raise AssertionError(f"{zone}'s SASL listener never took alice: {last}")


def round_trip(producer_conf: dict[str, Any], consumer_conf: dict[str, Any], n: int) -> None:
    """`n` records produced with one client config and all read back with another (a new
    group from the earliest offset), on a new topic."""
    topic = f"secure-{uuid.uuid4().hex[:8]}"
    producer = Producer({**producer_conf, "enable.idempotence": True, "acks": "all"})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), key=str(i % 2).encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {**consumer_conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(n))


def values_read(consumer: Any, n: int) -> set[bytes]:
    """The values a kafka-python consumer reads until it has `n` distinct ones (or times out)."""
    values: set[bytes] = set()
    for msg in consumer:
        values.add(msg.value)
        if len(values) == n:
            break
    consumer.close()
    return values


def _round_trip_confluent(fleet: ZoneFleet, zone: str, mech: str, user: str, pw: str) -> None:
    conf = _sasl_config(fleet, zone, mech, user, pw)
    round_trip(conf, conf, 50)


def test_confluent_kafka_scram_512_and_256_and_plain_through_every_proxy(
    sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = sasl_fleet
    _round_trip_confluent(fleet, "az1", "SCRAM-SHA-512", "alice", USERS["alice"])
    _round_trip_confluent(fleet, "az2", "SCRAM-SHA-256", "bob", USERS["bob"])
    _round_trip_confluent(fleet, "az3", "PLAIN", *PLAIN_USER)


def test_metadata_on_the_sasl_listener_names_only_sasl_addresses(
    sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = sasl_fleet
    for zone in fleet.zones:
        admin = AdminClient(_sasl_config(fleet, zone, "SCRAM-SHA-512", "alice", USERS["alice"]))
        brokers = admin.list_topics(timeout=10).brokers
        ports = {b.port for b in brokers.values()}
        assert ports == {sasl_port(fleet, zone)}, (zone, brokers)


def test_kcat_kafka_python_and_aiokafka_over_scram(
    sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = sasl_fleet
    topic = f"sasl-clients-{uuid.uuid4().hex[:8]}"
    create_topic(fleet, "az1", topic, 1)
    bootstrap = sasl_bootstrap(fleet, "az2")
    sasl = [
        "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-512",
        "-X", "sasl.username=alice", "-X", f"sasl.password={USERS['alice']}",
    ]  # fmt: skip
    subprocess.run(
        ["kcat", "-b", bootstrap, *sasl, "-P", "-t", topic],
        input=b"k1\nk2\nk3\n",
        check=True,
        timeout=60,
    )
    from kafka import KafkaConsumer, KafkaProducer

    kp = KafkaProducer(
        bootstrap_servers=bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice",
        sasl_plain_password=USERS["alice"],
    )
    kp.send(topic, b"kp1").get(timeout=30)
    kp.close()

    async def aio() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=sasl_bootstrap(fleet, "az3"),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="bob",
            sasl_plain_password=USERS["bob"],
        )
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aio1")
        finally:
            await producer.stop()

    asyncio.run(aio())
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=sasl_bootstrap(fleet, "az1"),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=PLAIN_USER[0],
        sasl_plain_password=PLAIN_USER[1],
        auto_offset_reset="earliest",
        consumer_timeout_ms=20000,
    )
    assert values_read(consumer, 5) == {b"k1", b"k2", b"k3", b"kp1", b"aio1"}


# -- refusals ------------------------------------------------------------------------------


def _request(sock: socket.socket, api_key: int, version: int, data: dict[str, Any]) -> Any:
    frame = encode_request(api_key, version, 7, "sasl-test", build_request(api_key, version, data))
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    size = struct.unpack(">i", _read(sock, 4))[0]
    return decode_response(api_key, version, _read(sock, size))[1]


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def test_refusals_have_kafka_codes_and_no_traceback(
    sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = sasl_fleet
    port = sasl_port(fleet, "az1")

    # A wrong password: librdkafka reports the broker's SASL_AUTHENTICATION_FAILED text.
    errors: list[KafkaError] = []
    conf = _sasl_config(fleet, "az1", "SCRAM-SHA-512", "alice", "wrong")
    admin = AdminClient({**conf, "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        admin.poll(0.5)  # error_cb is served by poll
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert any("invalid credentials" in e.str() for e in errors), errors

    # An unknown mechanism: UNSUPPORTED_SASL_MECHANISM with the enabled ones, then closed.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        resp = _request(sock, 17, 1, {"mechanism": "GSSAPI"})
        assert int(resp.error_code) == 33
        assert set(resp.mechanisms) == {"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"}
        assert _closed(sock)

    # Garbage SCRAM bytes: SASL_AUTHENTICATION_FAILED, then closed.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert int(_request(sock, 17, 1, {"mechanism": "SCRAM-SHA-512"}).error_code) == 0
        resp = _request(sock, 36, 2, {"auth_bytes": b"\xff\x00garbage"})
        assert int(resp.error_code) == 58
        assert _closed(sock)

    # Metadata before authenticating: the connection closes without an answer.
    with socket.create_connection(("127.0.0.1", port)) as sock:
        frame = encode_request(3, 12, 1, "early", build_request(3, 12, {"topics": None}))
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        assert _closed(sock)

    # A plaintext Kafka client that skips SASL on the SASL port gets no service either.
    plain = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "socket.timeout.ms": 3000})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)

    log = "".join(proc.output)
    assert "authentication failed from 127.0.0.1" in log
    assert "wrong" not in re.findall(r"authentication failed from [^\n]*", log)[0]
    assert "Traceback" not in log
