"""AlterClientQuotas and DescribeClientQuotas on a lone main (no metadata store: the quotas
document is on its WAL, docs/formats.md), with raw requests for exact error codes, the
`zonefleet quotas` CLI, a restart that keeps them, and a direct client of the main throttled
by it (issue 15, "Quotas")."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from fleet.config import local_fleet_toml
from tests.fleet_process import FleetProcess
from tests.ports import free_port_block
from tests.raw_kafka import RawKafka

ZONEFLEET = str(Path(sys.executable).with_name("zonefleet"))
DESCRIBE, ALTER = 48, 49
EXACT, DEFAULT, SPECIFIED = 0, 1, 2


class LoneMain:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.base = free_port_block(4)
        text = local_fleet_toml(data_dir, self.base)
        text, count = re.subn(r'(?m)^\[metadata\]\nurl = ".*"\n', "", text)
        assert count == 1
        self.path = data_dir / "fleet.toml"
        self.path.write_text(text)
        self.proc = self._start()

    def _start(self) -> FleetProcess:
        return FleetProcess(self.data_dir, self.base, ["--config", str(self.path)]).start()

    @property
    def bootstrap(self) -> str:
        assert self.proc.bootstrap is not None
        return self.proc.bootstrap

    def restart(self) -> None:
        assert self.proc.stop() == 0, "".join(self.proc.output[-40:])
        self.proc = self._start()


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoneMain]:
    main = LoneMain(tmp_path_factory.mktemp("quotas-api") / "lone")
    try:
        yield main
    finally:
        main.proc.stop()


def _entity(**names: str | None) -> list[dict[str, Any]]:
    return [
        {"entity_type": kind.replace("_", "-"), "entity_name": name} for kind, name in names.items()
    ]


def _op(key: str, value: float | None) -> dict[str, Any]:
    return {"key": key, "value": 0.0 if value is None else value, "remove": value is None}


def _alter(raw: RawKafka, entries: list[dict[str, Any]], validate_only: bool = False) -> Any:
    return raw.request(ALTER, 1, {"entries": entries, "validate_only": validate_only}).entries


def _describe(raw: RawKafka, components: list[dict[str, Any]], strict: bool = False) -> Any:
    return raw.request(DESCRIBE, 1, {"components": components, "strict": strict})


def _as_dict(resp: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    assert resp.error_code == ErrorCode.none, resp.error_message
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {
            v.key: v.value for v in entry.values
        }
        for entry in resp.entries
    }


def test_alter_checks_each_entity_as_kafka_does(lone: LoneMain) -> None:
    raw = RawKafka(lone.bootstrap)
    try:
        results = _alter(
            raw,
            [
                {"entity": _entity(client_id="app"), "ops": [_op("producer_byte_rate", 4096)]},
                {"entity": _entity(user=None), "ops": [_op("request_percentage", 12.5)]},
                {"entity": _entity(user="bad"), "ops": [_op("producer_byte_rate", 0)]},
                {"entity": _entity(user="frac"), "ops": [_op("consumer_byte_rate", 1.5)]},
                {"entity": _entity(user="what"), "ops": [_op("bytes_per_fortnight", 1)]},
                {"entity": _entity(ip="10.0.0.1", user="x"), "ops": [_op("producer_byte_rate", 1)]},
            ],
        )
        codes = [r.error_code for r in results]
        assert codes[:2] == [ErrorCode.none, ErrorCode.none]
        assert codes[2:] == [ErrorCode.invalid_request] * 4
        messages = [r.error_message for r in results[2:]]
        assert messages[0] == "Quota producer_byte_rate must be greater than 0"
        assert messages[1] == "consumer_byte_rate cannot be a fractional value."
        assert messages[2] == "Invalid configuration key bytes_per_fortnight"
        assert "IP entity shouldnot be combined" in messages[3]
        # validate_only checks and keeps nothing.
        (checked,) = _alter(
            raw,
            [{"entity": _entity(client_id="dry"), "ops": [_op("producer_byte_rate", 1)]}],
            validate_only=True,
        )
        assert checked.error_code == ErrorCode.none
        assert _as_dict(_describe(raw, [])) == {
            (("client-id", "app"),): {"producer_byte_rate": 4096.0},
            (("user", None),): {"request_percentage": 12.5},
        }
    finally:
        raw.close()


def test_describe_filters_as_kafka_does(lone: LoneMain) -> None:
    raw = RawKafka(lone.bootstrap)
    try:
        (ok,) = _alter(
            raw,
            [
                {
                    "entity": _entity(user="alice", client_id="app"),
                    "ops": [_op("consumer_byte_rate", 2048)],
                }
            ],
        )
        assert ok.error_code == ErrorCode.none
        exact_client = _describe(
            raw, [{"entity_type": "client-id", "match_type": EXACT, "match": "app"}]
        )
        assert set(_as_dict(exact_client)) == {
            (("client-id", "app"),),
            (("user", "alice"), ("client-id", "app")),
        }
        strict = _describe(
            raw, [{"entity_type": "client-id", "match_type": EXACT, "match": "app"}], strict=True
        )
        assert set(_as_dict(strict)) == {(("client-id", "app"),)}
        default_user = _describe(
            raw, [{"entity_type": "user", "match_type": DEFAULT, "match": None}]
        )
        assert set(_as_dict(default_user)) == {(("user", None),)}
        any_user = _describe(raw, [{"entity_type": "user", "match_type": SPECIFIED, "match": None}])
        assert len(_as_dict(any_user)) == 2
        bad = _describe(raw, [{"entity_type": "user", "match_type": EXACT, "match": None}])
        assert bad.error_code == ErrorCode.invalid_request and bad.entries is None
        unknown = _describe(raw, [{"entity_type": "group", "match_type": SPECIFIED, "match": None}])
        assert unknown.error_code == ErrorCode.unsupported_version
    finally:
        raw.close()


def test_the_cli_removes_a_key_and_quotas_survive_a_restart(lone: LoneMain) -> None:
    cli = [ZONEFLEET, "quotas", "--bootstrap", lone.bootstrap]
    removed = subprocess.run(
        [*cli, "alter", "--user", "alice", "--client-id", "app", "--delete", "consumer_byte_rate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert removed.returncode == 0, removed.stderr
    lone.restart()
    raw = RawKafka(lone.bootstrap)
    try:
        assert _as_dict(_describe(raw, [])) == {
            (("client-id", "app"),): {"producer_byte_rate": 4096.0},
            (("user", None),): {"request_percentage": 12.5},
        }
    finally:
        raw.close()


def test_a_direct_client_of_a_main_is_throttled_by_it(lone: LoneMain) -> None:
    """A client id with a tiny producer_byte_rate: the main's Produce answers carry a throttle
    time once its burst (ten windows of quota) is used up."""
    raw = RawKafka(lone.bootstrap)
    try:
        (ok,) = _alter(
            raw,
            [{"entity": _entity(client_id="tiny"), "ops": [_op("producer_byte_rate", 1024)]}],
        )
        assert ok.error_code == ErrorCode.none
    finally:
        raw.close()
    throttles: list[int] = []
    producer = Producer(
        {
            "bootstrap.servers": lone.bootstrap,
            "client.id": "tiny",
            "linger.ms": 0,
            "throttle_cb": lambda event: throttles.append(event.throttle_time),
        }
    )
    deadline = time.monotonic() + 30  # the main reads the quotas every 5 s
    while not any(throttles):
        assert time.monotonic() < deadline, "the main never throttled client id tiny"
        producer.produce("tiny-topic", b"x" * 4096)
        producer.flush(30)
        producer.poll(0.1)
    assert max(throttles) > 0


def test_the_topics_cli_over_the_same_connection_helper(lone: LoneMain) -> None:
    """`zonefleet topics` shares the Kafka CLI plumbing (fleet/kafka_cli.py) with `quotas`."""
    cli = [ZONEFLEET, "topics", "--bootstrap", lone.bootstrap]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)

    created = run("create", "cli-topic", "--partitions", "2")
    assert created.returncode == 0, created.stderr
    assert "cli-topic" in run("list").stdout.split()
    described = run("describe", "cli-topic")
    assert described.returncode == 0 and '"partition": 1' in described.stdout
    again = run("create", "cli-topic")
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr.upper()
    unreachable = subprocess.run(
        [ZONEFLEET, "topics", "--bootstrap", "127.0.0.1:1", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 1 and "cannot reach 127.0.0.1:1" in unreachable.stderr
