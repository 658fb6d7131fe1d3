"""SASL on the mains' own listeners (issue 15), with stock clients over real sockets.

The fleet of tests/test_e2e_sasl_proxies.py (`zonefleet up --config`, three zones, a
SASL_PLAINTEXT listener named SASL on each proxy), where each main has a SASL_PLAINTEXT
listener of the same name too. confluent-kafka bootstraps at a main's SASL listener with
SCRAM-SHA-512 (a user created there with AlterUserScramCredentials, which the mains read from
the metadata store) and with PLAIN (the credentials file), produces and consumes; Metadata
there names every node by its SASL address, and the proxies' SASL clients now see their
zone's main at its own SASL listener. A wrong password is refused with
SASL_AUTHENTICATION_FAILED, one log line and no traceback.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from fleet.config import load_fleet_config
from tests.fleet_process import FleetProcess
from tests.test_e2e_sasl_proxies import PLAIN_USER, round_trip, sasl_port, write_sasl_config
from tests.zone_fleet import ZoneFleet, running_up_fleet

MAIN_SASL_OFFSET = 5  # from the main's port (base + 10*K + 2): + 7, free in the zone's block
ALICE = ("alice", "alice-main-512")


def write_main_sasl_config(data_dir: Path) -> Path:
    """write_sasl_config's fleet, with a SASL_PLAINTEXT listener named SASL on each main."""
    path = write_sasl_config(data_dir)
    config = load_fleet_config(path, discover=None)
    text = path.read_text()
    for m in config.mains:
        line = f"rpc_port = {m.broker.rpc_port}\n"
        listener = (
            f'listeners = [{{ name = "SASL", protocol = "SASL_PLAINTEXT", '
            f"port = {m.broker.port + MAIN_SASL_OFFSET} }}]\n"
        )
        assert line in text
        text = text.replace(line, line + listener)
    path.write_text(text)
    return path


def main_sasl_port(fleet: ZoneFleet, zone: str) -> int:
    main = next(m.broker for m in fleet.config.mains if m.broker.zone == zone)
    return next(lst.port for lst in main.listeners if lst.name == "SASL")


def main_conf(fleet: ZoneFleet, zone: str, mechanism: str, user: str, pw: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{main_sasl_port(fleet, zone)}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": pw,
    }


@pytest.fixture(scope="module")
def main_sasl_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FleetProcess, ZoneFleet]]:
    data_dir = tmp_path_factory.mktemp("sasl-mains") / "fleet"
    data_dir.mkdir(parents=True)
    config = write_main_sasl_config(data_dir)
    with running_up_fleet(data_dir, config) as (proc, fleet):
        # The SCRAM user is made through a main's SASL listener, as PLAIN's carol.
        admin = AdminClient(main_conf(fleet, "az1", "PLAIN", *PLAIN_USER))
        upsert = UserScramCredentialUpsertion(
            ALICE[0], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), ALICE[1].encode()
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        # Every main (and proxy) reads the stored credentials on its own schedule.
        for zone in fleet.zones:
            _wait_authenticates(main_conf(fleet, zone, "SCRAM-SHA-512", *ALICE))
        yield proc, fleet


def _wait_authenticates(conf: dict[str, Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            AdminClient(conf).list_topics(timeout=5)
            return
        except KafkaException as exc:
            last = exc
    raise AssertionError(f"{conf['bootstrap.servers']} never took the user: {last}")


def test_scram_and_plain_bootstrapped_at_a_main(
    main_sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = main_sasl_fleet
    scram = main_conf(fleet, "az1", "SCRAM-SHA-512", *ALICE)
    plain = main_conf(fleet, "az2", "PLAIN", *PLAIN_USER)
    round_trip(scram, plain, 40)
    round_trip(plain, scram, 40)


def test_metadata_on_a_main_listener_names_sasl_addresses(
    main_sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    _, fleet = main_sasl_fleet
    for zone in fleet.zones:
        main_id = next(m.broker.node_id for m in fleet.config.mains if m.broker.zone == zone)
        expected = {main_sasl_port(fleet, zone), sasl_port(fleet, zone)}
        # At the main: its zone's main and proxy, each at its SASL address.
        admin = AdminClient(main_conf(fleet, zone, "SCRAM-SHA-512", *ALICE))
        brokers = admin.list_topics(timeout=10).brokers
        assert {b.port for b in brokers.values()} == expected, (zone, brokers)
        assert brokers[main_id].port == main_sasl_port(fleet, zone)
        # At the proxy: the zone's main is listed on its own SASL listener now.
        at_proxy = {
            **main_conf(fleet, zone, "SCRAM-SHA-512", *ALICE),
            "bootstrap.servers": f"127.0.0.1:{sasl_port(fleet, zone)}",
        }
        brokers = AdminClient(at_proxy).list_topics(timeout=10).brokers
        assert {b.port for b in brokers.values()} == expected, (zone, brokers)


def test_wrong_password_at_a_main_is_refused_without_traceback(
    main_sasl_fleet: tuple[FleetProcess, ZoneFleet],
) -> None:
    proc, fleet = main_sasl_fleet
    errors: list[KafkaError] = []
    conf = main_conf(fleet, "az2", "SCRAM-SHA-512", ALICE[0], "wrong")
    admin = AdminClient({**conf, "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        admin.poll(0.5)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert any("invalid credentials" in e.str() for e in errors), errors
    log = "".join(proc.output)
    lines = re.findall(r"authentication failed from [^\n]*", log)
    assert any("listener SASL" in line for line in lines), lines
    assert "Traceback" not in log
