"""The audit log and the admin token in a running fleet (issue 15, fleet-internal).

One 3-zone `zonefleet up --config` fleet, one process per node, with SASL_PLAINTEXT listeners
on the proxies, the authorizer on (`User:admin` the super user, over PLAIN), an `[admin]
token`, and the default audit log (`<data_dir>/audit/<node>.jsonl`). confluent-kafka logs in
with a wrong password and produces where it may not; admin creates an ACL and a SCRAM user.
Each shows up as a line in the right node's audit file, with no secret in any file. Every
node's /status answers 401 without the token and 200 with it; /metrics and /healthz stay
open; `zonefleet status` reads /status with the token from the fleet file.
"""

from __future__ import annotations

import json
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from fleet.admin_http import bearer_headers
from tests.fleet_process import ZONEFLEET
from tests.test_e2e_sasl_proxies import sasl_bootstrap, write_sasl_config
from tests.zone_fleet import ZoneFleet, running_up_fleet

ADMIN_PW = "admin-pw-audit"
ALICE_PW = "alice-pw-audit"
WRONG_PW = "not-alices-password"
TOKEN = "admin-http-token-" + uuid.uuid4().hex
SUFFIX = uuid.uuid4().hex[:6]
PAYROLL, GROUP = f"payroll-{SUFFIX}", f"g-{SUFFIX}"
SECRETS = (ADMIN_PW, ALICE_PW, WRONG_PW, TOKEN)


def _conf(fleet: ZoneFleet, user: str, password: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": sasl_bootstrap(fleet, "az1"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN" if user == "admin" else "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        **extra,
    }


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, ZoneFleet]]:
    data_dir = tmp_path_factory.mktemp("audit") / "fleet"
    data_dir.mkdir(parents=True)
    config = write_sasl_config(
        data_dir, {"admin": ADMIN_PW}, 'authorizer = true\nsuper_users = ["User:admin"]\n'
    )
    config.write_text(config.read_text() + f'\n[admin]\ntoken = "{TOKEN}"\n')
    with running_up_fleet(data_dir, config) as (_, fleet):
        admin = AdminClient(_conf(fleet, "admin", ADMIN_PW))
        for future in admin.create_topics([NewTopic(PAYROLL, 1, 1)]).values():
            future.result(timeout=30)
        yield data_dir, config, fleet


def _lines(data_dir: Path, node: str) -> list[dict[str, Any]]:
    path = data_dir / "audit" / f"{node}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_line(
    data_dir: Path, nodes: list[str], match: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        for node in nodes:
            for line in _lines(data_dir, node):
                if match(line):
                    return line
        assert time.monotonic() < deadline, f"no audit line: {what}"
        time.sleep(0.2)


def _mains(fleet: ZoneFleet) -> list[str]:
    return [f"main-{m.broker.node_id}" for m in fleet.config.mains]


