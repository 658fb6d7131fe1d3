"""A lone main's named listeners (issue 15), in process with confluent-kafka: SCRAM users
made through the SASL listener are checked from the main's own WAL at once, Metadata on the
listener names the main by its SASL address (no zone proxies: no zone view, only the
listener's addresses), and with the authorizer on the listener serves super users only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kafka_wire.listeners import ListenerConfig
from kafka_wire.sasl.gate import SaslSettings
from kafka_wire.sasl.plain import dump_credentials, make_credential
from main_broker.broker import MainBroker
from main_broker.config import BrokerConfig
from tests.ports import free_port

ADMIN = ("admin", "admin-pw")
CAROL = ("carol", "carol-pw")


def _config(tmp_path: Path, super_users: frozenset[str] | None = None) -> BrokerConfig:
    creds = tmp_path / "plain.json"
    creds.write_bytes(dump_credentials({u: make_credential(pw) for u, pw in (ADMIN, CAROL)}))
    return BrokerConfig(
        node_id=1,
        zone="az1",
        wal_url=f"osfs://{tmp_path / 'wal'}",
        port=free_port(),
        listeners=[ListenerConfig("SASL", "SASL_PLAINTEXT", "127.0.0.1", 0)],
        sasl=SaslSettings(mechanisms=("SCRAM-SHA-512", "PLAIN"), plain_credentials_file=str(creds)),
        listener_super_users=super_users,
    )


def _conf(port: int, mechanism: str, user: str, pw: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": pw,
    }


def _scram_user_produces(port: int) -> dict[int, int]:
    admin = AdminClient(_conf(port, "PLAIN", *ADMIN))
    upsert = UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"dave-pw"
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    dave = _conf(port, "SCRAM-SHA-512", "dave", "dave-pw")
    producer = Producer(dave)
    producer.produce("listened", b"v")
    assert producer.flush(30) == 0
    brokers = AdminClient(dave).list_topics(timeout=10).brokers
    return {node: b.port for node, b in brokers.items()}


async def test_lone_main_sasl_listener(tmp_path: Path) -> None:
    broker = MainBroker(_config(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        port = broker.secure.bound["SASL"]
        assert await trio.to_thread.run_sync(_scram_user_produces, port) == {1: port}
        nursery.cancel_scope.cancel()


def _lists(conf: dict[str, Any]) -> None:
    AdminClient({**conf, "socket.timeout.ms": 3000}).list_topics(timeout=5)


async def test_authorizer_on_leaves_a_main_listener_to_super_users(tmp_path: Path) -> None:
    broker = MainBroker(_config(tmp_path, frozenset({"User:admin"})))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        port = broker.secure.bound["SASL"]
        await trio.to_thread.run_sync(_lists, _conf(port, "PLAIN", *ADMIN))
        with pytest.raises(KafkaException):
            await trio.to_thread.run_sync(_lists, _conf(port, "PLAIN", *CAROL))
        nursery.cancel_scope.cancel()