def test_wrong_password_denied_produce_acl_and_scram_changes_are_audited(
    audited: tuple[Path, Path, ZoneFleet],
) -> None:
    data_dir, _, fleet = audited
    proxy = f"proxy-{next(p.proxy.node_id for p in fleet.config.proxies if p.proxy.zone == 'az1')}"
    admin = AdminClient(_conf(fleet, "admin", ADMIN_PW))

    # A SCRAM user: a scram_change on the main the proxy relayed it to.
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), ALICE_PW.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    scram = _wait_line(data_dir, _mains(fleet), lambda d: d["event"] == "scram_change", "scram")
    assert scram["changes"] == [
        {"user": "alice", "mechanism": "SCRAM-SHA-512", "change": "upsert", "outcome": "NONE"}
    ]
    # The principal the proxy authenticated travels with the relay RPC.
    assert (scram["outcome"], scram["listener"], scram["peer_host"], scram["principal"]) == (
        "NONE",
        "relay:" + proxy.split("-")[1],
        "127.0.0.1",
        "User:admin",
    )

    # ACLs: an acl_change with the bindings by Kafka's names. alice may see payroll (so her
    # producer sends its Produce: without DESCRIBE, Metadata alone would refuse her) but not
    # write it.
    acls = [
        AclBinding(
            ResourceType.TOPIC, PAYROLL, ResourcePatternType.LITERAL, "User:alice", "*",
            AclOperation.DESCRIBE, AclPermissionType.ALLOW,
        ),
        AclBinding(
            ResourceType.GROUP, GROUP, ResourcePatternType.LITERAL, "User:alice", "*",
            AclOperation.READ, AclPermissionType.ALLOW,
        ),
    ]  # fmt: skip
    for future in admin.create_acls(acls).values():
        future.result(timeout=30)
    change = _wait_line(data_dir, _mains(fleet), lambda d: d["event"] == "acl_change", "acl_change")
    assert (change["api"], change["outcome"]) == ("CreateAcls", "NONE")
    common = {"pattern_type": "LITERAL", "principal": "User:alice", "host": "*"}
    assert change["acls"] == [
        {"resource_type": "TOPIC", "resource": PAYROLL, **common, "operation": "DESCRIBE",
         "permission": "ALLOW"},
        {"resource_type": "GROUP", "resource": GROUP, **common, "operation": "READ",
         "permission": "ALLOW"},
    ]  # fmt: skip
    # Key order as docs/formats.md says.
    assert list(change["acls"][0]) == [
        "resource_type", "resource", "pattern_type", "principal", "host", "operation",
        "permission",
    ]  # fmt: skip

    # A wrong password: authentication_failed on the proxy, with the user it claimed.
    wrong = AdminClient(_conf(fleet, "alice", WRONG_PW))
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=5)
    failed = _wait_line(
        data_dir,
        [proxy],
        lambda d: d["event"] == "authentication_failed" and d["user"] == "alice",
        "wrong password",
    )
    assert (failed["mechanism"], failed["listener"], failed["outcome"]) == (
        "SCRAM-SHA-512",
        "SASL",
        "SASL_AUTHENTICATION_FAILED",
    )
    assert failed["principal"] == "User:ANONYMOUS" and failed["peer_host"] == "127.0.0.1"

    # A produce alice may not make: TOPIC_AUTHORIZATION_FAILED, and its operation_denied.
    # (Her credential and the ACLs reach the proxy within its refresh bounds: until then
    # Metadata refuses her the topic, which writes DESCRIBE denials; try again until the
    # Produce itself is refused.)
    def write_denied(d: dict[str, Any]) -> bool:
        want = ("operation_denied", PAYROLL, "WRITE")
        return (d["event"], d.get("resource"), d.get("operation")) == want

    deadline = time.monotonic() + 60
    while True:
        errors: list[KafkaError | None] = []
        producer = Producer({**_conf(fleet, "alice", ALICE_PW), "message.timeout.ms": 10000})
        producer.produce(PAYROLL, b"v", on_delivery=lambda err, msg, out=errors: out.append(err))
        producer.flush(15)
        codes = [e.code() if e is not None else None for e in errors]
        assert codes in ([], [KafkaError.TOPIC_AUTHORIZATION_FAILED]), codes
        if any(write_denied(d) for d in _lines(data_dir, proxy)):
            break
        assert time.monotonic() < deadline, f"alice's produce was never refused: {codes}"
    denied = _wait_line(data_dir, [proxy], write_denied, "denied produce")
    assert {k: denied[k] for k in ("principal", "resource_type", "operation", "outcome")} == {
        "principal": "User:alice",
        "resource_type": "TOPIC",
        "operation": "WRITE",
        "outcome": "TOPIC_AUTHORIZATION_FAILED",
    }

    # Every audit file: 0600, one JSON object a line, and no secret anywhere.
    files = sorted((data_dir / "audit").glob("*.jsonl"))
    assert {f.name for f in files} >= {f"{proxy}.jsonl"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        text = path.read_text()
        assert not any(secret in text for secret in SECRETS), path
        for line in text.splitlines():
            assert json.loads(line)["v"] == 1


def test_status_needs_the_admin_token_metrics_and_healthz_are_open(
    audited: tuple[Path, Path, ZoneFleet],
) -> None:
    data_dir, config_path, fleet = audited
    nodes = fleet.config.nodes()
    assert {n.admin_token for n in nodes} == {TOKEN}
    for node in nodes:
        base = f"http://{node.admin_host}:{node.admin_port}"
        refused = httpx.get(f"{base}/status", timeout=5)
        assert refused.status_code == 401, node
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(f"{base}/status", headers=bearer_headers("x" * 20)).status_code == 401
        status = httpx.get(f"{base}/status", headers=bearer_headers(TOKEN), timeout=5)
        assert status.status_code == 200 and status.json()["zone"] == node.zone
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        metrics = httpx.get(f"{base}/metrics", timeout=5)
        assert metrics.status_code == 200 and "zonefleet_" in metrics.text
    # The refusals are audited on each node (admin-http, Bearer, HTTP_401).
    refusal = _wait_line(
        data_dir,
        _mains(fleet),
        lambda d: d["event"] == "authentication_failed" and d["listener"] == "admin-http",
        "admin 401",
    )
    assert (refusal["mechanism"], refusal["outcome"]) == ("Bearer", "HTTP_401")
    # `zonefleet status` reads every node's /status with the fleet file's token.
    out = subprocess.run(
        [ZONEFLEET, "status", "--config", str(config_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = json.loads(out.stdout)
    assert len(rows) == len(nodes)
    assert all(row["healthy"] and row["status"] is not None for row in rows), rows
